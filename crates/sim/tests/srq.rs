//! Shared receive queues and asynchronous events.

use std::sync::{Arc, Mutex};

use softrnic_sim::harness::{IOVA, Pair, PairOptions, connect_rc};
use softrnic_transport::{
    AsyncEvent, CqId, Payload, Psn, QpCaps, QpInitAttr, QpState, QpType, RecvWorkRequest, RemoteAddr, SendOp, WcStatus,
};

fn srq_pair() -> Pair {
    Pair::new(PairOptions { srq: true, ..PairOptions::default() })
}

fn post_srq(pair: &mut Pair, wr_id: u64, offset: u64, len: u32) {
    let srq = pair.b.srq.expect("an SRQ");
    let sges = softrnic_transport::smallvec![pair.b.sge(offset, len)];
    pair.world.device(1).post_srq_recv(srq, RecvWorkRequest { wr_id, sges }).unwrap();
}

fn send(pair: &mut Pair, wr_id: u64, bytes: &[u8]) {
    pair.post(0, wr_id, SendOp::Send { imm: None }, Payload::Inline(bytes.into()));
}

#[test]
fn receives_come_from_the_srq_in_order() {
    let mut pair = srq_pair();
    post_srq(&mut pair, 10, 0, 64);
    post_srq(&mut pair, 11, 100, 64);
    send(&mut pair, 1, b"first");
    send(&mut pair, 2, b"second");
    let [a, b] = pair.settle();
    assert!(a.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), vec![(10, 5), (11, 6)]);
    assert_eq!(&pair.b.buffer.to_vec()[100..106], b"second");
    // The QP's own receive queue is not for posting.
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    let err = pair
        .world
        .device(1)
        .post_recv(now, qpn, RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![] })
        .unwrap_err();
    assert!(err.to_string().contains("SRQ"), "{err}");
}

#[test]
fn an_empty_srq_means_receiver_not_ready() {
    let mut pair = srq_pair();
    send(&mut pair, 1, b"early");
    for _ in 0..20 {
        pair.world.step();
    }
    assert!(pair.world.device(1).counters().rnr_naks_sent > 0);
    post_srq(&mut pair, 7, 0, 64);
    let [a, b] = pair.settle();
    assert_eq!((a[0].status, b[0].wr_id), (WcStatus::Success, 7));
}

#[test]
fn an_empty_srq_fetches_the_receives_its_program_wrote() {
    // No RNR retry: a message that found no receive would fail.
    let mut pair = Pair::new(PairOptions { srq: true, rnr_retry: 0, ..PairOptions::default() });
    let srq = pair.world.device(1).srq(pair.b.srq.unwrap()).unwrap().clone();
    // The program's side (softrnicd's SRQ ring) holds two receives the
    // engine has not been given; the first message asks for them.
    let sge = |offset| softrnic_transport::smallvec![pair.b.sge(offset, 64)];
    let written =
        Mutex::new(vec![RecvWorkRequest { wr_id: 30, sges: sge(0) }, RecvWorkRequest { wr_id: 31, sges: sge(64) }]);
    srq.fetch_on_demand();
    let id = srq.id();
    pair.world.hosts[1].receive_sources.for_srq(id, move || {
        for wr in written.lock().unwrap().drain(..) {
            srq.post(wr).unwrap();
        }
    });
    send(&mut pair, 1, b"one");
    send(&mut pair, 2, b"two");
    let [a, b] = pair.settle();
    assert!(a.iter().all(|c| c.status == WcStatus::Success), "{a:?}");
    assert_eq!(b.iter().map(|c| (c.wr_id, c.byte_len)).collect::<Vec<_>>(), [(30, 3), (31, 3)]);
    assert_eq!(pair.world.device(1).counters().rnr_naks_sent, 0);
}

