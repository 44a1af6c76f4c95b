//! Every operation on a perfect network, checked byte for byte; then each
//! recovery path driven on purpose: RNR, retransmission, a peer that dies.

use std::sync::{Arc, Mutex};

use softrnic_sim::Faults;
use softrnic_sim::harness::{IOVA, Pair, PairOptions, QKEY, connect_rc, first_psn};
use softrnic_transport::{
    Egress, HOLD_FOR, MAX_DATAGRAM_LEN, Payload, Posted, Psn, QpAttr, QpState, QpType, ReceivesWanted, RecvMeta,
    RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, UdDestination, WcOpcode, WcStatus,
};

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

fn remote(pair: &Pair, host: usize, offset: u64) -> RemoteAddr {
    RemoteAddr { addr: IOVA + offset, rkey: pair.side(host).mr.rkey }
}

fn bytes(pair: &Pair, host: usize, offset: usize, len: usize) -> Vec<u8> {
    pair.side(host).buffer.to_vec()[offset..offset + len].to_vec()
}

#[test]
fn send_lands_in_the_posted_receive() {
    let mut pair = Pair::new(PairOptions::default());
    let data = pattern(3000, 7);
    pair.a.buffer.write(0, &data);
    pair.post_recv(1, 77, 8192, 4096);
    pair.post(0, 1, SendOp::Send { imm: Some(0xabcd) }, pair.a.gather(0, 3000));
    let sent = pair.wait(0, 1);
    let received = pair.wait(1, 1);
    assert_eq!((sent[0].wr_id, sent[0].status, sent[0].opcode), (1, WcStatus::Success, WcOpcode::Send));
    assert_eq!(sent[0].byte_len, 3000);
    assert_eq!((received[0].wr_id, received[0].status, received[0].opcode), (77, WcStatus::Success, WcOpcode::Recv));
    assert_eq!(received[0].byte_len, 3000);
    assert_eq!(received[0].imm_data, Some(0xabcd));
    assert_eq!(bytes(&pair, 1, 8192, 3000), data);
    assert_eq!(bytes(&pair, 1, 8192 + 3000, 16), vec![0; 16], "bytes past the message are untouched");
}

/// A datagram that leaves on a same-host path carries no ICRC: delivered
/// as such (as a ring delivers it) it lands; the same bytes claiming to
/// have crossed UDP fail the check, as a forgery or a corruption would.
#[test]
fn a_same_host_datagram_carries_no_icrc_and_is_checked_for_none() {
    let mut pair = Pair::new(PairOptions::default());
    let data = pattern(2000, 9);
    pair.a.buffer.write(0, &data);
    pair.post_recv(1, 78, 8192, 4096);
    pair.post(0, 2, SendOp::Send { imm: None }, pair.a.gather(0, 2000));
    let (now, from) = (pair.world.now, pair.world.hosts[0].addr);
    let mut buf = vec![0; MAX_DATAGRAM_LEN];
    let t = pair
        .world
        .device(0)
        .poll_transmit_from(now, &mut buf, &mut |_| Egress::SameHost { references: false })
        .expect("the SEND");
    let datagram = buf[..t.len].to_vec();
    assert_eq!(datagram[t.len - 4..], [0; 4], "no ICRC computed");
    let receiver = pair.world.device(1);
    receiver.handle_datagram(now, from, RecvMeta::default(), &datagram);
    assert_eq!(receiver.counters().rx_icrc_errors, 1, "over UDP it would fail its check");
    receiver.handle_datagram(now, from, RecvMeta { same_host: true, ..RecvMeta::default() }, &datagram);
    assert_eq!(receiver.counters().rx_icrc_errors, 1);
    let received = pair.wait(1, 1);
    assert_eq!((received[0].wr_id, received[0].status, received[0].byte_len), (78, WcStatus::Success, 2000));
    assert_eq!(bytes(&pair, 1, 8192, 2000), data);
}

#[test]
fn send_gathers_and_scatters_across_sges_and_inline_data() {
    let mut pair = Pair::new(PairOptions::default());
    pair.a.buffer.write(0, b"hello, ");
    pair.a.buffer.write(100, b"world");
    let sges = vec![pair.a.sge(0, 7), pair.a.sge(100, 5)];
    let recv =
        RecvWorkRequest { wr_id: 5, sges: softrnic_transport::smallvec![pair.b.sge(1000, 4), pair.b.sge(2000, 20)] };
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    pair.world.device(1).post_recv(now, qpn, recv).unwrap();
    pair.post_recv(1, 6, 3000, 64);
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Gather(sges.into()));
    pair.post(0, 2, SendOp::Send { imm: None }, Payload::Inline(b"inline!"[..].into()));
    let [a, b] = pair.settle();
    assert_eq!(a.len(), 2);
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), vec![(5, 12), (6, 7)]);
    assert_eq!(bytes(&pair, 1, 1000, 4), b"hell");
    assert_eq!(bytes(&pair, 1, 2000, 8), b"o, world");
    assert_eq!(bytes(&pair, 1, 3000, 7), b"inline!");
}

#[test]
fn rdma_write_with_and_without_immediate() {
    let mut pair = Pair::new(PairOptions::default());
    let data = pattern(5000, 3);
    pair.a.buffer.write(0, &data);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 10_000), imm: None }, pair.a.gather(0, 5000));
    pair.post_recv(1, 9, 0, 0);
    pair.post(0, 2, SendOp::Write { remote: remote(&pair, 1, 20_000), imm: Some(42) }, pair.a.gather(0, 100));
    let [a, b] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect::<Vec<_>>(),
        vec![(1, WcOpcode::RdmaWrite, WcStatus::Success), (2, WcOpcode::RdmaWrite, WcStatus::Success)]
    );
    assert_eq!(b.len(), 1, "only the write with immediate consumes a receive");
    assert_eq!((b[0].wr_id, b[0].opcode, b[0].byte_len, b[0].imm_data), (9, WcOpcode::RecvRdmaWithImm, 100, Some(42)));
    assert_eq!(bytes(&pair, 1, 10_000, 5000), data);
    assert_eq!(bytes(&pair, 1, 20_000, 100), data[..100]);
}

