//! Protection domains and memory regions over the program's own memory
//! (`ibv_alloc_pd`, `ibv_reg_mr`): the NIC reads and writes the registered
//! bytes in place, as a real NIC's DMA would.

use std::ffi::{c_int, c_uint, c_void};

use softrnic_transport::{Access, PdId};

use crate::abi::*;
use crate::c_view::CView;
use crate::context::Context;
use crate::ffi::{refuse, refuse_null};

#[repr(C)]
pub struct Pd {
    pub ibv: CView<ibv_pd>,
    pub id: PdId,
}

impl Pd {
    /// # Safety
    /// `pd` must come from [`ibv_alloc_pd`] and not be freed.
    pub unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> &'a Pd {
        // SAFETY: `ibv` is the first field of a boxed `Pd` (caller).
        unsafe { &*(pd as *const Pd) }
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        // SAFETY: a PD never outlives its context (verbs' rule).
        unsafe { Context::from_ibv((*self.ibv.get()).context) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    crate::ffi::guard("ibv_alloc_pd", || {
        if context.is_null() {
            return refuse_null("ibv_alloc_pd", libc::EINVAL, "NULL context");
        }
        // SAFETY: a live context (caller).
        let ctx = unsafe { Context::from_ibv(context) };
        let id = match ctx.provider.alloc_pd() {
            Ok(id) => id,
            Err(e) => return refuse_null("ibv_alloc_pd", e.errno(), e),
        };
        ctx.objects().pds.insert(id);
        let pd = Box::new(Pd { ibv: CView::new(ibv_pd { context, handle: id.0 }), id });
        Box::into_raw(pd) as *mut ibv_pd
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    crate::ffi::guard("ibv_dealloc_pd", || {
        // SAFETY: a live PD (caller).
        let p = unsafe { Pd::from_ibv(pd) };
        let id = p.id;
        if let Err(e) = p.context().provider.dealloc_pd(id) {
            return refuse("ibv_dealloc_pd", e.errno(), e);
        }
        p.context().objects().pds.remove(&id);
        // SAFETY: boxed in `ibv_alloc_pd`, freed once here.
        drop(unsafe { Box::from_raw(pd as *mut Pd) });
        0
    })
}

/// Access flags softrnic acts on; the rest are accepted and ignored where
/// verbs lets a device ignore them.
fn access_of(verb: &str, flags: c_uint) -> Result<Access, c_int> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_HUGETLB
        | IBV_ACCESS_OPTIONAL_RANGE;
    if flags & IBV_ACCESS_ZERO_BASED != 0 || flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(refuse(verb, libc::EOPNOTSUPP, "zero-based and on-demand MRs are not supported"));
    }
    if flags & !known != 0 {
        return Err(refuse(verb, libc::EINVAL, format!("unknown access flags {:#x}", flags & !known)));
    }
    Ok(Access::from_bits_truncate(flags & (0xf | IBV_ACCESS_MW_BIND)))
}

/// Registers `[addr, addr + length)` of the program's memory, addressed by
/// peers from `iova`.
unsafe fn register(
    verb: &str,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() || (addr.is_null() && length > 0) {
        return refuse_null(verb, libc::EINVAL, "NULL PD or address");
    }
    let access = match access_of(verb, access) {
        Ok(a) => a,
        Err(e) => return refuse_null(verb, e, "bad access flags"),
    };
    // SAFETY: a live PD (caller).
    let p = unsafe { Pd::from_ibv(pd) };
    // SAFETY: verbs' contract: the program keeps the registered memory
    // mapped until `ibv_dereg_mr`, which removes the region from the
    // device before returning.
    let keys =
        match unsafe { p.context().provider.register_program_memory(p.id, addr as *mut u8, length, iova, access) } {
            Ok(k) => k,
            Err(e) => return refuse_null(verb, e.errno(), e),
        };
    p.context().objects().mrs.insert(keys.lkey);
    // SAFETY: the PD's context field never changes.
    let context = unsafe { (*p.ibv.get()).context };
    let mr = ibv_mr { context, pd, addr, length, handle: keys.lkey, lkey: keys.lkey, rkey: keys.rkey };
    Box::into_raw(Box::new(mr))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    crate::ffi::guard("ibv_reg_mr", || {
        // SAFETY: forwarded contract.
        unsafe { register("ibv_reg_mr", pd, addr, length, addr as u64, access as c_uint) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    crate::ffi::guard("ibv_reg_mr_iova", || {
        // SAFETY: forwarded contract.
        unsafe { register("ibv_reg_mr_iova", pd, addr, length, iova, access as c_uint) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    crate::ffi::guard("ibv_reg_mr_iova2", || {
        // SAFETY: forwarded contract.
        unsafe { register("ibv_reg_mr_iova2", pd, addr, length, iova, access) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    crate::ffi::guard("ibv_dereg_mr", || {
        if mr.is_null() {
            return refuse("ibv_dereg_mr", libc::EINVAL, "NULL MR");
        }
        // SAFETY: a live MR from `register` (caller).
        let m = unsafe { &*mr };
        // SAFETY: an MR's PD outlives it.
        let ctx = unsafe { Context::from_ibv(m.context) };
        let lkey = m.lkey;
        if let Err(e) = ctx.provider.deregister(lkey) {
            return refuse("ibv_dereg_mr", e.errno(), e);
        }
        ctx.objects().mrs.remove(&lkey);
        // SAFETY: boxed in `register`, freed once here.
        drop(unsafe { Box::from_raw(mr) });
        0
    })
}

/// `ibv_rereg_mr`: a new translation, PD or access for a live MR, which
/// keeps its `ibv_mr` and its keys (as hardware does: a peer's rkey stays
/// good). On failure the MR is unchanged and still the program's to
/// deregister.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    crate::ffi::guard("ibv_rereg_mr", || {
        const VERB: &str = "ibv_rereg_mr";
        let all = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
        if mr.is_null() || flags == 0 || flags & !all != 0 {
            refuse(VERB, libc::EINVAL, "bad MR or flags");
            return IBV_REREG_MR_ERR_INPUT;
        }
        // SAFETY: a live MR (caller).
        let old = unsafe { &mut *mr };
        // SAFETY: the MR's context is live.
        let ctx = unsafe { Context::from_ibv(old.context) };
        if !ctx.objects().mrs.contains(&old.lkey) {
            refuse(VERB, libc::EINVAL, "not a registered MR");
            return IBV_REREG_MR_ERR_INPUT;
        }
        let pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 { pd } else { old.pd };
        let moved = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        let (addr, length) = if moved { (addr, length) } else { (old.addr, old.length) };
        let access = match flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            true => match access_of(VERB, access as c_uint) {
                Ok(a) => Some(a),
                Err(e) => {
                    refuse(VERB, e, "bad access flags");
                    return IBV_REREG_MR_ERR_INPUT;
                }
            },
            false => None,
        };
        if pd.is_null() || (addr.is_null() && length > 0) {
            refuse(VERB, libc::EINVAL, "NULL PD or address");
            return IBV_REREG_MR_ERR_INPUT;
        }
        // SAFETY: a live PD (caller, or the MR's own).
        let pd_id = unsafe { Pd::from_ibv(pd) }.id;
        let range = (addr as *mut u8, length, moved);
        // SAFETY: verbs' contract, as for `ibv_reg_mr`: the program keeps
        // the new range mapped until the MR is deregistered or registered
        // anew, and the device stops reaching the old one before this
        // returns.
        match unsafe { ctx.provider.reregister_program_memory(old.lkey, pd_id, range, access) } {
            Ok(()) => {
                (old.pd, old.addr, old.length) = (pd, addr, length);
                0
            }
            Err(e) => {
                refuse(VERB, e.errno(), e);
                IBV_REREG_MR_ERR_INPUT
            }
        }
    })
}
