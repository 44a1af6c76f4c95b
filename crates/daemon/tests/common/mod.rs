//! What the daemon's tests share: a daemon of their own, and well-behaved
//! tenants to drive it.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::offload::Designs;
use softrnic_daemon::server::{Daemon, DaemonOptions, Running};
use softrnic_daemon_protocol::shared_memory::SharedMapping;
use softrnic_provider::client::{Cq, Qp, Session};
use softrnic_transport::{
    Access, Completion, CqId, MrKeys, Mtu, Payload, PdId, Psn, QpCaps, QpInitAttr, QpState, QpType, RcConnection,
    RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, WcOpcode, WcStatus, smallvec,
};

pub static NEXT: AtomicU8 = AtomicU8::new(10);

/// A fresh loopback address per device, so tests run side by side.
/// An RC QP of `pd` with both queues' completions on `cq`, default caps,
/// its own receive queue.
pub fn rc_init(pd: PdId, cq: CqId) -> QpInitAttr {
    QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps::default(),
        sq_sig_all: false,
        srq: None,
    }
}

pub fn address() -> IpAddr {
    IpAddr::from([127, 0, 9, NEXT.fetch_add(1, Ordering::Relaxed)])
}

pub fn daemon(name: &str) -> Running {
    daemon_with(name, DaemonConfig::default())
}

pub fn daemon_with(name: &str, config: DaemonConfig) -> Running {
    daemon_designed(name, config, Designs::default())
}

/// A daemon with the offloaded stack's `designs`. Its two command
/// processors share the devices, so the two ends of a test's pair are
/// served by threads of their own, at once.
pub fn daemon_designed(name: &str, config: DaemonConfig, designs: Designs) -> Running {
    start(DaemonOptions { processors: PROCESSORS, config, designs, ..DaemonOptions::at(socket(name)) })
}

/// Command processors of the tests' daemons.
pub const PROCESSORS: usize = 2;

/// A daemon running its embedded switch.
pub fn daemon_switched(name: &str) -> Running {
    start(DaemonOptions { processors: PROCESSORS, embedded_switch: true, ..DaemonOptions::at(socket(name)) })
}

fn socket(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("softrnicd-test-{}-{name}.sock", std::process::id()))
}

fn start(options: DaemonOptions) -> Running {
    Daemon::bind(options).unwrap().start().unwrap()
}

pub const REGION: usize = 1 << 16;

/// One tenant with a region, a CQ and an RC QP.
pub struct Tenant {
    pub session: Arc<Session>,
    pub pd: PdId,
    pub memory: SharedMapping,
    pub keys: MrKeys,
    pub cq: Cq,
    pub qp: Qp,
    pub psn: Psn,
}

impl Tenant {
    pub fn open(socket: &Path, addr: IpAddr) -> Tenant {
        Tenant::open_with(socket, addr, false)
    }

    /// A tenant that forwards its data commands over the socket, or not.
    pub fn open_with(socket: &Path, addr: IpAddr, forward: bool) -> Tenant {
        let session = Arc::new(Session::connect_with(socket, addr, forward).unwrap());
        let pd = session.alloc_pd().unwrap();
        let memory = SharedMapping::create("test-region", REGION).unwrap();
        let iova = memory.as_ptr() as u64;
        let keys = session.register_memory(pd, &memory, 0, REGION, iova, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
        let cq = session.create_cq(256, None).unwrap();
        let qp = session.create_qp(rc_init(pd, cq.id)).unwrap();
        Tenant { session, pd, memory, keys, cq, qp, psn: Psn::new(fastrand_psn()) }
    }

    pub fn iova(&self, offset: usize) -> u64 {
        self.memory.as_ptr() as u64 + offset as u64
    }

    pub fn sge(&self, offset: usize, len: u32) -> Payload {
        Payload::Gather(smallvec![Sge { addr: self.iova(offset), length: len, lkey: self.keys.lkey }])
    }

    /// Connects to `peer`.
    pub fn connect(&self, peer: &Tenant) {
        self.connect_to(peer.session.addr(), peer.qp.qpn, peer.psn);
    }

    /// Connects to a peer known by its numbers, with a 67 ms timeout and 7
    /// retries: the tests run side by side on two cores, and a 4 ms timeout
    /// with 3 retries gave up on live peers there. A dead peer takes half a
    /// second to fail.
    pub fn connect_to(&self, addr: IpAddr, qpn: u32, psn: Psn) {
        connect_qp(&self.session, &self.qp, self.psn, (addr, qpn, psn), (14, 7));
    }

    pub fn wait(&self, n: usize) -> Vec<Completion> {
        self.wait_up_to(n, Duration::from_secs(10))
    }

    /// [`Tenant::wait`] with a deadline of `limit`.
    pub fn wait_up_to(&self, n: usize, limit: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + limit;
        let mut out = Vec::new();
        while out.len() < n {
            assert!(Instant::now() < deadline, "{} of {n} completions after {limit:?}: {out:?}", out.len());
            if self.cq.poll(n - out.len(), &mut out) == 0 {
                std::thread::yield_now();
            }
        }
        out
    }

    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.memory.bytes(offset, len).read(0, &mut out);
        out
    }

