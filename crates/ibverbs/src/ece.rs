//! Enhanced Connection Establishment (`ibv_query_ece`, `ibv_set_ece`):
//! how two ends agree on softrnic's selective repeat.
//!
//! rdma-core added ECE for exactly this: options a connection may use
//! only if both ends have them. The flow (rdma_cm's, or a program's own
//! exchange): each end queries its QP's options and sends them to the
//! other; each sets what the other sent; the QP then uses what both
//! offer. softrnic offers [`SELECTIVE_REPEAT`], and [`AUTHENTICATE`] where
//! the process holds the shared secret (`SOFTRNIC_AUTH_KEY`). A peer of
//! another vendor (a real NIC, Soft-RoCE) offers none of softrnic's, and
//! the connection stays plain RoCEv2 go-back-N, exactly as a program that
//! never calls ECE gets unless `SOFTRNIC_SELECTIVE_REPEAT=1`.
//!
//! The options must be agreed before the QP receives: setting them after
//! INIT -> RTR fails with EINVAL, and INIT -> RTR applies them.

use std::ffi::c_int;

use softrnic_transport::{QpState, QpType, limits::VENDOR_ID};

use crate::abi::{ibv_ece, ibv_qp};
use crate::ffi::refuse;
use crate::qp::Qp;

/// The ECE option bit for selective repeat (softrnic's own numbering,
/// valid with its vendor ID).
pub const SELECTIVE_REPEAT: u32 = 1 << 0;

/// The ECE option bit for packet authentication
/// (`softrnic_transport::auth`): offered only with `SOFTRNIC_AUTH_KEY`.
pub const AUTHENTICATE: u32 = 1 << 1;

/// Every option this process offers.
fn supported() -> u32 {
    let authenticate = softrnic_engine::environment::auth_key().is_ok_and(|key| key.is_some());
    SELECTIVE_REPEAT | if authenticate { AUTHENTICATE } else { 0 }
}

/// What a QP offers before `ibv_set_ece`, and what it agreed after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ece {
    /// Nothing set: the QP offers every option; it uses selective repeat
    /// only if `SOFTRNIC_SELECTIVE_REPEAT=1` says so.
    Offered,
    /// The peer's options were set: these are the ones both have.
    Agreed(u32),
}

impl Ece {
    /// Whether the connection recovers by selective repeat.
    pub fn selective_repeat(self) -> bool {
        match self {
            // A bad value was reported when the device opened.
            Ece::Offered => softrnic_engine::environment::selective_repeat().unwrap_or(false),
            Ece::Agreed(options) => options & SELECTIVE_REPEAT != 0,
        }
    }

    /// Whether the connection authenticates its packets: both ends agreed,
    /// or (no ECE) this process holds the shared secret, which the peer
    /// must hold too, as with `SOFTRNIC_SELECTIVE_REPEAT`.
    pub fn authenticate(self) -> bool {
        match self {
            Ece::Offered => supported() & AUTHENTICATE != 0,
            Ece::Agreed(options) => options & AUTHENTICATE != 0,
        }
    }
}

/// # Safety
/// `qp` must be a live QP and `ece` writable, as `ibv_query_ece` requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    crate::ffi::guard("ibv_query_ece", || {
        if qp.is_null() || ece.is_null() {
            return refuse("ibv_query_ece", libc::EINVAL, "NULL QP or ECE");
        }
        // SAFETY: a live QP (caller).
        let q = unsafe { Qp::from_ibv(qp) };
        let options = match *q.ece.lock().unwrap_or_else(|e| e.into_inner()) {
            Ece::Offered if q.qp_type == QpType::Rc => supported(),
            Ece::Offered => 0,
            Ece::Agreed(options) => options,
        };
        // SAFETY: writable (caller).
        unsafe { *ece = ibv_ece { vendor_id: VENDOR_ID, options, comp_mask: 0 } };
        0
    })
}

/// # Safety
/// `qp` must be a live QP and `ece` readable, as `ibv_set_ece` requires.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int {
    crate::ffi::guard("ibv_set_ece", || {
        const VERB: &str = "ibv_set_ece";
        if qp.is_null() || ece.is_null() {
            return refuse(VERB, libc::EINVAL, "NULL QP or ECE");
        }
        // SAFETY: a live QP and a readable ECE (caller).
        let (q, peer) = unsafe { (Qp::from_ibv(qp), *ece) };
        if peer.vendor_id == 0 {
            // libibverbs' own answer to "no ECE at all".
            return refuse(VERB, libc::EOPNOTSUPP, "vendor_id 0: no ECE options to set");
        }
        if peer.comp_mask != 0 {
            return refuse(VERB, libc::EINVAL, "comp_mask must be 0");
        }
        let state = q.context().provider.query_qp(q.qpn()).map_or(QpState::Error, |(state, _)| state);
        if !matches!(state, QpState::Reset | QpState::Init) {
            return refuse(VERB, libc::EINVAL, "ECE is agreed before the QP receives: set it before INIT -> RTR");
        }
        let mut agreed = q.ece.lock().unwrap_or_else(|e| e.into_inner());
        if peer.vendor_id != VENDOR_ID {
            // Another vendor's options mean nothing here: plain RoCEv2.
            *agreed = Ece::Agreed(0);
            return refuse(
                VERB,
                libc::EINVAL,
                format!("vendor {:#x} is not softrnic's: no options agreed", peer.vendor_id),
            );
        }
        let ours = if q.qp_type == QpType::Rc { supported() } else { 0 };
        *agreed = Ece::Agreed(peer.options & ours);
        0
    })
}
