//! The memory translation and protection table: every key the device has
//! handed out, and the one check that every access passes.

use std::sync::Arc;

use super::window::{MemoryWindow, WindowBind, WindowFault, WindowType, window_handle};
use super::{Access, DmaBuffer, FileRanges, MemoryRegion, MrKeys, PdId, Registration};
use crate::error::{Result, VerbsError};
use imbl::shared_ptr::DefaultSharedPtr;
use rustc_hash::FxBuildHasher;
use softrnic_account::{self as account, Cost};

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

    /// `len` bytes of the view from `at` on.
    pub fn part(&self, at: usize, len: usize) -> MemoryView<'a> {
        assert!(at.checked_add(len).is_some_and(|end| end <= self.len), "a part outside the view");
        MemoryView { buffer: self.buffer, offset: self.offset + at, len }
    }

    /// Appends where the view's bytes lie in files peers can map to `out`;
    /// false if its buffer is not shared.
    pub fn shared_ranges(&self, out: &mut FileRanges) -> bool {
        match self.buffer {
            Some(buffer) => buffer.shared_ranges(self.offset, self.len, out),
            None => true,
        }
    }

    /// Copies the first `dst.len()` bytes of the view (at most its length).
    pub fn read(&self, dst: &mut [u8]) {
        assert!(dst.len() <= self.len);
        account::add(Cost::BytesCopied, dst.len() as u64);
        if let Some(buffer) = self.buffer {
            buffer.read(self.offset, dst);
        }
    }

    /// Copies `src` to the start of the view (at most its length).
    pub fn write(&self, src: &[u8]) {
        assert!(src.len() <= self.len);
        account::add(Cost::BytesCopied, src.len() as u64);
        if let Some(buffer) = self.buffer {
            buffer.write(self.offset, src);
        }
    }

    /// Copies the whole view into `dst` from `at` on.
    pub fn copy_to(&self, dst: &DmaBuffer, at: usize) {
        // One copy, however the bounce splits it.
        account::add(Cost::BytesCopied, self.len as u64);
        if let Some(buffer) = self.buffer {
            dst.copy_from(at, buffer, self.offset, self.len);
        }
    }

    /// Fills the whole view from `src`, starting at `at`.
    pub fn copy_from(&self, src: &DmaBuffer, at: usize) {
        account::add(Cost::BytesCopied, self.len as u64);
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

/// The memory regions of one device, by key: the snapshot every access,
/// local or remote, is checked against.
///
/// A region has two keys, both drawn by the caller (the control plane,
/// from its [`crate::entropy::Entropy`]) and neither derived from the
/// other or from anything else: its lkey, for the device's own work
/// requests, and its rkey, the only one a peer's request can name. So a
/// peer that learns one key learns nothing of the others, nor of the same
/// region's lkey.
///
/// The shards read the snapshot they were given while the control plane
/// makes the next, so the table is persistent (a hash array mapped trie,
/// `imbl`): a snapshot costs a pointer, and a change copies the few nodes
/// on its key's path, however many regions the table holds. (A plain map
/// copied whole made each registration cost a copy of every region.) Both
/// keys of a region live in the one trie, so that a registration, which
/// adds both, copies the nodes the snapshot shares once, not once a map.
#[derive(Debug, Default, Clone)]
pub struct MemoryTable {
    keys: Map<Key>,
    /// Memory windows allocated.
    windows: u32,
}

/// What a key names.
#[derive(Debug, Clone)]
enum Key {
    /// A live region: this is its lkey.
    Local(MemoryRegion),
    /// A live region's rkey, and the region's lkey.
    Remote(u32),
    /// A memory window, under its handle: the rkey with its low 8 bits
    /// clear. Every rkey the window takes lies in the block of 256 keys
    /// the handle starts, which no other key enters.
    Window(Arc<MemoryWindow>),
}

/// A persistent map by key, hashed as the rest of the transport hashes.
type Map<V> = imbl::GenericHashMap<u32, V, FxBuildHasher, DefaultSharedPtr>;

const MAX_REGIONS: usize = 1 << 24;

impl MemoryTable {
    pub fn new() -> MemoryTable {
        MemoryTable::default()
    }

    /// Registers what `r` describes (its PD checked by the caller), under
    /// two keys drawn from `draw`, which is asked again for any key that
    /// is 0 or already names a region.
    pub fn register(&mut self, r: Registration, draw: &mut impl FnMut() -> u32) -> Result<MrKeys> {
        Self::validate(&r)?;
        if self.keys.len() >= 2 * MAX_REGIONS {
            return Err(VerbsError::OutOfResources("memory regions".into()));
        }
        let lkey = self.fresh_key(draw);
        let rkey = std::iter::repeat_with(|| self.fresh_key(draw)).find(|&k| k != lkey).expect("an endless draw");
        let keys = MrKeys { lkey, rkey };
        self.keys.insert(lkey, Key::Local(MemoryRegion::of(r, keys)));
        self.keys.insert(rkey, Key::Remote(lkey));
        Ok(keys)
    }

    /// A key from `draw` that names nothing yet, nor lies in a window's
    /// block. 0 is never one, so that a zeroed work request names no
    /// region.
    fn fresh_key(&self, draw: &mut impl FnMut() -> u32) -> u32 {
        loop {
            let key = draw();
            if key != 0 && !self.keys.contains_key(&key) && self.window(key).is_none() {
                return key;
            }
        }
    }

    /// Allocates a memory window of `kind` in `pd` (checked by the caller)
    /// under an rkey drawn from `draw`, whose block of 256 keys holds no
    /// key yet. Returns the window's first rkey.
    pub fn alloc_window(&mut self, pd: PdId, kind: WindowType, draw: &mut impl FnMut() -> u32) -> Result<u32> {
        if self.keys.len() >= 2 * MAX_REGIONS || self.windows >= crate::limits::MAX_MW {
            return Err(VerbsError::OutOfResources("memory windows".into()));
        }
        let rkey = loop {
            let key = draw();
            let handle = window_handle(key);
            if handle != 0 && (0..=0xff).all(|low| !self.keys.contains_key(&(handle | low))) {
                break key;
            }
        };
        self.keys.insert(window_handle(rkey), Key::Window(Arc::new(MemoryWindow::new(pd, kind, rkey))));
        self.windows += 1;
        Ok(rkey)
    }

    /// Frees the window `rkey` (any key it has had) names. It lets go of
    /// its region, and an older snapshot reaches nothing through it.
    pub fn dealloc_window(&mut self, rkey: u32) -> Result<Arc<MemoryWindow>> {
        if self.window(rkey).is_none() {
            return Err(VerbsError::NotFound("memory window"));
        }
        let Some(Key::Window(window)) = self.keys.remove(&window_handle(rkey)) else { unreachable!("looked up above") };
        window.free();
        self.windows -= 1;
        Ok(window)
    }

    /// The window whose block holds `rkey`.
    pub fn window(&self, rkey: u32) -> Option<&Arc<MemoryWindow>> {
        match self.keys.get(&window_handle(rkey))? {
            Key::Window(window) => Some(window),
            _ => None,
        }
    }

    /// Binds a window as `bind` asks, over QP `qpn` of `pd`. Returns the
    /// window's new rkey. The table itself does not change: the binding
    /// lives in the window, which every snapshot shares.
    pub fn bind_window(&self, pd: PdId, qpn: u32, bind: &WindowBind) -> core::result::Result<u32, WindowFault> {
        let window = self.window(bind.window).ok_or(WindowFault::NoWindow)?;
        window.bind(pd, qpn, bind, self.lookup(bind.region_lkey))
    }

    /// Invalidates the type 2 window whose current rkey is `rkey`, for a
    /// QP of `pd`. A region's rkey cannot be invalidated: softrnic has no
    /// fast-registration regions, the only kind that can.
    pub fn invalidate(&self, pd: PdId, rkey: u32) -> core::result::Result<(), WindowFault> {
        self.window(rkey).ok_or(WindowFault::NoWindow)?.invalidate(pd, rkey)
    }

    /// Gives the region `lkey` names a new translation, protection domain
    /// (checked by the caller) or access (`ibv_rereg_mr`), under the same
    /// keys, as hardware keeps them: a peer holding the rkey reaches the
    /// new memory. Returns the keys and the region as it was (its PD, and
    /// its memory, which peers on this host may still be copying).
    pub fn reregister(&mut self, lkey: u32, r: Registration) -> Result<(MrKeys, MemoryRegion)> {
        Self::validate(&r)?;
        if self.lookup(lkey).is_none() {
            return Err(VerbsError::NotFound("memory region"));
        }
        let Some(Key::Local(region)) = self.keys.get_mut(&lkey) else { unreachable!("looked up above") };
        let (keys, windows) = (region.keys, region.windows.clone());
        let old = std::mem::replace(region, MemoryRegion { windows, ..MemoryRegion::of(r, keys) });
        Ok((keys, old))
    }

    /// The checks every registration passes.
    fn validate(r: &Registration) -> Result<()> {
        let Registration { ref buffer, offset, len, iova, access, .. } = *r;
        if offset.checked_add(len).is_none_or(|end| end > buffer.len()) {
            return Err(VerbsError::invalid(format!(
                "region {offset}+{len} does not fit its buffer of {} bytes",
                buffer.len()
            )));
        }
        if access.contains(Access::ZERO_BASED) {
            return Err(VerbsError::NotSupported("zero-based memory regions".into()));
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

    /// Deregisters the region `lkey` names. Returns it: its keys name
    /// nothing from now on.
    pub fn deregister(&mut self, lkey: u32) -> Result<MemoryRegion> {
        let Some(region) = self.lookup(lkey) else {
            return Err(VerbsError::NotFound("memory region"));
        };
        if region.windows.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            return Err(VerbsError::Busy("the region (memory windows are bound to it)"));
        }
        let Some(Key::Local(region)) = self.keys.remove(&lkey) else { unreachable!("looked up above") };
        self.keys.remove(&region.keys.rkey);
        Ok(region)
    }

    /// The region an lkey names, if it is live.
    pub fn lookup(&self, lkey: u32) -> Option<&MemoryRegion> {
        match self.keys.get(&lkey)? {
            Key::Local(region) => Some(region),
            Key::Remote(_) | Key::Window(_) => None,
        }
    }

    /// The region an rkey names, if it is live.
    fn lookup_remote(&self, rkey: u32) -> Option<&MemoryRegion> {
        match self.keys.get(&rkey)? {
            Key::Remote(lkey) => self.lookup(*lkey),
            Key::Local(_) | Key::Window(_) => None,
        }
    }

    /// Checks that `lkey` allows `need` on `[addr, addr + len)` from `pd`
    /// and returns that range. Zero-length accesses touch nothing and need
    /// no valid key, as in the IBTA (9.7.4.1.3).
    pub fn check(
        &self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> core::result::Result<MemoryView<'_>, AccessFault> {
        if len == 0 {
            return Ok(MemoryView::EMPTY);
        }
        let region = self.lookup(lkey).ok_or(AccessFault::InvalidKey)?;
        Self::check_region(region, pd, addr, len, need)
    }

    fn check_region(
        region: &MemoryRegion,
        pd: PdId,
        addr: u64,
        len: usize,
        need: Access,
    ) -> core::result::Result<MemoryView<'_>, AccessFault> {
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

    /// Checks a remote access arriving over QP `qpn` of `pd`: like
    /// [`Self::check`], under a region's rkey (a region registered without
    /// any remote permission has no valid rkey at all) or a window's
    /// current one (the window grants the rights; its region, only bounds).
    pub fn check_remote(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        addr: u64,
        len: usize,
        need: Access,
    ) -> core::result::Result<MemoryView<'_>, AccessFault> {
        if len == 0 {
            return Ok(MemoryView::EMPTY);
        }
        if let Some(region) = self.lookup_remote(rkey) {
            let region = Some(region).filter(|r| r.access.intersects(Access::REMOTE));
            return Self::check_region(region.ok_or(AccessFault::InvalidKey)?, pd, addr, len, need);
        }
        let window = self.window(rkey).ok_or(AccessFault::InvalidKey)?;
        let (lkey, at) = window.resolve(pd, qpn, rkey, addr, len as u64, need).ok_or(AccessFault::NotPermitted)?;
        Self::check_region(self.lookup(lkey).ok_or(AccessFault::InvalidKey)?, pd, at, len, Access::empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entropy::Entropy;
    use std::sync::Arc;

    /// Keys as the control plane draws them, each call from a stream of
    /// its own.
    fn draw() -> impl FnMut() -> u32 {
        static STREAM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Entropy::from_u64(STREAM.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).into_draw()
    }

    fn table_with_region(access: Access) -> (MemoryTable, PdId, MrKeys) {
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let buffer = Arc::new(DmaBuffer::new(64));
        let keys = table
            .register(Registration { pd, buffer, offset: 16, len: 32, iova: 0x1000, access }, &mut draw())
            .unwrap();
        (table, pd, keys)
    }

    #[test]
    fn checks_key_pd_bounds_and_access() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert!(table.check(pd, keys.lkey, 0x1000, 32, Access::empty()).is_ok());
        assert_eq!(table.check(pd, keys.lkey ^ 1, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::InvalidKey);
        let other = PdId(1);
        assert_eq!(table.check(other, keys.lkey, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::WrongPd);
        assert_eq!(table.check(pd, keys.lkey, 0xfff, 1, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        assert_eq!(table.check(pd, keys.lkey, 0x1001, 32, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        assert_eq!(table.check(pd, keys.lkey, u64::MAX, 2, Access::empty()).unwrap_err(), AccessFault::OutOfBounds);
        let (rkey, lkey) = (keys.rkey, keys.lkey);
        assert_eq!(
            table.check_remote(pd, 0, rkey, 0x1000, 8, Access::REMOTE_WRITE).unwrap_err(),
            AccessFault::NotPermitted
        );
        assert!(table.check_remote(pd, 0, rkey, 0x1000, 8, Access::REMOTE_READ).is_ok());
        assert_eq!(table.check(pd, rkey, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::InvalidKey, "an rkey");
        assert_eq!(
            table.check_remote(pd, 0, lkey, 0x1000, 1, Access::REMOTE_READ).unwrap_err(),
            AccessFault::InvalidKey
        );
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
            .register(
                Registration {
                    pd,
                    buffer: Arc::new(DmaBuffer::new(8)),
                    offset: 0,
                    len: 8,
                    iova: 0,
                    access: Access::LOCAL_WRITE,
                },
                &mut draw(),
            )
            .unwrap();
        assert_ne!(again.lkey, keys.lkey);
        assert!(table.lookup(keys.lkey).is_none());
    }

    /// A key is drawn, not derived from where its region is kept: every
    /// bit of the keys varies, the two keys of a region differ, and a key
    /// that names a live region (or 0) is never handed out again.
    #[test]
    fn keys_are_drawn_and_never_name_two_regions() {
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let buffer = Arc::new(DmaBuffer::new(8));
        let r = || Registration { pd, buffer: buffer.clone(), offset: 0, len: 8, iova: 0, access: Access::REMOTE_READ };
        let mut draw = draw();
        let keys: Vec<MrKeys> = (0..256).map(|_| table.register(r(), &mut draw).unwrap()).collect();
        let (mut ones, mut zeros) = (0u32, 0u32);
        for k in &keys {
            assert_ne!(k.lkey, k.rkey);
            (ones, zeros) = (ones | k.lkey | k.rkey, zeros | !k.lkey | !k.rkey);
        }
        assert_eq!((ones, zeros), (u32::MAX, u32::MAX), "every bit of a key is drawn");
        // A source that repeats itself: live keys and 0 are drawn again.
        let (live, fresh) = (keys[0], 0x5eed);
        let mut repeats = [live.lkey, live.rkey, 0, keys[1].rkey, fresh, fresh + 1].into_iter();
        let next = table.register(r(), &mut || repeats.next().unwrap()).unwrap();
        assert_eq!(next, MrKeys { lkey: fresh, rkey: fresh + 1 });
        assert_eq!(table.lookup(live.lkey).unwrap().keys, live, "the live region keeps its keys");
    }

    #[test]
    fn reregistering_keeps_the_keys() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE);
        let other = PdId(1);
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
        assert_eq!((again.0, again.1.pd), (keys, pd), "the keys, and the PD it had");
        assert!(table.check(other, keys.lkey, 0x9000, 16, Access::LOCAL_WRITE).is_ok());
        assert_eq!(table.check(pd, keys.lkey, 0x9000, 1, Access::empty()).unwrap_err(), AccessFault::WrongPd);
        assert!(table.check_remote(other, 0, keys.rkey, 0x9000, 1, Access::empty()).is_err(), "no remote access now");
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

    /// A window of `kind` in `pd`, and a bind onto all of the region `keys`
    /// names (at 0x1000, 32 bytes) for remote writes under key byte 1.
    fn window_on(table: &mut MemoryTable, pd: PdId, keys: MrKeys, kind: WindowType) -> (u32, WindowBind) {
        let rkey = table.alloc_window(pd, kind, &mut draw()).unwrap();
        let bind = WindowBind {
            window: rkey,
            new_rkey: 1,
            region_lkey: keys.lkey,
            addr: 0x1000,
            len: 32,
            access: Access::REMOTE_WRITE,
        };
        (rkey, bind)
    }

    #[test]
    fn a_type_2_window_answers_only_its_qp_its_pd_and_its_rights() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE | Access::MW_BIND);
        let (rkey, bind) = window_on(&mut table, pd, keys, WindowType::Two);
        assert_eq!(rkey & !0xff, table.window(rkey).map(|w| w.rkey() & !0xff).unwrap(), "its handle");
        assert_eq!(table.bind_window(PdId(9), 7, &bind), Err(WindowFault::WrongPd));
        let key = table.bind_window(pd, 7, &bind).unwrap();
        assert_eq!(key, (rkey & !0xff) | 1);
        assert!(table.check_remote(pd, 7, key, 0x1000, 32, Access::REMOTE_WRITE).is_ok());
        assert_eq!(
            table.check_remote(pd, 8, key, 0x1000, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessFault::NotPermitted,
            "another QP"
        );
        assert_eq!(
            table.check_remote(PdId(1), 7, key, 0x1000, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessFault::NotPermitted
        );
        assert_eq!(
            table.check_remote(pd, 7, key, 0x1000, 1, Access::REMOTE_READ).unwrap_err(),
            AccessFault::NotPermitted
        );
        assert_eq!(
            table.check_remote(pd, 7, key ^ 2, 0x1000, 1, Access::REMOTE_WRITE).unwrap_err(),
            AccessFault::NotPermitted,
            "a stale key byte"
        );
        assert_eq!(
            table.check_remote(pd, 7, key, 0x1001, 32, Access::REMOTE_WRITE).unwrap_err(),
            AccessFault::NotPermitted
        );
        assert_eq!(table.check(pd, key, 0x1000, 1, Access::empty()).unwrap_err(), AccessFault::InvalidKey, "no lkey");
        assert_eq!(table.invalidate(PdId(1), key), Err(WindowFault::WrongPd));
        assert_eq!(table.invalidate(pd, key ^ 2), Err(WindowFault::NotBound));
        table.invalidate(pd, key).unwrap();
        assert_eq!(table.invalidate(pd, key), Err(WindowFault::NotBound), "once");
        assert!(table.check_remote(pd, 7, key, 0x1000, 1, Access::REMOTE_WRITE).is_err());
    }

    /// No region key is ever drawn inside a window's block of 256 keys,
    /// and no window takes a block a region key lies in.
    #[test]
    fn windows_and_regions_never_share_a_block() {
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let buffer = Arc::new(DmaBuffer::new(8));
        let r = || Registration { pd, buffer: buffer.clone(), offset: 0, len: 8, iova: 0, access: Access::REMOTE_READ };
        let mut keys = [0x1100_0001u32, 0x1100_0002].into_iter();
        let mr = table.register(r(), &mut || keys.next().unwrap()).unwrap();
        let mut draws = [0x1100_00aa, 0x2200_0033].into_iter();
        let rkey = table.alloc_window(pd, WindowType::One, &mut || draws.next().unwrap()).unwrap();
        assert_eq!(rkey, 0x2200_0033, "the block of the region's keys was skipped");
        let mut draws = [0x2200_0044, 0x3300_0001, 0x3300_0002].into_iter();
        let next = table.register(r(), &mut || draws.next().unwrap()).unwrap();
        assert_eq!(next, MrKeys { lkey: 0x3300_0001, rkey: 0x3300_0002 }, "the window's block was skipped");
        assert!(table.lookup(mr.lkey).is_some());
    }

    /// A shard binding and invalidating a window while another checks
    /// peers' accesses through it: every access let through lies within
    /// a binding that was current, under that binding's key.
    #[test]
    fn binding_and_checking_from_two_threads_agree() {
        let (mut table, pd, keys) = table_with_region(Access::LOCAL_WRITE | Access::MW_BIND);
        let (_, bind) = window_on(&mut table, pd, keys, WindowType::Two);
        let table = Arc::new(table);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let binder = {
            let (table, stop) = (table.clone(), stop.clone());
            std::thread::spawn(move || {
                for round in 0..20_000u32 {
                    // Even rounds open the first half under key byte 2n,
                    // odd ones the second half under key byte 2n+1.
                    let half = u64::from(round % 2) * 16;
                    let b = WindowBind { new_rkey: round & 0xff, addr: 0x1000 + half, len: 16, ..bind };
                    let key = table.bind_window(pd, 7, &b).unwrap();
                    table.invalidate(pd, key).unwrap();
                }
                stop.store(true, std::sync::atomic::Ordering::Release);
            })
        };
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            for byte in 0..=0xffu32 {
                let key = (bind.window & !0xff) | byte;
                for at in [0x1000, 0x1010] {
                    if table.check_remote(pd, 7, key, at, 16, Access::REMOTE_WRITE).is_ok() {
                        let half = u32::from(at == 0x1010);
                        assert_eq!(byte % 2, half, "key byte {byte:#x} opens only its own half");
                    }
                    assert!(table.check_remote(pd, 7, key, 0x1008, 16, Access::REMOTE_WRITE).is_err(), "across halves");
                }
            }
        }
        binder.join().unwrap();
    }

    #[test]
    fn registration_rules() {
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let buffer = Arc::new(DmaBuffer::new(8));
        assert!(
            table
                .register(
                    Registration { pd, buffer: buffer.clone(), offset: 4, len: 8, iova: 0, access: Access::empty() },
                    &mut draw()
                )
                .is_err()
        );
        assert!(
            table
                .register(
                    Registration {
                        pd,
                        buffer: buffer.clone(),
                        offset: 0,
                        len: 8,
                        iova: 0,
                        access: Access::REMOTE_WRITE
                    },
                    &mut draw()
                )
                .is_err()
        );
        let keys = table
            .register(Registration { pd, buffer, offset: 0, len: 8, iova: 0, access: Access::empty() }, &mut draw())
            .unwrap();
        assert_eq!(table.check_remote(pd, 0, keys.rkey, 0, 8, Access::empty()).unwrap_err(), AccessFault::InvalidKey);
        assert_eq!(table.deregister(keys.lkey).unwrap().keys, keys);
        assert_eq!(table.deregister(keys.lkey).unwrap_err(), VerbsError::NotFound("memory region"));
    }
}
