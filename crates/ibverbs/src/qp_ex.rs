//! The work-request builder of `ibv_qp_ex` (`ibv_wr_start`, `ibv_wr_*`,
//! `ibv_wr_complete`), which perftest posts with.
//!
//! Each `ibv_wr_<opcode>` call begins a request from the QP's `wr_id` and
//! `wr_flags`; the setters after it fill that request in; `ibv_wr_complete`
//! posts them all and rings the doorbell once.

use std::ffi::{c_int, c_void};

use softrnic_transport::{Payload, RemoteAddr, SendOp, SendWorkRequest, Sge, SgeList, UdDestination};

use crate::abi::*;
use crate::ah::Ah;
use crate::ffi::refuse;
use crate::qp::{Qp, inline_bytes};

/// The `send_ops_flags` softrnic implements.
pub const SUPPORTED_SEND_OPS: u64 = IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
    | IBV_QP_EX_WITH_LOCAL_INV
    | IBV_QP_EX_WITH_BIND_MW
    | IBV_QP_EX_WITH_SEND_WITH_INV
    | IBV_QP_EX_WITH_ATOMIC_WRITE;

/// The `send_ops_flags` a QP of `qp_type` may ask for: UD only SENDs,
/// UC SENDs, WRITEs and the window operations, RC everything softrnic
/// implements.
pub fn send_ops_of(qp_type: c_int) -> u64 {
    let sends = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    let windows = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
    match qp_type {
        IBV_QPT_UD => sends,
        IBV_QPT_UC => sends | windows | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
        _ => SUPPORTED_SEND_OPS,
    }
}

/// Requests being built between `wr_start` and `wr_complete`.
#[derive(Default)]
pub struct Builder {
    pending: Vec<SendWorkRequest>,
    /// The first misuse seen (an errno), which `wr_complete` reports.
    error: Option<c_int>,
}

/// Fills in the builder's function pointers.
pub fn install(ex: &mut ibv_qp_ex) {
    ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    ex.wr_bind_mw = Some(wr_bind_mw);
    ex.wr_local_inv = Some(wr_local_inv);
    ex.wr_rdma_read = Some(wr_rdma_read);
    ex.wr_rdma_write = Some(wr_rdma_write);
    ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    ex.wr_send = Some(wr_send);
    ex.wr_send_imm = Some(wr_send_imm);
    ex.wr_send_inv = Some(wr_send_inv);
    ex.wr_send_tso = Some(wr_send_tso);
    ex.wr_set_ud_addr = Some(wr_set_ud_addr);
    ex.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
    ex.wr_atomic_write = Some(wr_atomic_write);
}

/// Runs `f` on the QP's builder.
///
/// # Safety
/// `qp` must be a live softrnic QP.
unsafe fn with_builder<T>(qp: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut Builder) -> T) -> T {
    // SAFETY: caller's promise; `ibv_qp_ex` is the start of a `Qp`.
    let q = unsafe { Qp::from_ibv(qp as *mut ibv_qp) };
    let mut b = q.builder.lock().unwrap_or_else(|e| e.into_inner());
    f(q, &mut b)
}

/// Begins a request for `op` with the QP's current `wr_id` and `wr_flags`.
unsafe fn begin(qp: *mut ibv_qp_ex, op: SendOp) {
    // SAFETY: a live QP (caller).
    let (wr_id, flags) = unsafe { ((*qp).wr_id, (*qp).wr_flags) };
    // SAFETY: forwarded contract.
    unsafe {
        with_builder(qp, |_, b| {
            b.pending.push(SendWorkRequest {
                wr_id,
                op,
                payload: Payload::Gather(SgeList::new()),
                signaled: flags & IBV_SEND_SIGNALED != 0,
                fence: flags & IBV_SEND_FENCE != 0,
                solicited: flags & IBV_SEND_SOLICITED != 0,
                ud: None,
            })
        })
    }
}