    pub fn write(&self, offset: usize, bytes: &[u8]) {
        self.memory.bytes(offset, bytes.len()).write(0, bytes);
    }
}

/// Brings `qp` (first PSN `sq_psn`) to RTS towards the `peer`'s QP
/// `(address, QPN, first PSN)`, with the RC `(timeout, retry_cnt)` given
/// and RNR retries without end.
pub fn connect_qp(session: &Session, qp: &Qp, sq_psn: Psn, peer: (IpAddr, u32, Psn), (timeout, retry_cnt): (u8, u8)) {
    let steps = RcConnection {
        access: Access::REMOTE,
        remote_addr: peer.0,
        dest_qpn: peer.1,
        rq_psn: peer.2,
        sq_psn,
        mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 16,
        max_rd_atomic: 16,
        min_rnr_timer: 1,
        timeout,
        retry_cnt,
        rnr_retry: 7,
        selective_repeat: false,
        authenticate: false,
    }
    .steps();
    for attr in &steps {
        session.modify_qp(qp, attr).unwrap();
    }
    assert_eq!(qp.state(), QpState::Rts);
}

pub fn fastrand_psn() -> u32 {
    (std::process::id().wrapping_mul(2654435761) ^ NEXT.load(Ordering::Relaxed) as u32) & 0xff_ffff
}

pub fn pair(socket: &Path) -> (Tenant, Tenant) {
    let (a, b) = (Tenant::open(socket, address()), Tenant::open(socket, address()));
    a.connect(&b);
    b.connect(&a);
    (a, b)
}

pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
}

/// Every operation between two tenants of the daemon on `socket`, each
/// result checked.
pub fn every_operation(socket: &Path) {
    let (a, b) = pair(socket);

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

/// Ping-pong where each receive is written to the ring just before the
/// SEND that needs it leaves the peer: the message can arrive before the
/// processor's pass has moved the receive into the engine, and the engine
/// then fetches it from the ring itself (as a NIC does), so no message is
/// RNR NAKed. 2000 rounds: without the fetch, a few of them were.
pub fn receives_posted_just_in_time(daemon: &Running) {
    let (a, b) = pair(daemon.socket());
    for i in 0..2000u64 {
        let recv =
            RecvWorkRequest { wr_id: i, sges: smallvec![Sge { addr: b.iova(0), length: 64, lkey: b.keys.lkey }] };
        b.session.post_recv(&b.qp, &recv).unwrap();
        let mut send = SendWorkRequest::new(i, SendOp::Send { imm: None }, a.sge(0, 64));
        send.signaled = true;
        a.session.post_send(&a.qp, &send).unwrap();
        let (sent, received) = (a.wait(1), b.wait(1));
        assert_eq!((sent[0].wr_id, sent[0].status), (i, WcStatus::Success));
        assert_eq!((received[0].wr_id, received[0].status, received[0].byte_len), (i, WcStatus::Success, 64));
    }
    let c = daemon.counters(b.session.addr()).unwrap();
    assert_eq!(c.transport.rnr_naks_sent, 0, "{c:?}");
}
