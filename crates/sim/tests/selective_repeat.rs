//! Selective repeat, one loss pattern at a time: whatever is lost, only it
//! goes again, the message completes once and in order, and every byte
//! lands where it belongs (`qp/placement.rs`, `qp/scoreboard.rs`).

use std::time::Duration;

use softrnic_sim::harness::{IOVA, Pair, PairOptions, first_psn};
use softrnic_transport::{
    Counters, Mtu, Payload, QpState, RemoteAddr, Retransmission, SendOp, TransportConfig, WcOpcode, WcStatus,
};
use softrnic_wire::packet::{Extensions, Headers};
use softrnic_wire::{Opcode, bth, reth};

/// Host 0 sends, host 1 answers; `(sender, n)` names the n-th datagram a
/// host puts on the wire after the warm-up.
const A: usize = 0;
const B: usize = 1;
/// Packets of every message here (1 KiB MTU).
const PACKETS: u32 = 16;
const LEN: u32 = PACKETS * 1024;
/// The harness's `timeout` attribute, 10: 4.096 µs × 2^10.
const TIMEOUT: Duration = Duration::from_nanos(4096 << 10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Write,
    Send,
    Read,
}

/// A selective-repeat pair with the adaptive timer, warmed up by one small
/// WRITE so that the timer has measured the path.
fn pair() -> Pair {
    let config = TransportConfig { retransmission: Retransmission::ADAPTIVE, ..TransportConfig::default() };
    let options = PairOptions { mtu: Mtu::Mtu1024, config, selective_repeat: true, ..PairOptions::default() };
    let mut pair = Pair::new(options);
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    let payload = pair.a.gather(0, 64);
    pair.post(A, 0, SendOp::Write { remote, imm: None }, payload);
    let [a, _] = pair.settle();
    assert_eq!(a[0].status, WcStatus::Success);
    pair
}

/// Runs one 16-packet `op` from A with the datagrams `doomed` lost and
/// `late` held back; checks completions and bytes, and returns A's and
/// B's counters and how long it took.
fn run(op: Op, doomed: &[(usize, u64)], late: &[(usize, u64)]) -> (Counters, Counters, Duration) {
    let mut pair = pair();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    // The data starts where it is read from: A's buffer, or B's for a READ.
    let (source, sink) = if op == Op::Read { (&pair.b, &pair.a) } else { (&pair.a, &pair.b) };
    source.buffer.write(0, &data);
    let sink_buffer = sink.buffer.clone();
    let base = [pair.world.device(A).counters().tx_packets, pair.world.device(B).counters().tx_packets];
    pair.world.network.doomed = doomed.iter().map(|&(host, n)| (host, base[host] + n)).collect();
    pair.world.network.late = late.iter().map(|&(host, n)| (host, base[host] + n, Duration::from_nanos(150))).collect();
    let start = pair.world.now;
    match op {
        Op::Write => {
            let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
            let payload: Payload = pair.a.gather(0, LEN);
            pair.post(A, 1, SendOp::Write { remote, imm: Some(7) }, payload);
            pair.post_recv(B, 2, 0, 0);
        }
        Op::Send => {
            pair.post_recv(B, 2, 0, LEN);
            let payload: Payload = pair.a.gather(0, LEN);
            pair.post(A, 1, SendOp::Send { imm: None }, payload);
        }
        Op::Read => {
            let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
            let payload: Payload = pair.a.gather(0, LEN);
            pair.post(A, 1, SendOp::Read { remote }, payload);
        }
    }
    let done = pair.wait(A, 1);
    let took = pair.world.now - start;
    assert_eq!(done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::Success)], "{op:?}");
    let [_, b] = pair.settle();
    if op != Op::Read {
        let opcode = if op == Op::Write { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
        let got: Vec<_> = b.iter().map(|c| (c.wr_id, c.status, c.opcode, c.byte_len)).collect();
        assert_eq!(got, [(2, WcStatus::Success, opcode, LEN)], "{op:?}: one receive completion, once");
    }
    assert!(sink_buffer.to_vec()[..LEN as usize] == data[..], "{op:?}: every byte placed");
    assert_eq!((pair.state(A), pair.state(B)), (QpState::Rts, QpState::Rts));
    (pair.world.device(A).counters().clone(), pair.world.device(B).counters().clone(), took)
}

