//! Unreliable connected QPs: SENDs and WRITEs with nothing acknowledged,
//! and each way a message is lost dropping it whole, never a part of it
//! delivered, never one twice, the QP going on.

use softrnic_sim::Faults;
use softrnic_sim::harness::{IOVA, Pair, PairOptions};
use softrnic_transport::{
    MAX_DATAGRAM_LEN, Mtu, Payload, QpState, QpType, RecvMeta, RemoteAddr, SendOp, VerbsError, WcOpcode, WcStatus,
};

fn uc(options: PairOptions) -> Pair {
    Pair::new(PairOptions { qp_type: QpType::Uc, ..options })
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(salt)).collect()
}

fn bytes(pair: &Pair, host: usize, offset: usize, len: usize) -> Vec<u8> {
    pair.side(host).buffer.to_vec()[offset..offset + len].to_vec()
}

/// The packets host 0 has to send now, in order.
fn burst(pair: &mut Pair) -> Vec<Vec<u8>> {
    let now = pair.world.now;
    let mut buf = vec![0; MAX_DATAGRAM_LEN];
    let mut out = Vec::new();
    while let Some(t) = pair.world.device(0).poll_transmit(now, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    out
}

fn deliver(pair: &mut Pair, datagrams: &[Vec<u8>]) {
    let (now, from) = (pair.world.now, pair.world.hosts[0].addr);
    for datagram in datagrams {
        pair.world.device(1).handle_datagram(now, from, RecvMeta::default(), datagram);
    }
}

#[test]
fn sends_and_writes_arrive_and_nothing_answers() {
    let mut pair = uc(PairOptions::default());
    let (message, written) = (pattern(3000, 1), pattern(2500, 2));
    pair.a.buffer.write(0, &message);
    pair.a.buffer.write(8192, &written);
    pair.post_recv(1, 70, 0, 4096);
    pair.post_recv(1, 71, 4096, 64);
    pair.post(0, 1, SendOp::Send { imm: Some(7) }, pair.a.gather(0, 3000));
    let target = RemoteAddr { addr: IOVA + 16384, rkey: pair.b.mr.rkey };
    pair.post(0, 2, SendOp::Write { remote: target, imm: Some(8) }, pair.a.gather(8192, 2500));
    let [a, b] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm_data)).collect::<Vec<_>>(),
        [(70, WcOpcode::Recv, 3000, Some(7)), (71, WcOpcode::RecvRdmaWithImm, 2500, Some(8))]
    );
    assert_eq!((bytes(&pair, 1, 0, 3000), bytes(&pair, 1, 16384, 2500)), (message, written));
    assert_eq!(pair.world.device(1).counters().tx_packets, 0, "a UC responder sends nothing");
    assert_eq!(pair.world.device(0).counters().tx_packets, 6, "three packets each, sent once");
}

#[test]
fn a_lost_packet_drops_its_message_whole_and_its_receive_takes_the_next() {
    let mut pair = uc(PairOptions::default());
    pair.a.buffer.write(0, &pattern(3000, 3));
    pair.a.buffer.write(4096, &pattern(100, 4));
    pair.post_recv(1, 70, 0, 4096);
    pair.post_recv(1, 71, 4096, 4096);
    pair.post(0, 1, SendOp::Send { imm: None }, pair.a.gather(0, 3000));
    pair.post(0, 2, SendOp::Send { imm: None }, pair.a.gather(4096, 100));
    let packets = burst(&mut pair);
    assert_eq!(packets.len(), 4);
    // The lost middle packet: the first message never completes, and its
    // receive holds the second.
    deliver(&mut pair, &[packets[0].clone(), packets[2].clone(), packets[3].clone()]);
    let [a, b] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), [(70, 100)]);
    assert_eq!(bytes(&pair, 1, 0, 100), pattern(100, 4));
    let counters = pair.world.device(1).counters();
    assert_eq!((counters.uc_messages_dropped, counters.rx_out_of_sequence), (1, 1));
    // A duplicate of the delivered message changes nothing.
    deliver(&mut pair, &[packets[3].clone()]);
    let [_, b] = pair.settle();
    assert!(b.is_empty(), "{b:?}");
    assert_eq!(pair.world.device(1).counters().rx_duplicate_requests, 1);
    // The QP goes on, and receive 71 takes the next message.
    pair.post(0, 3, SendOp::Send { imm: None }, Payload::Inline(b"later"[..].into()));
    let [_, b] = pair.settle();
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), [(71, 5)]);
}

#[test]
fn a_message_with_nowhere_to_go_is_dropped_without_a_word() {
    let mut pair = uc(PairOptions { access: softrnic_transport::Access::LOCAL_WRITE, ..PairOptions::default() });
    // No receive posted.
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"nobody listens"[..].into()));
    // A WRITE the responder's QP does not allow, then one under a key
    // that is no key.
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    pair.post(0, 2, SendOp::Write { remote, imm: None }, Payload::Inline([1u8; 8][..].into()));
    let [a, b] = pair.settle();
    assert!(a.iter().all(|c| c.status == WcStatus::Success), "{a:?}");
    assert!(b.is_empty(), "{b:?}");
    let counters = pair.world.device(1).counters();
    assert_eq!((counters.uc_messages_dropped, counters.rx_no_receive_posted, counters.tx_packets), (2, 1, 0));
    assert_eq!(bytes(&pair, 1, 0, 8), [0; 8], "the refused WRITE wrote nothing");
    // A SEND longer than its receive completes it with an error, and the
    // QP goes on.
    pair.post_recv(1, 70, 0, 16);
    pair.post_recv(1, 71, 64, 64);
    pair.post(0, 3, SendOp::Send { imm: None }, Payload::Inline([5u8; 40][..].into()));
    pair.post(0, 4, SendOp::Send { imm: None }, Payload::Inline([6u8; 40][..].into()));
    let [_, b] = pair.settle();
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(70, WcStatus::LocLenErr), (71, WcStatus::Success)]
    );
    assert_eq!(pair.state(1), QpState::Rts);
}

