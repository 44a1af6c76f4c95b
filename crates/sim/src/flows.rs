//! Long RC WRITE flows between the hosts of a fabric world: what the FCT
//! and incast experiments drive. Every host registers one region that is
//! the source and target of all its flows' WRITEs (the bytes are not what
//! these experiments measure), and one CQ for all its QPs.

use std::sync::Arc;

use softrnic_transport::{
    Access, CqId, DmaBuffer, Mtu, Payload, PdId, Psn, QpCaps, QpInitAttr, QpType, RcConnection, Registration,
    RemoteAddr, SendOp, SendWorkRequest, Sge,
};

use crate::world::World;

const IOVA: u64 = 0x1000_0000;

/// A host's verbs objects.
#[derive(Debug, Clone, Copy)]
pub struct Host {
    pub pd: PdId,
    pub cq: CqId,
    lkey: u32,
    rkey: u32,
}

impl Host {
    /// Opens host `h` with a region of `region` bytes.
    pub fn open(world: &mut World, h: usize, region: usize) -> Host {
        let device = world.device(h);
        let pd = device.alloc_pd();
        let cq = device.create_cq(1 << 16);
        let buffer = Arc::new(DmaBuffer::new(region));
        let access = Access::LOCAL_WRITE | Access::REMOTE;
        let mr = device
            .register_memory(Registration { pd, buffer, offset: 0, len: region, iova: IOVA, access })
            .expect("register");
        Host { pd, cq, lkey: mr.lkey, rkey: mr.rkey }
    }
}

/// Creates and connects a QP pair from `src` to `dst` with path MTU `mtu`
/// that keeps up to `depth` WRITEs posted; returns the sender's QPN.
pub fn connect(world: &mut World, hosts: &[Host], (src, dst): (usize, usize), mtu: Mtu, depth: usize) -> u32 {
    let caps = QpCaps { max_send_wr: depth as u32 * 2, max_recv_wr: 1, ..QpCaps::default() };
    let ends = [src, dst].map(|h| {
        let s = &hosts[h];
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd: s.pd,
            send_cq: s.cq,
            recv_cq: s.cq,
            caps,
            sq_sig_all: false,
            srq: None,
        };
        world.device(h).create_qp(init).expect("create_qp")
    });
    let now = world.now;
    for (side, host) in [src, dst].into_iter().enumerate() {
        let peer = [src, dst][1 - side];
        let connection = RcConnection {
            access: Access::REMOTE,
            remote_addr: world.ip(peer),
            dest_qpn: ends[1 - side],
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            mtu,
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 1,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            selective_repeat: false,
            authenticate: false,
        };
        for attr in connection.steps() {
            world.device(host).modify_qp(now, ends[side], &attr).expect("modify_qp");
        }
    }
    ends[0]
}

/// Posts one signalled WRITE of `len` bytes on `qpn` from `src` to `dst`.
pub fn post_write(world: &mut World, hosts: &[Host], (src, dst): (usize, usize), qpn: u32, wr_id: u64, len: u32) {
    let remote = RemoteAddr { addr: IOVA, rkey: hosts[dst].rkey };
    let payload =
        Payload::Gather(softrnic_transport::smallvec![Sge { addr: IOVA, length: len, lkey: hosts[src].lkey }]);
    let mut wr = SendWorkRequest::new(wr_id, SendOp::Write { remote, imm: None }, payload);
    wr.signaled = true;
    let now = world.now;
    world.device(src).post_send(now, qpn, wr).expect("post_send");
}
