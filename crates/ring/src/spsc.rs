//! One producer, one consumer, entries of one size in shared memory, as
//! the Linux rxe driver's mmap'd queues: a verbs queue that a program and
//! the engine serving it share (the program produces send and receive
//! requests, the engine completions).
//!
//! Each index has one writer, which keeps its own copy and publishes it
//! with a release store; it never reads its index back from shared memory,
//! where the other side could have changed it. The reader takes the other
//! side's index with an acquire load and checks it before use: an index
//! that no correct peer writes (ahead of what the reader itself has
//! published, or more than a lap away) makes the queue [`Broken`], never a
//! slot out of range, so a program that scribbles on its queue harms only
//! that queue. A full queue refuses; nothing is overwritten.

use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Release};

use crate::Word;

/// The shared words of one queue.
pub trait Queue {
    type W: Word;
    /// Entries the queue holds: a power of two.
    fn slots(&self) -> u64;
    /// How many entries the producer has published, ever.
    fn produced(&self) -> &Self::W;
    /// How many entries the consumer has released, ever.
    fn consumed(&self) -> &Self::W;
}

/// The other side wrote an index no correct peer writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken {
    /// The index it wrote, and what this side expected it near.
    pub found: u64,
    pub ours: u64,
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the peer's queue index {} is out of reach of ours ({})", self.found, self.ours)
    }
}

impl std::error::Error for Broken {}

/// The producer's side: its own count of what it has published, and the
/// consumer's as it last read it. Reading the consumer's index takes the
/// cache line the consumer writes on every release, so the producer reads
/// it again only when the count it has leaves no room (the cached indices
/// of Lamport's queue as FastForward and its successors keep them).
#[derive(Debug, Default)]
pub struct Producer {
    produced: u64,
    consumed_seen: u64,
}

impl Producer {
    /// The slot to fill next (`0..slots`), `None` while the queue is full.
    pub fn slot<Q: Queue>(&mut self, queue: &Q) -> Result<Option<u64>, Broken> {
        if self.room(queue)? == 0 {
            return Ok(None);
        }
        Ok(Some(self.produced & (queue.slots() - 1)))
    }

    /// At least how many slots are free: what the consumer's index last
    /// read leaves, read again only when that is none.
    pub fn room<Q: Queue>(&mut self, queue: &Q) -> Result<u64, Broken> {
        let room = queue.slots() - self.produced.wrapping_sub(self.consumed_seen);
        if room > 0 { Ok(room) } else { self.free(queue) }
    }

    /// How many slots are free now: entries the producer may write before
    /// it must wait for the consumer.
    pub fn free<Q: Queue>(&mut self, queue: &Q) -> Result<u64, Broken> {
        let consumed = queue.consumed().load(Acquire);
        let used = self.produced.wrapping_sub(consumed);
        if used > queue.slots() {
            return Err(Broken { found: consumed, ours: self.produced });
        }
        self.consumed_seen = consumed;
        Ok(queue.slots() - used)
    }

    /// Publishes the slot [`Producer::slot`] gave, once filled.
    pub fn publish<Q: Queue>(&mut self, queue: &Q) {
        self.produced = self.produced.wrapping_add(1);
        queue.produced().store(self.produced, Release);
    }
}

/// The consumer's side: its own count of what it has released, and the
/// producer's as it last read it (read again only once it has taken all
/// that count promised, for the same reason as [`Producer`]'s).
#[derive(Debug, Default)]
pub struct Consumer {
    consumed: u64,
    produced_seen: u64,
}

impl Consumer {
    /// The slot to read next (`0..slots`), `None` while the queue is empty.
    pub fn slot<Q: Queue>(&mut self, queue: &Q) -> Result<Option<u64>, Broken> {
        if self.consumed == self.produced_seen {
            let produced = queue.produced().load(Acquire);
            if produced.wrapping_sub(self.consumed) > queue.slots() {
                return Err(Broken { found: produced, ours: self.consumed });
            }
            self.produced_seen = produced;
            if produced == self.consumed {
                return Ok(None);
            }
        }
        Ok(Some(self.consumed & (queue.slots() - 1)))
    }

