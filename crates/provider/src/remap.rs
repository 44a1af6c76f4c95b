//! Memory a program allocated itself (perftest `malloc`s its buffers),
//! made reachable by softrnicd: FreeFlow's remap. The pages under the
//! buffer are copied into a memfd, and the memfd is mapped over them at the
//! same addresses (`MAP_FIXED | MAP_SHARED`). The program sees the same
//! bytes at the same addresses; the daemon maps the same memfd, so a peer's
//! WRITE lands where the program reads, with no system call per access.
//!
//! What it costs, and where it stops:
//! - Whole pages move. A buffer's neighbours on its first and last page
//!   are shared too (harmless: the process sees the same bytes).
//! - A thread that writes the pages between the copy and the mapping
//!   would lose that write (FreeFlow's remap does): neighbours on the
//!   first and last page are anyone's (the rdma_cm agent's mutex lost an
//!   unlock that way, and ucmatose hung). The pages are read-only for the
//!   copy and a writer waits ([`crate::held_writes`]); a system call that
//!   writes into them then fails with `EFAULT`. The current thread's own
//!   stack is refused outright.
//! - A later registration over pages an earlier one remapped reuses them
//!   (the daemon joins the segments of several memfds into one region), as
//!   long as the mapping is still there: `/proc/self/maps` says so, and a
//!   range the program freed and got back from a fresh mapping has lost
//!   it. Two buffers that share a page are common (two threads' `malloc`s).
//! - The pages stay shared after the region is deregistered, and a child
//!   the program forks shares them too instead of copying them (what
//!   `ibv_fork_init` exists for on hardware).
//! - A remap is kept while its pages are mapped, for registrations to
//!   come, and closed by the next registration once the program has
//!   unmapped them (freed a large buffer): its memfd would otherwise keep
//!   the freed pages, and a descriptor, for as long as the process runs.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use softrnic_daemon_protocol::protocol::MAX_FDS;
use softrnic_daemon_protocol::shared_memory::Segment;
use softrnic_transport::{SharedFile, SharedPart};

/// Pages of the program remapped onto a memfd.
pub struct Remap {
    fd: OwnedFd,
    /// The first page's address, and the bytes of whole pages.
    start: usize,
    len: usize,
    inode: u64,
}

impl Remap {
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn overlaps(&self, start: usize, end: usize) -> bool {
        start < self.start + self.len && self.start < end
    }

    /// Whether the pages are still our memfd's, at the offsets we mapped
    /// them, in the process's `mappings`: a program that freed the range
    /// (and perhaps got it back from a fresh mapping) has lost the sharing.
    fn intact(&self, mappings: &[Mapping]) -> bool {
        let mut covered = self.start;
        let first = mappings.partition_point(|m| m.end <= self.start);
        for m in &mappings[first..] {
            if m.start > covered {
                return false; // a hole: unmapped
            }
            // `covered` sits at file offset `offset + covered - start`;
            // ours put it at `covered - self.start`.
            if m.inode != self.inode || m.offset + (covered - m.start) != covered - self.start {
                return false;
            }
            covered = m.end;
            if covered >= self.start + self.len {
                return true;
            }
        }
        false
    }
}

/// One line of `/proc/self/maps`: a range, and what it maps.
struct Mapping {
    start: usize,
    end: usize,
    offset: usize,
    inode: u64,
    /// Private (copy-on-write), not shared with whoever else maps it.
    private: bool,
}

/// The process's mappings, in address order (none if they cannot be read,
/// so that no remap is taken for intact).
fn mappings() -> Vec<Mapping> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return Vec::new() };
    maps.lines()
        .filter_map(|line| {
            // start-end perms offset dev inode path
            let mut fields = line.split_whitespace();
            let (range, perms, offset, _, inode) =
                (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            let (start, end) = range.split_once('-')?;
            Some(Mapping {
                start: usize::from_str_radix(start, 16).ok()?,
                end: usize::from_str_radix(end, 16).ok()?,
                offset: usize::from_str_radix(offset, 16).ok()?,
                inode: inode.parse().ok()?,
                private: perms.ends_with('p'),
            })
        })
        .collect()
}

