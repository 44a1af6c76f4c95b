//! A verbs queue (send, receive or completion) in shared memory, as the
//! Linux rxe driver maps its queues into user space: a header with the
//! two indices on their own cache lines, then a power of two of
//! fixed-size slots. Each index has one writer (the program produces send
//! and receive entries and consumes completions; the daemon the reverse),
//! and the index protocol is [`softrnic_ring::spsc`]'s, which the model
//! checker runs.
//!
//! ```text
//!   0  magic "SRNICQ01" | slots u32 | slot size u32    (written once by the daemon)
//! 128  produced u64                                    (the producer's)
//! 256  consumed u64                                    (the consumer's)
//! 384  armed u64: a CQ's notification request          (the program's; the daemon swaps it back to 0)
//! 512  slot 0 | slot 1 | ...
//! ```
//!
//! The daemon never trusts the header after creating it: it keeps its own
//! copy of the sizes and of its own index, and the peer's index goes
//! through `spsc`'s check (a scribbled one breaks the queue, never reaches
//! past a slot).

use std::io;
use std::mem::offset_of;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use softrnic_ring::spsc;
use softrnic_transport::DmaBuffer;

use crate::shared_memory::{SharedLayout, SharedMapping};

const MAGIC: u64 = u64::from_le_bytes(*b"SRNICQ01");

/// The header, as the table above draws it: each index on a cache line
/// of its own, the padding atomics too, since the peer may write any of
/// it.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    slots: AtomicU32,
    slot_size: AtomicU32,
    _line_0: [AtomicU64; 14],
    produced: AtomicU64,
    _line_1: [AtomicU64; 15],
    consumed: AtomicU64,
    _line_2: [AtomicU64; 15],
    armed: AtomicU64,
    _line_3: [AtomicU64; 15],
}

const HEADER: usize = size_of::<Header>();
const _: () = assert!(offset_of!(Header, slots) == 8 && offset_of!(Header, slot_size) == 12);
const _: () = assert!(offset_of!(Header, produced) == 128 && offset_of!(Header, consumed) == 256);
const _: () = assert!(offset_of!(Header, armed) == 384 && HEADER == 512);

// SAFETY: `#[repr(C)]`, atomics only, any bit pattern valid.
unsafe impl SharedLayout for Header {}

/// What a program armed on a CQ's ring (`ibv_req_notify_cq`).
pub const ARMED_NEXT: u64 = 1;
pub const ARMED_SOLICITED: u64 = 2;

/// One queue's shared memory.
pub struct SharedQueue {
    mapping: SharedMapping,
    slots: u32,
    slot_size: u32,
    data: DmaBuffer,
}

impl SharedQueue {
    /// A new queue of at least `entries` slots (rounded up to a power of
    /// two) of `slot_size` bytes (a multiple of 8).
    pub fn create(name: &str, entries: u32, slot_size: u32) -> io::Result<SharedQueue> {
        let slots = entries.max(1).checked_next_power_of_two().ok_or_else(|| too_big(entries))?;
        let slot_size = slot_size.next_multiple_of(8);
        let len = (slots as usize).checked_mul(slot_size as usize).and_then(|d| d.checked_add(HEADER));
        let mapping = SharedMapping::create(name, len.ok_or_else(|| too_big(entries))?)?;
        let header = mapping.layout::<Header>(0);
        header.magic.store(MAGIC, Ordering::Relaxed);
        header.slots.store(slots, Ordering::Relaxed);
        header.slot_size.store(slot_size, Ordering::Relaxed);
        Ok(SharedQueue::new(mapping, slots, slot_size))
    }

