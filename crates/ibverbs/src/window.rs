//! Memory windows: `ibv_alloc_mw`, `ibv_bind_mw` (type 1), `ibv_dealloc_mw`
//! (the context's `ops`, which verbs.h's inline functions call), and the
//! bind a work request carries (`IBV_WR_BIND_MW`, `ibv_wr_bind_mw`).
//!
//! A window's `handle` is its rkey with the low 8 bits clear: the part of
//! every rkey it takes that names it, so a bind finds the window however
//! the program has kept `rkey` up to date.

use std::ffi::{c_int, c_uint};

use softrnic_transport::{Access, Payload, SendOp, SendWorkRequest, WindowBind, WindowType, window_handle, with_key};

use crate::abi::*;
use crate::context::Context;
use crate::ffi::{refuse, refuse_null};
use crate::memory::Pd;
use crate::qp::Qp;

/// `ibv_inc_rkey`: the next rkey of a window, its key byte moved on.
fn next_rkey(rkey: u32) -> u32 {
    with_key(rkey, (rkey as u8).wrapping_add(1))
}

/// The rights a bind grants, from `mw_access_flags`. Local write, which
/// programs pass along with the remote rights, is the region's to give
/// and is ignored here.
fn window_access(verb: &str, flags: c_uint) -> Result<Access, c_int> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_ZERO_BASED;
    if flags & !known != 0 {
        return Err(refuse(verb, libc::EINVAL, format!("access flags {:#x} mean nothing to a window", flags & !known)));
    }
    Ok(Access::from_bits_truncate(flags & !IBV_ACCESS_LOCAL_WRITE))
}

/// The bind of window `mw` under `rkey` as `info` describes it.
///
/// # Safety
/// `mw` must be a live window and `info.mr` NULL or a live region.
pub unsafe fn bind_of(verb: &str, mw: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<WindowBind, c_int> {
    if mw.is_null() {
        return Err(refuse(verb, libc::EINVAL, "NULL memory window"));
    }
    if info.mr.is_null() && info.length > 0 {
        return Err(refuse(verb, libc::EINVAL, "a bind with a length needs its MR"));
    }
    // SAFETY: live objects (caller).
    let (handle, region_lkey) = unsafe { ((*mw).handle, if info.mr.is_null() { 0 } else { (*info.mr).lkey }) };
    Ok(WindowBind {
        window: handle,
        new_rkey: rkey,
        region_lkey,
        addr: info.addr,
        len: info.length,
        access: window_access(verb, info.mw_access_flags)?,
    })
}

/// `ops.alloc_mw`.
pub unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: c_int) -> *mut ibv_mw {
    crate::ffi::guard("ibv_alloc_mw", || {
        const VERB: &str = "ibv_alloc_mw";
        let kind = match mw_type {
            IBV_MW_TYPE_1 => WindowType::One,
            IBV_MW_TYPE_2 => WindowType::Two,
            other => return refuse_null(VERB, libc::EINVAL, format!("memory window type {other}")),
        };
        if pd.is_null() {
            return refuse_null(VERB, libc::EINVAL, "NULL PD");
        }
        // SAFETY: a live PD (caller).
        let p = unsafe { Pd::from_ibv(pd) };
        let rkey = match p.context().provider.alloc_window(p.id, kind) {
            Ok(rkey) => rkey,
            Err(e) => return refuse_null(VERB, e.errno(), e),
        };
        let handle = window_handle(rkey);
        p.context().objects().mws.insert(handle);
        // SAFETY: the PD's context field never changes.
        let context = unsafe { (*p.ibv.get()).context };
        Box::into_raw(Box::new(ibv_mw { context, pd, rkey, handle, mw_type }))
    })
}

/// `ops.dealloc_mw`: bound or not, the window goes.
pub unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    crate::ffi::guard("ibv_dealloc_mw", || {
        if mw.is_null() {
            return refuse("ibv_dealloc_mw", libc::EINVAL, "NULL memory window");
        }
        // SAFETY: a live window from `alloc_mw` (caller).
        let (context, handle) = unsafe { ((*mw).context, (*mw).handle) };
        // SAFETY: a window never outlives its context.
        let ctx = unsafe { Context::from_ibv(context) };
        if let Err(e) = ctx.provider.dealloc_window(handle) {
            return refuse("ibv_dealloc_mw", e.errno(), e);
        }
        ctx.objects().mws.remove(&handle);
        // SAFETY: boxed in `alloc_mw`, freed once here.
        drop(unsafe { Box::from_raw(mw) });
        0
    })
}

/// `ops.bind_mw`: binds a type 1 window by posting the bind on `qp`'s
/// send queue under the window's next rkey, which `mw->rkey` takes at once
/// (as rxe does; a program that gets an error completion undoes it).
pub unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int {
    crate::ffi::guard("ibv_bind_mw", || {
        const VERB: &str = "ibv_bind_mw";
        if qp.is_null() || mw.is_null() || mw_bind.is_null() {
            return refuse(VERB, libc::EINVAL, "NULL QP, window or bind");
        }
        // SAFETY: live objects (caller).
        let (q, mw_bind, rkey, mw_type) = unsafe { (Qp::from_ibv(qp), &*mw_bind, (*mw).rkey, (*mw).mw_type) };
        if mw_type != IBV_MW_TYPE_1 {
            return refuse(VERB, libc::EINVAL, "ibv_bind_mw binds type 1 windows; post IBV_WR_BIND_MW for type 2");
        }
        let new_rkey = next_rkey(rkey);
        // SAFETY: as above.
        let bind = match unsafe { bind_of(VERB, mw, new_rkey, &mw_bind.bind_info) } {
            Ok(bind) => bind,
            Err(e) => return e,
        };
        let flags = mw_bind.send_flags;
        let wr = SendWorkRequest {
            signaled: flags & IBV_SEND_SIGNALED != 0,
            fence: flags & IBV_SEND_FENCE != 0,
            ..SendWorkRequest::new(mw_bind.wr_id, SendOp::BindWindow(bind), Payload::Gather(Default::default()))
        };
        if let Err(e) = q.context().provider.post_send(&q.posts, wr) {
            return refuse(VERB, e.errno(), e);
        }
        // SAFETY: a live window (caller).
        unsafe { (*mw).rkey = new_rkey };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_rkey_moves_only_the_key_byte() {
        assert_eq!(next_rkey(0x1234_5601), 0x1234_5602);
        assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(next_rkey(0xffff_ffff), 0xffff_ff00);
    }

    #[test]
    fn a_window_grants_remote_rights_only() {
        let all = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED;
        assert_eq!(window_access("t", all), Ok(Access::REMOTE_WRITE | Access::REMOTE_READ | Access::ZERO_BASED));
        assert_eq!(window_access("t", IBV_ACCESS_MW_BIND), Err(libc::EINVAL));
    }
}