#[test]
fn rdma_read_of_many_packets() {
    let mut pair = Pair::new(PairOptions::default());
    let data = pattern(10_000, 9);
    pair.b.buffer.write(30_000, &data);
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 1, 30_000) }, pair.a.gather(500, 10_000));
    let [a, b] = pair.settle();
    assert_eq!((a[0].status, a[0].opcode, a[0].byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 10_000));
    assert!(b.is_empty(), "a READ completes nothing at the responder");
    assert_eq!(bytes(&pair, 0, 500, 10_000), data);
}

#[test]
fn atomics_compare_swap_and_fetch_add() {
    let mut pair = Pair::new(PairOptions::default());
    pair.b.buffer.write(64, &100u64.to_ne_bytes());
    let target = remote(&pair, 1, 64);
    pair.post(0, 1, SendOp::FetchAdd { remote: target, add: 5 }, pair.a.gather(0, 8));
    pair.post(0, 2, SendOp::CompareSwap { remote: target, compare: 105, swap: 7 }, pair.a.gather(8, 8));
    pair.post(0, 3, SendOp::CompareSwap { remote: target, compare: 105, swap: 9 }, pair.a.gather(16, 8));
    let [a, _] = pair.settle();
    assert!(a.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        a.iter().map(|c| c.opcode).collect::<Vec<_>>(),
        vec![WcOpcode::FetchAdd, WcOpcode::CompSwap, WcOpcode::CompSwap]
    );
    let word = |pair: &Pair, host, at| u64::from_ne_bytes(bytes(pair, host, at, 8).try_into().unwrap());
    assert_eq!(word(&pair, 0, 0), 100, "fetch-and-add returns the old value");
    assert_eq!(word(&pair, 0, 8), 105, "the swap saw the sum");
    assert_eq!(word(&pair, 0, 16), 7, "the second swap failed and returned the current value");
    assert_eq!(word(&pair, 1, 64), 7);
}

#[test]
fn zero_length_operations_complete() {
    let mut pair = Pair::new(PairOptions::default());
    pair.post_recv(1, 1, 0, 0);
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Gather(softrnic_transport::smallvec![]));
    pair.post(
        0,
        2,
        SendOp::Write { remote: RemoteAddr { addr: 0, rkey: 0xdead }, imm: None },
        Payload::Gather(softrnic_transport::smallvec![]),
    );
    pair.post(
        0,
        3,
        SendOp::Read { remote: RemoteAddr { addr: 0, rkey: 0xdead } },
        Payload::Gather(softrnic_transport::smallvec![]),
    );
    let [a, b] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!((b[0].byte_len, b[0].status), (0, WcStatus::Success));
}

/// A SEND with invalidate (here from some other RNIC, on the wire) that
/// names a region's rkey names nothing the responder can invalidate (only
/// a type 2 window's key can be): the IBTA's class J error, the receive
/// completing with `RemInvReqErr` rather than claiming an invalidation it
/// never did. (`memory_windows.rs` has the keys that can.)
#[test]
fn send_with_invalidate_of_a_region_key_is_an_invalid_request() {
    use softrnic_wire::icrc::UdpFlow;
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, ROCEV2_UDP_PORT, bth};

    let mut pair = Pair::new(PairOptions::default());
    pair.post_recv(1, 1, 0, 64);
    let headers = Headers {
        bth: bth::Repr::new(Opcode::RcSendOnlyInv, pair.b.qpn, first_psn(pair.a.qpn)),
        ext: Extensions { invalidate_rkey: Some(pair.b.mr.rkey), ..Extensions::default() },
    };
    let mut buf = [0u8; 64];
    let len = headers.emit_packet(&mut buf, b"x").unwrap();
    let from = pair.world.hosts[0].addr;
    let to = pair.world.ip(1);
    UdpFlow { src: from.ip(), dst: to, src_port: ROCEV2_UDP_PORT, dst_port: ROCEV2_UDP_PORT }
        .seal(&mut buf[..len])
        .unwrap();
    let now = pair.world.now;
    pair.world.device(1).handle_datagram(now, from, Default::default(), &buf[..len]);
    let [_, b] = pair.settle();
    assert_eq!(pair.state(1), QpState::Error);
    assert_eq!(b.iter().map(|c| c.status).collect::<Vec<_>>(), vec![WcStatus::RemInvReqErr]);
    assert_eq!(pair.world.device(1).counters().fatal_naks_sent, 1);
}

/// A QP connected to itself (softrnicd's copy engine is one): its
/// requests reach its own responder inside the device, never the wire,
/// and a request from the wire for it, though from the device's own
/// address and with the PSN it expects, is dropped: anyone on the host can
/// send from that address. Before, the copy engine's QP answered any
/// request that named it.
#[test]
fn a_qp_connected_to_itself_never_touches_the_wire() {
    use softrnic_wire::icrc::UdpFlow;
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, ROCEV2_UDP_PORT, bth, reth};

    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn, psn) = (pair.world.now, pair.a.qpn, Psn::new(77));
    let device = pair.world.device(0);
    device.modify_qp(now, qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    softrnic_sim::harness::connect_rc_to(&mut pair.world, 0, qpn, 0, qpn, psn, softrnic_transport::Mtu::Mtu1024);
    let data = pattern(5000, 3);
    pair.a.buffer.write(0, &data);
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 0, 0) }, pair.a.gather(8192, 5000));
    let [a, _] = pair.settle();
    assert_eq!(a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(1, WcStatus::Success)]);
    assert_eq!(bytes(&pair, 0, 8192, 5000), data);
    let counters = pair.world.device(0).counters();
    assert_eq!((counters.tx_packets, counters.rx_packets), (0, 0), "nothing crossed the wire");

    // The READ took PSNs 77 to 81: the responder expects 82 next.
    let headers = Headers {
        bth: bth::Repr::new(Opcode::RcWriteOnly, qpn, Psn::new(82)),
        ext: Extensions {
            reth: Some(reth::Repr { virtual_address: IOVA, rkey: pair.a.mr.rkey, dma_length: 4 }),
            ..Extensions::default()
        },
    };
    let mut buf = [0u8; 128];
    let len = headers.emit_packet(&mut buf, b"evil").unwrap();
    let from = std::net::SocketAddr::new(pair.world.ip(0), ROCEV2_UDP_PORT);
    UdpFlow { src: from.ip(), dst: from.ip(), src_port: ROCEV2_UDP_PORT, dst_port: ROCEV2_UDP_PORT }
        .seal(&mut buf[..len])
        .unwrap();
    let now = pair.world.now;
    pair.world.device(0).handle_datagram(now, from, Default::default(), &buf[..len]);
    pair.settle();
    assert_eq!(pair.world.device(0).counters().rx_dropped_foreign, 1);
    assert_eq!(bytes(&pair, 0, 0, 4), data[..4], "nothing written");
}

