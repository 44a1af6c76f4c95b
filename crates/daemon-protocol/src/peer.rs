//! Who is at the other end of the control socket, as the kernel says
//! (`SO_PEERCRED`): a program checks that the daemon is its own user's
//! or root's before handing it memory, and the daemon names its tenants.
//!
//! Read with libc rather than rustix's `socket_peercred`, whose `UCred`
//! holds the pid as a non-zero type: a peer outside the reader's pid
//! namespace (softrnicd on the host, seen from a container, or the
//! reverse) has pid 0 there, which that type cannot hold (it read as an
//! error numbered 0).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_socket_pair_names_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = credentials(a.as_fd()).unwrap();
        assert_eq!(peer, Peer { pid: Some(std::process::id()), uid: rustix::process::getuid().as_raw() });
    }
}