#[test]
fn a_lost_packet_anywhere_goes_again_alone() {
    for op in [Op::Write, Op::Send] {
        for lost in [0, 1, 7, 12] {
            let (a, b, took) = run(op, &[(A, lost)], &[]);
            assert_eq!(a.retransmitted_packets, 1, "{op:?}, packet {lost}: only the hole");
            assert_eq!(a.timeouts, 0, "{op:?}, packet {lost}");
            assert!((1..=2).contains(&a.selective_naks_received), "{op:?}, packet {lost}: {a:?}");
            assert_eq!(b.rx_placed_out_of_order, u64::from(PACKETS - 1) - lost, "{op:?}, packet {lost}");
            assert!(took < TIMEOUT / 10, "{op:?}, packet {lost}: {took:?}");
        }
    }
}

#[test]
fn a_lost_last_packet_costs_a_probe() {
    for op in [Op::Write, Op::Send] {
        let (a, _, took) = run(op, &[(A, u64::from(PACKETS - 1))], &[]);
        assert_eq!((a.tail_loss_probes, a.retransmitted_packets), (1, 1), "{op:?}");
        assert!(took < TIMEOUT / 10, "{op:?}: {took:?}");
    }
}

#[test]
fn several_holes_each_go_again_once() {
    for op in [Op::Write, Op::Send] {
        let (a, _, _) = run(op, &[(A, 2), (A, 5), (A, 9)], &[]);
        assert_eq!((a.retransmitted_packets, a.timeouts), (3, 0), "{op:?}");
    }
}

#[test]
fn reordering_without_loss_sends_nothing_again() {
    for op in [Op::Write, Op::Send] {
        // Packet 4 arrives after 5 (a packet takes about 90 ns): overtaken,
        // not lost.
        let (a, b, _) = run(op, &[], &[(A, 4)]);
        assert_eq!((a.retransmitted_packets, a.timeouts), (0, 0), "{op:?}");
        assert!(b.rx_placed_out_of_order >= 1, "{op:?}: the overtaking packets were placed");
    }
}

#[test]
fn a_lost_retransmission_or_selective_nak_is_covered_by_the_timer() {
    // Packet 3, then its repair (A's 17th datagram), are lost.
    let (a, _, took) = run(Op::Write, &[(A, 3), (A, 16)], &[]);
    assert!(a.timeouts >= 1 && a.retransmitted_packets >= 2, "{a:?}");
    assert!(took < TIMEOUT / 10, "{took:?}");
    // Packet 3 is lost and so is every selective NAK B sends about it.
    let naks: Vec<_> = (0..PACKETS as u64).map(|n| (B, n)).collect();
    let (a, _, took) = run(Op::Send, &[&[(A, 3)], &naks[..]].concat(), &[]);
    assert!(a.timeouts >= 1, "{a:?}");
    assert!(took < TIMEOUT / 10, "{took:?}");
}

#[test]
fn a_lost_read_response_is_asked_for_alone() {
    for lost in [0, 6, 15] {
        // B's first datagrams are the READ's 16 responses.
        let (a, b, took) = run(Op::Read, &[(B, lost)], &[]);
        assert_eq!(a.retransmitted_packets, 1, "response {lost}: one READ request for the hole");
        assert_eq!(b.rx_duplicate_requests, 1, "response {lost}");
        assert_eq!(b.tx_packets - 16, 1 + 1, "response {lost}: the warm-up's ACK, then the hole's one response: {b:?}");
        assert!(took < TIMEOUT / 10, "response {lost}: {took:?}");
    }
}

