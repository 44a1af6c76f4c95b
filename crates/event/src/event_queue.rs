//! A queue of notifications behind a file descriptor that stays readable
//! while the queue holds any: a completion channel (which CQs fired) or a
//! device's asynchronous events.
//!
//! The descriptor is a semaphore eventfd with one signal per queued item,
//! so `poll`/`epoll` on it, a blocking `read` and a non-blocking one all
//! behave as they do on the kernel's uverbs event files.
//!
//! A blocking reader takes a signal first (a `read` with the kernel
//! file's own behaviour: it waits, fails with `EAGAIN` once the program
//! sets `O_NONBLOCK`, and with `EINTR` when a signal handler interrupts
//! it) and then an item. Everything else takes
//! an item and its signal together under the lock. While a reader waits in
//! its `read`, a signal taken under the lock could be the one that reader
//! was handed, leaving the reader with no item and the lock's holder
//! blocked in a `read` of its own, holding the lock: a deadlock (found by
//! rping, whose main thread destroys an rdma_cm ID while its CM thread
//! waits for that ID's events). So while a reader waits, an item taken
//! under the lock leaves its signal behind as an orphan, which the next
//! reader takes and discards.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Mutex, MutexGuard};

use crate::eventfd::EventFd;

#[derive(Debug)]
pub struct EventQueue<T> {
    signals: EventFd,
    queued: Mutex<Queued<T>>,
}

/// What the lock guards. Outside the lock, the eventfd holds one signal
/// per item and per orphan, less the signals readers took and have not
/// yet matched with an item.
#[derive(Debug)]
struct Queued<T> {
    items: VecDeque<T>,
    /// Threads in (or about to enter) [`EventQueue::pop`]'s `read`.
    readers: usize,
    /// Signals left in the eventfd whose items were taken under the lock.
    orphans: u64,
}

