//! Queue pairs (`ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`) and the
//! classic posting verbs (`ibv_post_send`, `ibv_post_recv`), translated to
//! the transport's work requests and attributes.

use std::ffi::c_int;
use std::sync::Mutex;

use softrnic_provider::provider::DeviceQp;
use softrnic_transport::{
    Access, InlineData, Mtu, Payload, Psn, QpAttr, QpCaps, QpInitAttr, QpState, QpType, RecvWorkRequest, RemoteAddr,
    SendOp, SendWorkRequest, Sge, SgeList, UdDestination,
};

use crate::abi::*;
use crate::acks::{AckFields, Reported};
use crate::ah::Ah;
use crate::c_view::CView;
use crate::context::{Context, limits};
use crate::cq::Cq;
use crate::device::{addr_of_gid, gid_of};
use crate::ece::Ece;
use crate::ffi::{refuse, refuse_null};
use crate::memory::Pd;
use crate::qp_ex::{self, Builder};
use crate::srq::Srq;

#[repr(C)]
pub struct Qp {
    /// The program's `ibv_qp` (its first field) and `ibv_qp_ex`.
    pub ex: CView<ibv_qp_ex>,
    pub qp_type: QpType,
    pub caps: ibv_qp_cap,
    pub sq_sig_all: bool,
    /// The program's end of the QP's queues, which posts go through.
    pub posts: DeviceQp,
    /// Work requests between `ibv_wr_start` and `ibv_wr_complete`.
    pub builder: Mutex<Builder>,
    /// Asynchronous events naming this QP handed out.
    pub async_events: Reported,
    /// The ECE options offered or agreed (`ece.rs`).
    pub ece: Mutex<Ece>,
}

impl Qp {
    /// # Safety
    /// `qp` must come from [`ibv_create_qp`] or `ibv_create_qp_ex` and not be
    /// destroyed.
    pub unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> &'a Qp {
        // SAFETY: `ex.qp_base` is the first field of a boxed `Qp` (caller).
        unsafe { &*(qp as *const Qp) }
    }

    pub fn context(&self) -> &Context {
        // SAFETY: a QP never outlives its context.
        unsafe { Context::from_ibv((*self.ex.get()).qp_base.context) }
    }

    /// The acknowledgement fields of its asynchronous events.
    pub fn acks(&self) -> AckFields {
        let qp = self.ex.get();
        // SAFETY: projections into our own live allocation.
        unsafe {
            AckFields {
                mutex: &raw mut (*qp).qp_base.mutex,
                cond: &raw mut (*qp).qp_base.cond,
                completed: &raw mut (*qp).qp_base.events_completed,
            }
        }
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP number never changes.
        unsafe { (*self.ex.get()).qp_base.qp_num }
    }
}

fn qp_type_of(verb: &str, t: c_int) -> Result<QpType, c_int> {
    match t {
        IBV_QPT_RC => Ok(QpType::Rc),
        IBV_QPT_UC => Ok(QpType::Uc),
        IBV_QPT_UD => Ok(QpType::Ud),
        IBV_QPT_RAW_PACKET => Err(refuse(
            verb,
            libc::EOPNOTSUPP,
            "raw packet QPs send Ethernet frames through a NIC's own queues, which softrnic (like rxe) has none of; \
             use RC, UC or UD",
        )),
        IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => Err(refuse(
            verb,
            libc::EOPNOTSUPP,
            "XRC QPs are not supported (nor XRC domains, ibv_open_xrcd); use RC with an SRQ",
        )),
        other => Err(refuse(verb, libc::EOPNOTSUPP, format!("QP type {other} is not supported; use RC, UC or UD"))),
    }
}