#[test]
fn a_lost_atomic_result_is_replayed_alone_and_the_rest_land() {
    let mut pair = pair();
    let base = [pair.world.device(A).counters().tx_packets, pair.world.device(B).counters().tx_packets];
    // B's answers: the ACK of the warm-up came first; these are the eight
    // ATOMIC results, and the second is lost.
    pair.world.network.doomed = vec![(B, base[B] + 1)];
    let remote = RemoteAddr { addr: IOVA + 0x100, rkey: pair.b.mr.rkey };
    for i in 0..8u64 {
        let result = pair.a.gather(0x200 + 8 * i, 8);
        pair.post(A, i, SendOp::FetchAdd { remote, add: 1 }, result);
    }
    let done = pair.wait(A, 8);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (0..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    // Each saw the counter before it: 0, 1, ..., 7, the lost one's from
    // the responder's replay, not a second execution.
    let results = pair.a.buffer.to_vec();
    let seen: Vec<u64> =
        (0..8).map(|i| u64::from_ne_bytes(results[0x200 + 8 * i..0x208 + 8 * i].try_into().unwrap())).collect();
    assert_eq!(seen, (0..8).collect::<Vec<u64>>());
    assert_eq!(u64::from_ne_bytes(pair.b.buffer.to_vec()[0x100..0x108].try_into().unwrap()), 8, "executed once each");
    let (a, b) = (pair.world.device(A).counters().clone(), pair.world.device(B).counters().clone());
    assert_eq!((a.retransmitted_packets, a.timeouts, b.rx_duplicate_requests), (1, 0, 1), "{a:?}");
}

#[test]
fn a_lost_repair_of_a_read_response_goes_again_without_waiting_for_the_timeout() {
    // Response 6 is lost, then its repair (B's 17th datagram): nothing
    // later shows the repair lost, so the repair timer, two of the path's
    // shortest round trips, sends it again.
    let (a, _, took) = run(Op::Read, &[(B, 6), (B, 16)], &[]);
    assert!((2..=3).contains(&a.retransmitted_packets), "{a:?}");
    assert!(took < TIMEOUT / 20, "{took:?}");
}

/// A READ asked for again while the responder's answer to it still waits
/// is answered once. Each repeat used to queue a stream of its own
/// beside the last: a paced responder's backlog then grew with every
/// timeout of the requester waiting behind it, until it outlasted the
/// requester's retries (seeds 100037 and 940176 of the switched
/// simulation, `simulation.rs`).
#[test]
fn a_read_asked_again_while_its_answer_waits_is_answered_once() {
    let mut pair = pair();
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    let payload = pair.a.gather(0, LEN);
    pair.post(A, 1, SendOp::Read { remote }, payload);
    assert_eq!(pair.wait(A, 1)[0].status, WcStatus::Success);
    pair.settle();
    // The warm-up WRITE took the first PSN, the READ the next 16.
    let first = first_psn(pair.a.qpn).add(1);
    let read = |k: u32| Headers {
        bth: bth::Repr::new(Opcode::RcReadRequest, pair.b.qpn, first.add(k)),
        ext: Extensions {
            reth: Some(reth::Repr {
                virtual_address: IOVA + u64::from(k) * 1024,
                rkey: remote.rkey,
                dma_length: LEN - k * 1024,
            }),
            ..Extensions::default()
        },
    };
    let (whole, tail) = (read(0), read(4));
    let sent = |pair: &mut Pair| pair.world.device(B).counters().tx_packets;
    let before = sent(&mut pair);
    // Before the responder sends anything: the whole READ again, then its
    // tail, then the whole again. The first stream answers all three.
    pair.inject(&whole, &[]);
    pair.inject(&tail, &[]);
    pair.inject(&whole, &[]);
    pair.settle();
    assert_eq!(pair.world.device(B).counters().rx_duplicate_requests, 3);
    assert_eq!(sent(&mut pair) - before, u64::from(PACKETS), "one stream of responses");
}

/// Seed 7011119: when the timer goes back to a READ, it asks only for the
/// responses still missing. Asked for whole, the responder (paced at
/// 68 Mb/s there) resent 442 responses that had arrived, one per half
/// millisecond, ahead of the ones that had not.
#[test]
fn a_read_gone_back_to_asks_only_for_its_holes() {
    // Responses 3 and 10 are lost, and so are A's repairs of them until
    // the timer has gone back to the READ more than once (A's first
    // datagram after the warm-up is the READ request itself).
    let repairs: Vec<_> = (1..=14).map(|n| (A, n)).collect();
    let (a, b, _) = run(Op::Read, &[&[(B, 3), (B, 10)], &repairs[..]].concat(), &[]);
    assert!(a.timeouts >= 2, "the timer went back: {a:?}");
    // B sent the 16 responses, the warm-up's ACK, and one response for
    // each hole: none of the 14 that had arrived (13 before this fix).
    assert_eq!(b.tx_packets - 17, 2, "{b:?}");
}

/// After an error completion a send queue reports flushes only, even for
/// a request whose acknowledgement came before the one ahead of it
/// failed: selective repeat takes acknowledgements out of order, but a
/// queue completes in order (simulator seed 636: a READ reported success
/// after the SEND ahead of it had failed).
#[test]
fn after_a_failed_request_the_ones_behind_it_flush_even_if_acknowledged() {
    let mut pair = pair();
    let base = pair.world.device(B).counters().tx_packets;
    // B answers READ 1 with datagrams 0 to 3 and READ 2 with datagram 4.
    // Response 0 of READ 1 is lost, and so is everything B sends after
    // READ 2's response: READ 1 runs out of retries, while READ 2's
    // answer has arrived.
    pair.world.network.doomed = std::iter::once(0).chain(5..400).map(|n| (B, base + n)).collect();
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    let payload = pair.a.gather(0, 4096);
    pair.post(A, 1, SendOp::Read { remote }, payload);
    let payload = pair.a.gather(8192, 64);
    pair.post(A, 2, SendOp::Read { remote }, payload);
    let done = pair.wait(A, 2);
    let statuses: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(statuses, [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(pair.state(A), QpState::Error);
}