/// Applies `f` to the request being built; a setter with none is an error
/// that `wr_complete` reports.
unsafe fn amend(qp: *mut ibv_qp_ex, verb: &str, f: impl FnOnce(&Qp, &mut SendWorkRequest) -> Result<(), c_int>) {
    // SAFETY: forwarded contract.
    unsafe {
        with_builder(qp, |q, b| {
            let result = match b.pending.last_mut() {
                Some(wr) => f(q, wr),
                None => Err(refuse(verb, libc::EINVAL, "no work request begun: call an ibv_wr_<opcode> first")),
            };
            if let Err(e) = result {
                b.error.get_or_insert(e);
            }
        })
    }
}

/// Records a misuse that `wr_complete` reports.
unsafe fn fail(qp: *mut ibv_qp_ex, errno: c_int) {
    // SAFETY: forwarded contract.
    unsafe {
        with_builder(qp, |_, b| {
            b.error.get_or_insert(errno);
        })
    }
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    crate::ffi::guard("wr_start", || {
        // SAFETY: a live QP (caller).
        unsafe {
            with_builder(qp, |_, b| {
                b.pending.clear();
                b.error = None;
            })
        }
    })
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    crate::ffi::guard("wr_complete", || {
        // SAFETY: a live QP (caller).
        unsafe {
            with_builder(qp, |q, b| {
                if let Some(e) = b.error.take() {
                    b.pending.clear();
                    return e;
                }
                let pending = &mut b.pending;
                let mut send_queue = q.context().provider.send_chain(&q.posts);
                for wr in pending.drain(..) {
                    if let Err(e) = send_queue.post(wr) {
                        return refuse("ibv_wr_complete", e.errno(), e);
                    }
                }
                0
            })
        }
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    crate::ffi::guard("wr_abort", || {
        // SAFETY: a live QP (caller).
        unsafe { wr_start(qp) }
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    crate::ffi::guard("wr_send", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::Send { imm: None }) }
    })
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    crate::ffi::guard("wr_send_imm", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::Send { imm: Some(u32::from_be(imm)) }) }
    })
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    crate::ffi::guard("wr_send_inv", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::SendWithInvalidate { rkey }) }
    })
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    crate::ffi::guard("wr_rdma_write", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::Write { remote: RemoteAddr { addr, rkey }, imm: None }) }
    })
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    crate::ffi::guard("wr_rdma_write_imm", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::Write { remote: RemoteAddr { addr, rkey }, imm: Some(u32::from_be(imm)) }) }
    })
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    crate::ffi::guard("wr_rdma_read", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::Read { remote: RemoteAddr { addr, rkey } }) }
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, compare: u64, swap: u64) {
    crate::ffi::guard("wr_atomic_cmp_swp", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::CompareSwap { remote: RemoteAddr { addr, rkey }, compare, swap }) }
    })
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, add: u64) {
    crate::ffi::guard("wr_atomic_fetch_add", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::FetchAdd { remote: RemoteAddr { addr, rkey }, add }) }
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    crate::ffi::guard("wr_set_sge", || {
        // SAFETY: a live QP (caller).
        unsafe {
            amend(qp, "ibv_wr_set_sge", |_, wr| {
                wr.payload = Payload::Gather(softrnic_transport::smallvec![Sge { addr, length, lkey }]);
                Ok(())
            })
        }
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    crate::ffi::guard("wr_set_sge_list", || {
        // SAFETY: `list` holds `n` entries (caller).
        let list = unsafe { crate::qp::sges(list, n as c_int) };
        // SAFETY: a live QP (caller).
        unsafe {
            amend(qp, "ibv_wr_set_sge_list", |_, wr| {
                wr.payload = Payload::Gather(list);
                Ok(())
            })
        }
    })
}

/// Copies inline data at once: the program may reuse its buffer as soon
/// as the setter returns.
unsafe fn set_inline(qp: *mut ibv_qp_ex, verb: &str, sges: &[Sge]) {
    // SAFETY: the buffers are readable now (caller).
    let bytes = unsafe { inline_bytes(sges) };
    // SAFETY: a live QP (caller).
    unsafe {
        amend(qp, verb, |q, wr| {
            if bytes.len() > q.caps.max_inline_data as usize {
                return Err(refuse(verb, libc::EINVAL, format!("{} inline bytes exceed max_inline_data", bytes.len())));
            }
            wr.payload = Payload::Inline(bytes);
            Ok(())
        })
    }
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    crate::ffi::guard("wr_set_inline_data", || {
        let sge = Sge { addr: addr as u64, length: length as u32, lkey: 0 };
        // SAFETY: `[addr, addr + length)` is readable (caller).
        unsafe { set_inline(qp, "ibv_wr_set_inline_data", &[sge]) }
    })
}

unsafe extern "C" fn wr_set_inline_data_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    crate::ffi::guard("wr_set_inline_data_list", || {
        // SAFETY: `list` holds `n` readable buffers (caller).
        let bufs = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(list, n) } };
        let sges: Vec<Sge> =
            bufs.iter().map(|b| Sge { addr: b.addr as u64, length: b.length as u32, lkey: 0 }).collect();
        // SAFETY: as above.
        unsafe { set_inline(qp, "ibv_wr_set_inline_data_list", &sges) }
    })
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, remote_qpn: u32, remote_qkey: u32) {
    crate::ffi::guard("wr_set_ud_addr", || {
        // SAFETY: a live QP, and `ah` live or NULL (caller).
        unsafe {
            amend(qp, "ibv_wr_set_ud_addr", |_, wr| {
                if ah.is_null() {
                    return Err(refuse("ibv_wr_set_ud_addr", libc::EINVAL, "NULL address handle"));
                }
                let addr = Ah::from_ibv(ah).dest;
                wr.ud = Some(UdDestination { addr, qpn: remote_qpn, qkey: remote_qkey });
                Ok(())
            })
        }
    })
}