/// Whether the whole pages under `[addr, addr + len)` are memory only
/// this process sees: private anonymous memory (the heap, `mmap`ed
/// buffers), or pages an earlier registration remapped. A shared mapping
/// is not (a file, or memory the program shares with another process, as
/// MPI's shared-memory transport does): remapped onto a memfd of its own,
/// the other process would no longer see this one's writes, nor this one
/// the other's.
pub fn only_this_process_sees(addr: *const u8, len: usize) -> bool {
    let page = rustix::param::page_size();
    let start = addr as usize & !(page - 1);
    let Some(end) = (addr as usize).checked_add(len.max(1)).map(|end| end.next_multiple_of(page)) else {
        return false;
    };
    let ours: Vec<u64> = REMAPS.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|r| r.inode).collect();
    let mappings = mappings();
    let mut covered = start;
    for m in mappings.iter().skip_while(|m| m.end <= start) {
        if m.start > covered || !(m.private && m.inode == 0 || ours.contains(&m.inode)) {
            return false;
        }
        covered = m.end;
        if covered >= end {
            return true;
        }
    }
    false
}

/// The process's remaps, so that overlapping registrations share pages.
static REMAPS: Mutex<Vec<Arc<Remap>>> = Mutex::new(Vec::new());

/// What a region lies on: segments of remaps, in address order.
pub struct Shared {
    pub parts: Vec<(Arc<Remap>, Segment)>,
    /// Where the region starts in the first segment.
    pub lead: usize,
}

impl Shared {
    /// Where the region's `len` bytes lie in the memfds, as this process
    /// holds them: what a device on this host reads them from
    /// ([`DmaBuffer::shared_in`](softrnic_transport::DmaBuffer::shared_in)).
    pub fn shared_parts(&self, len: usize) -> io::Result<Vec<SharedPart>> {
        let pid = std::process::id();
        let (mut parts, mut joined) = (Vec::new(), 0usize);
        for (remap, segment) in &self.parts {
            // Bytes of the segment the region covers: from `lead` in the
            // first, from its start in the others.
            let from = self.lead.max(joined);
            let to = (self.lead + len).min(joined + segment.len as usize);
            if from < to {
                let file = SharedFile { pid, fd: remap.fd.as_raw_fd(), inode: remap.inode };
                let file_offset = segment.offset + (from - joined) as u64;
                parts.push(SharedPart { at: from - self.lead, len: to - from, file, file_offset });
            }
            joined += segment.len as usize;
        }
        if parts.iter().map(|p| p.len).sum::<usize>() != len {
            return Err(refused("the region's pages are not all shared"));
        }
        Ok(parts)
    }
}

/// Makes `[addr, addr + len)` shared memory: its pages that earlier
/// registrations remapped stay as they are, the others are remapped now.
///
/// # Safety
/// The range must be memory of this process that it may read and write
/// (what `ibv_reg_mr` requires of it). Other threads may write its pages
/// meanwhile: they wait while the pages are replaced.
pub unsafe fn share(addr: *mut u8, len: usize) -> io::Result<Shared> {
    let page = rustix::param::page_size();
    let first = addr as usize & !(page - 1);
    let end = (addr as usize).checked_add(len.max(1)).ok_or_else(|| refused("the range wraps around"))?;
    let end = end.next_multiple_of(page);
    let mut remaps = REMAPS.lock().unwrap_or_else(|e| e.into_inner());
    // A remap whose pages the program unmapped (freed) shares nothing now,
    // here or anywhere: closed, and its pages with it.
    if !remaps.is_empty() {
        let mappings = mappings();
        remaps.retain(|r| r.intact(&mappings));
    }
    let mut existing: Vec<Arc<Remap>> = remaps.iter().filter(|r| r.overlaps(first, end)).cloned().collect();
    existing.sort_by_key(|r| r.start);
    let mut parts = Vec::new();
    let mut at = first;
    for r in existing {
        if at < r.start {
            // SAFETY: forwarded.
            let gap = unsafe { remap(at, r.start, page)? };
            remaps.push(gap.clone());
            parts.push((gap.clone(), Segment { offset: 0, len: gap.len as u64 }));
        }
        let from = at.max(r.start);
        let to = end.min(r.start + r.len);
        parts.push((r.clone(), Segment { offset: (from - r.start) as u64, len: (to - from) as u64 }));
        at = to;
    }
    if at < end {
        // SAFETY: forwarded.
        let tail = unsafe { remap(at, end, page)? };
        remaps.push(tail.clone());
        parts.push((tail.clone(), Segment { offset: 0, len: tail.len as u64 }));
    }
    if parts.len() > MAX_FDS {
        return Err(refused("the buffer spans more earlier registrations than one region can join"));
    }
    Ok(Shared { parts, lead: addr as usize - first })
}

