//! `ibv_attach_mcast` and `ibv_detach_mcast`: a UD QP joins a multicast
//! group, whose GID in RoCEv2 is an IP multicast address (IPv4-mapped for
//! IPv4); the LID means nothing on Ethernet and is ignored, as rxe
//! ignores it. Datagrams travel over IP multicast (the transport's
//! `multicast` module and the engine's datapath).

use std::ffi::c_int;

use crate::abi::*;
use crate::device::addr_of_gid;
use crate::ffi::refuse;
use crate::qp::Qp;

/// The QP and group a call names, or its errno.
///
/// # Safety
/// `qp` and `gid` must be NULL or live.
unsafe fn qp_and_group<'a>(
    verb: &str,
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
) -> Result<(&'a Qp, std::net::IpAddr), c_int> {
    if qp.is_null() || gid.is_null() {
        return Err(refuse(verb, libc::EINVAL, "NULL QP or GID"));
    }
    // SAFETY: live objects (caller).
    Ok(unsafe { (Qp::from_ibv(qp), addr_of_gid((*gid).raw)) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::ffi::guard("ibv_attach_mcast", || {
        // SAFETY: forwarded contract.
        match unsafe { qp_and_group("ibv_attach_mcast", qp, gid) } {
            Ok((q, group)) => match q.context().provider.attach_multicast(q.qpn(), group) {
                Ok(()) => 0,
                Err(e) => refuse("ibv_attach_mcast", e.errno(), e),
            },
            Err(errno) => errno,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::ffi::guard("ibv_detach_mcast", || {
        // SAFETY: forwarded contract.
        match unsafe { qp_and_group("ibv_detach_mcast", qp, gid) } {
            Ok((q, group)) => match q.context().provider.detach_multicast(q.qpn(), group) {
                Ok(()) => 0,
                Err(e) => refuse("ibv_detach_mcast", e.errno(), e),
            },
            Err(errno) => errno,
        }
    })
}
