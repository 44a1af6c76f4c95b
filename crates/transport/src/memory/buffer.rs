//! `DmaBuffer`: bytes that the application and the NIC share, the way a
//! real NIC DMAs into pinned application memory.
//!
//! This is one of softrnic's `unsafe` edges. The NIC reads and writes the
//! buffer while the application holds it, from other threads, and nothing
//! stops a program from reading bytes that a peer's WRITE is landing in
//! (a latency test spins on exactly that). So every access to the buffer
//! is a relaxed atomic one, words where aligned and bytes at the edges, or
//! between two buffers on x86-64 one string move (a byte-wise atomic
//! memcpy either way, as C++'s P1478 proposes): a race yields a mix
//! of old and new bytes, never undefined behaviour. Completion ordering
//! (the CQ's lock) is what tells the application when the NIC is done and
//! makes the bytes visible.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::shared::{FileRanges, SharedPart, SharedParts};

/// Memory that a memory region can expose to the NIC.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// The layout the buffer was allocated with, or `None` for memory that
    /// belongs to someone else (an application buffer registered through
    /// the C API).
    owned: Option<Layout>,
    /// What keeps borrowed memory alive (a mapping of shared memory), if
    /// the buffer holds it: dropped with the buffer.
    _keeper: Option<Box<dyn Send + Sync>>,
    /// Where its bytes lie in files other processes can map, if they do.
    shared: Option<SharedParts>,
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
            return DmaBuffer { ptr: NonNull::dangling(), len: 0, owned: None, _keeper: None, shared: None };
        }
        let layout = Layout::from_size_align(len, ALIGN).expect("buffer size overflows");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        DmaBuffer { ptr, len, owned: Some(layout), _keeper: None, shared: None }
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
        DmaBuffer { ptr, len, owned: None, _keeper: None, shared: None }
    }

    /// Wraps memory that `keeper` keeps valid (a mapping), and holds the
    /// keeper for as long as the buffer lives.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long
    /// as `keeper` lives.
    pub unsafe fn with_keeper(ptr: *mut u8, len: usize, keeper: Box<dyn Send + Sync>) -> DmaBuffer {
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        DmaBuffer { ptr, len, owned: None, _keeper: Some(keeper), shared: None }
    }

    /// Says where the buffer's bytes lie in shared files (`parts` cover
    /// it whole, in order), so that peers on this host may copy from them
    /// directly.
    pub fn shared_in(mut self, parts: Vec<SharedPart>) -> DmaBuffer {
        self.shared = Some(SharedParts::new(parts, self.len));
        self
    }

    /// Appends where bytes `[offset, offset + len)` lie in shared files to
    /// `out`; false (and nothing appended) if the buffer is not shared.
    pub(crate) fn shared_ranges(&self, offset: usize, len: usize, out: &mut FileRanges) -> bool {
        self.check(offset, len);
        let Some(parts) = &self.shared else { return false };
        parts.ranges(offset, len, out);
        true
    }

    /// Whether peers on this host may read it where it lies
    /// ([`DmaBuffer::shared_in`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
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

    /// Copies bytes starting at `offset` into `dst`. Bytes that another
    /// thread writes meanwhile may be old or new, each on its own.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        // SAFETY: the range lies inside the buffer (checked above); `dst`
        // is our own exclusive slice, so it cannot overlap it.
        unsafe { atomic_copy::load(self.ptr.as_ptr().add(offset), dst) }
    }

    /// Copies `src` into the buffer starting at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        // SAFETY: the range lies inside the buffer (checked above). `src`
        // cannot be part of the buffer: nothing hands out slices of it.
        unsafe { atomic_copy::store(src, self.ptr.as_ptr().add(offset)) }
    }

    /// Copies `len` bytes of `src` from `src_offset` into this buffer at
    /// `offset` (a payload from a peer's region into a region, the one
    /// copy of [`crate::by_reference`]): on x86-64 with one string move
    /// where the ranges do not overlap, else word by word where both sides
    /// share an alignment, otherwise through a bounce small enough to stay
    /// in the L1 cache. Each way each side keeps its atomic access.
    pub fn copy_from(&self, offset: usize, src: &DmaBuffer, src_offset: usize, len: usize) {
        self.check(offset, len);
        src.check(src_offset, len);
        // SAFETY: both ranges lie inside their buffers (checked above).
        let (from, to) = unsafe { (src.ptr.as_ptr().add(src_offset), self.ptr.as_ptr().add(offset)) };
        if from == to {
            return; // the bytes are already there
        }
        #[cfg(target_arch = "x86_64")]
        if (from as usize).abs_diff(to as usize) >= len {
            // SAFETY: in bounds (checked above), the ranges apart; both
            // accessed only atomically by everyone (or from outside Rust).
            unsafe { atomic_copy::string(from, to, len) };
            return;
        }
        if (from as usize).abs_diff(to as usize).is_multiple_of(8) {
            // SAFETY: in bounds (checked above); two buffers' ranges, or
            // one buffer's two, accessed only atomically by everyone. An
            // overlap within one buffer copies forwards, as a DMA engine
            // would, and yields some mix of bytes, never a torn word.
            unsafe { atomic_copy::between(from, to, len) };
            return;
        }
        let mut bounce = [0u8; 4096];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(bounce.len());
            src.read(src_offset + done, &mut bounce[..n]);
            self.write(offset + done, &bounce[..n]);
            done += n;
        }
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        let chunk = [byte; 256];
        for offset in (0..self.len).step_by(chunk.len()) {
            self.write(offset, &chunk[..chunk.len().min(self.len - offset)]);
        }
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