/// The limit counts the receives the program has written and the SRQ has
/// not been given yet (softrnicd's ring): they are fetched before the
/// event is raised, and it fires when the two together run low.
#[test]
fn the_limit_counts_the_receives_not_fetched_yet() {
    let mut pair = srq_pair();
    let id = pair.b.srq.unwrap();
    let srq = pair.world.device(1).srq(id).unwrap().clone();
    let sge = |offset| softrnic_transport::smallvec![pair.b.sge(offset, 64)];
    let ring =
        Arc::new(Mutex::new((1..4).map(|i| RecvWorkRequest { wr_id: i, sges: sge(i * 64) }).collect::<Vec<_>>()));
    let written = ring.clone();
    srq.fetch_on_demand();
    let fetching = srq.clone();
    pair.world.hosts[1].receive_sources.for_srq(id, move || {
        for wr in written.lock().unwrap().drain(..) {
            fetching.post(wr).unwrap();
        }
    });
    post_srq(&mut pair, 0, 0, 64);
    pair.world.device(1).modify_srq_limit(id, 3).unwrap();
    // One receive in the SRQ and three in the ring: the first message
    // leaves three, not zero.
    send(&mut pair, 1, b"a");
    pair.settle();
    assert_eq!(pair.world.device(1).poll_async_event(), None);
    assert_eq!(pair.world.device(1).query_srq(id).unwrap().1, 3);
    send(&mut pair, 2, b"b");
    pair.settle();
    assert_eq!(pair.world.device(1).poll_async_event(), Some(AsyncEvent::SrqLimitReached { srq: id }));
}

#[test]
fn the_limit_event_fires_once_when_the_srq_runs_low() {
    let mut pair = srq_pair();
    let srq = pair.b.srq.unwrap();
    for id in 0..4 {
        post_srq(&mut pair, id, id * 64, 64);
    }
    pair.world.device(1).modify_srq_limit(srq, 3).unwrap();
    send(&mut pair, 1, b"a");
    send(&mut pair, 2, b"b");
    pair.settle();
    assert_eq!(pair.world.device(1).poll_async_event(), Some(AsyncEvent::SrqLimitReached { srq }));
    assert_eq!(pair.world.device(1).poll_async_event(), None, "disarmed after firing");
    let (attr, posted) = pair.world.device(1).query_srq(srq).unwrap();
    assert_eq!((attr.limit, posted), (0, 2));
    assert!(pair.world.device(1).modify_srq_limit(srq, 65).is_err());
}

#[test]
fn a_qp_in_error_leaves_the_srq_its_requests() {
    let mut pair = srq_pair();
    let srq = pair.b.srq.unwrap();
    post_srq(&mut pair, 1, 0, 64);
    post_srq(&mut pair, 2, 64, 64);
    let (now, qpn) = (pair.world.now, pair.b.qpn);
    pair.world
        .device(1)
        .modify_qp(now, qpn, &softrnic_transport::QpAttr { state: Some(QpState::Error), ..Default::default() })
        .unwrap();
    let [_, b] = pair.settle();
    assert!(b.is_empty(), "nothing of the SRQ is flushed: {b:?}");
    assert_eq!(pair.world.device(1).poll_async_event(), Some(AsyncEvent::QpLastWqeReached { qpn }));
    assert_eq!(pair.world.device(1).query_srq(srq).unwrap().1, 2);
    assert!(pair.world.device(1).destroy_srq(srq).is_err(), "in use by the QP");
}

