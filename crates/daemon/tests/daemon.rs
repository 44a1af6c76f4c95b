//! softrnicd end to end: tenants that reach one daemon over its socket and
//! move data through shared queues, and tenants that misbehave.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use softrnic_daemon::client::{Cq, Qp, Session};
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::{Daemon, DaemonOptions, Running};
use softrnic_daemon::shared_memory::SharedMapping;
use softrnic_transport::{
    Access, Completion, MrKeys, Mtu, Payload, PdId, Psn, QpCaps, QpInitAttr, QpState, QpType, RcConnection,
    RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, WcOpcode, WcStatus, smallvec,
};

static NEXT: AtomicU8 = AtomicU8::new(10);

/// A fresh loopback address per device, so tests run side by side.
fn address() -> IpAddr {
    IpAddr::from([127, 0, 9, NEXT.fetch_add(1, Ordering::Relaxed)])
}

fn daemon(name: &str) -> Running {
    daemon_with(name, DaemonConfig::default())
}

fn daemon_with(name: &str, config: DaemonConfig) -> Running {
    let socket = std::env::temp_dir().join(format!("softrnicd-test-{}-{name}.sock", std::process::id()));
    Daemon::bind(DaemonOptions { socket, engine_threads: 1, config }).unwrap().start().unwrap()
}

const REGION: usize = 1 << 16;

/// One tenant with a region, a CQ and an RC QP.
struct Tenant {
    session: Arc<Session>,
    pd: PdId,
    memory: SharedMapping,
    keys: MrKeys,
    cq: Cq,
    qp: Qp,
    psn: Psn,
}

impl Tenant {
    fn open(socket: &Path, addr: IpAddr) -> Tenant {
        let session = Arc::new(Session::connect(socket, addr).unwrap());
        let pd = session.alloc_pd().unwrap();
        let memory = SharedMapping::create("test-region", REGION).unwrap();
        let iova = memory.as_ptr() as u64;
        let keys = session.register_memory(pd, &memory, 0, REGION, iova, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
        let cq = session.create_cq(256, None).unwrap();
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq.id,
            recv_cq: cq.id,
            caps: QpCaps::default(),
            sq_sig_all: false,
            srq: None,
        };
        let qp = session.create_qp(init).unwrap();
        Tenant { session, pd, memory, keys, cq, qp, psn: Psn::new(fastrand_psn()) }
    }

    fn iova(&self, offset: usize) -> u64 {
        self.memory.as_ptr() as u64 + offset as u64
    }

    fn sge(&self, offset: usize, len: u32) -> Payload {
        Payload::Gather(smallvec![Sge { addr: self.iova(offset), length: len, lkey: self.keys.lkey }])
    }

    /// Connects to `peer`, quick to give up on a dead one.
    fn connect(&self, peer: &Tenant) {
        let steps = RcConnection {
            access: Access::REMOTE,
            remote_addr: peer.session.addr(),
            dest_qpn: peer.qp.qpn,
            rq_psn: peer.psn,
            sq_psn: self.psn,
            mtu: Mtu::Mtu1024,
            max_dest_rd_atomic: 16,
            max_rd_atomic: 16,
            min_rnr_timer: 1,
            timeout: 10,
            retry_cnt: 3,
            rnr_retry: 7,
            selective_repeat: false,
        }
        .steps();
        for attr in &steps {
            self.session.modify_qp(&self.qp, attr).unwrap();
        }
        assert_eq!(self.qp.state(), QpState::Rts);
    }

    fn wait(&self, n: usize) -> Vec<Completion> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            assert!(Instant::now() < deadline, "{} of {n} completions after 10 s: {out:?}", out.len());
            if self.cq.poll(n - out.len(), &mut out) == 0 {
                std::thread::yield_now();
            }
        }
        out
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.memory.bytes(offset, len).read(0, &mut out);
        out
    }

    fn write(&self, offset: usize, bytes: &[u8]) {
        self.memory.bytes(offset, bytes.len()).write(0, bytes);
    }
}

fn fastrand_psn() -> u32 {
    (std::process::id().wrapping_mul(2654435761) ^ NEXT.load(Ordering::Relaxed) as u32) & 0xff_ffff
}

fn pair(socket: &Path) -> (Tenant, Tenant) {
    let (a, b) = (Tenant::open(socket, address()), Tenant::open(socket, address()));
    a.connect(&b);
    b.connect(&a);
    (a, b)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
}

