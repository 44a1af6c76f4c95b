//! Protection: every access with the wrong key, outside its region, without
//! the access right, misaligned, or too big for its receive gets the NAK
//! and the completion statuses the IBTA prescribes on both sides, and the
//! memory it aimed at is untouched.

use std::sync::Arc;

use proptest::prelude::*;
use softrnic_sim::harness::{IOVA, Pair, PairOptions, first_psn};
use softrnic_transport::{
    Access, Completion, DmaBuffer, Payload, QpAttr, QpState, RecvWorkRequest, Registration, RemoteAddr, SendOp, Sge,
    WcStatus,
};
use softrnic_wire::packet::{Extensions, Headers, SelectiveRepeatLayout};
use softrnic_wire::{Opcode, Psn, atomic_eth, bth, reth, sack, sreth};

const FILL: u8 = 0x5a;

/// A pair whose responder (host 1) has its region filled with [`FILL`].
fn pair_with(options: PairOptions) -> Pair {
    let pair = Pair::new(options);
    pair.b.buffer.fill(FILL);
    pair
}

fn pair() -> Pair {
    pair_with(PairOptions::default())
}

fn untouched(pair: &Pair, host: usize) -> bool {
    pair.side(host).buffer.to_vec().iter().all(|&b| b == FILL)
}

fn statuses(completions: &[Completion]) -> Vec<(u64, WcStatus)> {
    completions.iter().map(|c| (c.wr_id, c.status)).collect()
}

/// Posts one request from host 0 and a receive on host 1, runs to the end,
/// and checks the requester's status, the responder's QP state and that
/// the responder's memory is untouched.
fn expect_remote_failure(mut pair: Pair, op: SendOp, payload: Payload, status: WcStatus) -> Pair {
    pair.post_recv(1, 50, 0, 16);
    pair.post(0, 1, op, payload);
    pair.post(0, 2, SendOp::Send { imm: None }, Payload::Inline(b"after"[..].into()));
    let [a, b] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, status), (2, WcStatus::WrFlushErr)]);
    assert_eq!(statuses(&b), vec![(50, WcStatus::WrFlushErr)], "the responder's QP is in error and flushed");
    assert_eq!((pair.state(0), pair.state(1)), (QpState::Error, QpState::Error));
    assert!(untouched(&pair, 1), "the target memory changed");
    pair
}

fn remote(pair: &Pair, offset: u64) -> RemoteAddr {
    RemoteAddr { addr: IOVA + offset, rkey: pair.b.mr.rkey }
}

#[test]
fn write_with_a_wrong_rkey() {
    let pair = pair();
    let target = RemoteAddr { rkey: pair.b.mr.rkey ^ 0x100, ..remote(&pair, 0) };
    let pair = expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemAccessErr,
    );
    assert_eq!(pair.world.hosts[1].device.counters().fatal_naks_sent, 1);
}

#[test]
fn write_out_of_bounds() {
    let pair = pair();
    let end = pair.b.buffer.len() as u64;
    let target = remote(&pair, end - 4);
    expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemAccessErr,
    );
}

#[test]
fn write_below_the_region() {
    let pair = pair();
    let target = RemoteAddr { addr: IOVA - 4, rkey: pair.b.mr.rkey };
    expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemAccessErr,
    );
}

#[test]
fn read_out_of_bounds_leaves_the_local_buffer_alone() {
    let pair = pair();
    pair.a.buffer.fill(FILL);
    let end = pair.b.buffer.len() as u64;
    let payload = pair.a.gather(0, 64);
    let target = remote(&pair, end - 32);
    let pair = expect_remote_failure(pair, SendOp::Read { remote: target }, payload, WcStatus::RemAccessErr);
    assert!(untouched(&pair, 0));
}

/// A region on host 1 registered with only `access`, for the access tests.
fn region_with(pair: &mut Pair, access: Access) -> (Arc<DmaBuffer>, u32) {
    let buffer = Arc::new(DmaBuffer::new(4096));
    buffer.fill(FILL);
    let pd = pair.b.pd;
    let keys = pair
        .world
        .device(1)
        .register_memory(Registration { pd, buffer: buffer.clone(), offset: 0, len: 4096, iova: 0x9000_0000, access })
        .unwrap();
    (buffer, keys.rkey)
}

