//! Loss recovery, one loss pattern at a time: which packet is lost decides
//! which mechanism recovers it (a sequence NAK, the tail-loss probe, the
//! retransmission timer) and what it costs in time. Each test runs with the
//! IBTA's fixed timer and with the adaptive one (`qp/rto.rs`).

use std::time::Duration;

use softrnic_sim::harness::{IOVA, Pair, PairOptions};
use softrnic_sim::world::{Outage, OutageKind};
use softrnic_transport::{
    Choice, Mtu, Payload, QpState, RemoteAddr, Retransmission, SendOp, TransportConfig, WcStatus,
};

/// Host 0 sends, host 1 answers; `(sender, n)` in `doomed` is the n-th
/// datagram a host puts on the wire.
const A: usize = 0;
const B: usize = 1;

/// The harness's `timeout` attribute, 10: 4.096 µs × 2^10.
const TIMEOUT: Duration = Duration::from_nanos(4096 << 10);

/// A pair whose QPs time retransmissions as `retransmission` says, with
/// one small WRITE done first so that the adaptive timer has measured the
/// path (its first flight waits the full timeout, as a fixed timer does).
fn pair(retransmission: Retransmission) -> Pair {
    let config = TransportConfig { retransmission, ..TransportConfig::default() };
    let mut pair = Pair::new(PairOptions { mtu: Mtu::Mtu1024, config, ..PairOptions::default() });
    write(&mut pair, 0, 64);
    let [a, _] = pair.settle();
    assert_eq!(a[0].status, WcStatus::Success);
    pair
}

fn write(pair: &mut Pair, wr_id: u64, len: u32) {
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    let payload: Payload = pair.a.gather(0, len);
    pair.post(A, wr_id, SendOp::Write { remote, imm: None }, payload);
}

/// Sends an 8-packet WRITE with `doomed` lost; returns how long it took
/// to complete.
fn eight_packets_losing(pair: &mut Pair, doomed: &[(usize, u64)]) -> Duration {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    pair.a.buffer.write(0, &data);
    // The datagrams each host sent so far (the warm-up's) come first.
    let base = [pair.world.device(A).counters().tx_packets, pair.world.device(B).counters().tx_packets];
    pair.world.network.doomed = doomed.iter().map(|&(host, n)| (host, base[host] + n)).collect();
    let start = pair.world.now;
    write(pair, 1, 8192);
    let done = pair.wait(A, 1);
    assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, WcStatus::Success)]);
    assert_eq!(pair.b.buffer.to_vec()[..8192], data[..], "every byte placed");
    assert_eq!(pair.state(A), QpState::Rts);
    pair.world.now - start
}

fn counters(pair: &mut Pair) -> softrnic_transport::Counters {
    pair.world.device(A).counters().clone()
}

#[test]
fn a_lost_last_packet_costs_a_probe_not_the_timeout() {
    let mut fixed = pair(Retransmission::Fixed);
    let slow = eight_packets_losing(&mut fixed, &[(A, 7)]);
    assert!(slow >= TIMEOUT, "the fixed timer waits the attribute: {slow:?}");

    let mut adaptive = pair(Retransmission::ADAPTIVE);
    let fast = eight_packets_losing(&mut adaptive, &[(A, 7)]);
    let c = counters(&mut adaptive);
    assert_eq!((c.timeouts, c.tail_loss_probes, c.retransmitted_packets), (1, 1, 1), "one probe, one packet");
    assert!(fast < TIMEOUT / 10, "the adaptive timer recovers a tail loss in {fast:?}");
}

#[test]
fn a_lost_first_or_middle_packet_is_recovered_by_a_sequence_nak() {
    for mode in [Retransmission::Fixed, Retransmission::ADAPTIVE] {
        for lost in [0, 3] {
            let mut pair = pair(mode);
            let took = eight_packets_losing(&mut pair, &[(A, lost)]);
            let c = counters(&mut pair);
            assert_eq!((c.seq_naks_received, c.timeouts), (1, 0), "{mode:?}, packet {lost}");
            assert_eq!(c.retransmitted_packets, 8 - lost, "go-back-N resends from the gap");
            assert!(took < TIMEOUT / 10, "{mode:?}, packet {lost}: {took:?}");
        }
    }
}