#[test]
fn two_tenants_move_every_operation_through_shared_queues() {
    let daemon = daemon("ops");
    let (a, b) = pair(daemon.socket());

    // WRITE with immediate: lands in place and consumes a receive.
    let data = pattern(5000, 1);
    a.write(0, &data);
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 70, sges: smallvec![] }).unwrap();
    let write = SendOp::Write { remote: RemoteAddr { addr: b.iova(8192), rkey: b.keys.rkey }, imm: Some(0x1234) };
    let mut wr = SendWorkRequest::new(1, write, a.sge(0, 5000));
    wr.signaled = true;
    a.session.post_send(&a.qp, &wr).unwrap();
    let done = a.wait(1);
    assert_eq!((done[0].wr_id, done[0].status, done[0].opcode), (1, WcStatus::Success, WcOpcode::RdmaWrite));
    let got = b.wait(1);
    assert_eq!((got[0].wr_id, got[0].opcode, got[0].imm_data), (70, WcOpcode::RecvRdmaWithImm, Some(0x1234)));
    assert_eq!(b.read(8192, 5000), data);

    // SEND into a posted receive, two SGEs.
    let message = pattern(3000, 2);
    a.write(100, &message);
    let sges = smallvec![
        Sge { addr: b.iova(20000), length: 1000, lkey: b.keys.lkey },
        Sge { addr: b.iova(30000), length: 4000, lkey: b.keys.lkey }
    ];
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 71, sges }).unwrap();
    a.session.post_send(&a.qp, &SendWorkRequest::new(2, SendOp::Send { imm: None }, a.sge(100, 3000))).unwrap();
    let got = b.wait(1);
    assert_eq!((got[0].wr_id, got[0].byte_len, got[0].status), (71, 3000, WcStatus::Success));
    assert_eq!(b.read(20000, 1000), message[..1000]);
    assert_eq!(b.read(30000, 2000), message[1000..]);
    a.wait(1);

    // Inline SEND, READ, and both atomics.
    b.session
        .post_recv(
            &b.qp,
            &RecvWorkRequest { wr_id: 72, sges: smallvec![Sge { addr: b.iova(0), length: 64, lkey: b.keys.lkey }] },
        )
        .unwrap();
    let inline = Payload::Inline(softrnic_transport::InlineData::from_slice(b"inline bytes"));
    a.session.post_send(&a.qp, &SendWorkRequest::new(3, SendOp::Send { imm: None }, inline)).unwrap();
    assert_eq!(b.wait(1)[0].byte_len, 12);
    assert_eq!(b.read(0, 12), b"inline bytes");
    let remote = RemoteAddr { addr: b.iova(30000), rkey: b.keys.rkey };
    a.session.post_send(&a.qp, &SendWorkRequest::new(4, SendOp::Read { remote }, a.sge(40000, 2000))).unwrap();
    b.write(40000, &7u64.to_le_bytes());
    let counter = RemoteAddr { addr: b.iova(40000), rkey: b.keys.rkey };
    let add = SendOp::FetchAdd { remote: counter, add: 5 };
    a.session.post_send(&a.qp, &SendWorkRequest::new(5, add, a.sge(50000, 8))).unwrap();
    let swap = SendOp::CompareSwap { remote: counter, compare: 12, swap: 99 };
    a.session.post_send(&a.qp, &SendWorkRequest::new(6, swap, a.sge(50008, 8))).unwrap();
    let done = a.wait(4);
    assert!(done.iter().all(|c| c.status == WcStatus::Success), "{done:?}");
    assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [3, 4, 5, 6], "in order");
    assert_eq!(a.read(40000, 2000), message[1000..]);
    assert_eq!(a.read(50000, 8), 7u64.to_le_bytes(), "fetch-add returns the old value");
    assert_eq!(a.read(50008, 8), 12u64.to_le_bytes());
    assert_eq!(b.read(40000, 8), 99u64.to_le_bytes());
}

