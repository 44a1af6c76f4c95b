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
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::MmapRaw;
use rustix::fs::{MemfdFlags, SealFlags};
use softrnic_transport::DmaBuffer;

/// A mapped memfd.
pub struct SharedMapping {
    map: MmapRaw,
    fd: OwnedFd,
}

impl SharedMapping {
    /// A new zero-filled memfd of `len` bytes, mapped and sealed at that
    /// size.
    pub fn create(name: &str, len: usize) -> io::Result<SharedMapping> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        SharedMapping::map(fd, len)
    }

    /// Maps `len` bytes of a memfd that another process sent. Refused
    /// unless the file is sealed against shrinking and holds `len` bytes.
    pub fn attach(fd: OwnedFd, len: usize) -> io::Result<SharedMapping> {
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("not a sealable memfd ({e})")))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the memfd is not sealed against shrinking"));
        }
        let size = rustix::fs::fstat(&fd)?.st_size as u64;
        if size < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the memfd holds {size} bytes, {len} were announced"),
            ));
        }
        SharedMapping::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<SharedMapping> {
        let map = memmap2::MmapOptions::new().len(len).map_raw(&fd)?;
        Ok(SharedMapping { map, fd })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
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
    pub fn into_buffer(self, offset: usize, len: usize) -> DmaBuffer {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()), "bytes outside the mapping");
        // SAFETY: the range lies in the mapping, and the buffer owns the
        // mapping; the memfd is sealed against shrinking, so no page of it
        // can vanish while mapped.
        unsafe { DmaBuffer::with_keeper(self.as_ptr().add(offset), len, Box::new(self)) }
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