/// A WRITE forged from the peer's address, with the QP number and the
/// very PSN the responder expects next: accepted by a plain RoCE
/// connection, as by any RNIC; dropped and counted by one that
/// authenticates its packets, whose own traffic carries on.
#[test]
fn an_authenticated_connection_drops_what_its_key_did_not_seal() {
    use softrnic_wire::icrc::UdpFlow;
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, ROCEV2_UDP_PORT, bth, reth};

    let key = softrnic_transport::AuthKey::from_secret("the secret both hosts of the test share").unwrap();
    for authenticate in [false, true] {
        let config = softrnic_transport::TransportConfig { auth_key: Some(key), ..Default::default() };
        let mut pair = Pair::new(PairOptions { config, authenticate, ..PairOptions::default() });
        let data = pattern(3000, 5);
        pair.a.buffer.write(0, &data);
        pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, 3000));
        let [a, _] = pair.settle();
        assert_eq!(a[0].status, WcStatus::Success, "authenticate {authenticate}");
        assert_eq!(bytes(&pair, 1, 0, 3000), data);
        // The WRITE took three PSNs from the first.
        let next = Psn::new(first_psn(pair.a.qpn).value() + 3);
        let headers = Headers {
            bth: bth::Repr::new(Opcode::RcWriteOnly, pair.b.qpn, next),
            ext: Extensions {
                reth: Some(reth::Repr { virtual_address: IOVA, rkey: pair.b.mr.rkey, dma_length: 4 }),
                ..Extensions::default()
            },
        };
        let mut buf = [0u8; 128];
        let len = headers.emit_packet(&mut buf, b"evil").unwrap();
        let from = pair.world.hosts[0].addr;
        UdpFlow { src: from.ip(), dst: pair.world.ip(1), src_port: ROCEV2_UDP_PORT, dst_port: ROCEV2_UDP_PORT }
            .seal(&mut buf[..len])
            .unwrap();
        let now = pair.world.now;
        pair.world.device(1).handle_datagram(now, from, Default::default(), &buf[..len]);
        pair.settle();
        let written = bytes(&pair, 1, 0, 4) == b"evil";
        assert_eq!(written, !authenticate, "authenticate {authenticate}: the forgery took");
        assert_eq!(pair.world.device(1).counters().rx_auth_failures, u64::from(authenticate));
        // The connection's own traffic goes on.
        pair.post(0, 2, SendOp::Write { remote: remote(&pair, 1, 100), imm: None }, pair.a.gather(0, 64));
        let [a, _] = pair.settle();
        let status = a.iter().find(|c| c.wr_id == 2).map(|c| c.status);
        if authenticate {
            assert_eq!(status, Some(WcStatus::Success));
        }
    }
}

/// Both ends must hold the secret: a QP told to authenticate without it
/// is refused, saying what to set.
#[test]
fn authentication_without_the_secret_is_refused() {
    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let device = pair.world.device(0);
    device.modify_qp(now, qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    let init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(softrnic_transport::Access::REMOTE),
        authenticate: Some(true),
        ..QpAttr::default()
    };
    let refused = device.modify_qp(now, qpn, &init).unwrap_err().to_string();
    assert!(refused.contains("SOFTRNIC_AUTH_KEY"), "{refused}");
}

#[test]
fn unsignalled_requests_complete_silently_in_order() {
    let mut pair = Pair::new(PairOptions::default());
    for id in 0..5 {
        let mut wr = SendWorkRequest::new(
            id,
            SendOp::Write { remote: remote(&pair, 1, id * 8), imm: None },
            Payload::Inline(softrnic_transport::smallvec![id as u8; 8]),
        );
        wr.signaled = id == 4;
        pair.post_wr(0, wr);
    }
    let [a, _] = pair.settle();
    assert_eq!(a.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![4]);
    assert_eq!(bytes(&pair, 1, 0, 40), (0..5u8).flat_map(|i| [i; 8]).collect::<Vec<_>>());
    let qpn = pair.a.qpn;
    assert_eq!(pair.world.device(0).qp(qpn).unwrap().send_queue_len(), 0);
}

#[test]
fn receiver_not_ready_is_retried_until_a_receive_is_posted() {
    let mut pair = Pair::new(PairOptions { min_rnr_timer: 1, ..PairOptions::default() });
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"early"[..].into()));
    // Let the sender meet a few RNR NAKs before the receive appears.
    for _ in 0..20 {
        pair.world.step();
    }
    assert!(pair.world.device(1).counters().rnr_naks_sent > 0);
    pair.post_recv(1, 2, 0, 64);
    let [a, b] = pair.settle();
    assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::Success));
    assert_eq!((b[0].wr_id, b[0].byte_len), (2, 5));
    assert_eq!(bytes(&pair, 1, 0, 5), b"early");
}