#[test]
fn a_write_with_immediate_refused_leaves_its_receive_to_the_next_message() {
    let mut pair = uc(PairOptions::default());
    pair.post_recv(1, 80, 0, 64);
    // Taken before any byte is written, and given back when the key is
    // no key: the WRITE is dropped whole, its receive not completed.
    let bad = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey ^ 0x100 };
    pair.post(0, 1, SendOp::Write { remote: bad, imm: Some(3) }, Payload::Inline([1u8; 8][..].into()));
    // A plain WRITE refused after it leaves the spare where it is.
    pair.post(0, 2, SendOp::Write { remote: bad, imm: None }, Payload::Inline([2u8; 8][..].into()));
    let [_, b] = pair.settle();
    assert!(b.is_empty(), "{b:?}");
    assert_eq!(pair.world.device(1).counters().uc_messages_dropped, 2);
    pair.post(0, 3, SendOp::Send { imm: None }, Payload::Inline(b"next"[..].into()));
    let [_, b] = pair.settle();
    assert_eq!(b.iter().map(|c| (c.wr_id, c.opcode, c.byte_len)).collect::<Vec<_>>(), [(80, WcOpcode::Recv, 4)]);
    assert_eq!(bytes(&pair, 1, 0, 4), b"next");
}

#[test]
fn reads_and_atomics_need_rc() {
    let mut pair = uc(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let remote = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey };
    for op in [SendOp::Read { remote }, SendOp::FetchAdd { remote, add: 1 }] {
        let wr = softrnic_transport::SendWorkRequest::new(1, op, pair.a.gather(0, 8));
        let refused = pair.world.device(0).post_send(now, qpn, wr);
        assert!(matches!(refused, Err(VerbsError::NotSupported(_))), "{refused:?}");
    }
}

/// On a network that loses, duplicates, reorders and corrupts, every
/// message arrives whole and once, or not at all, in the order sent.
#[test]
fn over_a_hostile_network_messages_arrive_whole_once_or_not_at_all() {
    let (mut arrived, mut dropped_in_all) = (0, 0);
    for seed in 1..=20u64 {
        let faults = Faults { loss: 0.05, reorder: 0.05, duplicate: 0.05, corrupt: 0.02, ..Faults::NONE };
        let mut pair = uc(PairOptions { faults, seed, mtu: Mtu::Mtu256, ..PairOptions::default() });
        const MESSAGES: usize = 60;
        const SLOT: usize = 1024;
        for m in 0..MESSAGES {
            pair.post_recv(1, 1000 + m as u64, (m * SLOT) as u64, SLOT as u32);
        }
        let len = |m: usize| 1 + (m * 37) % 1000;
        for m in 0..MESSAGES {
            // Many-packet messages too: the MTU is 256 here.
            pair.a.buffer.write(m * SLOT, &pattern(len(m), m as u8));
            pair.post(
                0,
                m as u64,
                SendOp::Send { imm: Some(m as u32) },
                pair.a.gather((m * SLOT) as u64, len(m) as u32),
            );
        }
        let [a, b] = pair.settle();
        assert_eq!(a.len(), MESSAGES, "seed {seed}: every request completes at the requester");
        assert!(a.iter().all(|c| c.status == WcStatus::Success));
        let mut last = None;
        for (k, c) in b.iter().enumerate() {
            assert_eq!(c.status, WcStatus::Success, "seed {seed}: {c:?}");
            let m = c.imm_data.expect("each message names itself") as usize;
            assert!(last < Some(m), "seed {seed}: message {m} after {last:?}");
            last = Some(m);
            // Receives are taken in order: the k-th completion's buffer.
            assert_eq!(c.wr_id, 1000 + k as u64, "seed {seed}");
            assert_eq!(c.byte_len as usize, len(m), "seed {seed}: message {m}");
            assert_eq!(bytes(&pair, 1, k * SLOT, len(m)), pattern(len(m), m as u8), "seed {seed}: message {m}");
        }
        let dropped = pair.world.device(1).counters().uc_messages_dropped as usize;
        assert!(b.len() + dropped <= MESSAGES, "seed {seed}: {} arrived, {dropped} dropped", b.len());
        assert!(!b.is_empty(), "seed {seed}: nothing arrived");
        (arrived, dropped_in_all) = (arrived + b.len(), dropped_in_all + dropped);
    }
    // The faults bit, and most messages still arrived.
    assert!(dropped_in_all > 0 && arrived > 20 * 60 / 2, "{arrived} arrived, {dropped_in_all} dropped");
}