unsafe extern "C" fn wr_bind_mw(qp: *mut ibv_qp_ex, mw: *mut ibv_mw, rkey: u32, info: *const ibv_mw_bind_info) {
    crate::ffi::guard("wr_bind_mw", || {
        const VERB: &str = "ibv_wr_bind_mw";
        if info.is_null() {
            // SAFETY: a live QP (caller).
            return unsafe { fail(qp, refuse(VERB, libc::EINVAL, "NULL bind information")) };
        }
        // SAFETY: a live QP, window and bind information (caller).
        unsafe {
            match crate::window::bind_of(VERB, mw, rkey, &*info) {
                Ok(bind) => begin(qp, SendOp::BindWindow(bind)),
                Err(e) => fail(qp, e),
            }
        }
    })
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    crate::ffi::guard("wr_local_inv", || {
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::LocalInvalidate { rkey }) }
    })
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _hdr: *mut c_void, _hdr_sz: u16, _mss: u16) {
    crate::ffi::guard("wr_send_tso", || {
        // SAFETY: a live QP (caller).
        unsafe { fail(qp, refuse("ibv_wr_send_tso", libc::EOPNOTSUPP, "TSO needs a raw packet QP")) }
    })
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _srqn: u32) {
    crate::ffi::guard("wr_set_xrc_srqn", || {
        // SAFETY: a live QP (caller).
        unsafe { fail(qp, refuse("ibv_wr_set_xrc_srqn", libc::EOPNOTSUPP, "XRC is not supported")) }
    })
}

unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, data: *const c_void) {
    crate::ffi::guard("wr_atomic_write", || {
        if data.is_null() {
            // SAFETY: a live QP (caller).
            return unsafe { fail(qp, refuse("ibv_wr_atomic_write", libc::EINVAL, "NULL data")) };
        }
        // SAFETY: `data` points at the 8 bytes to write (verbs' contract),
        // copied now, at the call.
        let value = unsafe { std::ptr::read_unaligned(data as *const [u8; 8]) };
        // SAFETY: a live QP (caller).
        unsafe { begin(qp, SendOp::AtomicWrite { remote: RemoteAddr { addr, rkey }, value }) }
    })
}