impl<T> EventQueue<T> {
    pub fn new() -> io::Result<EventQueue<T>> {
        Ok(EventQueue {
            signals: EventFd::semaphore()?,
            queued: Mutex::new(Queued { items: VecDeque::new(), readers: 0, orphans: 0 }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queued<T>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `item` and makes the descriptor readable.
    pub fn push(&self, item: T) {
        let mut queued = self.lock();
        queued.items.push_back(item);
        // Under the lock, so that whoever holds it finds a signal for
        // every item.
        self.signals.signal();
    }

    /// [`EventQueue::push`], dropping the oldest item first when `cap` are
    /// queued: a program that never reads its events must not grow the
    /// queue without end.
    pub fn push_bounded(&self, item: T, cap: usize) {
        if self.len() >= cap {
            let _ = self.try_pop();
        }
        self.push(item);
    }

    /// The next item, if one is queued; never waits for one.
    pub fn try_pop(&self) -> Option<T> {
        let mut queued = self.lock();
        let item = queued.items.pop_front()?;
        self.forget_signals(&mut queued, 1);
        Some(item)
    }

    /// The next item, waiting for one unless the descriptor was made
    /// non-blocking (then `WouldBlock`).
    pub fn pop(&self) -> io::Result<T> {
        loop {
            self.lock().readers += 1;
            let taken = self.signals.take_one();
            let mut queued = self.lock();
            queued.readers -= 1;
            let result = match taken {
                Ok(()) if queued.orphans > 0 => {
                    queued.orphans -= 1;
                    None
                }
                // Every signal a reader takes is an item's or an orphan's.
                Ok(()) => Some(queued.items.pop_front().ok_or_else(|| io::Error::other("signalled without an item"))),
                Err(e) => Some(Err(e)),
            };
            // The last reader out takes the orphans left, so that the
            // descriptor is readable only while items are queued.
            if queued.readers == 0 {
                let orphans = std::mem::take(&mut queued.orphans);
                self.forget_signals(&mut queued, orphans);
            }
            if let Some(result) = result {
                return result;
            }
        }
    }

    /// Drops every queued item whose `keep` is false, with its signal:
    /// what a destroyed object had pending.
    pub fn retain(&self, keep: impl Fn(&T) -> bool) {
        let mut queued = self.lock();
        let before = queued.items.len();
        queued.items.retain(|item| keep(item));
        let dropped = before - queued.items.len();
        self.forget_signals(&mut queued, dropped as u64);
    }

    /// Takes the signals of `count` items just taken under the lock: with
    /// no reader waiting they are all in the eventfd and the reads return
    /// at once; otherwise they stay there as orphans.
    fn forget_signals(&self, queued: &mut Queued<T>, count: u64) {
        if queued.readers > 0 {
            queued.orphans += count;
            return;
        }
        for _ in 0..count {
            let _ = self.signals.take_one();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> AsRawFd for EventQueue<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.signals.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventfd::wait_readable;

    fn readable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, passed with its length; no waiting.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    #[test]
    fn readable_exactly_while_items_remain() {
        let q = EventQueue::new().unwrap();
        assert!(!readable(q.as_raw_fd()));
        q.push(1);
        q.push(2);
        wait_readable(&[q.as_raw_fd()], std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(q.pop().unwrap(), 1);
        assert!(readable(q.as_raw_fd()), "one item left");
        assert_eq!(q.try_pop(), Some(2));
        assert!(!readable(q.as_raw_fd()));
        assert_eq!(q.try_pop(), None);
    }

    #[test]
    fn retain_takes_the_signals_of_what_it_drops() {
        let q = EventQueue::new().unwrap();
        for i in 0..4 {
            q.push(i);
        }
        q.retain(|&i| i % 2 == 1);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop().unwrap(), 1);
        assert_eq!(q.pop().unwrap(), 3);
        assert!(!readable(q.as_raw_fd()));
    }

    #[test]
    fn a_bounded_push_drops_the_oldest() {
        let q = EventQueue::new().unwrap();
        for i in 0..5 {
            q.push_bounded(i, 3);
        }
        assert_eq!((q.try_pop(), q.try_pop(), q.try_pop(), q.try_pop()), (Some(2), Some(3), Some(4), None));
        assert!(!readable(q.as_raw_fd()));
    }

    /// A reader waits in `pop` while another thread pushes and takes items
    /// under the lock (`retain`, `try_pop`), as rping's main thread
    /// destroys an ID while its CM thread waits for events: nothing
    /// deadlocks, every item is taken once and in order, and afterwards
    /// the descriptor is not readable.
    #[test]
    fn items_taken_under_the_lock_while_a_reader_waits() {
        const ROUNDS: u64 = 20_000;
        const LAST: u64 = u64::MAX;
        let q = std::sync::Arc::new(EventQueue::new().unwrap());
        let reader = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                loop {
                    match q.pop().unwrap() {
                        LAST => return got,
                        item => got.push(item),
                    }
                }
            })
        };
        let (done, finished) = std::sync::mpsc::channel();
        let writer = q.clone();
        std::thread::spawn(move || {
            let removed = std::cell::Cell::new(0);
            let count = |taken: bool| removed.set(removed.get() + u64::from(taken));
            for i in 0..ROUNDS {
                writer.push(i);
                match i % 4 {
                    0 => writer.retain(|&item| {
                        count(item == i);
                        item != i
                    }),
                    1 => count(writer.try_pop().is_some()),
                    _ => {}
                }
            }
            writer.push(LAST);
            let _ = done.send((reader.join().unwrap(), removed.get()));
        });
        // Both threads block for good on a deadlock: the test fails rather
        // than hang.
        let (got, removed) = finished.recv_timeout(std::time::Duration::from_secs(60)).expect("deadlocked");
        assert_eq!(got.len() as u64 + removed, ROUNDS, "every item taken once");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
        assert!(!readable(q.as_raw_fd()), "no signal left without its item");
    }

    #[test]
    fn a_blocking_pop_waits_for_a_push() {
        let q = std::sync::Arc::new(EventQueue::new().unwrap());
        let pusher = q.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            pusher.push(7u32);
        });
        assert_eq!(q.pop().unwrap(), 7);
        t.join().unwrap();
    }
}
