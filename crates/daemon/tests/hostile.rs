//! Tenants that misbehave: scribbled rings, garbage on the socket, a
//! program killed mid-transfer. The daemon must go on serving everyone
//! else, and the tenant's own QPs must end in error with their requests
//! flushed.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Tenant, address, daemon, daemon_designed, pair, pattern};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::Running;
use softrnic_daemon::server::offload::{Designs, RxDesign, TxDesign};
use softrnic_daemon_protocol::protocol::{self, PROTOCOL_VERSION, Request, Response, Segment, Translation};
use softrnic_daemon_protocol::queue::SharedQueue;
use softrnic_daemon_protocol::shared_memory::SharedMapping;
use softrnic_ring::spsc::{self, Producer};
use softrnic_transport::{
    Access, Completion, CqId, PdId, Psn, QpAttr, QpCaps, QpInitAttr, QpState, QpType, RcConnection, RecvWorkRequest,
    RemoteAddr, SendOp, SendWorkRequest, SrqAttr, SrqId, WcStatus, WindowType, smallvec,
};

/// A connection to the daemon whose answers are awaited 20 s at most: a
/// daemon that stops answering fails the test instead of hanging it.
fn raw_connect(socket: &Path) -> OwnedFd {
    let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
    rustix::net::connect(&fd, &SocketAddrUnix::new(socket).unwrap()).unwrap();
    let patience = Some(std::time::Duration::from_secs(20));
    rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Recv, patience).unwrap();
    fd
}

fn call(fd: &OwnedFd, request: Request) -> (Response, Vec<OwnedFd>) {
    protocol::call(fd, &request, &[]).unwrap()
}

/// Proves the daemon still serves: a WRITE between two fresh tenants.
fn still_serves(socket: &Path) {
    let (a, b) = pair(socket);
    let data = pattern(4096, 9);
    a.write(0, &data);
    let remote = RemoteAddr { addr: b.iova(0), rkey: b.keys.rkey };
    let mut wr = SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, a.sge(0, 4096));
    wr.signaled = true;
    a.session.post_send(&a.qp, &wr).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.read(0, 4096), data);
}

/// A QP of `qp_type` in `pd` whose sends and receives complete on `cq`,
/// with the device's default capacities.
fn qp_init(qp_type: QpType, pd: PdId, cq: CqId) -> QpInitAttr {
    QpInitAttr { qp_type, ..common::rc_init(pd, cq) }
}

#[test]
fn fuzzed_ring_entries_and_indices_never_stop_the_daemon() {
    fuzz(&daemon("fuzz"));
}

#[test]
fn fuzzed_ring_entries_never_stop_the_copying_designs() {
    // The stages read what the rings say before the engine does.
    for (tx, rx) in [(TxDesign::EngineCopy, RxDesign::InCache), (TxDesign::BulkCopy, RxDesign::PerConnection)] {
        fuzz(&daemon_designed(&format!("fuzz-{tx}-{rx}"), DaemonConfig::default(), Designs { tx, rx }));
    }
}

