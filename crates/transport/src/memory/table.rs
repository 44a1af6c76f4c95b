//! The memory translation and protection table: every key the device has
//! handed out, and the one check that every access passes.

use super::{Access, DmaBuffer, MemoryRegion, MrKeys, PdId, Registration};
use crate::error::{Result, VerbsError};

/// Why an access was refused. The transport turns each into the status or
/// NAK that the IBTA prescribes for the side that made the access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFault {
    /// No region has this key (or it was deregistered).
    InvalidKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the access.
    NotPermitted,
}

/// A checked range of a memory region.
#[derive(Debug, Clone, Copy)]
pub struct MemoryView<'a> {
    buffer: Option<&'a DmaBuffer>,
    offset: usize,
    len: usize,
}

impl<'a> MemoryView<'a> {
    const EMPTY: MemoryView<'static> = MemoryView { buffer: None, offset: 0, len: 0 };

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the first `dst.len()` bytes of the view (at most its length).
    pub fn read(&self, dst: &mut [u8]) {
        assert!(dst.len() <= self.len);
        if let Some(buffer) = self.buffer {
            buffer.read(self.offset, dst);
        }
    }

    /// Copies `src` to the start of the view (at most its length).
    pub fn write(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        if let Some(buffer) = self.buffer {
            buffer.write(self.offset, src);
        }
    }

    /// Copies the whole view into `dst` from `at` on.
    pub fn copy_to(&self, dst: &DmaBuffer, at: usize) {
        if let Some(buffer) = self.buffer {
            dst.copy_from(at, buffer, self.offset, self.len);
        }
    }

    /// Fills the whole view from `src`, starting at `at`.
    pub fn copy_from(&self, src: &DmaBuffer, at: usize) {
        if let Some(buffer) = self.buffer {
            buffer.copy_from(self.offset, src, at, self.len);
        }
    }

    /// Applies `op` atomically to the 8 bytes of the view, returning the
    /// value they held.
    pub fn atomic_update(&self, op: impl Fn(u64) -> u64) -> u64 {
        assert_eq!(self.len, 8);
        self.buffer.map(|b| b.atomic_update(self.offset, op)).unwrap_or(0)
    }
}

#[derive(Debug, Default, Clone)]
struct Slot {
    region: Option<MemoryRegion>,
    /// Bumped on every reuse so that a stale key never names a new region.
    generation: u8,
}

/// Protection domains and memory regions of one device.
#[derive(Debug, Default, Clone)]
pub struct MemoryTable {
    /// Objects (regions and QPs) that use each protection domain; `None`
    /// once deallocated.
    pds: Vec<Option<u32>>,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
}

const MAX_REGIONS: usize = 1 << 24;

