//! Protection domains and memory regions.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::DmaBuffer;

/// A protection domain: QPs and memory regions only work together when
/// they belong to the same one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PdId(pub u32);

bitflags::bitflags! {
    /// What a memory region allows, with the values of `ibv_access_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    pub struct Access: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the region.
        const MW_BIND = 1 << 4;
        /// A window's binding addressed from 0 (a bind's flag only).
        const ZERO_BASED = 1 << 5;
    }
}

impl Access {
    /// Every remote permission.
    pub const REMOTE: Access = Access::REMOTE_WRITE.union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC);
}

/// The keys of a registered region: the lkey names it in the device's own
/// work requests, the rkey in a peer's. They differ, and neither tells
/// the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// What a registration asks for: `len` bytes of `buffer` from `offset` on,
/// in `pd`, addressed by work requests and peers from `iova` on, with
/// `access`. One value through every layer (the verbs, the engine, the
/// control plane, the table).
#[derive(Debug, Clone)]
pub struct Registration {
    pub pd: PdId,
    pub buffer: Arc<DmaBuffer>,
    pub offset: usize,
    pub len: usize,
    pub iova: u64,
    pub access: Access,
}

impl Registration {
    /// All of `buffer`, from `iova` on.
    pub fn whole(pd: PdId, buffer: Arc<DmaBuffer>, iova: u64, access: Access) -> Registration {
        let len = buffer.len();
        Registration { pd, buffer, offset: 0, len, iova, access }
    }
}

/// A registered memory region: `len` bytes of a buffer, addressed by
/// work requests and remote peers from `iova` on.
#[derive(Debug, Clone)]
pub struct MemoryRegion {
    pub pd: PdId,
    pub iova: u64,
    pub len: u64,
    pub access: Access,
    pub keys: MrKeys,
    pub(crate) buffer: Arc<DmaBuffer>,
    /// Memory windows bound to the region, which keep it registered.
    pub(crate) windows: Arc<AtomicU32>,
    /// Where `iova` lies in `buffer`.
    pub(crate) offset: usize,
}

impl MemoryRegion {
    /// The region `r` asked for, under `keys`.
    pub(crate) fn of(r: Registration, keys: MrKeys) -> MemoryRegion {
        let Registration { pd, buffer, offset, len, iova, access } = r;
        MemoryRegion { pd, iova, len: len as u64, access, keys, buffer, offset, windows: Arc::default() }
    }

    /// The buffer behind the region.
    pub fn buffer(&self) -> &Arc<DmaBuffer> {
        &self.buffer
    }
}