/// A NAK repeated for a request that has failed already names nothing new
/// (seeds 20007370 and 20009246). A SEND spends its RNR retries while the
/// READ ahead of it waits for its lost response; the RNR NAK comes again.
/// The READ is not blamed for it: it finishes, then the SEND reports its
/// error, and nothing else fails.
#[test]
fn a_repeated_rnr_nak_blames_no_other_request() {
    use softrnic_wire::aeth::{self, Syndrome};
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, bth};

    // An SRQ counts no credits, so the SEND goes beside the READ.
    let mut pair = Pair::new(PairOptions { rnr_retry: 0, srq: true, ..PairOptions::default() });
    let sq_psn = first_psn(pair.a.qpn);
    pair.post(0, 0, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, Payload::Inline([1u8; 8][..].into()));
    pair.settle();
    let base = pair.world.device(1).counters().tx_packets;
    pair.world.network.doomed = vec![(1, base)];
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 1, 0) }, pair.a.gather(0, 8));
    pair.post(0, 2, SendOp::Send { imm: None }, Payload::Inline(b"no receive"[..].into()));
    while pair.world.device(0).counters().rnr_naks_received == 0 {
        assert!(pair.world.step(), "the RNR NAK came");
    }
    let nak = Headers {
        bth: bth::Repr::new(Opcode::RcAck, pair.a.qpn, sq_psn.add(2)),
        ext: Extensions {
            aeth: Some(aeth::Repr { syndrome: Syndrome::RnrNak { timer: 1 }, msn: 1 }),
            ..Extensions::default()
        },
    };
    pair.inject_into(0, &nak, &[]);
    assert_eq!(pair.world.device(0).counters().rnr_naks_received, 2);
    let [a, _] = pair.settle();
    let statuses: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(statuses, [(1, WcStatus::Success), (2, WcStatus::RnrRetryExcErr)]);
    assert_eq!(pair.state(0), QpState::Error);
}

/// Receives the program wrote where the engine does not look (softrnicd's
/// shared rings), handed over only when the QP asks for them.
fn unfetched_receives(
    pair: &mut Pair,
    host: usize,
    receives: Vec<RecvWorkRequest>,
) -> Arc<Mutex<Vec<RecvWorkRequest>>> {
    let ring = Arc::new(Mutex::new(receives));
    let qpn = pair.side(host).qpn;
    let posts = pair.world.hosts[host].device.qp(qpn).unwrap().post_queues().clone();
    posts.fetch_on_demand();
    let written = ring.clone();
    pair.world.hosts[host].receive_sources.for_qp(qpn, move || {
        for wr in written.lock().unwrap().drain(..) {
            let _ = posts.post_recv(wr);
        }
    });
    ring
}

#[test]
fn a_message_fetches_the_receive_the_engine_was_not_given() {
    // No RNR retry: a message that found no receive would fail.
    let mut pair = Pair::new(PairOptions { rnr_retry: 0, ..PairOptions::default() });
    let sge = |offset| softrnic_transport::smallvec![pair.b.sge(offset, 64)];
    let receives = vec![RecvWorkRequest { wr_id: 20, sges: sge(0) }, RecvWorkRequest { wr_id: 21, sges: sge(64) }];
    let ring = unfetched_receives(&mut pair, 1, receives);
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"found".as_slice().into()));
    // A WRITE with immediate consumes a receive too.
    pair.post(
        0,
        2,
        SendOp::Write { remote: remote(&pair, 1, 200), imm: Some(9) },
        Payload::Inline([7u8; 4].as_slice().into()),
    );
    let [a, b] = pair.settle();
    assert!(ring.lock().unwrap().is_empty());
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), [(20, 5), (21, 4)]);
    assert_eq!(bytes(&pair, 1, 0, 5), b"found");
    assert_eq!(pair.world.device(1).counters().rnr_naks_sent, 0, "the receives were there to fetch");
}

#[test]
fn a_fetch_that_finds_nothing_is_answered_receiver_not_ready() {
    let mut pair = Pair::new(PairOptions { min_rnr_timer: 1, ..PairOptions::default() });
    let ring = unfetched_receives(&mut pair, 1, Vec::new());
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"early".as_slice().into()));
    for _ in 0..20 {
        pair.world.step();
    }
    assert!(pair.world.device(1).counters().rnr_naks_sent > 0);
    // The program writes its receive; the retry fetches it.
    ring.lock().unwrap().push(RecvWorkRequest { wr_id: 3, sges: softrnic_transport::smallvec![pair.b.sge(0, 64)] });
    let [a, b] = pair.settle();
    assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::Success));
    assert_eq!((b[0].wr_id, b[0].byte_len), (3, 5));
}