#[test]
fn each_remote_operation_needs_its_access_right() {
    type MakeOp = fn(RemoteAddr) -> SendOp;
    let cases: [(Access, MakeOp, &str); 3] = [
        (
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            |remote| SendOp::Write { remote, imm: None },
            "write",
        ),
        (Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC, |remote| SendOp::Read { remote }, "read"),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            |remote| SendOp::FetchAdd { remote, add: 1 },
            "atomic",
        ),
    ];
    for (access, make, name) in cases {
        let mut pair = pair();
        let (buffer, rkey) = region_with(&mut pair, access);
        let payload = pair.a.gather(0, 8);
        expect_remote_failure(pair, make(RemoteAddr { addr: 0x9000_0000, rkey }), payload, WcStatus::RemAccessErr);
        assert!(buffer.to_vec().iter().all(|&b| b == FILL), "{name} touched a region that forbids it");
    }
}

#[test]
fn a_region_without_remote_access_has_no_rkey() {
    let mut pair = pair();
    let (buffer, rkey) = region_with(&mut pair, Access::LOCAL_WRITE);
    let payload = pair.a.gather(0, 8);
    expect_remote_failure(
        pair,
        SendOp::Read { remote: RemoteAddr { addr: 0x9000_0000, rkey } },
        payload,
        WcStatus::RemAccessErr,
    );
    assert!(buffer.to_vec().iter().all(|&b| b == FILL));
}

#[test]
fn an_rkey_from_another_protection_domain_is_refused() {
    let mut pair = pair();
    let device = pair.world.device(1);
    let other_pd = device.alloc_pd();
    let buffer = Arc::new(DmaBuffer::new(64));
    buffer.fill(FILL);
    let keys = device
        .register_memory(Registration {
            pd: other_pd,
            buffer: buffer.clone(),
            offset: 0,
            len: 64,
            iova: 0x5000,
            access: Access::LOCAL_WRITE | Access::REMOTE,
        })
        .unwrap();
    let target = RemoteAddr { addr: 0x5000, rkey: keys.rkey };
    expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemAccessErr,
    );
    assert!(buffer.to_vec().iter().all(|&b| b == FILL));
}

#[test]
fn a_deregistered_region_is_gone() {
    let mut pair = pair();
    let lkey = pair.b.mr.lkey;
    pair.world.device(1).deregister_memory(lkey).unwrap();
    let target = remote(&pair, 0);
    expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemAccessErr,
    );
}

#[test]
fn a_qp_without_remote_write_rights_refuses_writes() {
    let mut pair = pair();
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    // Access flags may change in RTS.
    pair.world
        .device(1)
        .modify_qp(
            now,
            qpn,
            &QpAttr { state: Some(QpState::Rts), access: Some(Access::REMOTE_READ), ..QpAttr::default() },
        )
        .unwrap();
    let target = remote(&pair, 0);
    expect_remote_failure(
        pair,
        SendOp::Write { remote: target, imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn an_unaligned_atomic_is_an_invalid_request() {
    let pair = pair();
    let payload = pair.a.gather(0, 8);
    let target = remote(&pair, 12);
    expect_remote_failure(
        pair,
        SendOp::CompareSwap { remote: target, compare: 0, swap: 1 },
        payload,
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn a_send_larger_than_the_receive() {
    let mut pair = pair();
    pair.post_recv(1, 1, 0, 16);
    pair.post_recv(1, 2, 100, 16);
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(softrnic_transport::smallvec![7; 17]));
    let [a, b] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::RemInvReqErr)]);
    assert_eq!(statuses(&b), vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]);
    assert!(pair.b.buffer.to_vec()[16..].iter().all(|&b| b == FILL), "nothing past the receive buffer");
}

#[test]
fn a_receive_with_a_bad_lkey() {
    let mut pair = pair();
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    let bad = Sge { addr: IOVA, length: 64, lkey: 0xbad };
    pair.world
        .device(1)
        .post_recv(now, qpn, RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![bad] })
        .unwrap();
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(softrnic_transport::smallvec![7; 8]));
    let [a, b] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::RemOpErr)]);
    assert_eq!(statuses(&b), vec![(1, WcStatus::LocProtErr)]);
    assert!(untouched(&pair, 1));
}

