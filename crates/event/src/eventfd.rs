//! A Linux eventfd: how an engine thread is woken from its sleep, and the
//! file descriptor of a completion channel that `poll`/`epoll` can wait on.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A non-blocking eventfd with a zero counter.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nobody else owns.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// A blocking eventfd in semaphore mode: each read takes one signal,
    /// and a read with none pending waits (unless the fd's owner sets
    /// `O_NONBLOCK`, as verbs programs may on a completion channel).
    pub fn semaphore() -> io::Result<EventFd> {
        // SAFETY: eventfd has no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nobody else owns.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Takes one signal from a semaphore eventfd, waiting for it if the fd
    /// blocks. A signal handler that interrupts the wait makes it fail with
    /// `Interrupted`, as the kernel's event files do: programs end a test
    /// with `alarm(2)` and expect `ibv_get_cq_event` to return (qperf).
    pub fn take_one(&self) -> io::Result<()> {
        let mut count: u64 = 0;
        softrnic_account::one(softrnic_account::Cost::WakeReads);
        // SAFETY: reads at most 8 bytes into `count`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), &mut count as *mut u64 as *mut libc::c_void, 8) };
        match n {
            8 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Adds one to the counter, making the fd readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        softrnic_account::one(softrnic_account::Cost::WakeSignals);
        // SAFETY: writes the 8 bytes of `one` to our own descriptor. A full
        // counter (EAGAIN) already means "readable", so the result is moot.
        unsafe { libc::write(self.fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// Reads and clears the counter; returns how many signals it held.
    pub fn drain(&self) -> u64 {
        let mut count: u64 = 0;
        softrnic_account::one(softrnic_account::Cost::WakeReads);
        // SAFETY: reads at most 8 bytes into `count`.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), &mut count as *mut u64 as *mut libc::c_void, 8) };
        if n == 8 { count } else { 0 }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (to the
/// microsecond: `ppoll`, not `poll`'s milliseconds). With no fds it is a
/// precise sleep.
pub fn wait_readable(fds: &[RawFd], timeout: Duration) -> io::Result<()> {
    let mut pollfds = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 4];
    assert!(fds.len() <= pollfds.len(), "at most four fds");
    for (slot, &fd) in pollfds.iter_mut().zip(fds) {
        slot.fd = fd;
    }
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    softrnic_account::one(softrnic_account::Cost::Sleeps);
    // SAFETY: the array and the timespec live across the call, and the
    // length passed is the number of entries filled in.
    let rc = unsafe { libc::ppoll(pollfds.as_mut_ptr(), fds.len() as libc::nfds_t, &timeout, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signal whose handler does not ask for restarts interrupts a
    /// blocked `take_one`, which says so instead of waiting on.
    #[test]
    fn a_signal_interrupts_a_blocked_take() {
        extern "C" fn nothing(_: libc::c_int) {}
        // SAFETY: installs a handler that does nothing, without SA_RESTART,
        // for a signal nothing else in the tests uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut());
        }
        let fd = std::sync::Arc::new(EventFd::semaphore().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let fd = fd.clone();
            std::thread::spawn(move || {
                // SAFETY: the calling thread's own handle.
                tx.send(unsafe { libc::pthread_self() }).unwrap();
                fd.take_one()
            })
        };
        let thread = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !waiter.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the signal never interrupted the wait");
            // SAFETY: the waiter is alive (not finished) and handles SIGUSR2.
            unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(waiter.join().unwrap().unwrap_err().kind(), io::ErrorKind::Interrupted);
    }

    #[test]
    fn signals_accumulate_and_drain() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.drain(), 0);
        e.signal();
        e.signal();
        wait_readable(&[e.as_raw_fd()], Duration::from_secs(1)).unwrap();
        assert_eq!(e.drain(), 2);
        assert_eq!(e.drain(), 0);
    }
}