fn check_caps(verb: &str, cap: &ibv_qp_cap) -> Result<(), c_int> {
    let too_big = cap.max_send_wr > limits::MAX_QP_WR
        || cap.max_recv_wr > limits::MAX_QP_WR
        || cap.max_send_sge > limits::MAX_SGE
        || cap.max_recv_sge > limits::MAX_SGE
        || cap.max_inline_data > limits::MAX_INLINE_DATA;
    if too_big {
        return Err(refuse(
            verb,
            libc::EINVAL,
            format!(
                "capabilities exceed the device's: at most {} WRs, {} SGEs and {} bytes inline",
                limits::MAX_QP_WR,
                limits::MAX_SGE,
                limits::MAX_INLINE_DATA
            ),
        ));
    }
    Ok(())
}

/// Creates a QP from the fields `ibv_qp_init_attr` and
/// `ibv_qp_init_attr_ex` share.
/// Which QP number a new QP gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Numbered {
    /// The next free one.
    Next,
    /// 1: the General Services Interface.
    Gsi,
}

unsafe fn create(verb: &str, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    // SAFETY: forwarded contract.
    unsafe { create_numbered(verb, pd, attr, Numbered::Next) }
}

unsafe fn create_numbered(verb: &str, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr, number: Numbered) -> *mut ibv_qp {
    if pd.is_null() || attr.is_null() {
        return refuse_null(verb, libc::EINVAL, "NULL PD or attributes");
    }
    // SAFETY: live PD, readable and writable attributes (caller).
    let (p, a) = unsafe { (Pd::from_ibv(pd), &mut *attr) };
    let qp_type = match qp_type_of(verb, a.qp_type) {
        Ok(t) => t,
        Err(e) => return refuse_null(verb, e, "bad QP type"),
    };
    if let Err(e) = check_caps(verb, &a.cap) {
        return refuse_null(verb, e, "bad capabilities");
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        return refuse_null(verb, libc::EINVAL, "a QP needs a send CQ and a receive CQ");
    }
    // SAFETY: the CQs and the SRQ are live objects of this context (caller).
    let (send_cq, recv_cq) = unsafe { (Cq::from_ibv(a.send_cq).id, Cq::from_ibv(a.recv_cq).id) };
    // SAFETY: as above.
    let srq = (!a.srq.is_null()).then(|| unsafe { Srq::from_ibv(a.srq) }.id);
    let caps = QpCaps {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge.max(1),
        max_recv_sge: a.cap.max_recv_sge.max(1),
        max_inline_data: a.cap.max_inline_data,
    };
    let init = QpInitAttr { qp_type, pd: p.id, send_cq, recv_cq, caps, sq_sig_all: a.sq_sig_all != 0, srq };
    let ctx = p.context();
    let created = match number {
        Numbered::Next => ctx.provider.create_qp(init),
        Numbered::Gsi => ctx.provider.create_gsi_qp(init),
    };
    let posts = match created {
        Ok(posts) => posts,
        Err(e) => return refuse_null(verb, e.errno(), e),
    };
    let qpn = posts.qpn();
    // Report what the QP got, as providers do.
    a.cap = ibv_qp_cap {
        max_send_wr: caps.max_send_wr,
        max_recv_wr: caps.max_recv_wr,
        max_send_sge: caps.max_send_sge,
        max_recv_sge: caps.max_recv_sge,
        max_inline_data: caps.max_inline_data,
    };
    // SAFETY: all-zero is valid for the pthread objects and for the
    // optional function pointers, which `qp_ex::install` fills in.
    let mut ex: ibv_qp_ex = unsafe { std::mem::zeroed() };
    ex.qp_base.context = ctx.ibv();
    ex.qp_base.qp_context = a.qp_context;
    ex.qp_base.pd = pd;
    ex.qp_base.send_cq = a.send_cq;
    ex.qp_base.recv_cq = a.recv_cq;
    ex.qp_base.srq = a.srq;
    ex.qp_base.handle = qpn;
    ex.qp_base.qp_num = qpn;
    ex.qp_base.state = IBV_QPS_RESET;
    ex.qp_base.qp_type = a.qp_type;
    qp_ex::install(&mut ex);
    let qp = Box::new(Qp {
        ex: CView::new(ex),
        qp_type,
        caps: a.cap,
        sq_sig_all: a.sq_sig_all != 0,
        posts,
        builder: Mutex::default(),
        async_events: Reported::default(),
        ece: Mutex::new(Ece::Offered),
    });
    let qp = Box::into_raw(qp);
    ctx.objects().qps.insert(qpn, qp as usize);
    qp as *mut ibv_qp
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    crate::ffi::guard("ibv_create_qp", || {
        // SAFETY: forwarded contract.
        unsafe { create("ibv_create_qp", pd, attr) }
    })
}