fn fuzz(daemon: &Running) {
    let socket = daemon.socket();
    let (a, _b) = pair(socket);
    let seed = std::env::var("SOFTRNIC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    eprintln!("fuzz seed {seed} (SOFTRNIC_SEED to repeat)");
    let mut rng = fastrand::Rng::with_seed(seed);
    for round in 0..40 {
        // A hostile tenant with a QP connected to the good tenant `a`.
        let fd = raw_connect(socket);
        let (opened, _fds) = call(&fd, Request::Open { version: PROTOCOL_VERSION, addr: address(), forward: false });
        assert!(matches!(opened, Response::Opened(_)));
        let (Response::Pd(pd), _) = call(&fd, Request::AllocPd) else { panic!() };
        let (Response::Cq(cq), cq_fds) = call(&fd, Request::CreateCq { capacity: 16, channel: None }) else { panic!() };
        let cq_ring = SharedQueue::attach(cq_fds.into_iter().next().unwrap(), cq.slots, 64).unwrap();
        let init = QpInitAttr { sq_sig_all: true, ..qp_init(QpType::Rc, pd, cq.cq) };
        let (Response::Qp(layout), fds) = call(&fd, Request::CreateQp { init, blocks: None }) else { panic!() };
        let mut rings = fds.into_iter();
        let send = SharedQueue::attach(rings.next().unwrap(), layout.send_slots, layout.send_slot_size).unwrap();
        let recv = SharedQueue::attach(rings.next().unwrap(), layout.recv_slots, layout.recv_slot_size).unwrap();
        let steps = RcConnection {
            access: Access::REMOTE,
            remote_addr: a.session.addr(),
            dest_qpn: rng.u32(..0xff_ffff),
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            mtu: softrnic_transport::Mtu::Mtu1024,
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 1,
            timeout: 1,
            retry_cnt: 0,
            rnr_retry: 0,
            selective_repeat: false,
            authenticate: false,
        }
        .steps();
        for attr in &steps {
            call(&fd, Request::ModifyQp { qpn: layout.qpn, attr: *attr });
        }
        let (mut sp, mut rp) = (Producer::default(), Producer::default());
        for _ in 0..rng.usize(1..64) {
            let mut entry = vec![0u8; layout.send_slot_size as usize];
            rng.fill(&mut entry);
            if rng.bool() {
                entry[8] = rng.u8(0..8); // a real opcode now and then
                entry[9] &= 0x0f;
                entry[10..12].copy_from_slice(&rng.u16(0..4).to_le_bytes());
            }
            match rng.u8(0..10) {
                0 => <SharedQueue as spsc::Queue>::produced(&send).store(rng.u64(..), Ordering::Release),
                1 => <SharedQueue as spsc::Queue>::consumed(&cq_ring).store(rng.u64(..), Ordering::Release),
                2 => cq_ring.armed().store(rng.u64(..), Ordering::Release),
                3..6 => {
                    if let Ok(Some(slot)) = rp.slot(&recv) {
                        recv.write_slot(slot, &entry[..layout.recv_slot_size as usize]);
                        rp.publish(&recv);
                    }
                }
                _ => {
                    if let Ok(Some(slot)) = sp.slot(&send) {
                        send.write_slot(slot, &entry);
                        sp.publish(&send);
                    }
                }
            }
        }
        if round % 8 == 0 {
            // One entry certainly malformed (unless the ring is broken
            // already), so that the QP must end in error.
            if let Ok(Some(slot)) = sp.slot(&send) {
                let mut entry = vec![0u8; layout.send_slot_size as usize];
                entry[8] = 99;
                send.write_slot(slot, &entry);
                sp.publish(&send);
            }
            // The hostile tenant's QP ends in error, never anywhere worse.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let (Response::Query { state, .. }, _) = call(&fd, Request::QueryQp { qpn: layout.qpn }) else {
                    panic!()
                };
                if state == QpState::Error {
                    break;
                }
                assert!(Instant::now() < deadline, "round {round}: the hostile QP is in {state:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
        drop(fd);
    }
    still_serves(socket);
    assert_eq!(daemon.processor_restarts(), 0, "the command processor panicked");
}

#[test]
fn garbage_and_lies_on_the_socket_are_refused() {
    let daemon = daemon("garbage");
    let socket = daemon.socket();
    // Bytes that are not a message: the daemon hangs up.
    let fd = raw_connect(socket);
    rustix::net::send(&fd, &[0xff; 40], rustix::net::SendFlags::empty()).unwrap();
    assert!(protocol::receive::<Response>(fd.as_fd()).unwrap().is_none_or(|(r, _)| matches!(r, Response::Error(_))));
    // A protocol of another build.
    let fd = raw_connect(socket);
    let (response, _) = call(&fd, Request::Open { version: PROTOCOL_VERSION + 1, addr: address(), forward: false });
    let Response::Error(e) = response else { panic!("{response:?}") };
    assert!(e.message.contains("protocol"), "{e:?}");
    // Verbs before opening, objects that are not ours, memory that lies.
    let fd = raw_connect(socket);
    assert!(matches!(call(&fd, Request::AllocPd).0, Response::Error(_)));
    let fd = raw_connect(socket);
    call(&fd, Request::Open { version: PROTOCOL_VERSION, addr: address(), forward: false });
    let (Response::Pd(pd), _) = call(&fd, Request::AllocPd) else { panic!() };
    let refused = |request: Request, fds: &[std::os::fd::BorrowedFd<'_>]| {
        let (response, _) = protocol::call(&fd, &request, fds).unwrap();
        let Response::Error(e) = response else { panic!("{request:?} was accepted: {response:?}") };
        e.message
    };
    let one = |len| vec![Segment { offset: 0, len }];
    let translation = |lead, len, segments| Translation { iova: 0, lead, len, segments };
    let register =
        |len| Request::RegisterMemory { pd, access: Access::LOCAL_WRITE, translation: translation(0, len, one(len)) };
    assert!(refused(register(4096), &[]).contains("1 segments came with 0 memfds"));
    let unsealed = rustix::fs::memfd_create("x", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&unsealed, 4096).unwrap();
    assert!(refused(register(4096), &[unsealed.as_fd()]).contains("not sealed"));
    let small = SharedMapping::create("small", 4096).unwrap();
    assert!(refused(register(1 << 20), &[small.fd()]).contains("4096 bytes"));
    assert!(
        refused(
            Request::RegisterMemory { pd, access: Access::empty(), translation: translation(u64::MAX, 2, one(8)) },
            &[small.fd()]
        )
        .contains("must start in its first segment's first page")
    );
    // One byte over a sparse terabyte: charged a byte, it would have
    // mapped the terabyte into the daemon.
    let sparse =
        rustix::fs::memfd_create("sparse", rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING)
            .unwrap();
    rustix::fs::ftruncate(&sparse, 1 << 40).unwrap();
    rustix::fs::fcntl_add_seals(&sparse, rustix::fs::SealFlags::SHRINK).unwrap();
    let sparse_byte = |lead| Request::RegisterMemory {
        pd,
        access: Access::LOCAL_WRITE,
        translation: translation(lead, 1, one(1 << 40)),
    };
    assert!(refused(sparse_byte(0), &[sparse.as_fd()]).contains("cover no more than its pages"));
    assert!(refused(sparse_byte((1 << 40) - 1), &[sparse.as_fd()]).contains("first page"));
    assert!(
        refused(
            Request::RegisterMemory {
                pd: PdId(pd.0 + 1000),
                access: Access::empty(),
                translation: translation(0, 8, one(8))
            },
            &[small.fd()]
        )
        .contains("PD")
    );
    // Re-registration: only one's own region, PD and honest segments; the
    // region, refused all that, still re-registers.
    let (Response::Mr(keys), _) = protocol::call(&fd, &register(4096), &[small.fd()]).unwrap() else { panic!() };
    let rereg = |lkey, pd, translation| Request::ReregisterMemory { lkey, pd, access: None, translation };
    assert!(refused(rereg(keys.lkey ^ 0x100, None, None), &[]).contains("MR"));
    assert!(refused(rereg(keys.lkey, Some(PdId(pd.0 + 1000)), None), &[]).contains("PD"));
    let moved = |len| Some(translation(0, len, one(len)));
    assert!(refused(rereg(keys.lkey, None, moved(4096)), &[]).contains("1 segments came with 0 memfds"));
    assert!(refused(rereg(keys.lkey, None, moved(1 << 20)), &[small.fd()]).contains("4096 bytes"));
    let (done, _) = protocol::call(&fd, &rereg(keys.lkey, None, moved(2048)), &[small.fd()]).unwrap();
    assert!(matches!(done, Response::Done), "{done:?}");
    assert!(matches!(call(&fd, Request::DeregisterMemory { lkey: keys.lkey }).0, Response::Done));
    // Memory windows: only in one's own PD, and only one's own freed.
    assert!(refused(Request::AllocMw { pd: PdId(pd.0 + 1000), kind: WindowType::Two }, &[]).contains("PD"));
    let (Response::Window(rkey), _) = call(&fd, Request::AllocMw { pd, kind: WindowType::Two }) else { panic!() };
    assert!(refused(Request::DeallocMw { rkey: rkey ^ 0x100 }, &[]).contains("MW"));
    assert!(matches!(call(&fd, Request::DeallocMw { rkey: rkey ^ 0x7 }).0, Response::Done), "any key of its block");
    assert!(refused(Request::DeallocMw { rkey }, &[]).contains("MW"), "freed once");
    assert!(refused(Request::CreateCq { capacity: u32::MAX, channel: None }, &[]).contains("completions"));
    assert!(refused(Request::CreateCq { capacity: 4, channel: Some(77) }, &[]).contains("channel"));
    assert!(refused(Request::DestroyCq { cq: CqId(12345) }, &[]).contains("CQ"));
    let (Response::Cq(cq), _) = call(&fd, Request::CreateCq { capacity: 4, channel: None }) else { panic!() };
    let mut init =
        QpInitAttr { caps: QpCaps { max_send_wr: u32::MAX, ..QpCaps::default() }, ..qp_init(QpType::Rc, pd, cq.cq) };
    assert!(refused(Request::CreateQp { init, blocks: None }, &[]).contains("capabilities"));
    init.caps = QpCaps::default();
    init.send_cq = CqId(cq.cq.0 + 1000);
    assert!(refused(Request::CreateQp { init, blocks: None }, &[]).contains("CQ"));
    assert!(refused(Request::ModifyQp { qpn: 1, attr: QpAttr::default() }, &[]).contains("QP"));
    // SRQs: only one's own PD and SRQs, sizes the device has; a ring
    // entry that is not a receive stops only that SRQ.
    let attr = SrqAttr { max_wr: 8, max_sge: 1, limit: 0 };
    assert!(refused(Request::CreateSrq { pd: PdId(pd.0 + 1000), attr }, &[]).contains("PD"));
    assert!(refused(Request::CreateSrq { pd, attr: SrqAttr { max_wr: 0, ..attr } }, &[]).contains("SRQ holds"));
    assert!(refused(Request::QuerySrq { srq: SrqId(77) }, &[]).contains("SRQ"));
    init.send_cq = cq.cq;
    init.srq = Some(SrqId(77));
    assert!(refused(Request::CreateQp { init, blocks: None }, &[]).contains("SRQ"));
    let (Response::Srq(layout), fds) = call(&fd, Request::CreateSrq { pd, attr }) else { panic!() };
    let ring = SharedQueue::attach(fds.into_iter().next().unwrap(), layout.slots, layout.slot_size).unwrap();
    let mut producer = Producer::default();
    let slot = producer.slot(&ring).unwrap().unwrap();
    ring.write_slot(slot, &vec![0xa5; layout.slot_size as usize]);
    producer.publish(&ring);
    still_serves(socket);
    let (attr_now, _) = call(&fd, Request::QuerySrq { srq: layout.srq });
    assert!(matches!(attr_now, Response::SrqAttr(SrqAttr { max_wr: 8, .. })), "{attr_now:?}");
    drop(fd);
    still_serves(socket);
    assert_eq!(daemon.processor_restarts(), 0);
}

/// A forwarding tenant's work requests arrive as the bytes it sent, as
/// long as it made them: one shorter than an entry's fixed part is
/// refused with an answer that says so, and the tenant's connection goes
/// on (it panicked the tenant's thread, which never cleaned up).
#[test]
fn a_forwarded_work_request_too_short_is_refused() {
    let daemon = daemon("short-wqe");
    let socket = daemon.socket();
    let fd = raw_connect(socket);
    call(&fd, Request::Open { version: PROTOCOL_VERSION, addr: address(), forward: true });
    let (Response::Pd(pd), _) = call(&fd, Request::AllocPd) else { panic!() };
    let (Response::Cq(cq), _) = call(&fd, Request::CreateCq { capacity: 4, channel: None }) else { panic!() };
    let (Response::Qp(layout), _) = call(&fd, Request::CreateQp { init: qp_init(QpType::Rc, pd, cq.cq), blocks: None })
    else {
        panic!()
    };
    for len in [0, 5, 11, 71] {
        let (send, _) = call(&fd, Request::PostSend { qpn: layout.qpn, wqe: vec![0; len] });
        let Response::Error(e) = send else { panic!("a {len}-byte send WQE was accepted: {send:?}") };
        assert!(e.message.contains(&format!("{len} bytes, shorter than the entry's 72")), "{e:?}");
        let (recv, _) = call(&fd, Request::PostRecv { qpn: layout.qpn, wqe: vec![0; len.min(15)] });
        let Response::Error(e) = recv else { panic!("a short receive WQE was accepted: {recv:?}") };
        assert!(e.message.contains("shorter than the entry's 16"), "{e:?}");
    }
    // The same connection still serves.
    assert!(matches!(call(&fd, Request::AllocPd).0, Response::Pd(_)));
    drop(fd);
    still_serves(socket);
}

/// rdma_cm's QP1 through the daemon: an address's device has one, so the
/// first tenant on the address gets it, a second is refused (EBUSY, and
/// how to do without, after waiting for the holder to leave), and one
/// that asks the moment its holder's connection closes gets it: the
/// daemon frees it first and the asker waits for that.
#[test]
fn the_gsi_qp_of_an_address_is_one_tenants_at_a_time() {
    let daemon = daemon("gsi");
    let socket = daemon.socket();
    let addr = address();
    let ask = |fd: &OwnedFd| {
        let (opened, _) = call(fd, Request::Open { version: PROTOCOL_VERSION, addr, forward: false });
        assert!(matches!(opened, Response::Opened(_)), "{opened:?}");
        let (Response::Pd(pd), _) = call(fd, Request::AllocPd) else { panic!() };
        let (Response::Cq(cq), _) = call(fd, Request::CreateCq { capacity: 16, channel: None }) else { panic!() };
        call(fd, Request::CreateGsiQp { init: qp_init(QpType::Ud, pd, cq.cq) }).0
    };
    // The holder has a thousand other QPs to free when it leaves.
    let holder = raw_connect(socket);
    let held = ask(&holder);
    assert!(matches!(held, Response::Qp(ref layout) if layout.qpn == 1), "{held:?}");
    let (Response::Pd(pd), _) = call(&holder, Request::AllocPd) else { panic!() };
    let (Response::Cq(cq), _) = call(&holder, Request::CreateCq { capacity: 16, channel: None }) else { panic!() };
    for _ in 0..1000 {
        let init = qp_init(QpType::Rc, pd, cq.cq);
        assert!(matches!(call(&holder, Request::CreateQp { init, blocks: None }).0, Response::Qp(_)));
    }
    let refused = ask(&raw_connect(socket));
    let Response::Error(e) = refused else { panic!("a second QP1 on {addr}: {refused:?}") };
    assert_eq!(e.kind, protocol::ErrorKind::Busy);
    assert!(e.into_verbs().to_string().contains("give each program an address of its own"));
    // Another address has a QP1 of its own.
    let elsewhere = raw_connect(socket);
    call(&elsewhere, Request::Open { version: PROTOCOL_VERSION, addr: address(), forward: false });
    let next = raw_connect(socket);
    drop(holder);
    let passed_on = ask(&next);
    assert!(matches!(passed_on, Response::Qp(ref layout) if layout.qpn == 1), "{passed_on:?}");
    assert_eq!(daemon.processor_restarts(), 0);
}

/// The child's part of the next test: a tenant that writes to its peer
/// until it is killed.
fn child(socket: &Path, addr: IpAddr) {
    let me = Tenant::open(socket, addr);
    println!("ENDPOINT {} {} {}", me.qp.qpn, me.psn.value(), me.iova(0));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    let (peer, qpn, psn, rkey, iova) = (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
        f[4].parse().unwrap(),
    );
    me.connect_to(peer, qpn, Psn::new(psn));
    me.write(0, &pattern(4096, 3));
    for n in 0u64.. {
        let remote = RemoteAddr { addr: iova, rkey };
        let mut wr = SendWorkRequest::new(n, SendOp::Write { remote, imm: None }, me.sge(0, 4096));
        wr.signaled = n % 16 == 0;
        while me.session.post_send(&me.qp, &wr).is_err() {
            let mut out = Vec::new();
            me.cq.poll(16, &mut out);
        }
    }
}

#[test]
fn a_killed_client_leaves_its_peer_flushed_and_the_daemon_serving() {
    const CHILD: &str = "SOFTRNICD_TEST_CHILD";
    if let Ok(spec) = std::env::var(CHILD) {
        let (socket, addr) = spec.split_once(',').unwrap();
        return child(Path::new(socket), addr.parse().unwrap());
    }
    let daemon = daemon("killed");
    let socket = daemon.socket();
    let child_addr = address();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_killed_client_leaves_its_peer_flushed_and_the_daemon_serving", "--nocapture"])
        .env(CHILD, format!("{},{child_addr}", socket.display()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let endpoint =
        lines.by_ref().map(Result::unwrap).find(|l| l.starts_with("ENDPOINT")).expect("the child's endpoint");
    let f: Vec<u64> = endpoint.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    let me = Tenant::open(socket, address());
    me.connect_to(child_addr, f[0] as u32, Psn::new(f[1] as u32));
    me.session.post_recv(&me.qp, &RecvWorkRequest { wr_id: 77, sges: smallvec![] }).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{} {} {} {} {}", me.session.addr(), me.qp.qpn, me.psn.value(), me.keys.rkey, me.iova(0)).unwrap();
    // Mid-transfer: the child's writes are landing.
    let deadline = Instant::now() + Duration::from_secs(10);
    while me.read(0, 4096) != pattern(4096, 3) {
        assert!(Instant::now() < deadline, "the child's writes never arrived");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(daemon.served().0, 2);
    child.kill().unwrap();
    child.wait().unwrap();
    // The daemon frees the child's QP and CQ.
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.served() != (1, 1) {
        assert!(Instant::now() < deadline, "still served: {:?}", daemon.served());
        std::thread::sleep(Duration::from_millis(5));
    }
    // Our side: a send to the dead peer exhausts its retries, and
    // everything else flushes, the posted receive too.
    let remote = RemoteAddr { addr: f[2], rkey: 0 };
    let mut wr = SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, me.sge(0, 8));
    wr.signaled = true;
    me.session.post_send(&me.qp, &wr).unwrap();
    let done = me.wait(2);
    let (send, recv): (Vec<&Completion>, Vec<&Completion>) = done.iter().partition(|c| c.wr_id == 1);
    assert_eq!(send[0].status, WcStatus::RetryExcErr, "{done:?}");
    assert_eq!((recv[0].wr_id, recv[0].status), (77, WcStatus::WrFlushErr), "{done:?}");
    still_serves(socket);
}
