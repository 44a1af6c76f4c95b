//! `rpoll` and `rselect`: readiness of rsockets and of any other
//! descriptor together (librspreload hands a program's whole `poll` set
//! here once one of them is an rsocket).
//!
//! Each round asks every rsocket for its events (taking its completions
//! and CM events) and the kernel for the rest without waiting. With
//! nothing ready, it polls for [`struct@SPIN`](super::SPIN), then arms every
//! rsocket's notifications and sleeps in one `ppoll` over the other
//! descriptors and the rsockets' wake-up descriptors.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::{SPIN, Shared, fail, lock, table};

/// Where one of the program's entries is watched.
enum Watched {
    /// An rsocket.
    RSocket(Shared),
    /// A descriptor the kernel polls, at this index of the kernel set.
    Kernel(usize),
    /// A negative descriptor: ignored, as poll ignores it.
    Ignored,
}

pub fn poll(fds: &mut [libc::pollfd], timeout: c_int) -> c_int {
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let spin_until = Instant::now() + *SPIN;
    let mut kernel: Vec<libc::pollfd> = Vec::with_capacity(fds.len());
    let watched: Vec<Watched> = {
        let sockets = table();
        fds.iter()
            .map(|p| match sockets.get(&p.fd) {
                _ if p.fd < 0 => Watched::Ignored,
                Some(socket) => Watched::RSocket(socket.clone()),
                None => {
                    kernel.push(libc::pollfd { fd: p.fd, events: p.events, revents: 0 });
                    Watched::Kernel(kernel.len() - 1)
                }
            })
            .collect()
    };
    let program_fds = kernel.len();
    loop {
        let mut ready = 0;
        for (p, w) in fds.iter_mut().zip(&watched) {
            p.revents = match w {
                Watched::RSocket(socket) => lock(socket).poll_events(p.events),
                _ => 0,
            };
            ready += c_int::from(p.revents != 0);
        }
        let now = Instant::now();
        let expired = deadline.is_some_and(|d| now >= d);
        let sleep = ready == 0 && !expired && now >= spin_until;
        // Arm every rsocket before sleeping; one that had news meanwhile
        // makes this round's kernel poll a look, not a sleep.
        kernel.truncate(program_fds);
        let mut news = false;
        if sleep {
            for w in &watched {
                if let Watched::RSocket(socket) = w {
                    let mut s = lock(socket);
                    news |= s.arm();
                    kernel.extend(s.wake_fds().into_iter().map(|fd| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    }));
                }
            }
        }
        let wait = match (sleep && !news, deadline) {
            (false, _) => Duration::ZERO,
            (true, None) => super::NAP,
            (true, Some(d)) => d.saturating_duration_since(Instant::now()).min(super::NAP),
        };
        let spec =
            libc::timespec { tv_sec: wait.as_secs() as libc::time_t, tv_nsec: wait.subsec_nanos() as libc::c_long };
        let rc = match kernel.is_empty() && wait.is_zero() {
            // Nothing for the kernel to look at or wait for.
            true => 0,
            // SAFETY: `kernel` holds its length of pollfds across the call.
            false => unsafe { libc::ppoll(kernel.as_mut_ptr(), kernel.len() as libc::nfds_t, &spec, std::ptr::null()) },
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return fail("rpoll", e.raw_os_error().unwrap_or(libc::EIO), e);
            }
            set_interrupted();
            return -1;
        }
        for (p, w) in fds.iter_mut().zip(&watched) {
            if let Watched::Kernel(at) = w {
                p.revents = kernel[*at].revents;
                ready += c_int::from(p.revents != 0);
            }
        }
        if sleep {
            for w in &watched {
                if let Watched::RSocket(socket) = w {
                    lock(socket).drain_wakeups();
                }
            }
        }
        if ready > 0 || expired {
            return ready;
        }
    }
}

fn set_interrupted() {
    softrnic_verbs_abi::ffi::set_errno(libc::EINTR);
}

/// `select` as `rpoll` over the descriptors below `nfds` in the sets.
///
/// # Safety
/// The sets are null or valid `fd_set`s; `timeout` null or readable.
pub unsafe fn select(
    nfds: c_int,
    read: *mut libc::fd_set,
    write: *mut libc::fd_set,
    except: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
        return fail("rselect", libc::EINVAL, format!("nfds {nfds}"));
    }
    // SAFETY: valid sets or null (caller).
    let is_set = |set: *mut libc::fd_set, fd: c_int| !set.is_null() && unsafe { libc::FD_ISSET(fd, set) };
    let mut fds: Vec<libc::pollfd> = (0..nfds)
        .filter_map(|fd| {
            let mut events = 0;
            if is_set(read, fd) {
                events |= libc::POLLIN;
            }
            if is_set(write, fd) {
                events |= libc::POLLOUT;
            }
            (events != 0 || is_set(except, fd)).then_some(libc::pollfd { fd, events, revents: 0 })
        })
        .collect();
    // SAFETY: readable or null (caller).
    let ms = match unsafe { timeout.as_ref() } {
        None => -1,
        Some(t) => (t.tv_sec.saturating_mul(1000) + t.tv_usec / 1000).clamp(0, c_int::MAX as i64) as c_int,
    };
    let rc = poll(&mut fds, ms);
    if rc < 0 {
        return rc;
    }
    // SAFETY: valid sets or null (caller).
    unsafe {
        for set in [read, write, except] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
    }
    let mut count = 0;
    for p in &fds {
        for (set, hit) in [
            (read, p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && p.events & libc::POLLIN != 0),
            (write, p.revents & (libc::POLLOUT | libc::POLLERR) != 0 && p.events & libc::POLLOUT != 0),
            (except, p.revents & libc::POLLPRI != 0),
        ] {
            if hit && !set.is_null() {
                // SAFETY: a valid set (caller); fd below FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}
