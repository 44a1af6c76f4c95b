//! Who is at the other end of the control socket, as the kernel says
//! (`SO_PEERCRED`): a program checks that the daemon is its own user's
//! or root's before handing it memory, and the daemon names its tenants,
//! checks their users, and holds each by a pidfd (`SO_PEERPIDFD`) while it
//! reads what `/proc` says of it.
//!
//! Read with libc rather than rustix's `socket_peercred`, whose `UCred`
//! holds the pid as a non-zero type: a peer outside the reader's pid
//! namespace (softrnicd on the host, seen from a container, or the
//! reverse) has pid 0 there, which that type cannot hold (it read as an
//! error numbered 0).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// The peer's credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its process, or `None` where it lies outside this process's pid
    /// namespace.
    pub pid: Option<u32>,
    pub uid: u32,
}

/// The credentials of the process that connected (or listens) at the
/// other end of the Unix socket `fd`.
pub fn credentials(fd: BorrowedFd<'_>) -> io::Result<Peer> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a `ucred` of `len` bytes, which SO_PEERCRED fills
    // (saying how much of it in `len`); `fd` is an open descriptor.
    let done = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &mut len)
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(io::Error::other(format!("SO_PEERCRED gave {len} bytes")));
    }
    Ok(Peer { pid: u32::try_from(cred.pid).ok().filter(|&pid| pid != 0), uid: cred.uid })
}

/// A pidfd of the process that connected at the other end of `fd`
/// (`pid` in this pid namespace): the kernel's own (`SO_PEERPIDFD`, Linux
/// 6.5), or on older kernels one opened by pid (`pidfd_open`), which can
/// name another process if the program exited between connecting and now.
pub fn pidfd(fd: BorrowedFd<'_>, pid: u32) -> io::Result<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `pidfd` is an int of `len` bytes, which SO_PEERPIDFD fills
    // with a new descriptor; `fd` is an open descriptor.
    let done = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERPIDFD, (&raw mut pidfd).cast(), &mut len)
    };
    if done == 0 && pidfd >= 0 {
        // SAFETY: the kernel just made this descriptor, and it is ours.
        return Ok(unsafe { OwnedFd::from_raw_fd(pidfd) });
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
        return Err(e);
    }
    let pid = rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| io::Error::other("no pid"))?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

/// Whether the process `pidfd` names still runs (one that exited answers
/// no, even once its pid is another process's).
pub fn alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: signal 0 only checks; no memory is passed (info is NULL).
    let sent = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    // EPERM: it lives, and is not ours to signal.
    sent == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_socket_pair_names_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = credentials(a.as_fd()).unwrap();
        assert_eq!(peer, Peer { pid: Some(std::process::id()), uid: rustix::process::getuid().as_raw() });
        assert!(alive(pidfd(a.as_fd(), std::process::id()).unwrap().as_fd()), "this process");
    }

    /// A program that connected and exited: its pidfd says so, though its
    /// pid may name another process by now.
    #[test]
    fn a_peer_that_exited_is_not_alive() {
        let dir = std::env::temp_dir().join(format!("softrnic-peer-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("socket");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let connect = format!("import socket; socket.socket(socket.AF_UNIX).connect({:?})", path.to_str().unwrap());
        let mut child = std::process::Command::new("python3").args(["-c", &connect]).spawn().unwrap();
        let (socket, _) = listener.accept().unwrap();
        let pid = credentials(socket.as_fd()).unwrap().pid.unwrap();
        assert_eq!(pid, child.id());
        let pidfd = pidfd(socket.as_fd(), pid).unwrap();
        child.wait().unwrap();
        assert!(!alive(pidfd.as_fd()), "exited and reaped");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
