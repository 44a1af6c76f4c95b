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
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use softrnic_ring::spsc;
use softrnic_transport::DmaBuffer;

use crate::shared_memory::SharedMapping;

const MAGIC: u64 = u64::from_le_bytes(*b"SRNICQ01");
const MAGIC_AT: usize = 0;
const SLOTS_AT: usize = 8;
const SLOT_SIZE_AT: usize = 12;
const PRODUCED_AT: usize = 128;
const CONSUMED_AT: usize = 256;
const ARMED_AT: usize = 384;
const HEADER: usize = 512;

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
        mapping.word(MAGIC_AT).store(MAGIC, Ordering::Relaxed);
        mapping.word32(SLOTS_AT).store(slots, Ordering::Relaxed);
        mapping.word32(SLOT_SIZE_AT).store(slot_size, Ordering::Relaxed);
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
        if mapping.word(MAGIC_AT).load(Ordering::Relaxed) != MAGIC
            || mapping.word32(SLOTS_AT).load(Ordering::Relaxed) != slots
            || mapping.word32(SLOT_SIZE_AT).load(Ordering::Relaxed) != slot_size
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

    /// A CQ's notification request.
    pub fn armed(&self) -> &AtomicU64 {
        self.mapping.word(ARMED_AT)
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
        self.mapping.word(PRODUCED_AT)
    }

    fn consumed(&self) -> &AtomicU64 {
        self.mapping.word(CONSUMED_AT)
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