/// Copies between memory other threads may access at the same time and a
/// private slice, with relaxed atomics on the shared side.
mod atomic_copy {
    use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

    const WORD: usize = 8;

    /// Bytes before `ptr`'s next 8-byte boundary, at most `len`.
    fn head(ptr: *const u8, len: usize) -> usize {
        ptr.align_offset(WORD).min(len)
    }

    /// Copies `dst.len()` bytes from shared memory at `src`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `dst.len()` bytes, accessed by
    /// others only through atomics (or from outside Rust).
    pub unsafe fn load(src: *const u8, dst: &mut [u8]) {
        let len = dst.len();
        let head = head(src, len);
        let words = (len - head) / WORD;
        // SAFETY (every block below): in bounds of `src` and `dst` by the
        // arithmetic on `len`, and the word accesses are 8-byte aligned
        // because `head` brought `src` to a boundary.
        unsafe {
            for (i, byte) in dst.iter_mut().enumerate().take(head) {
                *byte = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Relaxed);
            }
            for w in 0..words {
                let at = head + w * WORD;
                let word = AtomicU64::from_ptr(src.add(at) as *mut u64).load(Relaxed);
                dst[at..at + WORD].copy_from_slice(&word.to_ne_bytes());
            }
            for (i, byte) in dst.iter_mut().enumerate().skip(head + words * WORD) {
                *byte = AtomicU8::from_ptr(src.add(i) as *mut u8).load(Relaxed);
            }
        }
    }

    /// Copies `len` bytes from shared memory at `src` to shared memory at
    /// `dst`, word by word: the two must be equally aligned modulo 8.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// both accessed by others only through atomics (or from outside
    /// Rust).
    pub unsafe fn between(src: *const u8, dst: *mut u8, len: usize) {
        debug_assert!((src as usize).abs_diff(dst as usize).is_multiple_of(WORD));
        let head = head(dst, len);
        let words = (len - head) / WORD;
        // SAFETY: in bounds of both by the arithmetic on `len`; the word
        // accesses are aligned on both sides because `head` brought `dst`
        // to a boundary and `src` shares its alignment.
        unsafe {
            for i in 0..head {
                AtomicU8::from_ptr(dst.add(i)).store(AtomicU8::from_ptr(src.add(i) as *mut u8).load(Relaxed), Relaxed);
            }
            for w in 0..words {
                let at = head + w * WORD;
                let word = AtomicU64::from_ptr(src.add(at) as *mut u64).load(Relaxed);
                AtomicU64::from_ptr(dst.add(at) as *mut u64).store(word, Relaxed);
            }
            for i in head + words * WORD..len {
                AtomicU8::from_ptr(dst.add(i)).store(AtomicU8::from_ptr(src.add(i) as *mut u8).load(Relaxed), Relaxed);
            }
        }
    }

    /// Copies `len` bytes from shared memory at `src` to shared memory at
    /// `dst` with one `rep movsb`, which on processors with fast string
    /// moves (ERMS, FSRM) runs at `memcpy`'s speed where the word loop of
    /// [`between`] cannot (LLVM does not widen atomics): 64 KiB between
    /// 8 MiB buffers at 490 to 528 Gb/s here against 376 to 411. It is
    /// the same byte-wise atomic copy: x86-64 reads and writes every byte
    /// of every access single-copy atomically (Intel SDM vol. 3A, 9.1.1),
    /// and a string move reads each source byte once and writes each
    /// destination byte once, so what it does to memory is what relaxed
    /// atomic byte loads and stores would do, which is what an `asm!`
    /// block must be explainable as.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes,
    /// the two ranges must not overlap (a string move over an overlap is
    /// not a forward byte copy), and both are accessed by others only
    /// through atomics (or from outside Rust).
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn string(src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: the caller's; the direction flag is clear, as the ABI
        // requires at every call, so the move goes forwards.
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rcx") len => _,
                inout("rsi") src => _,
                inout("rdi") dst => _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Copies `src` into shared memory at `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `src.len()` bytes, accessed by
    /// others only through atomics (or from outside Rust).
    pub unsafe fn store(src: &[u8], dst: *mut u8) {
        let len = src.len();
        let head = head(dst, len);
        let words = (len - head) / WORD;
        // SAFETY: as in `load`, with the roles swapped.
        unsafe {
            for (i, &byte) in src.iter().enumerate().take(head) {
                AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed);
            }
            for w in 0..words {
                let at = head + w * WORD;
                let word = u64::from_ne_bytes(src[at..at + WORD].try_into().expect("a word"));
                AtomicU64::from_ptr(dst.add(at) as *mut u64).store(word, Relaxed);
            }
            for (i, &byte) in src.iter().enumerate().skip(head + words * WORD) {
                AtomicU8::from_ptr(dst.add(i)).store(byte, Relaxed);
            }
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

    /// Through the bounce (alignments that differ) and word by word
    /// (alignments that agree), with ragged heads and tails.
    #[test]
    fn copies_between_buffers_at_any_alignment() {
        let src = DmaBuffer::from_bytes(&(0..10_000u32).map(|i| i as u8).collect::<Vec<_>>());
        for (at, from, len) in [(3, 5, 9_000), (3, 11, 9_001), (0, 8, 8), (5, 5, 2), (16, 0, 9_984)] {
            let dst = DmaBuffer::new(10_000);
            dst.copy_from(at, &src, from, len);
            let out = dst.to_vec();
            assert!(out[..at].iter().all(|&b| b == 0), "{at} {from} {len}");
            assert!(out[at..at + len].iter().enumerate().all(|(i, &b)| b == (i + from) as u8), "{at} {from} {len}");
            assert!(out[at + len..].iter().all(|&b| b == 0), "{at} {from} {len}");
        }
    }

    /// Within one buffer: ranges apart take the string move (on x86-64);
    /// overlapping ones the word loop (alignments that agree) or the
    /// bounce, which copy forwards, so a copy to lower addresses moves
    /// every byte as it was.
    #[test]
    fn copies_within_one_buffer_apart_or_overlapping() {
        let original: Vec<u8> = (0..400u32).map(|i| i as u8).collect();
        for (at, from, len) in [(200, 0, 100), (0, 8, 64), (0, 3, 64), (5, 13, 300)] {
            let buffer = DmaBuffer::from_bytes(&original);
            buffer.copy_from(at, &buffer, from, len);
            let out = buffer.to_vec();
            assert_eq!(&out[at..at + len], &original[from..from + len], "{at} {from} {len}");
            assert_eq!(&out[..at], &original[..at], "{at} {from} {len}");
            assert_eq!(&out[at + len..], &original[at + len..], "{at} {from} {len}");
        }
    }

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
    fn copies_of_every_alignment_and_length() {
        let buffer = DmaBuffer::new(64);
        let data: Vec<u8> = (1..=40).collect();
        for offset in 0..9 {
            for len in [0, 1, 7, 8, 9, 17, 31, 40] {
                buffer.fill(0);
                buffer.write(offset, &data[..len]);
                let mut out = vec![0u8; len + 2];
                buffer.read(offset.saturating_sub(1), &mut out[..len + 1]);
                let lead = usize::from(offset > 0);
                assert_eq!(&out[lead..lead + len], &data[..len], "offset {offset} len {len}");
                assert_eq!(out[..lead].iter().chain(&out[lead + len..len + 1]).copied().max().unwrap_or(0), 0);
            }
        }
    }

    /// A reader racing a writer sees old or new bytes, each on its own; run
    /// under Miri or ThreadSanitizer this is the data race the atomics rule
    /// out.
    #[test]
    fn a_reader_racing_a_writer_sees_only_written_bytes() {
        let buffer = std::sync::Arc::new(DmaBuffer::new(4096));
        let writer = {
            let buffer = buffer.clone();
            std::thread::spawn(move || {
                for round in 0..200u8 {
                    buffer.write(3, &[round; 4000]);
                }
            })
        };
        let mut seen = vec![0u8; 4000];
        for _ in 0..200 {
            buffer.read(3, &mut seen);
            assert!(seen.iter().all(|&b| b < 200));
        }
        writer.join().unwrap();
        buffer.read(3, &mut seen);
        assert!(seen.iter().all(|&b| b == 199));
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
