//! Memory windows: rkeys that grant a peer part of a region, bound and
//! unbound by the data path while the region stays registered.
//!
//! A window is allocated by the control plane (`ibv_alloc_mw`) and then
//! bound by a work request on a send queue (`IBV_WR_BIND_MW`, or
//! `ibv_bind_mw` for a type 1 window, which posts one), in order with the
//! requests around it. A bind names a range of a region registered with
//! `IBV_ACCESS_MW_BIND` and the remote rights the window grants; it gives
//! the window a new rkey, whose top 24 bits stay the window's own and whose
//! low 8 (the "key") the consumer picks, so that a peer holding the rkey of
//! an earlier binding reaches nothing. The rules are the IBTA's (10.6.7)
//! as the rxe driver applies them:
//!
//! - **Type 1**: bound through any QP of its protection domain, usable
//!   over any of them; binding with length 0 unbinds it; it cannot be
//!   invalidated (only rebound).
//! - **Type 2**: bound to the one QP that bound it, usable only over that
//!   QP; bound only when free (never rebound in place), invalidated
//!   locally (`IBV_WR_LOCAL_INV`) or by the peer (SEND with invalidate),
//!   which makes it free again. Its binding may be zero-based: the peer
//!   addresses it from 0.
//!
//! A bound window holds its region: the region cannot be deregistered
//! until every window bound to it is unbound, invalidated or freed.
//!
//! The binding changes under a lock of its own, inside the window that
//! every snapshot of the memory table shares, so that a shard binding a
//! window and another checking a peer's access through it agree at once,
//! without a new snapshot.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Access, MemoryRegion, PdId};

/// The two kinds of memory window, with the values of `ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum WindowType {
    One = 1,
    Two = 2,
}

/// What a bind work request asks (`ibv_mw_bind_info`, with the window and
/// the new rkey).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowBind {
    /// Any rkey the window has had: its top 24 bits name it.
    pub window: u32,
    /// The window's rkey from now on; only its low 8 bits are taken.
    pub new_rkey: u32,
    /// The region the window opens onto, by its lkey.
    pub region_lkey: u32,
    /// The range, in the region's addresses.
    pub addr: u64,
    pub len: u64,
    /// The remote rights granted, and [`Access::ZERO_BASED`].
    pub access: Access,
}

/// Why a bind or an invalidation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WindowFault {
    #[error("no memory window has this key")]
    NoWindow,
    #[error("no memory region has this lkey")]
    NoRegion,
    #[error("the window, the region and the QP are not all in one protection domain")]
    WrongPd,
    #[error("a type 2 window must be invalidated before it is bound again")]
    Bound,
    #[error("the window is not bound, or the key is not its current one")]
    NotBound,
    #[error("a type 2 window is bound with a length, and a type 1 window is never zero-based")]
    BadBind,
    #[error("the region was not registered with IBV_ACCESS_MW_BIND")]
    RegionNotBindable,
    #[error("a window that grants remote write or atomic access needs a region with local write")]
    RegionNotWritable,
    #[error("the range lies outside the region")]
    OutOfRegion,
    #[error("a type 1 window cannot be invalidated")]
    TypeOne,
}

/// Where a bound window opens: the window's side of [`WindowBind`].
#[derive(Debug, Clone)]
pub(super) struct Bound {
    pub region_lkey: u32,
    /// The region's count of windows bound to it.
    pub region_windows: Arc<AtomicU32>,
    pub addr: u64,
    pub len: u64,
    pub access: Access,
    /// A type 2 window's QP.
    pub qpn: Option<u32>,
}

#[derive(Debug)]
struct Binding {
    rkey: u32,
    bound: Option<Bound>,
    /// Freed: an older snapshot that still holds the window reaches
    /// nothing through it.
    freed: bool,
}

/// One memory window.
#[derive(Debug)]
pub struct MemoryWindow {
    pub pd: PdId,
    pub kind: WindowType,
    binding: Mutex<Binding>,
}

/// The 24 bits of an rkey that name a window (its handle): the same in
/// every rkey the window takes.
pub fn window_handle(rkey: u32) -> u32 {
    rkey & !0xff
}

/// The window's rkey `rkey` with the consumer's key byte `key` in place
/// of its own: what a bind under `key` makes it (`ibv_inc_rkey` moves
/// `key` on by one).
pub fn with_key(rkey: u32, key: u8) -> u32 {
    window_handle(rkey) | u32::from(key)
}

