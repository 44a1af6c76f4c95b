//! Doorbells: how a program tells the daemon's command processor that a
//! queue has new entries, without a system call while the processor is
//! awake.
//!
//! The processor polls the queues while there is work. Before it sleeps it
//! raises `sleeping` in every tenant's doorbell page, looks at the queues
//! once more, and blocks on its wake-up eventfd. A program that publishes
//! an entry then reads `sleeping` and writes the eventfd only when the
//! processor sleeps: rxe's `post_send_db` write, made rare. The flag is
//! [`softrnic_ring::wakeup`]'s request, so no wake-up is lost between the
//! two.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;
use softrnic_ring::wakeup;

use crate::shared_memory::SharedMapping;

const PAGE: usize = 4096;
const SLEEPING_AT: usize = 0;

/// The daemon's wake-up eventfd.
pub fn wake_eventfd() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Counts one wake-up on an eventfd.
pub fn signal(eventfd: impl AsFd) {
    // A full counter (2^64 - 2 unread wake-ups) still wakes the reader.
    let _ = rustix::io::write(eventfd, &1u64.to_ne_bytes());
}

/// Takes every wake-up counted so far.
pub fn drain(eventfd: impl AsFd) {
    let mut count = [0u8; 8];
    let _ = rustix::io::read(eventfd, &mut count);
}

/// One tenant's doorbell page.
pub struct DoorbellPage {
    page: SharedMapping,
}

impl DoorbellPage {
    pub fn create() -> io::Result<DoorbellPage> {
        Ok(DoorbellPage { page: SharedMapping::create("softrnic-doorbell", PAGE)? })
    }

    pub fn attach(fd: OwnedFd) -> io::Result<DoorbellPage> {
        Ok(DoorbellPage { page: SharedMapping::attach(fd, PAGE)? })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.page.fd()
    }

    /// The daemon, about to sleep (`true`) or awake again.
    pub fn set_sleeping(&self, sleeping: bool) {
        let word = self.page.word(SLEEPING_AT);
        if sleeping { wakeup::request(word, 1) } else { wakeup::withdraw(word) }
    }

    /// The program, after publishing an entry: wakes the daemon if it
    /// sleeps.
    pub fn ring(&self, wake: impl AsFd) {
        if wakeup::requested(self.page.word(SLEEPING_AT)) != 0 {
            signal(wake);
        }
    }
}