#[test]
fn local_protection_errors_send_nothing() {
    // A gather list with a bad lkey, and a READ into memory without LOCAL_WRITE.
    let mut pair = pair();
    let bad = Payload::Gather(softrnic_transport::smallvec![Sge { addr: IOVA, length: 8, lkey: 0xbad }]);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 0), imm: None }, bad);
    let [a, _] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::LocProtErr)]);
    assert_eq!(pair.world.device(0).counters().tx_packets, 0);
    assert_eq!(pair.state(0), QpState::Error);

    let mut pair = pair_with(PairOptions { access: Access::REMOTE_READ, ..PairOptions::default() });
    let into_read_only = pair.a.gather(0, 8);
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 0) }, into_read_only);
    let [a, _] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::LocProtErr)]);
}

#[test]
fn rnr_with_no_receive_posted_and_no_retries() {
    let mut pair = pair_with(PairOptions { rnr_retry: 0, ..PairOptions::default() });
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(softrnic_transport::smallvec![1; 8]));
    let [a, _] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::RnrRetryExcErr)]);
    assert!(untouched(&pair, 1));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Correctly sealed packets with arbitrary opcodes, PSNs, keys and
    /// addresses never panic the device and never write outside the
    /// registered region, whatever they claim; on a selective-repeat
    /// connection too, whose SEND and WRITE packets say where they belong.
    #[test]
    fn hostile_packets_stay_inside_registered_memory(
        selective in any::<bool>(),
        claims in prop::collection::vec((0u32..70_000, 0u32..6), 40),
        packets in prop::collection::vec((
            prop::sample::select(Opcode::ALL.to_vec()), 0u32..64, any::<bool>(),
            prop_oneof![Just(0u64), 0u64..70_000, any::<u64>()], any::<bool>(), 0u32..5000,
            prop::collection::vec(any::<u8>(), 0..1100),
        ), 1..40),
    ) {
        let mut pair = Pair::new(PairOptions { selective_repeat: selective, ..PairOptions::default() });
        let guard = Arc::new(DmaBuffer::new(4096));
        guard.fill(FILL);
        // A second region without remote rights, which no packet may touch.
        let pd = pair.b.pd;
        pair.world.device(1).register_memory(Registration { pd, buffer: guard.clone(), offset: 0, len: 4096, iova: 0x9000_0000, access: Access::LOCAL_WRITE }).unwrap();
        let (qpn, rkey, epsn) = (pair.b.qpn, pair.b.mr.rkey, first_psn(pair.a.qpn));
        for ((opcode, psn_offset, right_key, va, relative, len, payload), (offset, receive_number)) in packets.into_iter().zip(claims) {
            let addr = if relative { IOVA.wrapping_add(va) } else { va };
            let key = if right_key { rkey } else { rkey ^ 0x300 };
            let layout = opcode.layout();
            let ext = Extensions {
                deth: layout.deth.then_some(softrnic_wire::deth::Repr { qkey: 0, src_qpn: 1 }),
                reth: layout.reth.then_some(reth::Repr { virtual_address: addr, rkey: key, dma_length: len }),
                atomic_eth: layout.atomic_eth.then_some(atomic_eth::Repr { virtual_address: addr, rkey: key, swap_or_add: 1, compare: 0 }),
                aeth: layout.aeth.then_some(softrnic_wire::aeth::Repr { syndrome: softrnic_wire::aeth::Syndrome::Ack { credit_code: 0 }, msn: 0 }),
                atomic_ack: layout.atomic_ack_eth.then_some(0),
                immediate: layout.immdt.then_some(0),
                invalidate_rkey: layout.ieth.then_some(key),
                sreth: None,
                sack: None,
            };
            let mut headers = Headers {
                bth: bth::Repr { ack_request: true, ..bth::Repr::new(opcode, qpn, epsn.add(psn_offset)) },
                ext,
            };
            let bth = bth::Repr { selective_repeat: true, ..headers.bth };
            if selective && let Ok(s) = SelectiveRepeatLayout::of(&bth) {
                headers.bth = bth;
                headers.ext.sreth = s.sreth.then_some(sreth::Repr { virtual_address: addr, rkey: key, message_length: len, offset, receive_number });
                headers.ext.sack = s.sack.then_some(sack::Repr { words: [u64::from(offset); 8] });
            }
            let payload: &[u8] = if layout.payload { &payload } else { &[] };
            pair.inject(&headers, payload);
            pair.world.flush();
        }
        prop_assert!(guard.to_vec().iter().all(|&b| b == FILL), "a region without remote rights changed");
    }
}

