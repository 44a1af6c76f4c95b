//! A queue of notifications behind a file descriptor that stays readable
//! while the queue holds any: a completion channel (which CQs fired) or a
//! device's asynchronous events.
//!
//! The descriptor is a semaphore eventfd with one signal per queued item,
//! so `poll`/`epoll` on it, a blocking `read` and a non-blocking one all
//! behave as they do on the kernel's uverbs event files.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;

use crate::eventfd::EventFd;

#[derive(Debug)]
pub struct EventQueue<T> {
    signals: EventFd,
    items: Mutex<VecDeque<T>>,
}

impl<T> EventQueue<T> {
    pub fn new() -> io::Result<EventQueue<T>> {
        Ok(EventQueue { signals: EventFd::semaphore()?, items: Mutex::new(VecDeque::new()) })
    }

    /// Queues `item` and makes the descriptor readable.
    pub fn push(&self, item: T) {
        // The item goes in before its signal, so whoever takes the signal
        // finds an item.
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push_back(item);
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
        let item = self.items.lock().unwrap_or_else(|e| e.into_inner()).pop_front()?;
        // Its signal was written right after it was queued.
        let _ = self.signals.take_one();
        Some(item)
    }

    /// The next item, waiting for one unless the descriptor was made
    /// non-blocking (then `WouldBlock`).
    pub fn pop(&self) -> io::Result<T> {
        self.signals.take_one()?;
        let item = self.items.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
        item.ok_or_else(|| io::Error::other("event queue signalled without an item"))
    }

    /// Drops every queued item whose `keep` is false, with its signal:
    /// what a destroyed object had pending.
    pub fn retain(&self, keep: impl Fn(&T) -> bool) {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let before = items.len();
        items.retain(|item| keep(item));
        for _ in items.len()..before {
            let _ = self.signals.take_one();
        }
    }

    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).len()
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
