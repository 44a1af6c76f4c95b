//! rdma_cm's multicast joins (`rdma_join_multicast`, `_ex`,
//! `rdma_leave_multicast`), as `mckey` uses them: a UD ID, bound or
//! resolved, joins an IP multicast group; its QP is attached to the group
//! (unless the join is send-only) and the program hears
//! `RDMA_CM_EVENT_MULTICAST_JOIN`, whose `param.ud` carries the address
//! handle attributes of the group, QP number 0xFFFFFF and the qkey to send
//! with, and its own context in `private_data`, as librdmacm's does.
//!
//! RoCEv2 has no subnet manager to join through: the group is an IP
//! multicast address, and joining is the device's (IP multicast, the
//! engine's datapath), so the event follows at once.

use std::ffi::{c_int, c_void};
use std::net::IpAddr;

use softrnic_verbs_abi::ffi::guard;

use crate::abi::*;
use crate::api::{fail, live, raise};
use crate::device::gid_of;
use crate::id::{self, Happened, Id};
use crate::verbs;

/// # Safety
/// `id` live; `addr` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard("rdma_join_multicast", || {
        // SAFETY: forwarded contract.
        unsafe { join("rdma_join_multicast", id, addr, false, context) }
    })
}

/// # Safety
/// `id` live; `attr` readable, its address a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard("rdma_join_multicast_ex", || {
        const VERB: &str = "rdma_join_multicast_ex";
        if attr.is_null() {
            return fail(VERB, libc::EINVAL, "NULL attributes");
        }
        // SAFETY: readable (caller).
        let attr = unsafe { &*attr };
        let needed = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
        if attr.comp_mask & needed != needed || attr.comp_mask & !needed != 0 {
            return fail(
                VERB,
                libc::EINVAL,
                format!("comp_mask {:#x}: the address and the join flags", attr.comp_mask),
            );
        }
        let send_only = match attr.join_flags {
            RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
            RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            other => return fail(VERB, libc::EINVAL, format!("join flags {other}")),
        };
        // SAFETY: forwarded contract.
        unsafe { join(VERB, id, attr.addr, send_only, context) }
    })
}

/// # Safety
/// `id` live; `addr` a sockaddr.
unsafe fn join(
    verb: &str,
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> c_int {
    // SAFETY: forwarded contract.
    let id = match unsafe { live(verb, id) } {
        Ok(id) => id,
        Err(rc) => return rc,
    };
    // SAFETY: as above.
    let group = match unsafe { id::read_sockaddr(addr) } {
        Some(at) if at.ip().to_canonical().is_multicast() => at.ip().to_canonical(),
        Some(at) => return fail(verb, libc::EINVAL, format!("{} is not a multicast address", at.ip())),
        None => return fail(verb, libc::EINVAL, "no address"),
    };
    if id.lock().bound.is_none() {
        return fail(verb, libc::EINVAL, "the ID must be bound first (rdma_bind_addr or rdma_resolve_addr)");
    }
    if id.lock().multicast.iter().any(|(joined, _)| *joined == group) {
        return fail(verb, libc::EADDRINUSE, format!("the ID has joined {group} already"));
    }
    let qp = id.public.qp;
    let attach = !send_only && !qp.is_null();
    if attach {
        let gid = gid_of(group);
        // SAFETY: the ID's live QP, and a GID on the stack.
        let rc = unsafe { verbs::ibv_attach_mcast(qp, &gid, 0) };
        if rc != 0 {
            return fail(verb, rc, format!("attaching the ID's QP to {group}"));
        }
    }
    id.lock().multicast.push((group, attach));
    raise(id, Happened::MulticastJoined { group, context: context as usize });
    0
}

/// # Safety
/// `id` live; `addr` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard("rdma_leave_multicast", || {
        const VERB: &str = "rdma_leave_multicast";
        // SAFETY: forwarded contract.
        let id = match unsafe { live(VERB, id) } {
            Ok(id) => id,
            Err(rc) => return rc,
        };
        // SAFETY: as above.
        let Some(group) = (unsafe { id::read_sockaddr(addr) }).map(|at| at.ip().to_canonical()) else {
            return fail(VERB, libc::EINVAL, "no address");
        };
        leave(VERB, id, group)
    })
}

/// Leaves `group`, detaching the ID's QP if the join attached it.
fn leave(verb: &str, id: &mut Id, group: IpAddr) -> c_int {
    let joined = id.lock().multicast.iter().position(|(g, _)| *g == group);
    let Some(index) = joined else {
        return fail(verb, libc::EADDRNOTAVAIL, format!("the ID has not joined {group}"));
    };
    let (_, attached) = id.lock().multicast.remove(index);
    let qp = id.public.qp;
    if attached && !qp.is_null() {
        let gid = gid_of(group);
        // SAFETY: the ID's live QP, and a GID on the stack.
        let rc = unsafe { verbs::ibv_detach_mcast(qp, &gid, 0) };
        if rc != 0 {
            return fail(verb, rc, format!("detaching the ID's QP from {group}"));
        }
    }
    0
}