/// Requests that arrive behind the one waiting for receives wait with it
/// and keep their order, on both recoveries: one question, no NAK, no
/// packet handled out of turn. Every packet of two messages reaches the
/// receiver in one batch, as a burst reaches an engine shard, before the
/// driver answers. (A WRITE goes first: its ACK tells the requester that
/// the responder does not count credits, so that the two SENDs go
/// together rather than the first alone as a probe.)
#[test]
fn requests_behind_a_held_one_wait_in_order() {
    for selective_repeat in [false, true] {
        let what = format!("selective repeat {selective_repeat}");
        let mut pair = Pair::new(PairOptions { rnr_retry: 0, selective_repeat, ..PairOptions::default() });
        let qpn = pair.b.qpn;
        let posts = pair.world.hosts[1].device.qp(qpn).unwrap().post_queues().clone();
        posts.fetch_on_demand();
        pair.post(
            0,
            9,
            SendOp::Write { remote: remote(&pair, 1, 8192), imm: None },
            Payload::Inline([1u8; 8][..].into()),
        );
        pair.settle();
        assert_eq!(pair.world.device(0).qp(pair.a.qpn).unwrap().credits_available(), None, "{what}");
        let (first, second) = (pattern(3000, 1), pattern(2500, 2));
        pair.a.buffer.write(0, &first);
        pair.a.buffer.write(4096, &second);
        pair.post(0, 1, SendOp::Send { imm: None }, pair.a.gather(0, 3000));
        pair.post(0, 2, SendOp::Send { imm: None }, pair.a.gather(4096, 2500));
        let (now, from) = (pair.world.now, pair.world.hosts[0].addr);
        let mut buf = vec![0; MAX_DATAGRAM_LEN];
        let mut burst = Vec::new();
        while let Some(t) = pair.world.device(0).poll_transmit(now, &mut buf) {
            burst.push(buf[..t.len].to_vec());
        }
        assert_eq!(burst.len(), 6, "{what}: three packets of 1024 bytes each");
        let receiver = pair.world.device(1);
        for datagram in &burst {
            receiver.handle_datagram(now, from, RecvMeta::default(), datagram);
        }
        let wanted = receiver.poll_receives_wanted();
        assert_eq!(wanted, Some(ReceivesWanted { qpn, srq: None }), "{what}");
        assert_eq!(receiver.poll_receives_wanted(), None, "{what}: one question");
        assert!(receiver.poll_transmit(now, &mut buf).is_none(), "{what}: nothing answered while held");
        // The driver posts what the program wrote, and answers.
        for (wr_id, offset) in [(20, 0), (21, 4096)] {
            let _: Posted = posts
                .post_recv(RecvWorkRequest { wr_id, sges: softrnic_transport::smallvec![pair.b.sge(offset, 4096)] })
                .unwrap();
        }
        pair.world.device(1).receives_fetched(now, wanted.unwrap());
        let [a, b] = pair.settle();
        assert_eq!(
            a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            [(1, WcStatus::Success), (2, WcStatus::Success)],
            "{what}"
        );
        assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), [(20, 3000), (21, 2500)], "{what}");
        assert_eq!((bytes(&pair, 1, 0, 3000), bytes(&pair, 1, 4096, 2500)), (first, second), "{what}");
        let counters = pair.world.device(1).counters().clone();
        assert_eq!(counters.receive_fetches, 1, "{what}");
        assert_eq!(
            (
                counters.rnr_naks_sent,
                counters.rx_out_of_sequence,
                counters.rx_held_overflow,
                counters.retransmitted_packets
            ),
            (0, 0, 0, 0),
            "{what}"
        );
        assert_eq!(pair.world.device(0).counters().retransmitted_packets, 0, "{what}");
    }
}

/// A question the driver has taken is waited for, however late its
/// answer (an engine thread preempted between the two for 1.3 ms on a
/// 2-core CI machine had a receive posted in time RNR NAKed); one nobody
/// takes ends after `HOLD_FOR`, as if answered with nothing.
#[test]
fn a_question_taken_is_waited_for_and_one_left_ends_in_time() {
    for taken in [true, false] {
        let mut pair = Pair::new(PairOptions::default());
        let qpn = pair.b.qpn;
        let posts = pair.world.hosts[1].device.qp(qpn).unwrap().post_queues().clone();
        posts.fetch_on_demand();
        pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"just in time"[..].into()));
        let (now, from) = (pair.world.now, pair.world.hosts[0].addr);
        let mut buf = vec![0; MAX_DATAGRAM_LEN];
        let sent = pair.world.device(0).poll_transmit(now, &mut buf).expect("the SEND leaves");
        let receiver = pair.world.device(1);
        receiver.handle_datagram(now, from, RecvMeta::default(), &buf[..sent.len]);
        let wanted = match taken {
            true => receiver.poll_receives_wanted(),
            false => None,
        };
        let late = now + HOLD_FOR * 10;
        receiver.handle_timeout(late);
        let answered = receiver.poll_transmit(late, &mut buf).is_some();
        assert_eq!(answered, !taken, "taken {taken}: the request waits only for a question taken");
        assert_eq!(receiver.counters().rnr_naks_sent, u64::from(!taken), "taken {taken}");
        let receive = RecvWorkRequest { wr_id: 7, sges: softrnic_transport::smallvec![pair.b.sge(0, 64)] };
        let _: Posted = posts.post_recv(receive).unwrap();
        if let Some(wanted) = wanted {
            pair.world.device(1).receives_fetched(late, wanted);
        }
        let [a, b] = pair.settle();
        assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::Success), "taken {taken}");
        assert_eq!((b[0].wr_id, b[0].byte_len), (7, 12), "taken {taken}");
        assert_eq!(bytes(&pair, 1, 0, 12), b"just in time", "taken {taken}");
    }
}

/// A QP entering the error state asks for the receives its program
/// wrote, and they flush with the rest, in order.
#[test]
fn receives_not_fetched_yet_flush_when_the_qp_fails() {
    let mut pair = Pair::new(PairOptions::default());
    pair.post_recv(1, 10, 0, 64);
    let sge = |offset| softrnic_transport::smallvec![pair.b.sge(offset, 64)];
    let receives = vec![RecvWorkRequest { wr_id: 11, sges: sge(64) }, RecvWorkRequest { wr_id: 12, sges: sge(128) }];
    let ring = unfetched_receives(&mut pair, 1, receives);
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    pair.world.device(1).modify_qp(now, qpn, &QpAttr { state: Some(QpState::Error), ..QpAttr::default() }).unwrap();
    let [_, b] = pair.settle();
    assert!(ring.lock().unwrap().is_empty());
    assert_eq!(
        b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(10, WcStatus::WrFlushErr), (11, WcStatus::WrFlushErr), (12, WcStatus::WrFlushErr)]
    );
}

#[test]
fn rnr_retries_run_out() {
    let mut pair = Pair::new(PairOptions { rnr_retry: 2, ..PairOptions::default() });
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"nobody listens"[..].into()));
    pair.post(0, 2, SendOp::Send { imm: None }, Payload::Inline(b"queued"[..].into()));
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.state(0), QpState::Error);
    assert_eq!(pair.world.device(0).counters().rnr_naks_received, 3, "the first NAK and two retries");
}