#[test]
fn a_lost_ack_is_repeated_after_a_probe() {
    // B acknowledges the warm-up with its datagram 0 here; the WRITE's
    // one ACK (8 packets, fewer than the ACK request interval) is next.
    let mut adaptive = pair(Retransmission::ADAPTIVE);
    let fast = eight_packets_losing(&mut adaptive, &[(B, 0)]);
    let c = counters(&mut adaptive);
    assert_eq!((c.tail_loss_probes, c.retransmitted_packets), (1, 1), "the last packet alone goes again");
    assert_eq!(adaptive.world.device(B).counters().rx_duplicate_requests, 1);
    assert!(fast < TIMEOUT / 10, "{fast:?}");

    let mut fixed = pair(Retransmission::Fixed);
    let slow = eight_packets_losing(&mut fixed, &[(B, 0)]);
    assert!(slow >= TIMEOUT);
    assert_eq!(counters(&mut fixed).retransmitted_packets, 8, "go-back-N resends the whole flight");
}

#[test]
fn a_lost_probe_falls_back_to_going_back() {
    // The last packet, then its probe, are lost: the next expiry goes back
    // to the oldest unacknowledged packet.
    let mut pair = pair(Retransmission::ADAPTIVE);
    let took = eight_packets_losing(&mut pair, &[(A, 7), (A, 8)]);
    let c = counters(&mut pair);
    assert_eq!((c.timeouts, c.tail_loss_probes), (2, 1));
    assert!(took < TIMEOUT / 10, "{took:?}");
}

#[test]
fn a_lost_nak_is_covered_by_the_timer() {
    // Packet 2 is lost; B's sequence NAK (its first datagram) is lost too.
    for mode in [Retransmission::Fixed, Retransmission::ADAPTIVE] {
        let mut pair = pair(mode);
        let took = eight_packets_losing(&mut pair, &[(A, 2), (B, 0)]);
        let c = counters(&mut pair);
        assert!(c.timeouts >= 1, "{mode:?}");
        if mode == Retransmission::Fixed {
            assert!(took >= TIMEOUT, "{took:?}");
        } else {
            assert!(took < TIMEOUT / 10, "{took:?}");
        }
    }
}

#[test]
fn an_adaptive_timer_spends_retries_no_faster_than_the_attribute() {
    // A dead peer: the QP fails after retry_cnt + 1 full timeouts, however
    // short the adaptive timer is.
    let mut pair = pair(Retransmission::ADAPTIVE);
    pair.world.hosts[B].up = false;
    let start = pair.world.now;
    write(&mut pair, 1, 64);
    let [a, _] = pair.settle();
    assert_eq!(a[0].status, WcStatus::RetryExcErr);
    let took = pair.world.now - start;
    assert!(took >= TIMEOUT * 8, "7 retries and the first try, each a full timeout: {took:?}");
    // And not much slower: each retry is spent a timeout after the last
    // fell due, not at the first expiry after it (which cost seed
    // 12019469 a sixth more than its retries allow).
    assert!(took < TIMEOUT * 9, "{took:?}");
    assert!(counters(&mut pair).timeouts > 8, "the adaptive timer also tried in between");
}

#[test]
fn long_reads_on_a_path_slower_than_a_window_per_timeout_complete() {
    // At 100 MB/s one READ window (512 responses of 4 KiB) takes 21 ms,
    // five times the 4.2 ms timeout: after a loss the repair waits behind
    // the rest of the window, and the timer must not fire behind it (each
    // expiry asked for every READ again and deepened the backlog until
    // the retries ran out).
    for retransmission in [Retransmission::Fixed, Retransmission::ADAPTIVE] {
        for seed in 0..3 {
            let config = TransportConfig { retransmission, ..TransportConfig::default() };
            let faults = softrnic_sim::Faults { loss: 0.002, ..softrnic_sim::Faults::NONE };
            let len = 4 << 20;
            let options =
                PairOptions { mtu: Mtu::Mtu4096, region_len: len, config, faults, seed, ..PairOptions::default() };
            let mut pair = Pair::new(options);
            pair.world.network.bytes_per_micro = 100;
            let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
            for wr_id in 0..8 {
                let payload: Payload = pair.a.gather(0, len as u32);
                pair.post(A, wr_id, SendOp::Read { remote }, payload);
            }
            let done = pair.wait(A, 8);
            let statuses: Vec<_> = done.iter().map(|c| c.status).collect();
            assert_eq!(statuses, [WcStatus::Success; 8], "{retransmission:?}, seed {seed}: {:?}", counters(&mut pair));
        }
    }
}

