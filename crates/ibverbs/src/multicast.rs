//! `ibv_attach_mcast` and `ibv_detach_mcast`: a UD QP joins a multicast
//! group, whose GID in RoCEv2 is an IP multicast address (IPv4-mapped for
//! IPv4); the LID means nothing on Ethernet and is ignored, as rxe
//! ignores it. Datagrams travel over IP multicast (the transport's
//! `multicast` module and the engine's datapath).

use std::ffi::c_int;
use std::net::IpAddr;

use softrnic_provider::Provider;

use crate::abi::*;
use crate::device::addr_of_gid;
use crate::engines::ContextEngine;
use crate::ffi::refuse;
use crate::qp::Qp;

/// Runs `change` (attach or detach) for the QP and group a call names;
/// returns the call's errno (0 when it succeeded).
///
/// # Safety
/// `qp` and `gid` must be NULL or live.
unsafe fn change_membership(
    verb: &str,
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    change: impl FnOnce(&Provider<ContextEngine>, u32, IpAddr) -> softrnic_transport::Result<()>,
) -> c_int {
    if qp.is_null() || gid.is_null() {
        return refuse(verb, libc::EINVAL, "NULL QP or GID");
    }
    // SAFETY: live objects (caller).
    let (q, group) = unsafe { (Qp::from_ibv(qp), addr_of_gid((*gid).raw)) };
    match change(&q.context().provider, q.qpn(), group) {
        Ok(()) => 0,
        Err(e) => refuse(verb, e.errno(), e),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::ffi::guard("ibv_attach_mcast", || {
        // SAFETY: forwarded contract.
        unsafe { change_membership("ibv_attach_mcast", qp, gid, |p, qpn, group| p.attach_multicast(qpn, group)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::ffi::guard("ibv_detach_mcast", || {
        // SAFETY: forwarded contract.
        unsafe { change_membership("ibv_detach_mcast", qp, gid, |p, qpn, group| p.detach_multicast(qpn, group)) }
    })
}