impl MemoryTable {
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    pub fn alloc_pd(&mut self) -> PdId {
        self.pds.push(Some(0));
        PdId(self.pds.len() as u32 - 1)
    }

    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        match self.pds.get_mut(pd.0 as usize) {
            Some(slot @ Some(0)) => {
                *slot = None;
                Ok(())
            }
            Some(Some(_)) => Err(VerbsError::Busy("protection domain")),
            _ => Err(VerbsError::NotFound("protection domain")),
        }
    }

    pub fn pd_exists(&self, pd: PdId) -> bool {
        matches!(self.pds.get(pd.0 as usize), Some(Some(_)))
    }

    /// Records that one more object uses `pd` (or one fewer).
    pub(crate) fn pd_users(&mut self, pd: PdId, delta: i32) -> Result<()> {
        match self.pds.get_mut(pd.0 as usize) {
            Some(Some(users)) => {
                *users = users.checked_add_signed(delta).expect("pd user count");
                Ok(())
            }
            _ => Err(VerbsError::NotFound("protection domain")),
        }
    }

    /// Registers what `r` describes.
    pub fn register(&mut self, r: Registration) -> Result<MrKeys> {
        self.validate(&r)?;
        let index = match self.free_slots.pop() {
            Some(index) => index,
            None if self.slots.len() < MAX_REGIONS => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
            None => return Err(VerbsError::OutOfResources("memory regions".into())),
        };
        let slot = &mut self.slots[index];
        slot.generation = slot.generation.wrapping_add(1);
        let key = ((index as u32) << 8) | u32::from(slot.generation);
        let keys = MrKeys { lkey: key, rkey: key };
        let pd = r.pd;
        slot.region = Some(MemoryRegion::of(r, keys));
        self.pd_users(pd, 1)?;
        Ok(keys)
    }

    /// Gives the region `lkey` names a new translation, protection domain
    /// or access (`ibv_rereg_mr`), under the same keys, as hardware keeps
    /// them: a peer holding the rkey reaches the new memory.
    pub fn reregister(&mut self, lkey: u32, r: Registration) -> Result<MrKeys> {
        let old = self.lookup(lkey).ok_or(VerbsError::NotFound("memory region"))?;
        let (old_pd, keys) = (old.pd, old.keys);
        self.validate(&r)?;
        let pd = r.pd;
        self.slots[(lkey >> 8) as usize].region = Some(MemoryRegion::of(r, keys));
        self.pd_users(old_pd, -1)?;
        self.pd_users(pd, 1)?;
        Ok(keys)
    }

    /// The checks every registration passes.
    fn validate(&self, r: &Registration) -> Result<()> {
        let Registration { pd, ref buffer, offset, len, iova, access } = *r;
        if !self.pd_exists(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if offset.checked_add(len).is_none_or(|end| end > buffer.len()) {
            return Err(VerbsError::invalid(format!(
                "region {offset}+{len} does not fit its buffer of {} bytes",
                buffer.len()
            )));
        }
        if iova.checked_add(len as u64).is_none() {
            return Err(VerbsError::invalid("iova + length overflows"));
        }
        // Verbs: remote write or atomic access needs local write too.
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::invalid("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE as well"));
        }
        Ok(())
    }

    pub fn deregister(&mut self, lkey: u32) -> Result<()> {
        let index = (lkey >> 8) as usize;
        let region = self.lookup(lkey).ok_or(VerbsError::NotFound("memory region"))?;
        let pd = region.pd;
        self.slots[index].region = None;
        self.free_slots.push(index);
        self.pd_users(pd, -1)
    }

    /// The region a key names, if it is live.
    pub fn lookup(&self, key: u32) -> Option<&MemoryRegion> {
        let slot = self.slots.get((key >> 8) as usize)?;
        slot.region.as_ref().filter(|r| r.keys.lkey == key)
    }

    /// Checks that `key` allows `need` on `[addr, addr + len)` from `pd`
    /// and returns that range. Zero-length accesses touch nothing and need
    /// no valid key, as in the IBTA (9.7.4.1.3).
    pub fn check(
        &self,
        pd: PdId,
        key: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> core::result::Result<MemoryView<'_>, AccessFault> {
        if len == 0 {
            return Ok(MemoryView::EMPTY);
        }
        let region = self.lookup(key).ok_or(AccessFault::InvalidKey)?;
        if region.pd != pd {
            return Err(AccessFault::WrongPd);
        }
        let start = addr.checked_sub(region.iova).ok_or(AccessFault::OutOfBounds)?;
        let end = start.checked_add(len as u64).ok_or(AccessFault::OutOfBounds)?;
        if end > region.len {
            return Err(AccessFault::OutOfBounds);
        }
        if !region.access.contains(need) {
            return Err(AccessFault::NotPermitted);
        }
        Ok(MemoryView { buffer: Some(&region.buffer), offset: region.offset + start as usize, len })
    }

    /// Checks a remote access: like [`Self::check`], but a region registered
    /// without any remote permission has no valid rkey at all.
    pub fn check_remote(
        &self,
        pd: PdId,
        rkey: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> core::result::Result<MemoryView<'_>, AccessFault> {
        if len > 0 && self.lookup(rkey).is_some_and(|r| !r.access.intersects(Access::REMOTE)) {
            return Err(AccessFault::InvalidKey);
        }
        self.check(pd, rkey, addr, len, need)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn table_with_region(access: Access) -> (MemoryTable, PdId, MrKeys) {
        let mut table = MemoryTable::new();
        let pd = table.alloc_pd();
        let buffer = Arc::new(DmaBuffer::new(64));
        let keys = table.register(Registration { pd, buffer, offset: 16, len: 32, iova: 0x1000, access }).unwrap();
        (table, pd, keys)
    }

    #[test]
    fn checks_key_pd_bounds_and_access() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert!(table.check(pd, keys.lkey, 0x1000, 32, Access::empty()).is_ok());
        assert_eq!(table.check(pd, keys.lkey ^ 1, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::InvalidKey);
        let other = table.alloc_pd();
        assert_eq!(table.check(other, keys.lkey, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::WrongPd);
        assert_eq!(table.check(pd, keys.lkey, 0xfff, 1, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        assert_eq!(table.check(pd, keys.lkey, 0x1001, 32, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        assert_eq!(table.check(pd, keys.lkey, u64::MAX, 2, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        assert_eq!(table.check(pd, keys.rkey, 0x1000, 8, Access::REMOTE_WRITE).unwrap_err(), AccessFault::NotPermitted);
        assert!(table.check(pd, 0xdead, 0, 0, Access::REMOTE_WRITE).is_ok(), "zero length needs no key");
        table.deregister(keys.lkey).unwrap();
        assert_eq!(table.check(pd, keys.lkey, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::InvalidKey);
    }

    #[test]
    fn views_address_the_registered_part_of_the_buffer() {
        let (table, pd, keys) = table_with_region(Access::LOCAL_WRITE);
        let view = table.check(pd, keys.lkey, 0x1004, 4, Access::LOCAL_WRITE).unwrap();
        view.write(b"wxyz");
        let region = table.lookup(keys.lkey).unwrap();
        assert_eq!(&region.buffer().to_vec()[20..24], b"wxyz");
    }

    #[test]
    fn stale_keys_do_not_name_reused_slots() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE);
        table.deregister(keys.lkey).unwrap();
        let again = table
            .register(Registration {
                pd,
                buffer: Arc::new(DmaBuffer::new(8)),
                offset: 0,
                len: 8,
                iova: 0,
                access: Access::LOCAL_WRITE,
            })
            .unwrap();
        assert_ne!(again.lkey, keys.lkey);
        assert!(table.lookup(keys.lkey).is_none());
    }

    #[test]
    fn reregistering_keeps_the_keys_and_moves_the_pd_count() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE);
        let other = table.alloc_pd();
        let buffer = Arc::new(DmaBuffer::new(16));
        // A bad request changes nothing.
        assert!(
            table
                .reregister(
                    keys.lkey,
                    Registration {
                        pd: other,
                        buffer: buffer.clone(),
                        offset: 8,
                        len: 16,
                        iova: 0,
                        access: Access::empty()
                    }
                )
                .is_err()
        );
        assert_eq!(table.lookup(keys.lkey).unwrap().pd, pd);
        let again = table
            .reregister(
                keys.lkey,
                Registration { pd: other, buffer, offset: 0, len: 16, iova: 0x9000, access: Access::LOCAL_WRITE },
            )
            .unwrap();
        assert_eq!(again, keys);
        assert!(table.check(other, keys.lkey, 0x9000, 16, Access::LOCAL_WRITE).is_ok());
        assert_eq!(table.check(pd, keys.lkey, 0x9000, 1, Access::empty()).unwrap_err(), AccessFault::WrongPd);
        // The first PD has no user left; the second has the region.
        assert!(table.dealloc_pd(pd).is_ok());
        assert!(table.dealloc_pd(other).is_err());
        assert!(
            table
                .reregister(
                    0xdead,
                    Registration {
                        pd: other,
                        buffer: Arc::new(DmaBuffer::new(1)),
                        offset: 0,
                        len: 1,
                        iova: 0,
                        access: Access::empty()
                    }
                )
                .is_err()
        );
    }

    #[test]
    fn registration_rules() {
        let mut table = MemoryTable::new();
        let pd = table.alloc_pd();
        let buffer = Arc::new(DmaBuffer::new(8));
        assert!(
            table
                .register(Registration {
                    pd,
                    buffer: buffer.clone(),
                    offset: 4,
                    len: 8,
                    iova: 0,
                    access: Access::empty()
                })
                .is_err()
        );
        assert!(
            table
                .register(Registration {
                    pd,
                    buffer: buffer.clone(),
                    offset: 0,
                    len: 8,
                    iova: 0,
                    access: Access::REMOTE_WRITE
                })
                .is_err()
        );
        assert!(
            table
                .register(Registration {
                    pd: PdId(9),
                    buffer: buffer.clone(),
                    offset: 0,
                    len: 8,
                    iova: 0,
                    access: Access::empty()
                })
                .is_err()
        );
        let keys =
            table.register(Registration { pd, buffer, offset: 0, len: 8, iova: 0, access: Access::empty() }).unwrap();
        assert_eq!(table.dealloc_pd(pd), Err(VerbsError::Busy("protection domain")));
        assert_eq!(table.check_remote(pd, keys.rkey, 0, 8, Access::empty()).unwrap_err(), AccessFault::InvalidKey);
        table.deregister(keys.lkey).unwrap();
        table.dealloc_pd(pd).unwrap();
    }
}
