//! The files that peers on this host registered their memory on, mapped
//! by a shard so that it copies their payloads straight out of them
//! ([`softrnic_transport::by_reference`]).
//!
//! A reference names a memfd by its process, descriptor and inode. The
//! shard opens it through `/proc/<pid>/fd/<fd>`, which the kernel allows
//! only to a process that may read the other's memory anyway (the same
//! user, and the peer not marked undumpable); checks that it is still the
//! file the reference meant (the inode), that it is a memfd, and that it
//! is sealed against shrinking (a mapping of a file truncated under it
//! faults, and a fault in the engine would take the program down); and
//! maps it whole. A mapping is kept for the packets to come, and let go
//! once its peer has closed the file (checked about once a second), so
//! that memory a peer freed is not held here for long.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::MmapRaw;
use rustc_hash::FxHashMap;
use rustix::fs::SealFlags;
use softrnic_transport::{DmaBuffer, PeerMemory, SharedFile};

/// The most files a shard keeps mapped; past it, it starts over.
const MAX_MAPPED: usize = 1024;
/// How often the mappings are checked against their peers' files.
const RECHECK: Duration = Duration::from_secs(1);
/// Lookups between two looks at the clock.
const LOOKUPS_PER_CLOCK: u32 = 4096;

/// A shard's mappings of its peers' files.
#[derive(Default)]
pub struct PeerFiles {
    mapped: FxHashMap<SharedFile, Arc<DmaBuffer>>,
    lookups: u32,
    checked_at: Option<Instant>,
}

impl PeerFiles {
    pub fn new() -> PeerFiles {
        PeerFiles::default()
    }

    /// Drops the mappings of files their peers have closed (or whose
    /// descriptor now names another file).
    fn forget_closed(&mut self) {
        self.mapped.retain(|file, _| still_open(file));
    }
}

impl PeerMemory for PeerFiles {
    fn map(&mut self, file: &SharedFile) -> Option<Arc<DmaBuffer>> {
        self.lookups = self.lookups.wrapping_add(1);
        if self.lookups.is_multiple_of(LOOKUPS_PER_CLOCK) {
            let now = Instant::now();
            if self.checked_at.is_none_or(|at| now.duration_since(at) >= RECHECK) {
                self.checked_at = Some(now);
                self.forget_closed();
            }
        }
        if let Some(buffer) = self.mapped.get(file) {
            return Some(buffer.clone());
        }
        let buffer = Arc::new(open_and_map(file).ok()?);
        if self.mapped.len() >= MAX_MAPPED {
            self.mapped.clear();
        }
        self.mapped.insert(*file, buffer.clone());
        Some(buffer)
    }
}

fn proc_path(file: &SharedFile) -> String {
    format!("/proc/{}/fd/{}", file.pid, file.fd)
}

/// Whether `file`'s descriptor still names it.
fn still_open(file: &SharedFile) -> bool {
    std::fs::metadata(proc_path(file)).is_ok_and(|meta| meta.ino() == file.inode)
}

/// Opens the memfd `file` names, checks it, and maps it whole.
fn open_and_map(file: &SharedFile) -> io::Result<DmaBuffer> {
    let refused = |why: &str| io::Error::new(io::ErrorKind::PermissionDenied, why.to_string());
    let path = proc_path(file);
    // What the descriptor names: a memfd reads as "/memfd:<name>".
    let target = std::fs::read_link(&path)?;
    if !target.to_string_lossy().starts_with("/memfd:") {
        return Err(refused("not a memfd"));
    }
    let opened = std::fs::OpenOptions::new().read(true).write(true).open(&path)?;
    let meta = opened.metadata()?;
    if meta.ino() != file.inode {
        return Err(refused("the descriptor names another file now"));
    }
    let seals = rustix::fs::fcntl_get_seals(opened.as_fd())?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(refused("the memfd is not sealed against shrinking"));
    }
    let map = MmapRaw::map_raw(&opened)?;
    // SAFETY: the mapping is valid for reads and writes of its length for
    // as long as the buffer, which keeps it; the file cannot shrink under
    // it (sealed, checked above). Its owner writes it only through atomic
    // copies or from outside Rust, as `DmaBuffer` requires.
    Ok(unsafe { DmaBuffer::with_keeper(map.as_mut_ptr(), map.len(), Box::new(map)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::MemfdFlags;
    use std::os::fd::AsRawFd;

    fn memfd(len: u64, seals: SealFlags) -> std::os::fd::OwnedFd {
        let fd = rustix::fs::memfd_create("softrnic-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&fd, len).unwrap();
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        fd
    }

    fn named(fd: &std::os::fd::OwnedFd) -> SharedFile {
        let inode = rustix::fs::fstat(fd).unwrap().st_ino;
        SharedFile { pid: std::process::id(), fd: fd.as_raw_fd(), inode }
    }

    #[test]
    fn maps_a_sealed_memfd_and_sees_what_its_owner_writes() {
        let fd = memfd(8192, SealFlags::SHRINK | SealFlags::GROW);
        rustix::io::pwrite(&fd, b"payload", 100).unwrap();
        let mut files = PeerFiles::new();
        let buffer = files.map(&named(&fd)).expect("mapped");
        assert_eq!(buffer.len(), 8192);
        let mut out = [0u8; 7];
        buffer.read(100, &mut out);
        assert_eq!(&out, b"payload");
        assert!(Arc::ptr_eq(&buffer, &files.map(&named(&fd)).unwrap()), "kept mapped");
    }

    #[test]
    fn refuses_what_a_reference_must_not_reach() {
        let mut files = PeerFiles::new();
        let unsealed = memfd(4096, SealFlags::empty());
        assert!(files.map(&named(&unsealed)).is_none(), "a memfd its owner may shrink");
        let fd = memfd(4096, SealFlags::SHRINK);
        let stale = SharedFile { inode: named(&fd).inode + 1, ..named(&fd) };
        assert!(files.map(&stale).is_none(), "another file under the descriptor");
        let regular = std::fs::File::open("/proc/self/status").unwrap();
        let inode = regular.metadata().unwrap().ino();
        let not_memfd = SharedFile { pid: std::process::id(), fd: regular.as_raw_fd(), inode };
        assert!(files.map(&not_memfd).is_none(), "not a memfd");
        let gone = SharedFile { pid: u32::MAX - 1, fd: 3, inode: 1 };
        assert!(files.map(&gone).is_none(), "no such process");
    }

    #[test]
    fn lets_go_of_files_their_owner_closed() {
        let fd = memfd(4096, SealFlags::SHRINK);
        let file = named(&fd);
        let mut files = PeerFiles::new();
        assert!(files.map(&file).is_some());
        drop(fd);
        files.forget_closed();
        assert!(files.mapped.is_empty());
        assert!(files.map(&file).is_none(), "closed: nothing to map");
    }
}