#[test]
fn a_dead_peer_exhausts_retries_and_flushes_everything() {
    let mut pair = Pair::new(PairOptions { retry_cnt: 3, ..PairOptions::default() });
    pair.post_recv(0, 100, 0, 64);
    pair.world.hosts[1].up = false;
    for id in 0..3 {
        pair.post(
            0,
            id,
            SendOp::Write { remote: remote(&pair, 1, 0), imm: None },
            Payload::Inline(softrnic_transport::smallvec![1; 16]),
        );
    }
    let [a, _] = pair.settle();
    let statuses: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (100, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(pair.state(0), QpState::Error);
    assert_eq!(pair.world.device(0).counters().timeouts, 4, "the first try and three retries");
    // Work posted to a QP in error completes at once, flushed.
    pair.post(0, 7, SendOp::Send { imm: None }, Payload::Inline(softrnic_transport::smallvec![]));
    let [a, _] = pair.settle();
    assert_eq!((a[0].wr_id, a[0].status), (7, WcStatus::WrFlushErr));
}

#[test]
fn a_peer_that_dies_mid_transfer_fails_the_transfer() {
    let mut pair = Pair::new(PairOptions { retry_cnt: 2, ..PairOptions::default() });
    let data = pattern(60_000, 1);
    pair.a.buffer.write(0, &data);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, 60_000));
    for _ in 0..10 {
        pair.world.step();
    }
    pair.world.hosts[1].up = false;
    let [a, _] = pair.settle();
    assert_eq!((a[0].wr_id, a[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!(pair.state(0), QpState::Error);
}

/// A peer that crashes and restarts mid-transfer comes back without the
/// QP: its fresh device drops what still arrives for it, and the
/// survivor's QP fails the transfer, flushes what was posted after it
/// and its receives, and never hangs.
#[test]
fn a_peer_that_restarts_mid_transfer_is_a_qp_gone() {
    let mut pair = Pair::new(PairOptions { retry_cnt: 2, ..PairOptions::default() });
    pair.post_recv(0, 100, 0, 64);
    pair.a.buffer.write(0, &pattern(60_000, 3));
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, 60_000));
    pair.post(0, 2, SendOp::Read { remote: remote(&pair, 1, 0) }, pair.a.gather(0, 1024));
    for _ in 0..10 {
        pair.world.step();
    }
    pair.world.restart(1);
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr), (100, WcStatus::WrFlushErr)]
    );
    assert_eq!(pair.state(0), QpState::Error);
    assert!(pair.world.device(1).qp(pair.b.qpn).is_none(), "the restarted host has no QP");
    assert!(pair.world.device(1).counters().rx_unknown_qp > 0, "and dropped what came for it");
}

#[test]
fn heavy_loss_is_recovered_by_retransmission() {
    let faults = Faults { loss: 0.2, ..Faults::NONE };
    let mut pair =
        Pair::new(PairOptions { faults, seed: 7, mtu: softrnic_transport::Mtu::Mtu256, ..PairOptions::default() });
    let data = pattern(40_000, 5);
    pair.a.buffer.write(0, &data);
    pair.b.buffer.write(0, &data);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 20_000), imm: None }, pair.a.gather(0, 40_000));
    pair.post(0, 2, SendOp::Read { remote: remote(&pair, 1, 0) }, pair.a.gather(40_000, 20_000));
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(bytes(&pair, 1, 20_000, 40_000), data);
    assert_eq!(bytes(&pair, 0, 40_000, 20_000), data[..20_000]);
    assert!(pair.world.device(0).counters().retransmitted_packets > 0);
    assert!(pair.world.network.stats.dropped > 0);
}

#[test]
fn psns_wrap_around_2_pow_24() {
    let mut pair = Pair::new(PairOptions { mtu: softrnic_transport::Mtu::Mtu256, ..PairOptions::default() });
    // Reconnect both QPs with PSNs a few packets before the wrap.
    let now = pair.world.now;
    for (host, peer) in [(0usize, 1usize), (1, 0)] {
        let (qpn, peer_qpn) = (pair.side(host).qpn, pair.side(peer).qpn);
        let reset = QpAttr { state: Some(QpState::Reset), ..QpAttr::default() };
        pair.world.device(host).modify_qp(now, qpn, &reset).unwrap();
        connect_rc(&mut pair.world, host, qpn, peer_qpn, Psn::new(0xff_fff0), softrnic_transport::Mtu::Mtu256);
    }
    let data = pattern(256 * 40, 11);
    pair.a.buffer.write(0, &data);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, data.len() as u32));
    let [a, _] = pair.settle();
    assert_eq!(a[0].status, WcStatus::Success);
    assert_eq!(bytes(&pair, 1, 0, data.len()), data);
}

#[test]
fn the_state_machine_guards_posting_and_flushes_on_error() {
    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let device = pair.world.device(0);
    let err = device.modify_qp(now, qpn, &QpAttr { state: Some(QpState::Rtr), ..QpAttr::default() }).unwrap_err();
    assert!(err.to_string().contains("from Rts to Rtr"), "{err}");
    device.post_recv(now, qpn, RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![] }).unwrap();
    device.post_recv(now, qpn, RecvWorkRequest { wr_id: 2, sges: softrnic_transport::smallvec![] }).unwrap();
    device.modify_qp(now, qpn, &QpAttr { state: Some(QpState::Error), ..QpAttr::default() }).unwrap();
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect::<Vec<_>>(),
        vec![(1, WcStatus::WrFlushErr, WcOpcode::Recv), (2, WcStatus::WrFlushErr, WcOpcode::Recv)]
    );
    // RESET, then INIT: sends are refused until RTS.
    let device = pair.world.device(0);
    device.modify_qp(now, qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    device
        .modify_qp(
            now,
            qpn,
            &QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(softrnic_transport::Access::REMOTE),
                ..QpAttr::default()
            },
        )
        .unwrap();
    let err = device
        .post_send(
            now,
            qpn,
            SendWorkRequest::new(3, SendOp::Send { imm: None }, Payload::Inline(softrnic_transport::smallvec![])),
        )
        .unwrap_err();
    assert!(err.to_string().contains("move it to RTS"), "{err}");
    assert_eq!(err.errno(), 22);
}

