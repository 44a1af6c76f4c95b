//! A small harness for hand-written scenarios: two hosts, one connected RC
//! pair (or UD QPs), a registered buffer on each side, and helpers to post
//! and wait. The protocol and protection tests are written with it.

use std::net::SocketAddr;
use std::sync::Arc;

use softrnic_transport::{
    Access, Completion, CqId, DmaBuffer, MrKeys, Mtu, Payload, PdId, Psn, QpCaps, QpInitAttr, QpState, QpType,
    RcConnection, RecvWorkRequest, Registration, SendOp, SendWorkRequest, Sge, SrqAttr, SrqId, TransportConfig,
    ud_steps,
};

use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::icrc::UdpFlow;
use softrnic_wire::packet::Headers;

use crate::network::Faults;
use crate::world::World;

/// Start of every harness region in its owner's address space.
pub const IOVA: u64 = 0x1000_0000;

/// One side of a connection.
#[derive(Debug)]
pub struct Side {
    pub host: usize,
    pub pd: PdId,
    pub cq: CqId,
    pub qpn: u32,
    pub buffer: Arc<DmaBuffer>,
    pub mr: MrKeys,
    /// The shared receive queue the QP takes receives from, if any.
    pub srq: Option<SrqId>,
}

impl Side {
    /// An SGE over `len` bytes of this side's region from `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge { addr: IOVA + offset, length: len, lkey: self.mr.lkey }
    }

    pub fn gather(&self, offset: u64, len: u32) -> Payload {
        Payload::Gather(softrnic_transport::smallvec![self.sge(offset, len)])
    }
}

/// The first PSN of the QP numbered `qpn` in a [`Pair`]: a function of the
/// number, so that a test can forge a packet at a PSN the responder
/// expects.
pub fn first_psn(qpn: u32) -> Psn {
    Psn::new(qpn.wrapping_mul(1000))
}

/// Two hosts with a connected pair of QPs.
#[derive(Debug)]
pub struct Pair {
    pub world: World,
    pub a: Side,
    pub b: Side,
}

/// How to build a [`Pair`].
#[derive(Debug, Clone)]
pub struct PairOptions {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub region_len: usize,
    pub access: Access,
    pub faults: Faults,
    pub seed: u64,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub config: TransportConfig,
    /// Give host 1's QP a shared receive queue (of 64 requests).
    pub srq: bool,
    /// Recover by selective repeat rather than go-back-N.
    pub selective_repeat: bool,
    /// Authenticate every packet (the config must hold the shared secret).
    pub authenticate: bool,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            region_len: 64 * 1024,
            access: Access::LOCAL_WRITE | Access::REMOTE,
            faults: Faults::NONE,
            seed: 1,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            config: TransportConfig::default(),
            srq: false,
            selective_repeat: false,
            authenticate: false,
        }
    }
}

/// Connects QP `qpn` of `host` to `dest_qpn` on the other host, both
/// starting at PSN `psn`, with the harness's usual limits and timers.
pub fn connect_rc(world: &mut World, host: usize, qpn: u32, dest_qpn: u32, psn: Psn, mtu: Mtu) {
    connect_rc_to(world, host, qpn, 1 - host, dest_qpn, psn, mtu);
}

/// [`connect_rc`] to `dest_qpn` on `remote_host`, which may be `host`
/// itself (a QP connected to itself, as softrnicd's copy engine is).
pub fn connect_rc_to(world: &mut World, host: usize, qpn: u32, remote_host: usize, dest_qpn: u32, psn: Psn, mtu: Mtu) {
    let connection = RcConnection {
        access: Access::REMOTE,
        remote_addr: world.ip(remote_host),
        dest_qpn,
        rq_psn: psn,
        sq_psn: psn,
        mtu,
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        selective_repeat: false,
        authenticate: false,
    };
    let now = world.now;
    for attr in connection.steps() {
        world.device(host).modify_qp(now, qpn, &attr).expect("modify_qp");
    }
}

/// The Q_Key harness UD QPs use.
pub const QKEY: u32 = 0x1111_1111;

impl Pair {
    pub fn new(options: PairOptions) -> Pair {
        let mut world = World::with_config(2, options.faults, options.seed, options.config.clone());
        let [a, b] = [0, 1].map(|host| {
            let device = world.device(host);
            let pd = device.alloc_pd();
            let cq = device.create_cq(4096);
            let buffer = Arc::new(DmaBuffer::new(options.region_len));
            let mr = device
                .register_memory(Registration {
                    pd,
                    buffer: buffer.clone(),
                    offset: 0,
                    len: options.region_len,
                    iova: IOVA,
                    access: options.access,
                })
                .expect("register");
            let caps = QpCaps { max_send_wr: 128, max_recv_wr: 128, ..QpCaps::default() };
            let srq = (options.srq && host == 1)
                .then(|| device.create_srq(pd, SrqAttr { max_wr: 64, max_sge: 4, limit: 0 }).expect("create_srq"));
            let init =
                QpInitAttr { qp_type: options.qp_type, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq };
            let qpn = device.create_qp(init).expect("create_qp");
            Side { host, pd, cq, qpn, buffer, mr, srq }
        });
        let mut pair = Pair { world, a, b };
        pair.connect(&options);
        pair
    }

