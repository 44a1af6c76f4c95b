//! `DmaBuffer`: bytes that the application and the NIC share, the way a
//! real NIC DMAs into pinned application memory.
//!
//! This is one of softrnic's `unsafe` edges. The NIC reads and writes the
//! buffer while the application holds it; as with real RDMA, the two must
//! not touch the same bytes at the same time, and the verbs' completion
//! ordering is what tells the application when the NIC is done.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Memory that a memory region can expose to the NIC.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// The layout the buffer was allocated with, or `None` for memory that
    /// belongs to someone else (an application buffer registered through
    /// the C API).
    owned: Option<Layout>,
}

// SAFETY: the buffer is plain bytes with no thread affinity; every access
// goes through raw copies or atomics, never through references that could
// alias a `&mut`.
unsafe impl Send for DmaBuffer {}
// SAFETY: as above; concurrent access to the same bytes is the caller's
// protocol (completion ordering), exactly as with hardware DMA.
unsafe impl Sync for DmaBuffer {}

/// Serialises atomics on addresses that are not 8-byte aligned in the host's
/// memory (possible when a region's IOVA and its buffer disagree modulo 8).
static UNALIGNED_ATOMICS: Mutex<()> = Mutex::new(());

const ALIGN: usize = 64;

impl DmaBuffer {
    /// A zero-filled buffer of `len` bytes, aligned to a cache line.
    pub fn new(len: usize) -> DmaBuffer {
        if len == 0 {
            return DmaBuffer { ptr: NonNull::dangling(), len: 0, owned: None };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        DmaBuffer { ptr, len, owned: Some(layout) }
    }

    /// A buffer initialised with `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> DmaBuffer {
        let buffer = DmaBuffer::new(bytes.len());
        buffer.write(0, bytes);
        buffer
    }

    /// Wraps memory that someone else owns.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long
    /// as the returned buffer (and every region made from it) lives.
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> DmaBuffer {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        DmaBuffer { ptr, len, owned: None }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the first byte, for IOVAs that equal host addresses.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len).expect("range overflows");
        assert!(end <= self.len, "access {offset}..{end} outside buffer of {} bytes", self.len);
    }

    /// Copies bytes starting at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        // SAFETY: the range lies inside the buffer (checked above), and
        // `dst` cannot overlap it because it is a live `&mut` of its own.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `src` into the buffer starting at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        // SAFETY: the range lies inside the buffer (checked above). `src`
        // may point into this same buffer (a loopback copy), so use `copy`.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) }
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: writes exactly the buffer's own `len` bytes.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) }
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.len];
        self.read(0, &mut out);
        out
    }

    /// Applies `op` atomically to the native-endian `u64` at `offset` and
    /// returns the value it held before.
    pub(crate) fn atomic_update(&self, offset: usize, op: impl Fn(u64) -> u64) -> u64 {
        self.check(offset, 8);
        // SAFETY: in bounds (checked above).
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        if ptr.align_offset(8) == 0 {
            // SAFETY: the pointer is 8-byte aligned, in bounds, and all
            // concurrent NIC access to it is through atomics as well.
            let cell = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
            let mut current = cell.load(Ordering::Acquire);
            loop {
                match cell.compare_exchange_weak(current, op(current), Ordering::AcqRel, Ordering::Acquire) {
                    Ok(previous) => return previous,
                    Err(actual) => current = actual,
                }
            }
        } else {
            let _guard = UNALIGNED_ATOMICS.lock().unwrap_or_else(|e| e.into_inner());
            let mut bytes = [0u8; 8];
            self.read(offset, &mut bytes);
            let previous = u64::from_ne_bytes(bytes);
            self.write(offset, &op(previous).to_ne_bytes());
            previous
        }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `new` with exactly this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaBuffer").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written() {
        let buffer = DmaBuffer::new(16);
        buffer.write(3, b"abc");
        let mut out = [0u8; 5];
        buffer.read(2, &mut out);
        assert_eq!(&out, b"\0abc\0");
        buffer.fill(7);
        assert_eq!(buffer.to_vec(), vec![7u8; 16]);
    }

    #[test]
    #[should_panic(expected = "outside buffer")]
    fn out_of_bounds_access_is_refused() {
        DmaBuffer::new(4).write(2, b"abc");
    }

    #[test]
    fn atomics_aligned_and_not() {
        let buffer = DmaBuffer::new(32);
        buffer.write(8, &5u64.to_ne_bytes());
        assert_eq!(buffer.atomic_update(8, |v| v + 3), 5);
        assert_eq!(buffer.atomic_update(8, |v| v), 8);
        assert_eq!(buffer.atomic_update(19, |v| v + 1), 0);
        assert_eq!(buffer.atomic_update(19, |v| v), 1);
    }
}