#[test]
fn two_qps_share_one_srq() {
    // Host 1 serves two QPs from one SRQ; host 0 has a QP for each.
    let mut pair = srq_pair();
    let srq = pair.b.srq.unwrap();
    let now = pair.world.now;
    let (pd0, pd1) = (pair.a.pd, pair.b.pd);
    let cq0: CqId = pair.a.cq;
    let cq1: CqId = pair.b.cq;
    let caps = QpCaps::default();
    let extra0 = pair
        .world
        .device(0)
        .create_qp(QpInitAttr {
            qp_type: QpType::Rc,
            pd: pd0,
            send_cq: cq0,
            recv_cq: cq0,
            caps,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let extra1 = pair
        .world
        .device(1)
        .create_qp(QpInitAttr {
            qp_type: QpType::Rc,
            pd: pd1,
            send_cq: cq1,
            recv_cq: cq1,
            caps,
            sq_sig_all: false,
            srq: Some(srq),
        })
        .unwrap();
    for (host, me, peer) in [(0usize, extra0, extra1), (1, extra1, extra0)] {
        connect_rc(&mut pair.world, host, me, peer, Psn::new(500), softrnic_transport::Mtu::Mtu1024);
    }
    for id in 0..4 {
        post_srq(&mut pair, 100 + id, id * 64, 64);
    }
    send(&mut pair, 1, b"via the first QP");
    let mut wr = softrnic_transport::SendWorkRequest::new(
        2,
        SendOp::Send { imm: None },
        Payload::Inline(b"via the second"[..].into()),
    );
    wr.signaled = true;
    pair.world.device(0).post_send(now, extra0, wr).unwrap();
    let [a, b] = pair.settle();
    assert_eq!(a.len(), 2);
    let mut got: Vec<(u32, u32)> = b.iter().map(|c| (c.qp_num, c.byte_len)).collect();
    got.sort();
    let mut want = vec![(pair.b.qpn, 16), (extra1, 14)];
    want.sort();
    assert_eq!(got, want, "each QP drew one receive from the shared queue");
    assert_eq!(pair.world.device(1).query_srq(srq).unwrap().1, 2);
}

#[test]
fn responder_errors_raise_the_matching_async_event() {
    let mut pair = Pair::new(PairOptions::default());
    let bad = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey ^ 0x100 };
    pair.post(0, 1, SendOp::Write { remote: bad, imm: None }, Payload::Inline(softrnic_transport::smallvec![0; 8]));
    pair.settle();
    let qpn = pair.b.qpn;
    assert_eq!(pair.world.device(1).poll_async_event(), Some(AsyncEvent::QpAccessError { qpn }));
    assert_eq!(pair.world.device(0).poll_async_event(), None, "the requester's error is in its completion");

    let mut pair = Pair::new(PairOptions::default());
    let unaligned = RemoteAddr { addr: IOVA + 4, rkey: pair.b.mr.rkey };
    pair.post(0, 1, SendOp::FetchAdd { remote: unaligned, add: 1 }, pair.a.gather(0, 8));
    pair.settle();
    let qpn = pair.b.qpn;
    assert_eq!(pair.world.device(1).poll_async_event(), Some(AsyncEvent::QpRequestError { qpn }));
}

#[test]
fn a_write_with_immediate_takes_its_receive_before_writing() {
    // Taken before a byte lands, so that no other QP of the SRQ can take
    // it between a look and its use; refused after taking it (a key that
    // is no key), the receive is the QP's and is flushed with it, while
    // the SRQ keeps the rest.
    let mut pair = srq_pair();
    let srq = pair.b.srq.unwrap();
    post_srq(&mut pair, 10, 0, 64);
    post_srq(&mut pair, 11, 64, 64);
    let bad = RemoteAddr { addr: IOVA, rkey: pair.b.mr.rkey ^ 0x100 };
    pair.post(0, 1, SendOp::Write { remote: bad, imm: Some(5) }, Payload::Inline(softrnic_transport::smallvec![7; 8]));
    let [a, b] = pair.settle();
    assert_eq!(a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(1, WcStatus::RemAccessErr)]);
    assert_eq!(b.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), [(10, WcStatus::WrFlushErr)]);
    assert_eq!(pair.world.device(1).query_srq(srq).unwrap().1, 1, "the other receive stays in the SRQ");
    assert_eq!(pair.b.buffer.to_vec()[..8], [0; 8], "nothing written");

    // Accepted, over three packets: the receive taken with the last.
    let mut pair = srq_pair();
    post_srq(&mut pair, 20, 0, 64);
    let remote = RemoteAddr { addr: IOVA + 4096, rkey: pair.b.mr.rkey };
    pair.a.buffer.write(0, &[9; 3000]);
    pair.post(0, 2, SendOp::Write { remote, imm: Some(6) }, pair.a.gather(0, 3000));
    let [a, b] = pair.settle();
    assert_eq!(a[0].status, WcStatus::Success);
    let got: Vec<_> = b.iter().map(|c| (c.wr_id, c.status, c.byte_len, c.imm_data)).collect();
    assert_eq!(got, [(20, WcStatus::Success, 3000, Some(6))]);
    assert!(pair.b.buffer.to_vec()[4096..7096].iter().all(|&x| x == 9));
}