/// Remaps the whole pages `[start, end)` onto a new memfd.
///
/// # Safety
/// As for [`share`].
unsafe fn remap(start: usize, end: usize, page: usize) -> io::Result<Arc<Remap>> {
    let here = &page as *const usize as usize;
    if (start.saturating_sub(page)..end + page).contains(&here) {
        return Err(refused("the buffer is on this thread's stack, which cannot be remapped while it runs"));
    }
    let len = end - start;
    let fd = rustix::fs::memfd_create("softrnic-mr", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
    // SAFETY: the caller's pages, made read-only meanwhile (a thread that
    // writes one waits, and its write lands on the memfd): the copy reads
    // them through the kernel (a page it cannot read is an EFAULT, not a
    // fault here), the mapping replaces them at the same addresses with the
    // memfd that now holds the same bytes; neither allocates.
    unsafe {
        crate::held_writes::hold_writes(start, len, || {
            let mut done = 0;
            while done < len {
                let wrote =
                    libc::pwrite(fd.as_raw_fd(), (start + done) as *const libc::c_void, len - done, done as i64);
                if wrote <= 0 {
                    return Err(io::Error::last_os_error());
                }
                done += wrote as usize;
            }
            rustix::mm::mmap(
                start as *mut libc::c_void,
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                &fd,
                0,
            )?;
            Ok(())
        })?;
    }
    let inode = rustix::fs::fstat(&fd)?.st_ino;
    Ok(Arc::new(Remap { fd, start, len, inode }))
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(shared: &Shared) -> softrnic_daemon_protocol::shared_memory::SharedMapping {
        let parts = shared.parts.iter().map(|(r, s)| (r.fd().try_clone_to_owned().unwrap(), *s)).collect();
        softrnic_daemon_protocol::shared_memory::SharedMapping::attach_segments(parts).unwrap()
    }

    #[test]
    fn heap_buffers_keep_their_bytes_and_share_pages_they_have_in_common() {
        let page = rustix::param::page_size();
        let mut buffer = vec![0u8; 4 * page];
        for (i, b) in buffer.iter_mut().enumerate() {
            *b = i as u8;
        }
        let base = buffer.as_mut_ptr();
        // Two regions that share a page, as two threads' buffers may.
        // SAFETY: our own buffer, nobody else writes it.
        let a = unsafe { share(base.add(50), 2 * page) }.unwrap();
        assert!(buffer.iter().enumerate().all(|(i, b)| *b == i as u8), "the same bytes at the same place");
        // SAFETY: as above.
        let b = unsafe { share(base.add(2 * page + 10), page) }.unwrap();
        assert!(b.parts.len() >= 2, "the shared page and a new one");
        assert!(Arc::ptr_eq(&b.parts[0].0, a.parts.last().map(|(r, _)| r).unwrap()), "the common page is reused");
        // Writes through the daemon's view of either land in the buffer.
        let (va, vb) = (joined(&a), joined(&b));
        va.bytes(a.lead, 8).write(0, b"from far");
        assert_eq!(&buffer[50..58], b"from far");
        vb.bytes(b.lead, 4).write(0, b"near");
        assert_eq!(&buffer[2 * page + 10..2 * page + 14], b"near");
        assert_eq!(va.bytes(a.lead + 2 * page - 40, 4).to_vec(), b"near", "one memory, seen from both regions");
        let local = [0u8; 64];
        // SAFETY: refused before anything is remapped.
        let stack = unsafe { share(local.as_ptr() as *mut u8, 64) };
        assert!(stack.err().unwrap().to_string().contains("stack"));
    }

    /// Private memory may be remapped; memory the process shares with
    /// another (MPI's shared-memory segments) or maps from a file may not:
    /// remapped, the other side would stop seeing its writes.
    #[test]
    fn only_memory_this_process_alone_sees_may_be_remapped() {
        let page = rustix::param::page_size();
        let map = |flags: MapFlags| {
            // SAFETY: a fresh anonymous mapping of our own, unmapped below.
            unsafe {
                rustix::mm::mmap_anonymous(std::ptr::null_mut(), 4 * page, ProtFlags::READ | ProtFlags::WRITE, flags)
            }
            .unwrap()
            .cast::<u8>()
        };
        let private = map(MapFlags::PRIVATE);
        let shared = map(MapFlags::SHARED);
        assert!(only_this_process_sees(private.wrapping_add(100), 2 * page));
        assert!(!only_this_process_sees(shared.wrapping_add(100), 2 * page), "shared with a child it forks");
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        // SAFETY: a fresh read-only mapping of a file, unmapped below.
        let mapped =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), page, ProtFlags::READ, MapFlags::PRIVATE, &file, 0) }
                .unwrap()
                .cast::<u8>();
        assert!(!only_this_process_sees(mapped, 64), "a file's pages");
        // SAFETY: our own private buffer, nobody else writes it.
        let remapped = unsafe { share(private.wrapping_add(page), page) }.unwrap();
        assert!(only_this_process_sees(private, 4 * page), "pages a registration remapped are its own");
        drop(remapped);
        for at in [private, shared] {
            // SAFETY: unmaps what was mapped above.
            unsafe { rustix::mm::munmap(at.cast(), 4 * page) }.unwrap();
        }
        // SAFETY: as above.
        unsafe { rustix::mm::munmap(mapped.cast(), page) }.unwrap();
    }

    /// The memfds the process's remaps hold open.
    fn remapped_inodes() -> Vec<u64> {
        REMAPS.lock().unwrap().iter().map(|r| r.inode).collect()
    }

    #[test]
    fn remaps_of_freed_buffers_are_closed_by_the_next_registration() {
        let len = 1 << 20;
        let anonymous = || {
            // SAFETY: a fresh private mapping of our own.
            let at = unsafe {
                rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::PRIVATE,
                )
            };
            at.unwrap().cast::<u8>()
        };
        // Large buffers, as malloc maps them: registered, then freed.
        let buffers: Vec<*mut u8> = (0..20).map(|_| anonymous()).collect();
        let mut freed = Vec::new();
        for &at in &buffers {
            // SAFETY: our own mapping, nobody else writes it.
            let shared = unsafe { share(at, len) }.unwrap();
            freed.push(shared.parts[0].0.inode);
        }
        let kept = anonymous();
        // SAFETY: as above.
        let live = unsafe { share(kept, len) }.unwrap();
        assert!(freed.iter().all(|i| remapped_inodes().contains(i)), "kept while mapped, for reuse");
        for &at in &buffers {
            // SAFETY: unmapping what we mapped above; nothing uses it now.
            unsafe { rustix::mm::munmap(at.cast(), len) }.unwrap();
        }
        // The next registration, anywhere, closes the freed ones' memfds
        // and keeps the live one's.
        let other = vec![1u8; 4096];
        // SAFETY: our own buffer.
        let _ = unsafe { share(other.as_ptr() as *mut u8, other.len()) }.unwrap();
        let inodes = remapped_inodes();
        assert!(freed.iter().all(|i| !inodes.contains(i)), "a freed buffer's remap is closed");
        assert!(inodes.contains(&live.parts[0].0.inode), "a mapped one's stays");
        // SAFETY: as above.
        unsafe { rustix::mm::munmap(kept.cast(), len) }.unwrap();
    }
}