#[test]
fn full_queues_are_refused_with_enomem() {
    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    let device = pair.world.device(1);
    for id in 0..128 {
        device.post_recv(now, qpn, RecvWorkRequest { wr_id: id, sges: softrnic_transport::smallvec![] }).unwrap();
    }
    let err =
        device.post_recv(now, qpn, RecvWorkRequest { wr_id: 999, sges: softrnic_transport::smallvec![] }).unwrap_err();
    assert_eq!(err.errno(), 12, "{err}");
}

#[test]
fn completion_notification_fires_when_armed() {
    let mut pair = Pair::new(PairOptions::default());
    let cq = pair.b.cq;
    pair.world.device(1).request_notify_cq(cq, false).unwrap();
    pair.post_recv(1, 1, 0, 64);
    pair.post(0, 1, SendOp::Send { imm: None }, Payload::Inline(b"ping"[..].into()));
    pair.settle();
    assert_eq!(pair.world.device(1).poll_cq_notification(), Some(cq));
    assert_eq!(pair.world.device(1).poll_cq_notification(), None);
}

fn ud_pair() -> Pair {
    Pair::new(PairOptions { qp_type: QpType::Ud, ..PairOptions::default() })
}

fn ud_send(pair: &mut Pair, wr_id: u64, data: &[u8], qkey: u32) {
    let dest = UdDestination { addr: pair.world.ip(1), qpn: pair.b.qpn, qkey };
    let mut wr = SendWorkRequest::new(wr_id, SendOp::Send { imm: Some(5) }, Payload::Inline(data.into()));
    wr.ud = Some(dest);
    pair.post_wr(0, wr);
}

#[test]
fn ud_datagrams_arrive_behind_a_grh() {
    let mut pair = ud_pair();
    pair.post_recv(1, 1, 0, 40 + 64);
    ud_send(&mut pair, 9, b"datagram", QKEY);
    let [a, b] = pair.settle();
    assert_eq!((a[0].wr_id, a[0].status), (9, WcStatus::Success));
    let c = b[0];
    assert_eq!((c.status, c.byte_len, c.src_qp, c.grh, c.imm_data), (WcStatus::Success, 48, pair.a.qpn, true, Some(5)));
    assert_eq!(c.source, Some(pair.world.ip(0)));
    let grh = bytes(&pair, 1, 0, 40);
    assert_eq!(grh[20], 0x45, "an IPv4 header in the last 20 bytes of the GRH");
    assert_eq!(&grh[32..36], &[127, 0, 0, 2], "source address");
    assert_eq!(bytes(&pair, 1, 40, 8), b"datagram");
}

#[test]
fn ud_drops_wrong_qkeys_and_unexpected_datagrams() {
    let mut pair = ud_pair();
    ud_send(&mut pair, 1, b"no receive posted", QKEY);
    ud_send(&mut pair, 2, b"wrong key", QKEY ^ 1);
    let [a, b] = pair.settle();
    assert_eq!(a.len(), 2, "UD sends complete when sent");
    assert!(b.is_empty());
    let counters = pair.world.device(1).counters();
    assert_eq!((counters.rx_no_receive_posted, counters.rx_qkey_violations), (1, 1));
}

/// A program's UD QP posing as a CM agent: it may not take the GSI's
/// controlled Q_Key (EPERM, as Linux refuses it), and a send that names a
/// controlled Q_Key goes out with its QP's own, so it never reaches a
/// QP1 (here it reaches the peer, whose Q_Key is the QP's own).
#[test]
fn only_the_gsi_qp_takes_a_controlled_qkey() {
    let mut pair = ud_pair();
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let gsi_qkey = softrnic_wire::mad::GSI_QKEY;
    let refused = pair.world.device(0).modify_qp(now, qpn, &QpAttr { qkey: Some(gsi_qkey), ..QpAttr::default() });
    let refused = refused.unwrap_err();
    assert_eq!(refused.errno(), 1, "EPERM: {refused}");
    assert!(refused.to_string().contains("controlled Q_Key"), "{refused}");
    pair.post_recv(1, 1, 0, 40 + 64);
    ud_send(&mut pair, 2, b"as QP1", gsi_qkey);
    let [_, b] = pair.settle();
    assert_eq!(b[0].status, WcStatus::Success, "sent with the QP's own Q_Key");
    assert_eq!(pair.world.device(1).counters().rx_qkey_violations, 0);
}

#[test]
fn ud_messages_longer_than_the_mtu_fail_locally() {
    let mut pair = ud_pair();
    let mut wr = SendWorkRequest::new(1, SendOp::Send { imm: None }, pair.a.gather(0, 5000));
    wr.ud = Some(UdDestination { addr: pair.world.ip(1), qpn: pair.b.qpn, qkey: QKEY });
    pair.post_wr(0, wr);
    let [a, _] = pair.settle();
    assert_eq!(a[0].status, WcStatus::LocLenErr);
    assert_eq!(pair.state(0), QpState::Sqe);
}

#[test]
fn many_outstanding_reads_survive_neighbour_swaps_and_loss() {
    // Duplicate READs must reuse the original's responder resource; when
    // they did not, a new READ was refused with a fatal NAK.
    for seed in 0..20 {
        let faults =
            Faults { reorder: 0.03, loss: 0.01, reorder_window: std::time::Duration::from_nanos(500), ..Faults::NONE };
        let mut pair = Pair::new(PairOptions { faults, seed, region_len: 1 << 22, ..PairOptions::default() });
        let size = 20_000u64;
        for i in 0..100u64 {
            let remote = remote(&pair, 1, i * size);
            pair.post(0, i, SendOp::Read { remote }, pair.a.gather(2_000_000 + i * size, size as u32));
        }
        let [a, _] = pair.settle();
        assert_eq!(a.len(), 100, "seed {seed}");
        assert!(
            a.iter().all(|c| c.status == WcStatus::Success),
            "seed {seed}: {:?}",
            a.iter().find(|c| c.status != WcStatus::Success)
        );
    }
}

