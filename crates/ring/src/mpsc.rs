//! Many producers, one consumer: the shared-memory wire's inboxes (the
//! engine's `shm` datapath lays them out in memory). A bounded queue in
//! the style of Dmitry Vyukov's: slot `i` carries a sequence number that
//! says whose turn it is. `seq == pos`: free for the producer of position
//! `pos`; `seq == pos + 1`: published, for the consumer; `seq == pos +
//! slots`: free again, for the producer one lap later.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::Word;

/// The words of one ring.
pub trait Ring {
    type W: Word;
    fn slots(&self) -> u64;
    /// The next position a producer will claim.
    fn tail(&self) -> &Self::W;
    /// The sequence number of the slot that holds position `pos`.
    fn seq(&self, pos: u64) -> &Self::W;
}

/// How often a producer tries to claim before calling the ring full: other
/// producers win a few races at most, and a consumer whose ring is broken
/// (another process wrote it wrong) must not keep a sender spinning.
const CLAIM_ATTEMPTS: usize = 1024;

/// A producer claims the next position; `None` if the ring is full (or
/// too broken to use).
pub fn claim<R: Ring>(ring: &R) -> Option<u64> {
    let mut pos = ring.tail().load(Relaxed);
    for _ in 0..CLAIM_ATTEMPTS {
        let seq = ring.seq(pos).load(Acquire);
        match seq.wrapping_sub(pos) as i64 {
            0 => match ring.tail().compare_exchange(pos, pos.wrapping_add(1)) {
                Ok(_) => return Some(pos),
                Err(now) => pos = now,
            },
            lag if lag < 0 => return None,
            _ => pos = ring.tail().load(Relaxed),
        }
    }
    None
}

/// A producer publishes the position it claimed and filled; false if the
/// consumer gave up on it meanwhile (see [`abandon`]).
pub fn publish<R: Ring>(ring: &R, pos: u64) -> bool {
    ring.seq(pos).compare_exchange(pos, pos.wrapping_add(1)).is_ok()
}

/// What the consumer finds at its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Published: read it, then [`release`] it.
    Ready,
    /// Nothing to read yet: the slot is free, or claimed and not
    /// published; [`claimed`] tells which.
    NotPublished,
    /// A sequence number no correct producer writes.
    Corrupt,
}

/// The consumer looks at position `head`. Only the slot's own word is
/// read: the ring's tail is the line every producer's claim writes, and
/// a consumer reading it on every look of an empty ring would pull it
/// away from the producer before each claim (a transfer between cores
/// per datagram: 5 to 15 % of a 64 B stream's message rate).
pub fn peek<R: Ring>(ring: &R, head: u64) -> Head {
    match ring.seq(head).load(Acquire) {
        s if s == head.wrapping_add(1) => Head::Ready,
        s if s == head => Head::NotPublished,
        _ => Head::Corrupt,
    }
}

/// Whether a producer has claimed position `head`, found
/// [`Head::NotPublished`]: a producer is filling the slot, or died while
/// it did (see [`abandon`]). Reads the tail, so a consumer asks now and
/// then, not on every look.
pub fn claimed<R: Ring>(ring: &R, head: u64) -> bool {
    ring.tail().load(Acquire) != head
}

/// The consumer frees the slot it has read, for the next lap.
pub fn release<R: Ring>(ring: &R, head: u64) {
    ring.seq(head).store(head.wrapping_add(ring.slots()), Release);
}

/// The consumer gives up on a position claimed and never published (its
/// producer died); true if it did, false if the producer published first.
pub fn abandon<R: Ring>(ring: &R, head: u64) -> bool {
    ring.seq(head).compare_exchange(head, head.wrapping_add(ring.slots())).is_ok()
}

#[cfg(all(test, loom))]
mod model {
    use std::sync::atomic::Ordering::Relaxed;

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64;

    use super::*;

    /// A ring of two slots, each with one word of data.
    struct Model {
        tail: AtomicU64,
        seq: [AtomicU64; 2],
        data: [AtomicU64; 2],
    }

    impl Ring for Model {
        type W = AtomicU64;
        fn slots(&self) -> u64 {
            2
        }
        fn tail(&self) -> &AtomicU64 {
            &self.tail
        }
        fn seq(&self, pos: u64) -> &AtomicU64 {
            &self.seq[(pos % 2) as usize]
        }
    }

    fn model() -> Arc<Model> {
        Arc::new(Model {
            tail: AtomicU64::new(0),
            seq: [AtomicU64::new(0), AtomicU64::new(1)],
            data: [AtomicU64::new(0), AtomicU64::new(0)],
        })
    }

    fn push(ring: &Model, value: u64) -> bool {
        match claim(ring) {
            Some(pos) => {
                ring.data[(pos % 2) as usize].store(value, Relaxed);
                publish(ring, pos)
            }
            None => false,
        }
    }

    /// Two producers and the consumer at once: every published value is
    /// read once, with the bytes its producer wrote, and nothing else.
    #[test]
    fn two_producers_one_consumer() {
        loom::model(|| {
            let ring = model();
            let producers: Vec<_> = [7u64, 9]
                .into_iter()
                .map(|value| {
                    let ring = ring.clone();
                    loom::thread::spawn(move || push(&ring, value))
                })
                .collect();
            let mut head = 0;
            let mut got = Vec::new();
            for _ in 0..2 {
                if peek(&*ring, head) == Head::Ready {
                    got.push(ring.data[(head % 2) as usize].load(Relaxed));
                    release(&*ring, head);
                    head += 1;
                }
            }
            let pushed = producers.into_iter().map(|p| p.join().unwrap()).filter(|&ok| ok).count();
            while peek(&*ring, head) == Head::Ready {
                got.push(ring.data[(head % 2) as usize].load(Relaxed));
                release(&*ring, head);
                head += 1;
            }
            got.sort();
            assert_eq!(pushed, 2, "two slots hold two datagrams");
            assert_eq!(got, vec![7, 9]);
        });
    }

    /// A consumer giving up on a claimed slot races its late producer:
    /// exactly one of them wins, and the ring stays usable.
    #[test]
    fn abandoning_races_publishing() {
        loom::model(|| {
            let ring = model();
            let pos = claim(&*ring).expect("room");
            let producer = {
                let ring = ring.clone();
                loom::thread::spawn(move || {
                    ring.data[0].store(5, Relaxed);
                    publish(&*ring, pos)
                })
            };
            let abandoned = peek(&*ring, 0) == Head::NotPublished && claimed(&*ring, 0) && abandon(&*ring, 0);
            let published = producer.join().unwrap();
            assert!(abandoned ^ published, "abandoned {abandoned}, published {published}");
            if published {
                assert_eq!(peek(&*ring, 0), Head::Ready);
                assert_eq!(ring.data[0].load(Relaxed), 5);
                release(&*ring, 0);
            }
            // The next lap's producer gets the slot either way.
            assert!(push(&ring, 6));
            assert!(push(&ring, 8));
        });
    }
}
