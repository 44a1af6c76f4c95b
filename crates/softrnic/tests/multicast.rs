//! Multicast over real UDP on loopback: UD QPs on two devices attach to an
//! IP multicast group, one datagram sent to the group's QP number reaches
//! every one of them (two on one device, one on another), with the
//! group in the GRH; a QP that detaches hears nothing more.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrnic::{
    Access, CompletionQueue, ConnectOptions, Context, MemoryRegion, QpCaps, QpType, QueuePair, RecvWorkRequest, SendOp,
    SendWorkRequest, UdDestination, WcStatus,
};
use softrnic_transport::multicast::MULTICAST_QPN;

const GRH: usize = 40;

struct Member {
    qp: QueuePair,
    cq: CompletionQueue,
    mr: MemoryRegion,
}

fn member(ctx: &Context) -> Member {
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(QpType::Ud, &cq, &cq, QpCaps::default(), true).unwrap();
    qp.connect(&qp.endpoint(&mr), &ConnectOptions::default()).unwrap();
    for i in 0..4 {
        qp.post_recv(RecvWorkRequest { wr_id: i, sges: vec![mr.sge(i as usize * 512, 512)].into() }).unwrap();
    }
    Member { qp, cq, mr }
}

/// The next completion within 10 s, or none after `quiet` if `quiet` is
/// given (a datagram that must not arrive).
fn next(cq: &CompletionQueue, quiet: Option<Duration>) -> Option<softrnic::Completion> {
    let deadline = Instant::now() + quiet.unwrap_or(Duration::from_secs(10));
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if cq.poll(1, &mut out) == 1 {
            return out.pop();
        }
        std::thread::yield_now();
    }
    assert!(quiet.is_some(), "no completion within 10 s");
    None
}

#[test]
fn a_datagram_to_a_group_reaches_every_attached_qp_and_no_detached_one() {
    let group = IpAddr::V4(Ipv4Addr::new(239, 255, 77, 1));
    let (a, b, c) = (
        Context::open("127.0.1.201".parse().unwrap()).unwrap(),
        Context::open("127.0.1.202".parse().unwrap()).unwrap(),
        Context::open("127.0.1.203".parse().unwrap()).unwrap(),
    );
    let sender = member(&a);
    let members = [member(&b), member(&b), member(&c)];
    for m in &members {
        m.qp.attach_multicast(group).unwrap();
    }
    let qkey = ConnectOptions::default().qkey;
    let to_group = UdDestination { addr: group, qpn: MULTICAST_QPN, qkey };
    let send = |wr_id: u64, text: &[u8]| {
        sender.mr.write(0, text);
        let wr = SendWorkRequest {
            ud: Some(to_group),
            ..SendWorkRequest::new(wr_id, SendOp::Send { imm: None }, sender.mr.gather(0, text.len() as u32))
        };
        sender.qp.post_send(wr).unwrap();
        assert_eq!(next(&sender.cq, None).unwrap().status, WcStatus::Success);
    };

    send(1, b"to everyone");
    for m in &members {
        let got = next(&m.cq, None).unwrap();
        assert_eq!((got.status, got.byte_len as usize), (WcStatus::Success, GRH + 11));
        assert_eq!((got.source, got.src_qp), (Some(a.addr()), sender.qp.qpn()));
        let mut bytes = [0u8; GRH + 11];
        m.mr.read(got.wr_id as usize * 512, &mut bytes);
        assert_eq!(&bytes[GRH..], b"to everyone");
        assert_eq!(bytes[36..40], [239, 255, 77, 1], "the GRH's destination is the group");
    }

    members[2].qp.detach_multicast(group).unwrap();
    assert!(members[2].qp.detach_multicast(group).is_err(), "detached once");
    send(2, b"to the rest");
    for m in &members[..2] {
        assert_eq!(next(&m.cq, None).unwrap().byte_len as usize, GRH + 11);
    }
    assert!(next(&members[2].cq, Some(Duration::from_millis(200))).is_none(), "a detached QP hears nothing");
    // Nothing of the devices' own making went wrong: every copy checked,
    // parsed, found a receive and was not dropped by the host.
    for ctx in [&b, &c] {
        let counters = ctx.counters();
        let t = &counters.transport;
        assert_eq!((t.rx_icrc_errors, t.rx_malformed, t.rx_no_receive_posted), (0, 0, 0), "{:?}", ctx.addr());
        assert_eq!(counters.rx_dropped_by_kernel, 0);
    }
    assert_eq!(b.counters().transport.rx_unknown_qp, 0, "b's QPs stayed attached");
}

#[test]
fn only_ud_qps_join_and_only_multicast_addresses_are_groups() {
    let ctx = Context::open("127.0.1.204".parse().unwrap()).unwrap();
    let ud = member(&ctx);
    assert!(ud.qp.attach_multicast("127.0.1.9".parse().unwrap()).is_err(), "not a multicast address");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let rc = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    assert!(rc.attach_multicast("239.255.77.2".parse().unwrap()).is_err(), "an RC QP");
    // Its GID, IPv4-mapped, names the same group.
    ud.qp.attach_multicast("::ffff:239.255.77.2".parse().unwrap()).unwrap();
    ud.qp.detach_multicast("239.255.77.2".parse().unwrap()).unwrap();
}