    /// Maps a queue the daemon created, with the sizes its answer gave.
    pub fn attach(fd: OwnedFd, slots: u32, slot_size: u32) -> io::Result<SharedQueue> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("shared queue: {what}"));
        if !slots.is_power_of_two() || !slot_size.is_multiple_of(8) || slot_size == 0 {
            return Err(bad("sizes out of shape"));
        }
        let len = (slots as usize).checked_mul(slot_size as usize).and_then(|d| d.checked_add(HEADER));
        let mapping = SharedMapping::attach(fd, len.ok_or_else(|| bad("too large"))?)?;
        let header = mapping.layout::<Header>(0);
        if header.magic.load(Ordering::Relaxed) != MAGIC
            || header.slots.load(Ordering::Relaxed) != slots
            || header.slot_size.load(Ordering::Relaxed) != slot_size
        {
            return Err(bad("header does not match the layout announced"));
        }
        Ok(SharedQueue::new(mapping, slots, slot_size))
    }

    fn new(mapping: SharedMapping, slots: u32, slot_size: u32) -> SharedQueue {
        let data = mapping.bytes(HEADER, slots as usize * slot_size as usize);
        SharedQueue { mapping, slots, slot_size, data }
    }

    pub fn slot_count(&self) -> u32 {
        self.slots
    }

    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mapping.fd()
    }

    /// Copies slot `slot` (an index `spsc` handed out) into `out`.
    pub fn read_slot(&self, slot: u64, out: &mut [u8]) {
        let len = out.len().min(self.slot_size as usize);
        self.data.read(self.offset(slot), &mut out[..len]);
    }

    /// Writes `bytes` at the start of slot `slot`.
    pub fn write_slot(&self, slot: u64, bytes: &[u8]) {
        assert!(bytes.len() <= self.slot_size as usize, "entry larger than its slot");
        self.data.write(self.offset(slot), bytes);
    }

    fn offset(&self, slot: u64) -> usize {
        assert!(slot < u64::from(self.slots), "slot {slot} out of range");
        slot as usize * self.slot_size as usize
    }

    fn header(&self) -> &Header {
        self.mapping.layout(0)
    }

    /// A CQ's notification request.
    pub fn armed(&self) -> &AtomicU64 {
        &self.header().armed
    }
}

fn too_big(entries: u32) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("a queue of {entries} entries is too large"))
}

impl spsc::Queue for SharedQueue {
    type W = AtomicU64;

    fn slots(&self) -> u64 {
        u64::from(self.slots)
    }

    fn produced(&self) -> &AtomicU64 {
        &self.header().produced
    }

    fn consumed(&self) -> &AtomicU64 {
        &self.header().consumed
    }
}

#[cfg(test)]
mod tests {
    use softrnic_ring::spsc::{Consumer, Producer};

    use super::*;

    #[test]
    fn entries_cross_between_two_mappings() {
        let daemon = SharedQueue::create("t", 3, 20).unwrap();
        assert_eq!((daemon.slot_count(), daemon.slot_size()), (4, 24));
        let program = SharedQueue::attach(daemon.fd().try_clone_to_owned().unwrap(), 4, 24).unwrap();
        let (mut p, mut c) = (Producer::default(), Consumer::default());
        for round in 0..10u8 {
            let slot = p.slot(&program).unwrap().unwrap();
            program.write_slot(slot, &[round; 24]);
            p.publish(&program);
            let slot = c.slot(&daemon).unwrap().unwrap();
            let mut got = [0u8; 24];
            daemon.read_slot(slot, &mut got);
            assert_eq!(got, [round; 24]);
            c.release(&daemon);
        }
        assert_eq!(c.slot(&daemon).unwrap(), None);
    }

    #[test]
    fn a_layout_that_disagrees_is_refused() {
        let daemon = SharedQueue::create("t", 4, 24).unwrap();
        assert!(SharedQueue::attach(daemon.fd().try_clone_to_owned().unwrap(), 8, 24).is_err());
        assert!(SharedQueue::attach(daemon.fd().try_clone_to_owned().unwrap(), 4, 20).is_err());
        assert!(SharedQueue::attach(daemon.fd().try_clone_to_owned().unwrap(), 3, 24).is_err());
    }
}