    /// Frees the slot [`Consumer::slot`] gave, once read, for the producer.
    pub fn release<Q: Queue>(&mut self, queue: &Q) {
        self.consumed = self.consumed.wrapping_add(1);
        queue.consumed().store(self.consumed, Release);
    }
}

/// A queue of `N` one-word entries for the tests, on std's atomics or
/// loom's.
#[cfg(test)]
struct TestQueue<A, const N: usize> {
    produced: A,
    consumed: A,
    data: [A; N],
}

#[cfg(test)]
impl<A: Word + Default, const N: usize> TestQueue<A, N> {
    fn new() -> Self {
        TestQueue { produced: A::default(), consumed: A::default(), data: std::array::from_fn(|_| A::default()) }
    }
}

#[cfg(test)]
impl<A: Word, const N: usize> Queue for TestQueue<A, N> {
    type W = A;
    fn slots(&self) -> u64 {
        N as u64
    }
    fn produced(&self) -> &A {
        &self.produced
    }
    fn consumed(&self) -> &A {
        &self.consumed
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    type Memory = TestQueue<AtomicU64, 4>;

    fn memory() -> Memory {
        TestQueue::new()
    }

    fn push(p: &mut Producer, q: &Memory, value: u64) -> Result<bool, Broken> {
        match p.slot(q)? {
            Some(slot) => {
                q.data[slot as usize].store(value, Relaxed);
                p.publish(q);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn pop(c: &mut Consumer, q: &Memory) -> Result<Option<u64>, Broken> {
        Ok(c.slot(q)?.map(|slot| {
            let value = q.data[slot as usize].load(Relaxed);
            c.release(q);
            value
        }))
    }

    /// In order, a lap after lap, full at four, empty at none.
    #[test]
    fn entries_come_out_in_order_lap_after_lap() {
        let q = memory();
        let (mut p, mut c) = (Producer::default(), Consumer::default());
        let mut next_out = 0;
        for value in 0..100 {
            if !push(&mut p, &q, value).unwrap() {
                assert_eq!(q.produced.load(Relaxed) - q.consumed.load(Relaxed), 4, "refused only when full");
                assert_eq!(pop(&mut c, &q).unwrap(), Some(next_out));
                next_out += 1;
                assert!(push(&mut p, &q, value).unwrap());
            }
        }
        while let Some(value) = pop(&mut c, &q).unwrap() {
            assert_eq!(value, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, 100);
    }

    #[test]
    fn free_counts_what_the_producer_may_still_write() {
        let q = memory();
        let (mut p, mut c) = (Producer::default(), Consumer::default());
        assert_eq!(p.free(&q), Ok(4));
        for value in 0..3 {
            push(&mut p, &q, value).unwrap();
        }
        assert_eq!(p.free(&q), Ok(1));
        pop(&mut c, &q).unwrap();
        assert_eq!(p.free(&q), Ok(2));
        q.consumed.store(9, Relaxed);
        assert!(p.free(&q).is_err(), "a consumer ahead of the producer is broken");
    }

    /// Each side reads the other's index only when the count it has runs
    /// out: the producer when the queue looks full, the consumer when it
    /// looks empty.
    #[test]
    fn each_side_reads_the_others_index_only_when_its_count_runs_out() {
        let q = memory();
        let (mut p, mut c) = (Producer::default(), Consumer::default());
        for value in 0..4 {
            push(&mut p, &q, value).unwrap();
        }
        assert_eq!(pop(&mut c, &q).unwrap(), Some(0));
        // The consumer read "4 produced" once: a fifth published now is
        // not seen until it has taken the three it knows of.
        push(&mut p, &q, 4).unwrap();
        q.produced.store(0xdead, Relaxed); // unread while the count lasts
        for value in 1..4 {
            assert_eq!(pop(&mut c, &q).unwrap(), Some(value));
        }
        assert!(c.slot(&q).is_err(), "read once the count ran out, and refused");
        // The producer's room lasts until the consumer's index it read
        // leaves none; only then does it look again.
        let q = memory();
        let (mut p, mut c) = (Producer::default(), Consumer::default());
        assert_eq!(p.room(&q), Ok(4));
        push(&mut p, &q, 0).unwrap();
        pop(&mut c, &q).unwrap();
        assert_eq!(p.room(&q), Ok(3), "what the last read left: at least that many");
        for value in 1..4 {
            push(&mut p, &q, value).unwrap();
        }
        assert_eq!(p.room(&q), Ok(1), "read again once the count ran out");
    }

    /// A peer that writes its index anywhere it likes breaks the queue
    /// for this side, which never touches a slot out of range.
    #[test]
    fn a_scribbled_index_breaks_the_queue_and_nothing_else() {
        let q = memory();
        let (mut p, _) = (Producer::default(), Consumer::default());
        push(&mut p, &q, 7).unwrap();
        for garbage in [5, 1 << 40, u64::MAX] {
            q.produced.store(garbage, Relaxed);
            let mut c = Consumer::default();
            assert_eq!(c.slot(&q), Err(Broken { found: garbage, ours: 0 }), "{garbage}");
        }
        // A consumer claiming more than was produced, or a lap behind:
        // found when the producer next reads it.
        for garbage in [2, u64::MAX - 8] {
            q.consumed.store(garbage, Relaxed);
            assert!(p.free(&q).is_err(), "{garbage}");
            // The same producer, its last read leaving it no room.
            let mut full = Producer { produced: 1, consumed_seen: 1u64.wrapping_sub(4) };
            assert!(full.slot(&q).is_err(), "{garbage}");
        }
        // The index wraps like any counter: a queue that has run for 2^64
        // entries goes on.
        let q = memory();
        let start = u64::MAX - 2;
        q.produced.store(start, Relaxed);
        q.consumed.store(start, Relaxed);
        let mut p = Producer { produced: start, consumed_seen: start };
        let mut c = Consumer { consumed: start, produced_seen: start };
        for value in 0..10 {
            assert!(push(&mut p, &q, value).unwrap());
            assert_eq!(pop(&mut c, &q).unwrap(), Some(value));
        }
    }
}

#[cfg(all(test, loom))]
mod model {
    use std::sync::atomic::Ordering::Relaxed;

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    use super::*;

    /// The producer puts three values through two slots while the consumer
    /// takes them: each arrives once, in order, with the bytes written.
    #[test]
    fn three_values_through_two_slots() {
        loom::model(|| {
            // Two slots, each with one word of data.
            let q = Arc::new(TestQueue::<AtomicU64, 2>::new());
            let producer = {
                let q = q.clone();
                loom::thread::spawn(move || {
                    let mut p = Producer::default();
                    for value in [11u64, 12, 13] {
                        loop {
                            match p.slot(&*q).expect("a correct consumer") {
                                Some(slot) => {
                                    q.data[slot as usize].store(value, Relaxed);
                                    p.publish(&*q);
                                    break;
                                }
                                None => loom::thread::yield_now(),
                            }
                        }
                    }
                })
            };
            let mut c = Consumer::default();
            let mut got = Vec::new();
            while got.len() < 3 {
                match c.slot(&*q).expect("a correct producer") {
                    Some(slot) => {
                        got.push(q.data[slot as usize].load(Relaxed));
                        c.release(&*q);
                    }
                    None => loom::thread::yield_now(),
                }
            }
            producer.join().unwrap();
            assert_eq!(got, [11, 12, 13]);
        });
    }
}