    fn connect(&mut self, o: &PairOptions) {
        let now = self.world.now;
        for (me, peer) in [(&self.a, &self.b), (&self.b, &self.a)] {
            let peer_ip = self.world.ip(peer.host);
            let device = self.world.device(me.host);
            let steps = match o.qp_type {
                // UC connects as RC does; its responder ignores what it lacks.
                QpType::Rc | QpType::Uc => RcConnection {
                    access: Access::REMOTE,
                    remote_addr: peer_ip,
                    dest_qpn: peer.qpn,
                    rq_psn: first_psn(peer.qpn),
                    sq_psn: first_psn(me.qpn),
                    mtu: o.mtu,
                    max_dest_rd_atomic: 16,
                    max_rd_atomic: 16,
                    min_rnr_timer: o.min_rnr_timer,
                    timeout: o.timeout,
                    retry_cnt: o.retry_cnt,
                    rnr_retry: o.rnr_retry,
                    selective_repeat: o.selective_repeat,
                    authenticate: o.authenticate,
                }
                .steps(),
                QpType::Ud => ud_steps(QKEY, Psn::new(0)),
            };
            for attr in steps {
                device.modify_qp(now, me.qpn, &attr).expect("modify_qp");
            }
        }
    }

    pub fn side(&self, host: usize) -> &Side {
        if host == 0 { &self.a } else { &self.b }
    }

    /// Posts a signalled send work request from `host`.
    pub fn post(&mut self, host: usize, wr_id: u64, op: SendOp, payload: Payload) {
        self.post_wr(host, SendWorkRequest::new(wr_id, op, payload));
    }

    pub fn post_wr(&mut self, host: usize, wr: SendWorkRequest) {
        let (now, qpn) = (self.world.now, self.side(host).qpn);
        self.world.device(host).post_send(now, qpn, wr).expect("post_send");
    }

    /// Posts a receive of `len` bytes at `offset` on `host`.
    pub fn post_recv(&mut self, host: usize, wr_id: u64, offset: u64, len: u32) {
        let (now, qpn) = (self.world.now, self.side(host).qpn);
        let sges = vec![self.side(host).sge(offset, len)];
        self.world.device(host).post_recv(now, qpn, RecvWorkRequest { wr_id, sges: sges.into() }).expect("post_recv");
    }

    /// Runs until `host` has `n` completions (or nothing is left to do) and
    /// returns them.
    pub fn wait(&mut self, host: usize, n: usize) -> Vec<Completion> {
        let cq = self.side(host).cq;
        let mut got = Vec::new();
        self.world.run_until(
            |world| {
                world.device(host).poll_cq(cq, usize::MAX, &mut got);
                got.len() >= n
            },
            1_000_000,
        );
        got
    }

    /// Runs until nothing is left to happen, and returns the completions of
    /// both sides.
    pub fn settle(&mut self) -> [Vec<Completion>; 2] {
        while self.world.step() {}
        [0, 1].map(|host| {
            let cq = self.side(host).cq;
            let mut out = Vec::new();
            self.world.device(host).poll_cq(cq, usize::MAX, &mut out);
            out
        })
    }

    pub fn state(&mut self, host: usize) -> QpState {
        let qpn = self.side(host).qpn;
        self.world.device(host).qp(qpn).expect("qp").state()
    }

    /// Hands host 1 a packet with a valid ICRC, as if from host 0: a
    /// hostile one, or a repeat the network never made.
    pub fn inject(&mut self, headers: &Headers, payload: &[u8]) {
        let from = self.world.hosts[0].addr;
        self.inject_from(from, headers, payload);
    }

    /// [`Pair::inject`], as if from `from`.
    pub fn inject_from(&mut self, from: SocketAddr, headers: &Headers, payload: &[u8]) {
        self.deliver(1, from, headers, payload);
    }

    /// Hands `host` a packet with a valid ICRC, as if from the other host.
    pub fn inject_into(&mut self, host: usize, headers: &Headers, payload: &[u8]) {
        let from = self.world.hosts[1 - host].addr;
        self.deliver(host, from, headers, payload);
    }

    fn deliver(&mut self, host: usize, from: SocketAddr, headers: &Headers, payload: &[u8]) {
        let mut buf = vec![0u8; headers.len() + payload.len() + 8];
        let len = headers.emit_packet(&mut buf, payload).expect("the packet fits");
        let to = self.world.ip(host);
        UdpFlow { src: from.ip(), dst: to, src_port: from.port(), dst_port: ROCEV2_UDP_PORT }
            .seal(&mut buf[..len])
            .expect("a RoCEv2 packet");
        let now = self.world.now;
        self.world.device(host).handle_datagram(now, from, Default::default(), &buf[..len]);
    }
}
