//! Memory that a program and softrnicd both map: a memfd, sealed so that
//! neither side can shrink it under the other.
//!
//! Sealing is what makes mapping a stranger's memory safe. A mapping of a
//! file that is later truncated faults (`SIGBUS`) on the pages past the new
//! end, and a fault in the engine would take every tenant down with it. So
//! the daemon seals what it creates (`F_SEAL_SHRINK | F_SEAL_GROW |
//! F_SEAL_SEAL`) and maps a program's memfd only if the program sealed it
//! against shrinking first.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use serde::{Deserialize, Serialize};
use softrnic_transport::{DmaBuffer, SharedFile, SharedPart};

/// One memfd's part of a mapping: `len` bytes from `offset` (a multiple
/// of the page size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub offset: u64,
    pub len: u64,
}

/// Contiguous memory mapped from one or more memfds.
pub struct SharedMapping {
    ptr: NonNull<u8>,
    /// Bytes the segments hold.
    len: usize,
    /// Bytes mapped: each segment rounded up to whole pages.
    mapped: usize,
    /// The memfds, and which part of each is mapped, in mapping order.
    fds: Vec<OwnedFd>,
    segments: Vec<Segment>,
}

// SAFETY: a mapping of shared memory; every access goes through atomics or
// the atomic copies of `DmaBuffer`.
unsafe impl Send for SharedMapping {}
// SAFETY: as above.
unsafe impl Sync for SharedMapping {}

impl SharedMapping {
    /// A new zero-filled memfd of `len` bytes, mapped and sealed at that
    /// size.
    pub fn create(name: &str, len: usize) -> io::Result<SharedMapping> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        SharedMapping::map(vec![(fd, Segment { offset: 0, len: len as u64 })])
    }

    /// Maps `len` bytes of a memfd that another process sent. Refused
    /// unless the file is sealed against shrinking and holds `len` bytes.
    pub fn attach(fd: OwnedFd, len: usize) -> io::Result<SharedMapping> {
        SharedMapping::attach_segments(vec![(fd, Segment { offset: 0, len: len as u64 })])
    }

    /// Maps the segments of memfds another process sent, one after the
    /// other: every segment but the last must be whole pages, and every
    /// memfd sealed against shrinking and as long as its segment says.
    pub fn attach_segments(parts: Vec<(OwnedFd, Segment)>) -> io::Result<SharedMapping> {
        let page = rustix::param::page_size() as u64;
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
        if parts.is_empty() {
            return Err(bad("a mapping needs at least one segment".into()));
        }
        for (i, (fd, segment)) in parts.iter().enumerate() {
            let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| bad(format!("not a sealable memfd ({e})")))?;
            if !seals.contains(SealFlags::SHRINK) {
                return Err(bad("the memfd is not sealed against shrinking".into()));
            }
            let end = segment.offset.checked_add(segment.len).ok_or_else(|| bad("a segment overflows".into()))?;
            let size = rustix::fs::fstat(fd)?.st_size as u64;
            if size < end {
                return Err(bad(format!("the memfd holds {size} bytes, {end} were announced")));
            }
            if segment.offset % page != 0 || (i + 1 < parts.len() && segment.len % page != 0) {
                return Err(bad("segments must start on a page, and all but the last be whole pages".into()));
            }
        }
        SharedMapping::map(parts)
    }

    fn map(parts: Vec<(OwnedFd, Segment)>) -> io::Result<SharedMapping> {
        let page = rustix::param::page_size();
        let len: usize = parts.iter().map(|(_, s)| s.len as usize).sum();
        let mapped: usize = parts.iter().map(|(_, s)| (s.len as usize).next_multiple_of(page)).sum::<usize>().max(page);
        // SAFETY: a fresh anonymous reservation, placed by the kernel.
        let base =
            unsafe { rustix::mm::mmap_anonymous(std::ptr::null_mut(), mapped, ProtFlags::empty(), MapFlags::PRIVATE)? };
        let ptr = NonNull::new(base.cast()).expect("mmap returns no NULL");
        let segments = parts.iter().map(|(_, segment)| *segment).collect();
        let mut mapping = SharedMapping { ptr, len, mapped, fds: Vec::new(), segments };
        let mut at = 0;
        let mut fds = Vec::with_capacity(parts.len());
        for (fd, segment) in parts {
            let span = (segment.len as usize).next_multiple_of(page);
            if span > 0 {
                // SAFETY: replaces pages of our own reservation (the drop
                // of `mapping` unmaps it all if this fails).
                unsafe {
                    rustix::mm::mmap(
                        mapping.ptr.as_ptr().add(at).cast(),
                        span,
                        ProtFlags::READ | ProtFlags::WRITE,
                        MapFlags::SHARED | MapFlags::FIXED,
                        &fd,
                        segment.offset,
                    )?;
                }
            }
            at += span;
            fds.push(fd);
        }
        mapping.fds = fds;
        Ok(mapping)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The (first) memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fds[0].as_fd()
    }

    /// The `T` at `offset`: a layout both processes share, made of atomics
    /// only ([`SharedLayout`]).
    pub fn layout<T: SharedLayout>(&self, offset: usize) -> &T {
        let fits = offset.checked_add(size_of::<T>()).is_some_and(|end| end <= self.len());
        assert!(offset.is_multiple_of(align_of::<T>()) && fits, "layout at {offset} outside the mapping");
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned); the mapping lives as long as `self`; `T` is atomics
        // only, valid in any bit pattern, which the other process touches
        // only atomically, as we do (`SharedLayout`'s contract).
        unsafe { &*(self.as_ptr().add(offset) as *const T) }
    }

    /// The 8-byte word at `offset`, shared with the other process.
    pub fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= self.len(), "word at {offset} outside the mapping");
        // SAFETY: in bounds and aligned (checked; the mapping is page
        // aligned); the mapping lives as long as `self`, and the other
        // process touches these bytes only atomically, as we do.
        unsafe { &*(self.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// The 4-byte word at `offset`, shared with the other process.
    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= self.len(), "word at {offset} outside the mapping");
        // SAFETY: as for `word`.
        unsafe { &*(self.as_ptr().add(offset) as *const AtomicU32) }
    }

    /// `len` bytes from `offset` as a buffer that owns the mapping: the
    /// memory stays mapped for as long as anyone (a memory region, the
    /// engine's table) holds the buffer.
    ///
    /// The buffer says where its bytes lie in the memfds, so that devices
    /// on this host read them from there ([`DmaBuffer::shared_in`]).
    pub fn into_buffer(self, offset: usize, len: usize) -> DmaBuffer {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "bytes outside the mapping");
        let parts = self.shared_parts(offset, len);
        // SAFETY: the range lies in the mapping, and the buffer owns the
        // mapping; the memfd is sealed against shrinking, so no page of it
        // can vanish while mapped.
        let buffer = unsafe { DmaBuffer::with_keeper(self.as_ptr().add(offset), len, Box::new(self)) };
        match parts {
            Some(parts) => buffer.shared_in(parts),
            None => buffer,
        }
    }

    /// Where bytes `[offset, offset + len)` of the mapping lie in its
    /// memfds, as this process holds them (`None` if one cannot be
    /// named).
    fn shared_parts(&self, offset: usize, len: usize) -> Option<Vec<SharedPart>> {
        let page = rustix::param::page_size();
        let pid = std::process::id();
        let (end, mut parts, mut at) = (offset + len, Vec::new(), 0);
        for (fd, segment) in self.fds.iter().zip(&self.segments) {
            let held = (at, at + segment.len as usize);
            let (from, to) = (offset.max(held.0), end.min(held.1));
            if from < to {
                let file = SharedFile { pid, fd: fd.as_raw_fd(), inode: rustix::fs::fstat(fd).ok()?.st_ino };
                let file_offset = segment.offset + (from - held.0) as u64;
                parts.push(SharedPart { at: from - offset, len: to - from, file, file_offset });
            }
            at += (segment.len as usize).next_multiple_of(page);
        }
        Some(parts)
    }

    /// `len` bytes from `offset` as a buffer of atomic byte copies: the
    /// other process may write them at any moment, so no Rust reference
    /// may cover them.
    pub fn bytes(&self, offset: usize, len: usize) -> DmaBuffer {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "bytes outside the mapping");
        // SAFETY: the range lies in the mapping; whoever holds the buffer
        // also holds `self` (the callers keep both in one struct).
        unsafe { DmaBuffer::from_raw_parts(self.as_ptr().add(offset), len) }
    }
}

