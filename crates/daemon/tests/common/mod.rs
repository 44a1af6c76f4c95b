//! What the daemon's tests share: a daemon of their own, and well-behaved
//! tenants to drive it.
#![allow(dead_code)]

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
    Access, Completion, MrKeys, Mtu, Payload, PdId, Psn, QpCaps, QpInitAttr, QpState, QpType, RcConnection, Sge,
    smallvec,
};

pub static NEXT: AtomicU8 = AtomicU8::new(10);

/// A fresh loopback address per device, so tests run side by side.
pub fn address() -> IpAddr {
    IpAddr::from([127, 0, 9, NEXT.fetch_add(1, Ordering::Relaxed)])
}

pub fn daemon(name: &str) -> Running {
    daemon_with(name, DaemonConfig::default())
}

pub fn daemon_with(name: &str, config: DaemonConfig) -> Running {
    let socket = std::env::temp_dir().join(format!("softrnicd-test-{}-{name}.sock", std::process::id()));
    Daemon::bind(DaemonOptions { socket, engine_threads: 1, config }).unwrap().start().unwrap()
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

    pub fn iova(&self, offset: usize) -> u64 {
        self.memory.as_ptr() as u64 + offset as u64
    }

    pub fn sge(&self, offset: usize, len: u32) -> Payload {
        Payload::Gather(smallvec![Sge { addr: self.iova(offset), length: len, lkey: self.keys.lkey }])
    }

    /// Connects to `peer`, quick to give up on a dead one.
    pub fn connect(&self, peer: &Tenant) {
        self.connect_to(peer.session.addr(), peer.qp.qpn, peer.psn);
    }

    pub fn connect_to(&self, addr: IpAddr, qpn: u32, psn: Psn) {
        let steps = RcConnection {
            access: Access::REMOTE,
            remote_addr: addr,
            dest_qpn: qpn,
            rq_psn: psn,
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

    pub fn wait(&self, n: usize) -> Vec<Completion> {
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

    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.memory.bytes(offset, len).read(0, &mut out);
        out
    }

    pub fn write(&self, offset: usize, bytes: &[u8]) {
        self.memory.bytes(offset, bytes.len()).write(0, bytes);
    }
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