/// Seed 8000297 in small: under go-back-N a paced responder (its READ
/// responses leave at 32 Mb/s, so what it still owes waits in the QP,
/// where a repeat restarts it) loses a READ response, and then the same
/// response again in the stream that answers the repeat. That stream's
/// later responses show the hole lost again: it is asked for at once,
/// rather than after the stream (62 responses, 16 ms) has ended. Returns
/// how long the READ took and how many responses B sent.
fn read_losing_its_hole_twice(second_loss: u64) -> (Duration, u64) {
    // Under congestion control READ responses are paced; the QP's rate
    // limit sets the pace.
    let mut config = TransportConfig::default();
    config.congestion.algorithm = Some(Choice::builtin("dcqcn", "").unwrap());
    let mut pair = Pair::new(PairOptions { mtu: Mtu::Mtu1024, config, ..PairOptions::default() });
    let now = pair.world.now;
    pair.world.device(B).set_qp_rate_limit(now, pair.b.qpn, Some(32_000_000)).unwrap();
    let base = [pair.world.device(A).counters().tx_packets, pair.world.device(B).counters().tx_packets];
    pair.world.network.doomed = vec![(B, base[B] + 2), (B, base[B] + second_loss)];
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
    pair.b.buffer.write(0, &data);
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    let payload: Payload = pair.a.gather(0, 65536);
    let start = pair.world.now;
    pair.post(A, 1, SendOp::Read { remote }, payload);
    let done = pair.wait(A, 1);
    assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::Success)]);
    assert_eq!(pair.a.buffer.to_vec()[..65536], data[..], "every byte placed");
    (pair.world.now - start, pair.world.device(B).counters().tx_packets - base[B])
}

#[test]
fn a_hole_lost_again_in_the_answer_to_its_repeat_is_asked_for_at_once() {
    // B's datagrams 0 to 3 are responses 0 to 3 (2 lost); response 3
    // shows the hole, and the repeat reaches B after it sent response 3,
    // so datagram 4 is response 2 again, and is lost too.
    let (took, sent) = read_losing_its_hole_twice(4);
    // 64 responses and 4 more: the second stream stopped a round trip
    // after its first response (before: it ran to its end, 128 responses
    // and 37 ms).
    assert_eq!(sent, 68);
    assert!(took < Duration::from_millis(18), "{took:?}");
}

/// A host frozen and resumed (a VM paused, a process stopped) finds its
/// clock jumped forward past every timer, and past its QP's whole retry
/// budget (100 ms against eight timeouts of 4.2 ms): the retransmission
/// timer fires once, not once per timeout skipped, what was in flight
/// goes again, and everything completes.
#[test]
fn a_clock_that_jumps_forward_costs_one_timeout_not_the_retries() {
    for retransmission in [Retransmission::Fixed, Retransmission::ADAPTIVE] {
        let mut pair = pair(retransmission);
        for wr_id in 1..=3 {
            write(&mut pair, wr_id, 65536);
        }
        // The WRITEs are on the wire (64 packets at 100 Gb/s take 5 µs).
        let now = pair.world.now;
        pair.world.run_until_time(now + Duration::from_micros(2));
        let before = counters(&mut pair).timeouts;
        pair.world.jump_clock(A, Duration::from_millis(100));
        let done = pair.wait(A, 3);
        let statuses: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(statuses, [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
        let timeouts = counters(&mut pair).timeouts - before;
        assert_eq!(timeouts, 1, "{retransmission:?}");
        assert_eq!(pair.state(A), QpState::Rts);
    }
}

/// The simulator's liveness phase in small: a network that loses every
/// packet for a while, then heals. What was posted meanwhile completes,
/// once and in order, as soon as the timers find the path open again, and
/// within the QP's retries (7 of 4.2 ms: a partition shorter than that
/// costs no request).
#[test]
fn a_network_that_heals_finishes_what_was_posted_meanwhile() {
    for retransmission in [Retransmission::Fixed, Retransmission::ADAPTIVE] {
        let mut pair = pair(retransmission);
        pair.world.network.faults.loss = 1.0;
        for wr_id in 1..=3 {
            write(&mut pair, wr_id, 4096);
        }
        let partitioned = pair.world.now + TIMEOUT * 3;
        pair.world.run_until_time(partitioned);
        let lost = pair.world.network.stats.dropped;
        assert!(lost >= 3, "{retransmission:?}: the partition lost the flight and its retries ({lost})");
        let mut early = Vec::new();
        let cq = pair.a.cq;
        pair.world.device(A).poll_cq(cq, usize::MAX, &mut early);
        assert!(early.is_empty(), "{retransmission:?}: nothing completes across a partition: {early:?}");
        pair.world.heal();
        let done = pair.wait(A, 3);
        let took = pair.world.now - partitioned;
        assert_eq!(
            done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)],
            "{retransmission:?}"
        );
        assert!(took <= TIMEOUT * 2, "{retransmission:?}: the next retry after the heal took {took:?}");
        assert_eq!(pair.state(A), QpState::Rts);
    }
}