#[test]
fn a_window_of_writes_arrives_whole_and_in_order() {
    let daemon = daemon("window");
    let (a, b) = pair(daemon.socket());
    for round in 0..20u8 {
        let data = pattern(REGION / 2, round);
        a.write(0, &data);
        // 128 writes of 256 bytes, signalled every 16th.
        for i in 0..128usize {
            let remote = RemoteAddr { addr: b.iova(i * 256), rkey: b.keys.rkey };
            let mut wr = SendWorkRequest::new(i as u64, SendOp::Write { remote, imm: None }, a.sge(i * 256, 256));
            wr.signaled = i % 16 == 15;
            loop {
                match a.session.post_send(&a.qp, &wr) {
                    Ok(()) => break,
                    Err(softrnic_transport::VerbsError::OutOfResources(_)) => {
                        let mut out = Vec::new();
                        a.cq.poll(16, &mut out);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.last().map(|c: &Completion| c.wr_id) != Some(127) {
            assert!(Instant::now() < deadline);
            a.cq.poll(16, &mut done);
        }
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(b.read(0, 128 * 256), data[..128 * 256], "round {round}");
    }
}

#[test]
fn a_guessed_rkey_of_another_tenant_is_a_remote_access_error() {
    let daemon = daemon("rkey");
    let socket = daemon.socket();
    let (a, b) = pair(socket);
    // A third tenant on b's very device, with memory of its own.
    let victim = Tenant::open(socket, b.session.addr());
    victim.write(0, &[0x5a; 64]);
    let remote = RemoteAddr { addr: victim.iova(0), rkey: victim.keys.rkey };
    a.write(0, &[0xff; 64]);
    let mut wr = SendWorkRequest::new(9, SendOp::Write { remote, imm: None }, a.sge(0, 64));
    wr.signaled = true;
    a.session.post_send(&a.qp, &wr).unwrap();
    let done = a.wait(1);
    assert_eq!(done[0].status, WcStatus::RemAccessErr, "{done:?}");
    assert_eq!(victim.read(0, 64), [0x5a; 64], "untouched");
    // Nor may a tenant use another's keys or objects locally.
    let stolen = Payload::Gather(smallvec![Sge { addr: victim.iova(0), length: 8, lkey: victim.keys.lkey }]);
    let other = Tenant::open(socket, address());
    assert!(other.session.destroy_qp(victim.qp.qpn).is_err(), "another tenant's QP is unknown");
    assert!(other.session.deregister_memory(victim.keys.lkey).is_err(), "and its region");
    assert!(other.session.dealloc_pd(victim.pd).is_err(), "and its PD");
    let c = Tenant::open(socket, address());
    other.connect(&c);
    other.session.post_send(&other.qp, &SendWorkRequest::new(10, SendOp::Send { imm: None }, stolen)).unwrap();
    let done = other.wait(1);
    assert_eq!(done[0].status, WcStatus::LocProtErr, "a stolen lkey: {done:?}");
}

#[test]
fn limits_refuse_what_exceeds_them() {
    let config = DaemonConfig::parse("[tenant]\nmax_qps = 1\nmax_memory_mib = 1\n").unwrap();
    let daemon = daemon_with("limits", config);
    let t = Tenant::open(daemon.socket(), address());
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        pd: t.pd,
        send_cq: t.cq.id,
        recv_cq: t.cq.id,
        caps: QpCaps::default(),
        sq_sig_all: false,
        srq: None,
    };
    let e = t.session.create_qp(init).err().unwrap();
    assert!(e.to_string().contains("at most 1 QPs"), "{e}");
    let big = SharedMapping::create("big", 2 << 20).unwrap();
    let e = t.session.register_memory(t.pd, &big, 0, 2 << 20, 0, Access::LOCAL_WRITE).unwrap_err();
    assert!(e.to_string().contains("MiB registered"), "{e}");
}

#[test]
fn a_departed_tenant_frees_what_it_held_and_its_peer_flushes() {
    let daemon = daemon("departed");
    let (a, b) = pair(daemon.socket());
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 1, sges: smallvec![] }).unwrap();
    let b_addr = b.session.addr();
    drop(b);
    // The peer's requests now go unanswered: it retries, then fails.
    let remote = RemoteAddr { addr: 0, rkey: 0 };
    for wr_id in 0..4 {
        let mut wr = SendWorkRequest::new(wr_id, SendOp::Write { remote, imm: None }, a.sge(0, 8));
        wr.signaled = true;
        a.session.post_send(&a.qp, &wr).unwrap();
    }
    let done = a.wait(4);
    assert_eq!(done[0].status, WcStatus::RetryExcErr, "{done:?}");
    assert!(done[1..].iter().all(|c| c.status == WcStatus::WrFlushErr), "{done:?}");
    // The departed tenant's address serves a new tenant at once.
    let again = Tenant::open(daemon.socket(), b_addr);
    again.connect(&a);
    assert_eq!(again.qp.state(), QpState::Rts);
}