/// A layout both sides of a mapping read and write at any moment: a
/// `#[repr(C)]` struct of atomics (padding included), so that a
/// reference to it never covers a byte the other process writes without
/// an atomic.
///
/// # Safety
/// The type is `#[repr(C)]`, holds atomics only, and every bit pattern
/// is a valid value of it.
pub unsafe trait SharedLayout: Sync {}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping; whoever could reach it (a buffer, a
        // queue) holds `self`, so nobody does any more.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.mapped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsealed_or_short_memfd_is_refused() {
        let fd = rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let err = SharedMapping::attach(fd.try_clone().unwrap(), 4096).err().unwrap();
        assert!(err.to_string().contains("not sealed"), "{err}");
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
        let err = SharedMapping::attach(fd.try_clone().unwrap(), 8192).err().unwrap();
        assert!(err.to_string().contains("4096 bytes"), "{err}");
        let mapping = SharedMapping::attach(fd, 4096).unwrap();
        assert_eq!(mapping.len(), 4096);
    }

    #[test]
    fn segments_of_two_memfds_map_as_one_range() {
        let page = rustix::param::page_size();
        let (a, b) = (SharedMapping::create("a", 3 * page).unwrap(), SharedMapping::create("b", 2 * page).unwrap());
        a.bytes(2 * page, 4).write(0, b"tail");
        b.bytes(0, 4).write(0, b"head");
        let parts = vec![
            (a.fd().try_clone_to_owned().unwrap(), Segment { offset: 2 * page as u64, len: page as u64 }),
            (b.fd().try_clone_to_owned().unwrap(), Segment { offset: 0, len: 100 }),
        ];
        let joined = SharedMapping::attach_segments(parts).unwrap();
        assert_eq!(joined.len(), page + 100);
        assert_eq!(joined.bytes(0, 4).to_vec(), b"tail");
        assert_eq!(joined.bytes(page, 4).to_vec(), b"head");
        let ragged = vec![
            (a.fd().try_clone_to_owned().unwrap(), Segment { offset: 0, len: 100 }),
            (b.fd().try_clone_to_owned().unwrap(), Segment { offset: 0, len: 100 }),
        ];
        assert!(SharedMapping::attach_segments(ragged).is_err(), "a ragged middle cannot be contiguous");
    }

    #[test]
    fn both_mappings_see_one_memory() {
        let a = SharedMapping::create("t", 4096).unwrap();
        let b = SharedMapping::attach(a.fd().try_clone_to_owned().unwrap(), 4096).unwrap();
        a.word(128).store(7, std::sync::atomic::Ordering::Release);
        assert_eq!(b.word(128).load(std::sync::atomic::Ordering::Acquire), 7);
        a.bytes(1000, 5).write(0, b"hello");
        assert_eq!(b.bytes(1000, 5).to_vec(), b"hello");
        assert!(rustix::fs::ftruncate(a.fd(), 0).is_err(), "sealed");
    }
}