impl MemoryWindow {
    pub(super) fn new(pd: PdId, kind: WindowType, rkey: u32) -> MemoryWindow {
        MemoryWindow { pd, kind, binding: Mutex::new(Binding { rkey, bound: None, freed: false }) }
    }

    fn lock(&self) -> MutexGuard<'_, Binding> {
        // Every change leaves the binding whole; a panic elsewhere must not
        // wedge the window.
        self.binding.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The window's rkey now.
    pub fn rkey(&self) -> u32 {
        self.lock().rkey
    }

    /// Binds the window as `bind` asks, over QP `qpn` of `qp_pd`, onto
    /// `region` (the region `bind.region_lkey` names, if it is live).
    pub(super) fn bind(
        &self,
        qp_pd: PdId,
        qpn: u32,
        bind: &WindowBind,
        region: Option<&MemoryRegion>,
    ) -> Result<u32, WindowFault> {
        let mut binding = self.lock();
        if binding.freed {
            return Err(WindowFault::NoWindow);
        }
        if self.pd != qp_pd {
            return Err(WindowFault::WrongPd);
        }
        let zero_based = bind.access.contains(Access::ZERO_BASED);
        match self.kind {
            WindowType::One if zero_based => return Err(WindowFault::BadBind),
            WindowType::Two if binding.bound.is_some() => return Err(WindowFault::Bound),
            WindowType::Two if bind.len == 0 => return Err(WindowFault::BadBind),
            _ => {}
        }
        let bound = if bind.len == 0 {
            None
        } else {
            let region = region.ok_or(WindowFault::NoRegion)?;
            if region.pd != self.pd {
                return Err(WindowFault::WrongPd);
            }
            if !region.access.contains(Access::MW_BIND) {
                return Err(WindowFault::RegionNotBindable);
            }
            let writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
            if bind.access.intersects(writes) && !region.access.contains(Access::LOCAL_WRITE) {
                return Err(WindowFault::RegionNotWritable);
            }
            let end = bind.addr.checked_add(bind.len).ok_or(WindowFault::OutOfRegion)?;
            if bind.addr < region.iova || end > region.iova + region.len {
                return Err(WindowFault::OutOfRegion);
            }
            Some(Bound {
                region_lkey: bind.region_lkey,
                region_windows: region.windows.clone(),
                addr: bind.addr,
                len: bind.len,
                access: bind.access & (Access::REMOTE | Access::ZERO_BASED),
                qpn: (self.kind == WindowType::Two).then_some(qpn),
            })
        };
        if let Some(new) = &bound {
            new.region_windows.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(old) = std::mem::replace(&mut binding.bound, bound) {
            old.region_windows.fetch_sub(1, Ordering::Relaxed);
        }
        binding.rkey = with_key(binding.rkey, bind.new_rkey as u8);
        Ok(binding.rkey)
    }

    /// Invalidates the type 2 window whose current rkey is `rkey`, for a
    /// QP of `pd` (`IBV_WR_LOCAL_INV`, or a peer's SEND with invalidate
    /// arriving there). The window is free again; its rkey stays, and no
    /// access is granted under it.
    pub(super) fn invalidate(&self, pd: PdId, rkey: u32) -> Result<(), WindowFault> {
        let mut binding = self.lock();
        if binding.freed || binding.rkey != rkey || binding.bound.is_none() {
            return Err(WindowFault::NotBound);
        }
        if self.pd != pd {
            return Err(WindowFault::WrongPd);
        }
        if self.kind == WindowType::One {
            return Err(WindowFault::TypeOne);
        }
        if let Some(old) = binding.bound.take() {
            old.region_windows.fetch_sub(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Frees the window (`ibv_dealloc_mw`): it lets go of its region.
    pub(super) fn free(&self) {
        let mut binding = self.lock();
        binding.freed = true;
        if let Some(old) = binding.bound.take() {
            old.region_windows.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Where a peer's access under `rkey` over QP `qpn` of `pd` lands, if
    /// the window grants it: the region's lkey and the address in the
    /// region's own terms. `need` holds the remote rights asked for.
    pub(super) fn resolve(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Option<(u32, u64)> {
        let binding = self.lock();
        let bound = binding.bound.as_ref().filter(|_| !binding.freed && binding.rkey == rkey)?;
        if self.pd != pd || bound.qpn.is_some_and(|own| own != qpn) || !bound.access.contains(need) {
            return None;
        }
        let at = if bound.access.contains(Access::ZERO_BASED) { bound.addr.checked_add(addr)? } else { addr };
        let end = at.checked_add(len)?;
        (at >= bound.addr && end <= bound.addr + bound.len).then_some((bound.region_lkey, at))
    }
}