/// softrnic's own verb: creates the device's General Services Interface,
/// the UD QP numbered 1 that CM MADs are sent to (the kernel owns it on a
/// hardware device; here softrnic's librdmacm does). Attributes as for a UD
/// QP; a device has one (EBUSY for a second).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softrnic_create_gsi_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    crate::ffi::guard("softrnic_create_gsi_qp", || {
        // SAFETY: forwarded contract.
        unsafe { create_numbered("softrnic_create_gsi_qp", pd, attr, Numbered::Gsi) }
    })
}

/// `verbs_context::create_qp_ex`, behind the header's `ibv_create_qp_ex`.
pub unsafe extern "C" fn create_qp_ex(_context: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    crate::ffi::guard("create_qp_ex", || {
        const VERB: &str = "ibv_create_qp_ex";
        // SAFETY: readable attributes (caller).
        let a = unsafe { &mut *attr };
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 {
            return refuse_null(
                VERB,
                libc::EOPNOTSUPP,
                format!("comp_mask {:#x} asks for XRC, RSS or TSO", a.comp_mask),
            );
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
            return refuse_null(VERB, libc::EINVAL, "a QP needs a PD (IBV_QP_INIT_ATTR_PD)");
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return refuse_null(
                VERB,
                libc::EOPNOTSUPP,
                format!("create_flags {:#x} are not supported", a.create_flags),
            );
        }
        let allowed = qp_ex::send_ops_of(a.qp_type);
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags & !allowed != 0 {
            return refuse_null(
                VERB,
                libc::EOPNOTSUPP,
                format!(
                    "send_ops_flags {:#x} are not supported on this QP type (UD only sends; UC sends and writes)",
                    a.send_ops_flags & !allowed
                ),
            );
        }
        // SAFETY: `ibv_qp_init_attr_ex` begins with the fields of
        // `ibv_qp_init_attr` (checked in tests/layout.rs); the PD belongs to
        // `context`.
        unsafe { create(VERB, a.pd, attr as *mut ibv_qp_init_attr) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    crate::ffi::guard("ibv_qp_to_qp_ex", || {
        // Every softrnic QP is an `ibv_qp_ex`.
        qp as *mut ibv_qp_ex
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    crate::ffi::guard("ibv_destroy_qp", || {
        // SAFETY: a live QP (caller).
        let q = unsafe { Qp::from_ibv(qp) };
        let ctx = q.context();
        let qpn = q.qpn();
        if let Err(e) = ctx.provider.destroy_qp(qpn) {
            return refuse("ibv_destroy_qp", e.errno(), e);
        }
        ctx.objects().qps.remove(&qpn);
        // No event can name the QP any more; wait for the program to
        // acknowledge those it took, as rdma-core does.
        // SAFETY: live until freed below.
        unsafe { q.acks().wait_for(&q.async_events) };
        // SAFETY: boxed in `create`, freed once here.
        drop(unsafe { Box::from_raw(qp as *mut Qp) });
        0
    })
}

fn state_of(s: c_int) -> Option<QpState> {
    Some(match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        IBV_QPS_ERR => QpState::Error,
        _ => return None,
    })
}

fn state_to_c(s: QpState) -> c_int {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Sqe => IBV_QPS_SQE,
        QpState::Error => IBV_QPS_ERR,
    }
}

fn mtu_of(m: c_int) -> Option<Mtu> {
    Some(match m {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

/// The destination an address vector names: RoCE needs the GRH (the GID
/// is the peer's IP address), on port 1, from GID index 0.
pub fn destination_of(verb: &str, ah: &ibv_ah_attr) -> Result<std::net::IpAddr, c_int> {
    if ah.is_global == 0 {
        return Err(refuse(verb, libc::EINVAL, "RoCE needs a GRH: set is_global and grh.dgid (the peer's GID)"));
    }
    if ah.port_num != 1 && ah.port_num != 0 {
        return Err(refuse(verb, libc::EINVAL, format!("port {} does not exist", ah.port_num)));
    }
    if u32::from(ah.grh.sgid_index) >= limits::GID_TABLE_LEN {
        return Err(refuse(verb, libc::EINVAL, format!("GID index {} does not exist", ah.grh.sgid_index)));
    }
    // SAFETY: every bit pattern is a valid `raw` GID.
    Ok(addr_of_gid(unsafe { ah.grh.dgid.raw }))
}

/// Translates `ibv_modify_qp`'s attributes and mask.
fn attr_of(verb: &str, a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    let has = |bit: c_int| mask & bit != 0;
    let unsupported = IBV_QP_ALT_PATH | IBV_QP_CAP;
    if mask & unsupported != 0 {
        return Err(refuse(verb, libc::EOPNOTSUPP, "alternate paths and resizing a QP are not supported"));
    }
    let bad = |what: &str| refuse(verb, libc::EINVAL, what);
    let mut out = QpAttr::default();
    if has(IBV_QP_STATE) {
        out.state = Some(state_of(a.qp_state).ok_or_else(|| bad("unknown qp_state"))?);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        out.access = Some(Access::from_bits_truncate(a.qp_access_flags & 0xf));
    }
    if has(IBV_QP_PKEY_INDEX) {
        if a.pkey_index != 0 {
            return Err(bad("P_Key index must be 0 (the table has one entry)"));
        }
        out.pkey_index = Some(a.pkey_index);
    }
    if has(IBV_QP_PORT) {
        if a.port_num != 1 {
            return Err(bad("port_num must be 1"));
        }
        out.port = Some(a.port_num);
    }
    if has(IBV_QP_QKEY) {
        out.qkey = Some(a.qkey);
    }
    if has(IBV_QP_AV) {
        out.remote_addr = Some(destination_of(verb, &a.ah_attr)?);
    }
    if has(IBV_QP_PATH_MTU) {
        out.path_mtu = Some(mtu_of(a.path_mtu).ok_or_else(|| bad("path_mtu must be IBV_MTU_256..IBV_MTU_4096"))?);
    }
    if has(IBV_QP_TIMEOUT) {
        out.timeout = Some(a.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        out.retry_cnt = Some(a.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        out.rnr_retry = Some(a.rnr_retry);
    }
    if has(IBV_QP_RQ_PSN) {
        out.rq_psn = Some(Psn::new(a.rq_psn));
    }
    if has(IBV_QP_SQ_PSN) {
        out.sq_psn = Some(Psn::new(a.sq_psn));
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        if u32::from(a.max_rd_atomic) > u32::from(limits::MAX_RD_ATOMIC) {
            return Err(bad("max_rd_atomic exceeds the device's max_qp_init_rd_atom"));
        }
        out.max_rd_atomic = Some(a.max_rd_atomic);
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        if u32::from(a.max_dest_rd_atomic) > u32::from(limits::MAX_RD_ATOMIC) {
            return Err(bad("max_dest_rd_atomic exceeds the device's max_qp_rd_atom"));
        }
        out.max_dest_rd_atomic = Some(a.max_dest_rd_atomic);
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(a.min_rnr_timer);
    }
    if has(IBV_QP_DEST_QPN) {
        out.dest_qpn = Some(a.dest_qp_num);
    }
    Ok(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    crate::ffi::guard("ibv_modify_qp", || {
        const VERB: &str = "ibv_modify_qp";
        if qp.is_null() || attr.is_null() {
            return refuse(VERB, libc::EINVAL, "NULL QP or attributes");
        }
        // SAFETY: a live QP and readable attributes (caller).
        let (q, a) = unsafe { (Qp::from_ibv(qp), &*attr) };
        let mut converted = match attr_of(VERB, a, mask) {
            Ok(c) => c,
            Err(e) => return e,
        };
        // An RC connection's recovery and authentication are fixed as it
        // starts to receive: what ECE agreed, else the environment.
        if q.qp_type == QpType::Rc && converted.state == Some(QpState::Rtr) {
            let ece = *q.ece.lock().unwrap_or_else(|e| e.into_inner());
            converted.selective_repeat = Some(ece.selective_repeat());
            converted.authenticate = Some(ece.authenticate());
        }
        let qpn = q.qpn();
        let provider = &q.context().provider;
        let result = provider.modify_qp(&q.posts, &converted).and_then(|state| {
            if mask & IBV_QP_RATE_LIMIT != 0 {
                let bps = (a.rate_limit != 0).then(|| u64::from(a.rate_limit) * 1000);
                provider.set_qp_rate_limit(qpn, bps)?;
            }
            Ok(state)
        });
        match result {
            Ok(state) => {
                // SAFETY: the program's QP; verbs keeps `state` current.
                unsafe { (*qp).state = state_to_c(state) };
                0
            }
            Err(e) => refuse(VERB, e.errno(), e),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    crate::ffi::guard("ibv_query_qp", || {
        let _ = mask; // everything is cheap to report
        // SAFETY: a live QP (caller).
        let q = unsafe { Qp::from_ibv(qp) };
        let qpn = q.qpn();
        let Some((state, now)) = q.context().provider.query_qp(qpn) else {
            return refuse("ibv_query_qp", libc::EINVAL, "no such QP");
        };
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut out: ibv_qp_attr = unsafe { std::mem::zeroed() };
        out.qp_state = state_to_c(state);
        out.cur_qp_state = out.qp_state;
        out.path_mtu = now.path_mtu as c_int;
        out.qkey = now.qkey;
        out.rq_psn = now.rq_psn.value();
        out.sq_psn = now.sq_psn.value();
        out.dest_qp_num = now.dest_qpn;
        out.qp_access_flags = now.access.bits();
        out.cap = q.caps;
        if let Some(addr) = now.remote_addr {
            out.ah_attr.grh.dgid = ibv_gid { raw: gid_of(addr) };
            out.ah_attr.grh.hop_limit = 64;
            out.ah_attr.is_global = 1;
            out.ah_attr.port_num = 1;
        }
        out.pkey_index = now.pkey_index;
        out.max_rd_atomic = now.max_rd_atomic;
        out.max_dest_rd_atomic = now.max_dest_rd_atomic;
        out.min_rnr_timer = now.min_rnr_timer;
        out.port_num = now.port;
        out.timeout = now.timeout;
        out.retry_cnt = now.retry_cnt;
        out.rnr_retry = now.rnr_retry;
        // SAFETY: writable outputs (caller); `init_attr` may be NULL.
        unsafe {
            *attr = out;
            if !init_attr.is_null() {
                let base = &(*q.ex.get()).qp_base;
                *init_attr = ibv_qp_init_attr {
                    qp_context: base.qp_context,
                    send_cq: base.send_cq,
                    recv_cq: base.recv_cq,
                    srq: base.srq,
                    cap: q.caps,
                    qp_type: base.qp_type,
                    sq_sig_all: q.sq_sig_all.into(),
                };
            }
        }
        0
    })
}

/// The SGEs of a C list.
///
/// # Safety
/// `list` must hold `n` readable entries.
pub unsafe fn sges(list: *const ibv_sge, n: c_int) -> SgeList {
    if n <= 0 || list.is_null() {
        return SgeList::new();
    }
    // SAFETY: caller's promise.
    let list = unsafe { std::slice::from_raw_parts(list, n as usize) };
    list.iter().map(|s| Sge { addr: s.addr, length: s.length, lkey: s.lkey }).collect()
}

/// The bytes of an inline send, copied out of the program's buffers.
///
/// # Safety
/// Each SGE's `[addr, addr + length)` must be readable.
/// The bytes are copied through raw pointers, never viewed as a Rust
/// slice: the program's memory is the program's, and a slice would
/// promise that nothing changes it while the copy runs.
pub unsafe fn inline_bytes(sges: &[Sge]) -> InlineData {
    let total = sges.iter().map(|s| s.length as usize).sum();
    let mut bytes = InlineData::with_capacity(total);
    for s in sges {
        let (at, len) = (bytes.len(), s.length as usize);
        // SAFETY: the source is readable for `len` bytes (caller's promise;
        // inline data is read at post time), the destination is the
        // vector's spare capacity, reserved above for every SGE, and the
        // two cannot overlap; the first `at + len` bytes are then written.
        unsafe {
            std::ptr::copy_nonoverlapping(s.addr as *const u8, bytes.as_mut_ptr().add(at), len);
            bytes.set_len(at + len);
        }
    }
    bytes
}

/// Translates one `ibv_send_wr`.
///
/// # Safety
/// `wr` must be a valid work request whose lists and inline buffers are
/// readable, and its AH (for UD) live.
unsafe fn send_wr_of(q: &Qp, wr: &ibv_send_wr) -> Result<SendWorkRequest, c_int> {
    const VERB: &str = "ibv_post_send";
    // SAFETY: caller's promise.
    let list = unsafe { sges(wr.sg_list, wr.num_sge) };
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    // SAFETY: `wr.wr` is the union the opcode selects (caller).
    let (rdma, atomic, ud) = unsafe { (wr.wr.rdma, wr.wr.atomic, wr.wr.ud) };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send { imm: None },
        IBV_WR_SEND_WITH_IMM => SendOp::Send { imm: Some(u32::from_be(wr.imm_data)) },
        // `invalidate_rkey` shares `imm_data`'s place, in host order.
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInvalidate { rkey: wr.imm_data },
        IBV_WR_LOCAL_INV => SendOp::LocalInvalidate { rkey: wr.imm_data },
        IBV_WR_BIND_MW => {
            let b = wr.bind_mw;
            // SAFETY: the window and region the request names are live
            // (caller).
            SendOp::BindWindow(unsafe { crate::window::bind_of(VERB, b.mw, b.rkey, &b.bind_info) }?)
        }
        IBV_WR_RDMA_WRITE => {
            SendOp::Write { remote: RemoteAddr { addr: rdma.remote_addr, rkey: rdma.rkey }, imm: None }
        }
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::Write {
            remote: RemoteAddr { addr: rdma.remote_addr, rkey: rdma.rkey },
            imm: Some(u32::from_be(wr.imm_data)),
        },
        IBV_WR_RDMA_READ => SendOp::Read { remote: RemoteAddr { addr: rdma.remote_addr, rkey: rdma.rkey } },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote: RemoteAddr { addr: atomic.remote_addr, rkey: atomic.rkey },
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        // The 8 bytes to store are read from the gather list now, at post
        // time, as rxe takes them (like inline data: no key needed).
        IBV_WR_ATOMIC_WRITE => {
            if list.len() != 1 || list[0].length != 8 {
                return Err(refuse(VERB, libc::EINVAL, "an ATOMIC WRITE's data is one SGE of 8 bytes"));
            }
            // SAFETY: the SGE names 8 readable bytes (caller's promise).
            let value = unsafe { std::ptr::read_unaligned(list[0].addr as *const [u8; 8]) };
            SendOp::AtomicWrite { remote: RemoteAddr { addr: rdma.remote_addr, rkey: rdma.rkey }, value }
        }
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote: RemoteAddr { addr: atomic.remote_addr, rkey: atomic.rkey },
            add: atomic.compare_add,
        },
        other => return Err(refuse(VERB, libc::EINVAL, format!("opcode {other} is not supported"))),
    };
    let payload = if inline && matches!(op, SendOp::Send { .. } | SendOp::Write { .. }) {
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(q.caps.max_inline_data) {
            return Err(refuse(VERB, libc::EINVAL, format!("{total} inline bytes exceed max_inline_data")));
        }
        // SAFETY: caller's promise.
        Payload::Inline(unsafe { inline_bytes(&list) })
    } else if op.is_local() || matches!(op, SendOp::AtomicWrite { .. }) {
        // A bind or local invalidate names no memory of its own; an
        // ATOMIC WRITE's was read above.
        Payload::Gather(Default::default())
    } else {
        Payload::Gather(list)
    };
    let ud = match q.qp_type {
        QpType::Rc | QpType::Uc => None,
        QpType::Ud => {
            if ud.ah.is_null() {
                return Err(refuse(VERB, libc::EINVAL, "a UD send needs wr.ud.ah"));
            }
            // SAFETY: a live AH (caller).
            let addr = unsafe { Ah::from_ibv(ud.ah) }.dest;
            Some(UdDestination { addr, qpn: ud.remote_qpn, qkey: ud.remote_qkey })
        }
    };
    Ok(SendWorkRequest {
        wr_id: wr.wr_id,
        op,
        payload,
        signaled: wr.send_flags & IBV_SEND_SIGNALED != 0,
        fence: wr.send_flags & IBV_SEND_FENCE != 0,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
        ud,
    })
}

/// `ops.post_send`: posts the chain in order and rings the doorbell once.
pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    crate::ffi::guard("post_send", || {
        // SAFETY: a live QP (caller).
        let q = unsafe { Qp::from_ibv(qp) };
        let mut send_queue = q.context().provider.send_chain(&q.posts);
        let mut next = wr;
        while !next.is_null() {
            // SAFETY: the chain is the caller's valid list.
            let w = unsafe { &*next };
            // SAFETY: as above.
            let posted = unsafe { send_wr_of(q, w) }
                .and_then(|req| send_queue.post(req).map_err(|e| refuse("ibv_post_send", e.errno(), e)));
            if let Err(e) = posted {
                if !bad_wr.is_null() {
                    // SAFETY: a writable out-pointer (caller).
                    unsafe { *bad_wr = next };
                }
                return e;
            }
            next = w.next;
        }
        0
    })
}

/// Posts a chain of receive requests with `post`, reporting the first that
/// fails.
///
/// # Safety
/// `wr` must be a valid chain of receive requests.
pub unsafe fn post_recv_chain(
    verb: &str,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(RecvWorkRequest) -> softrnic_transport::Result<()>,
) -> c_int {
    let mut next = wr;
    while !next.is_null() {
        // SAFETY: the chain is the caller's valid list.
        let w = unsafe { &*next };
        // SAFETY: as above.
        let request = RecvWorkRequest { wr_id: w.wr_id, sges: unsafe { sges(w.sg_list, w.num_sge) } };
        if let Err(e) = post(request) {
            if !bad_wr.is_null() {
                // SAFETY: a writable out-pointer (caller).
                unsafe { *bad_wr = next };
            }
            return refuse(verb, e.errno(), e);
        }
        next = w.next;
    }
    0
}

/// `ops.post_recv`. A receive sends nothing, so it rings no doorbell: an
/// ACK the last poll owes waits for the program's next send and leaves in
/// the same system call (a ping-pong posts its receive, then its send).
pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    crate::ffi::guard("post_recv", || {
        // SAFETY: a live QP (caller).
        let q = unsafe { Qp::from_ibv(qp) };
        let provider = &q.context().provider;
        // SAFETY: forwarded contract.
        unsafe { post_recv_chain("ibv_post_recv", wr, bad_wr, |r| provider.post_recv(&q.posts, r)) }
    })
}
