use softrnic_transport::{Access, WindowBind, WindowType, with_key};

use crate::{MemoryRegion, ProtectionDomain};

/// A memory window: an rkey that opens part of a region registered with
/// [`Access::MW_BIND`], bound and shut by work requests on a QP of its
/// domain ([`crate::SendOp::BindWindow`], [`crate::SendOp::LocalInvalidate`],
/// or a peer's [`crate::SendOp::SendWithInvalidate`] for a type 2 window).
pub struct MemoryWindow {
    pub(crate) pd: ProtectionDomain,
    pub(crate) rkey: u32,
    pub(crate) kind: WindowType,
}

impl MemoryWindow {
    pub fn kind(&self) -> WindowType {
        self.kind
    }

    /// The rkey the window was allocated under; each bind gives it another.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The bind that opens `len` bytes of `region` from `offset` with the
    /// remote rights in `access` (and [`Access::ZERO_BASED`], for a type 2
    /// window addressed from 0), under key byte `key`; and the rkey the
    /// window has once the bind completes. Post it as
    /// `SendOp::BindWindow(bind)`.
    pub fn bind(&self, region: &MemoryRegion, offset: usize, len: usize, access: Access, key: u8) -> (WindowBind, u32) {
        let bind = WindowBind {
            window: self.rkey,
            new_rkey: u32::from(key),
            region_lkey: region.lkey(),
            addr: region.iova() + offset as u64,
            len: len as u64,
            access,
        };
        (bind, with_key(self.rkey, key))
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        let _ = self.pd.ctx.provider.dealloc_window(self.rkey);
    }
}