/// A path clogged for longer than the timeout holds everything sent on
/// it, retransmissions too, and lets it all go in order when the clog
/// ends: nothing is lost, the copies are duplicates, and the WRITE lands
/// once. A partition as long loses everything sent across it, either
/// way; the retries carry the WRITE over once it ends.
#[test]
fn a_clogged_path_and_a_partition_each_end_with_the_write_done_once() {
    for kind in [OutageKind::Clog, OutageKind::Partition] {
        let mut pair = pair(Retransmission::ADAPTIVE);
        let (from, until) = (pair.world.now, pair.world.now + TIMEOUT * 2);
        pair.world.outages.push(Outage { kind, between: (A, B), from, until });
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 1) as u8).collect();
        pair.a.buffer.write(0, &data);
        write(&mut pair, 1, 4096);
        let done = pair.wait(A, 1);
        assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::Success)], "{kind:?}");
        assert!(pair.world.now >= until, "{kind:?}: nothing crossed before the outage ended");
        assert_eq!(pair.b.buffer.to_vec()[..4096], data[..], "{kind:?}");
        let held_back = pair.world.device(B).counters().rx_duplicate_requests;
        match kind {
            OutageKind::Clog => {
                assert_eq!(pair.world.partitioned, 0);
                assert!(held_back >= 1, "the clog let its retransmissions through too: {held_back}");
            }
            OutageKind::Partition => assert!(pair.world.partitioned >= 2, "{}", pair.world.partitioned),
        }
        assert_eq!(pair.state(A), QpState::Rts);
    }
}

/// A paced QP's packets wait their turn at the pacer, and a packet that
/// waits is not lost: the timer counts from when it may leave. At 10 Mb/s
/// each 1 KiB packet waits 0.8 ms, far longer than the adaptive timer's
/// wait on this path, and an 8-packet WRITE on a perfect network needs no
/// timeout, no probe and no packet sent twice (seed 22012789: a timer
/// shorter than the gap fired before each packet left).
#[test]
fn a_paced_write_is_timed_from_when_its_packets_may_leave() {
    for retransmission in [Retransmission::ADAPTIVE, Retransmission::Adaptive { floor: Duration::from_micros(10) }] {
        let mut pair = pair(retransmission);
        let (now, qpn) = (pair.world.now, pair.a.qpn);
        pair.world.device(A).set_qp_rate_limit(now, qpn, Some(10_000_000)).unwrap();
        let before = counters(&mut pair);
        write(&mut pair, 1, 8 * 1024);
        let [a, _] = pair.settle();
        assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::Success), "{retransmission:?}");
        let after = counters(&mut pair);
        let spent = |f: fn(&softrnic_transport::Counters) -> u64| f(&after) - f(&before);
        assert_eq!(
            (spent(|c| c.timeouts), spent(|c| c.tail_loss_probes), spent(|c| c.retransmitted_packets)),
            (0, 0, 0),
            "{retransmission:?}"
        );
    }
}