#[test]
fn requests_before_a_fatal_error_still_complete() {
    // The READ executes before the bad WRITE: its data still comes back,
    // then the NAK fails the WRITE.
    let mut pair = pair();
    pair.b.buffer.write(0, b"readable");
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 0) }, pair.a.gather(100, 8));
    let bad = RemoteAddr { rkey: pair.b.mr.rkey ^ 0x100, ..remote(&pair, 0) };
    pair.post(0, 2, SendOp::Write { remote: bad, imm: None }, Payload::Inline(softrnic_transport::smallvec![1; 8]));
    // Host 1 handles both requests before it sends anything.
    pair.world.flush();
    let (now, later) = (pair.world.now, pair.world.now + std::time::Duration::from_millis(1));
    while let Some(packet) = pair.world.network.pop_due(later) {
        pair.world.device(1).handle_datagram(now, packet.from, packet.meta, &packet.bytes);
    }
    let [a, _] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::Success), (2, WcStatus::RemAccessErr)]);
    assert_eq!(&pair.a.buffer.to_vec()[100..108], b"readable");
    assert_eq!((pair.state(0), pair.state(1)), (QpState::Error, QpState::Error));
}

/// A repeated READ is answered only within a READ the responder executed
/// and still keeps, as a NIC answers one from its responder resources: a
/// READ request forged with a PSN from the past half window, or asking
/// more, other bytes, other PSNs or another key than the original, gets
/// no response at all (before, the first was answered with the whole
/// region, 64 packets, and a region of a gigabyte would have been sent
/// whole); a true repeat of the original's second half still gets it.
#[test]
fn a_repeated_read_is_held_to_the_original() {
    let mut pair = pair();
    let (_, other_rkey) = region_with(&mut pair, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let payload = pair.a.gather(0, 2048);
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 0) }, payload);
    let [a, _] = pair.settle();
    assert_eq!(statuses(&a), vec![(1, WcStatus::Success)], "two response packets at MTU 1024");
    let (first, rkey, qpn) = (first_psn(pair.a.qpn), pair.b.mr.rkey, pair.b.qpn);
    let read = |psn: Psn, virtual_address: u64, dma_length: u32, rkey: u32| Headers {
        bth: bth::Repr::new(Opcode::RcReadRequest, qpn, psn),
        ext: Extensions { reth: Some(reth::Repr { virtual_address, rkey, dma_length }), ..Extensions::default() },
    };
    let sent = |pair: &mut Pair| pair.world.device(1).counters().tx_packets;
    let forged = [
        ("a PSN of the past half window", read(first.sub(100_000), IOVA, 64 * 1024, rkey)),
        ("more than the original", read(first, IOVA, 4096, rkey)),
        ("other bytes", read(first, IOVA + 4096, 1024, rkey)),
        ("another region's key", read(first, 0x9000_0000, 2048, other_rkey)),
        ("PSNs past the original", read(first.add(1), IOVA + 1024, 2048, rkey)),
    ];
    for (what, headers) in forged {
        let (before, malformed) = (sent(&mut pair), pair.world.device(1).counters().rx_malformed);
        pair.inject(&headers, &[]);
        pair.world.flush();
        assert_eq!(sent(&mut pair), before, "{what}: answered");
        assert_eq!(pair.world.device(1).counters().rx_malformed, malformed + 1, "{what}: not counted");
    }
    let before = sent(&mut pair);
    pair.inject(&read(first.add(1), IOVA + 1024, 1024, rkey), &[]);
    pair.world.flush();
    assert_eq!(sent(&mut pair), before + 1, "a true repeat of the second packet is answered");
    assert_eq!(pair.state(1), QpState::Rts, "no request above was a fatal error");
}

/// Only the connected peer may slow a QP down with a CNP: one from any
/// other address (who need only guess the QP's number) is dropped and
/// counted; the peer's is taken.
#[test]
fn a_cnp_from_anyone_but_the_peer_is_dropped() {
    let mut pair = pair();
    let cnp = softrnic_wire::cnp::headers(pair.b.qpn, 0xffff);
    let counters = |pair: &mut Pair| {
        let c = pair.world.device(1).counters();
        (c.rx_cnps, c.rx_dropped_foreign)
    };
    let before = counters(&mut pair);
    pair.inject_from("127.0.0.99:4791".parse().unwrap(), &cnp, &[]);
    assert_eq!(counters(&mut pair), (before.0, before.1 + 1), "a stranger's CNP");
    let peer = pair.world.hosts[0].addr;
    pair.inject_from(peer, &cnp, &[]);
    assert_eq!(counters(&mut pair), (before.0 + 1, before.1 + 1), "the peer's CNP");
}
