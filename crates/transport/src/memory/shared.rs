//! Registered memory that other processes on the host can map: where a
//! buffer's bytes lie in shared files (memfds), so that a peer on the
//! same-host wire copies a payload straight out of them, once, instead of
//! the bytes travelling through a ring ([`crate::by_reference`]).
//!
//! The transport only carries these facts; it never opens a file. The
//! engine fills them in when it registers memory on a memfd, and maps a
//! peer's files for its shards through [`PeerMemory`].

use std::sync::Arc;

use smallvec::SmallVec;

use super::DmaBuffer;

/// A file of the host that holds registered memory: a memfd that process
/// `pid` holds open as descriptor `fd`. The `inode` tells it apart from a
/// later file under the same number (the process closed the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SharedFile {
    pub pid: u32,
    pub fd: i32,
    pub inode: u64,
}

/// `len` bytes of a buffer, from its byte `at` on, lie in `file` from
/// `file_offset` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPart {
    pub at: usize,
    pub len: usize,
    pub file: SharedFile,
    pub file_offset: u64,
}

/// Bytes of a peer's file: `len` of them from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRange {
    pub file: SharedFile,
    pub offset: u64,
    pub len: u32,
}

/// The ranges of files that hold some bytes of registered memory, in
/// order: a packet's payload spans few (one per memfd it crosses).
pub type FileRanges = SmallVec<[FileRange; 4]>;

/// Where a buffer's bytes lie in shared files: parts in buffer order that
/// cover it whole.
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedParts(Box<[SharedPart]>);

impl SharedParts {
    /// `parts`, which must cover `[0, len)` in order without gaps.
    pub(crate) fn new(parts: Vec<SharedPart>, len: usize) -> SharedParts {
        let mut covered = 0;
        for part in &parts {
            assert_eq!(part.at, covered, "shared parts must cover the buffer in order");
            covered += part.len;
        }
        assert_eq!(covered, len, "shared parts must cover the whole buffer");
        SharedParts(parts.into_boxed_slice())
    }

    /// Appends the file ranges that hold `[offset, offset + len)` to `out`.
    pub(crate) fn ranges(&self, offset: usize, len: usize, out: &mut FileRanges) {
        let end = offset + len;
        let first = self.0.partition_point(|p| p.at + p.len <= offset);
        for part in &self.0[first..] {
            if part.at >= end {
                break;
            }
            let from = offset.max(part.at);
            let to = end.min(part.at + part.len);
            let range = FileRange {
                file: part.file,
                offset: part.file_offset + (from - part.at) as u64,
                len: (to - from) as u32,
            };
            // Two parts adjacent in one file read as one range.
            match out.last_mut() {
                Some(last) if last.file == range.file && last.offset + u64::from(last.len) == range.offset => {
                    last.len += range.len
                }
                _ => out.push(range),
            }
        }
    }
}

/// How a device reaches the files its peers' references name: the engine
/// maps them (and keeps them mapped); the simulator's one-host world
/// looks them up in its `HostFiles`. A device with none refuses a
/// reference like any other it cannot resolve.
pub trait PeerMemory: Send {
    /// `file`, mapped whole for reading, or `None` if it cannot be: the
    /// process or its descriptor is gone, the descriptor now names another
    /// file, or the file is not one a device registered memory on.
    fn map(&mut self, file: &SharedFile) -> Option<Arc<DmaBuffer>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(fd: i32) -> SharedFile {
        SharedFile { pid: 7, fd, inode: 100 + fd as u64 }
    }

    #[test]
    fn ranges_follow_parts_and_join_what_is_adjacent_in_one_file() {
        let parts = SharedParts::new(
            vec![
                SharedPart { at: 0, len: 100, file: file(3), file_offset: 4000 },
                SharedPart { at: 100, len: 50, file: file(3), file_offset: 4100 },
                SharedPart { at: 150, len: 50, file: file(4), file_offset: 0 },
            ],
            200,
        );
        let mut out = FileRanges::new();
        parts.ranges(90, 70, &mut out);
        assert_eq!(
            out.as_slice(),
            [FileRange { file: file(3), offset: 4090, len: 60 }, FileRange { file: file(4), offset: 0, len: 10 }]
        );
        out.clear();
        parts.ranges(160, 40, &mut out);
        assert_eq!(out.as_slice(), [FileRange { file: file(4), offset: 10, len: 40 }]);
    }

    #[test]
    #[should_panic(expected = "cover the whole buffer")]
    fn parts_must_cover_the_buffer() {
        SharedParts::new(vec![SharedPart { at: 0, len: 10, file: file(3), file_offset: 0 }], 20);
    }
}