#[test]
fn a_fatal_nak_flushes_older_reads_instead_of_retrying_them() {
    let mut pair = Pair::new(PairOptions::default());
    // A READ whose response the network loses, then a WRITE the responder
    // refuses: the READ is flushed at once, not retried until exhausted.
    pair.post(0, 1, SendOp::Read { remote: remote(&pair, 1, 0) }, pair.a.gather(0, 8));
    pair.world.flush();
    pair.world.step(); // the READ reaches host 1, which queues its response
    pair.world.network.faults.loss = 1.0;
    pair.world.flush(); // the response is lost
    pair.world.network.faults.loss = 0.0;
    let bad = RemoteAddr { rkey: pair.b.mr.rkey ^ 0x100, ..remote(&pair, 1, 0) };
    pair.post(0, 2, SendOp::Write { remote: bad, imm: None }, Payload::Inline(softrnic_transport::smallvec![1; 8]));
    let [a, _] = pair.settle();
    let statuses: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(statuses, vec![(1, WcStatus::WrFlushErr), (2, WcStatus::RemAccessErr)]);
    assert_eq!(pair.world.device(0).counters().timeouts, 0, "nothing waited for a timer: {statuses:?}");
}

#[test]
fn a_stale_sequence_nak_does_not_skip_the_rest_of_a_message() {
    use softrnic_wire::aeth::{NakCode, Syndrome};
    use softrnic_wire::icrc::UdpFlow;
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, ROCEV2_UDP_PORT, aeth, bth};

    let mut pair = Pair::new(PairOptions::default());
    let first_psn = first_psn(pair.a.qpn);
    pair.post(
        0,
        1,
        SendOp::Write { remote: remote(&pair, 1, 0), imm: None },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
    );
    pair.settle();
    let data = pattern(40 * 1024, 9);
    pair.a.buffer.write(0, &data);
    pair.post(0, 2, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, data.len() as u32));
    pair.world.flush();
    // A NAK for the PSN of the first, long acknowledged, WRITE arrives late.
    let headers = Headers {
        bth: bth::Repr::new(Opcode::RcAck, pair.a.qpn, first_psn),
        ext: Extensions {
            aeth: Some(aeth::Repr { syndrome: Syndrome::Nak(NakCode::PsnSequenceError), msn: 0 }),
            ..Extensions::default()
        },
    };
    let mut buf = [0u8; 64];
    let len = headers.emit_packet(&mut buf, &[]).unwrap();
    let from = pair.world.hosts[1].addr;
    let to = pair.world.ip(0);
    UdpFlow { src: from.ip(), dst: to, src_port: ROCEV2_UDP_PORT, dst_port: ROCEV2_UDP_PORT }
        .seal(&mut buf[..len])
        .unwrap();
    let now = pair.world.now;
    pair.world.device(0).handle_datagram(now, from, Default::default(), &buf[..len]);
    let [a, _] = pair.settle();
    assert_eq!(a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(2, WcStatus::Success)]);
    assert_eq!(bytes(&pair, 1, 0, data.len()), data);
    assert_eq!(pair.world.device(0).counters().timeouts, 0, "recovered without waiting for a timer");
}

#[test]
fn a_rate_limit_paces_requests() {
    let timed = |limit: Option<u64>| {
        let mut pair = Pair::new(PairOptions { region_len: 1 << 20, ..PairOptions::default() });
        let (now, qpn) = (pair.world.now, pair.a.qpn);
        pair.world.device(0).set_qp_rate_limit(now, qpn, limit).unwrap();
        pair.post(0, 1, SendOp::Write { remote: remote(&pair, 1, 0), imm: None }, pair.a.gather(0, 500_000));
        let [a, _] = pair.settle();
        assert_eq!(a[0].status, WcStatus::Success);
        pair.world.now
    };
    let unlimited = timed(None);
    let at_1_gbps = timed(Some(1_000_000_000));
    // 500 kB at 1 Gb/s take at least 4 ms; the 100 Gb/s link alone, 40 µs.
    assert!(at_1_gbps.as_nanos() >= 4_000_000, "{at_1_gbps:?}");
    assert!(unlimited.as_nanos() < 1_000_000, "{unlimited:?}");
    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    assert!(pair.world.device(0).set_qp_rate_limit(now, qpn, Some(0)).is_err());
}

/// A QP that owes its peer an ACK while its own requester has a long
/// WRITE to send lets the ACK go after one request, not once the
/// requester has nothing left (simulator seed 8003009: a requester that
/// always had another packet, with its NIC taking one at a time, held its
/// QP's ACKs for 8 ms, and the peer's SEND spent its retries).
#[test]
fn an_ack_owed_goes_after_one_request_however_many_wait() {
    use softrnic_wire::packet::{Extensions, Headers};
    use softrnic_wire::{Opcode, bth};

    let mut pair = Pair::new(PairOptions::default());
    pair.post_recv(1, 1, 0, 64);
    // A's SEND reaches B, whose responder now owes A an ACK...
    let bth = bth::Repr { ack_request: true, ..bth::Repr::new(Opcode::RcSendOnly, pair.b.qpn, first_psn(pair.a.qpn)) };
    pair.inject(&Headers { bth, ext: Extensions::default() }, &[7; 64]);
    // ...and B's requester has a WRITE of 64 packets to send.
    pair.post(1, 2, SendOp::Write { remote: remote(&pair, 0, 0), imm: None }, pair.b.gather(0, 64 * 1024));
    let now = pair.world.now;
    let device = pair.world.device(1);
    let mut buf = vec![0u8; MAX_DATAGRAM_LEN];
    let mut opcodes = Vec::new();
    while let Some(t) = device.poll_transmit(now, &mut buf) {
        opcodes.push(bth::Header::new_unchecked(&buf[..t.len]).opcode_byte());
    }
    assert!(opcodes.len() > 64, "the WRITE and the ACK: {opcodes:?}");
    let ack = opcodes.iter().position(|&op| op == Opcode::RcAck as u8);
    assert_eq!(ack, Some(1), "the ACK went after the first request: {opcodes:?}");
}
