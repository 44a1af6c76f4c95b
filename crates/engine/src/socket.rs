//! The datapath: one UDP socket on port 4791 of the device's address, with
//! batched sends and receives (`sendmmsg`/`recvmmsg`).
//!
//! This is one of softrnic's `unsafe` edges: the batch calls take arrays of
//! C structures that point into our buffers.
//!
//! IPv4 sockets set `IP_PMTUDISC_DO`: Linux then sends with DF and IPv4 ID
//! 0 from an unconnected socket, so every byte the ICRC covers is known
//! (docs/ARCHITECTURE.md, "Why the ICRC is exact").

use std::io;
use std::mem::{MaybeUninit, size_of, zeroed};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, Socket, Type};
use softrnic_transport::MAX_DATAGRAM_LEN;
use softrnic_wire::ROCEV2_UDP_PORT;

/// Datagrams moved per system call at most.
pub const BATCH: usize = 32;

/// Why a device could not open its socket, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "{0} is not an address of this machine; give one that is (for example 127.0.0.2, or an address from `ip addr`) with SOFTRNIC_ADDR or --addr"
    )]
    NotLocal(IpAddr),
    #[error(
        "UDP port 4791 of {0} is already in use, probably by another softrnic device; give each device its own address (127.0.0.2, 127.0.0.3, ...)"
    )]
    InUse(IpAddr),
    #[error("cannot open a UDP socket on {0}:4791: {1}")]
    Other(IpAddr, io::Error),
}

/// The device's UDP socket.
#[derive(Debug)]
pub struct RoceSocket {
    socket: UdpSocket,
    local: SocketAddr,
}

impl RoceSocket {
    /// Binds UDP port 4791 of `addr`, non-blocking.
    pub fn bind(addr: IpAddr) -> Result<RoceSocket, BindError> {
        let local = SocketAddr::new(addr, ROCEV2_UDP_PORT);
        let other = |e| BindError::Other(addr, e);
        let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP)).map_err(other)?;
        socket.set_nonblocking(true).map_err(other)?;
        // Room for bursts of a window of 4 KiB datagrams; the kernel caps it.
        let _ = socket.set_recv_buffer_size(8 << 20);
        let _ = socket.set_send_buffer_size(8 << 20);
        if addr.is_ipv4() {
            set_dont_fragment(&socket).map_err(other)?;
        } else {
            socket.set_only_v6(true).map_err(other)?;
        }
        socket.bind(&SockAddr::from(local)).map_err(|e| match e.kind() {
            io::ErrorKind::AddrNotAvailable => BindError::NotLocal(addr),
            io::ErrorKind::AddrInUse => BindError::InUse(addr),
            _ => other(e),
        })?;
        Ok(RoceSocket { socket: socket.into(), local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Sends each `(destination, bytes)`; returns how many the kernel took.
    /// A full send buffer stops the batch early (the transport retransmits
    /// what is lost, as it would on a real link).
    pub fn send_batch(&self, packets: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
        let n = packets.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut names: [MaybeUninit<SockAddr>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        let mut iovecs: [libc::iovec; BATCH] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for (i, (dst, bytes)) in packets[..n].iter().enumerate() {
            let name = names[i].write(SockAddr::from(*dst));
            iovecs[i] = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
            let h = &mut headers[i].msg_hdr;
            h.msg_name = name.as_ptr() as *mut _;
            h.msg_namelen = name.len();
            h.msg_iov = &mut iovecs[i];
            h.msg_iovlen = 1;
        }
        // SAFETY: `headers[..n]` point at live addresses and iovecs that
        // point into `packets`, all of which outlive the call; the kernel
        // only reads them.
        let sent = unsafe { libc::sendmmsg(self.fd(), headers.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
        if sent < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                // A peer that is gone answers with ICMP; the transport's
                // timers deal with it.
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable => Ok(1),
                _ => Err(e),
            };
        }
        Ok(sent as usize)
    }

    /// Receives up to [`BATCH`] datagrams into `batch` without blocking.
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut iovecs: [libc::iovec; BATCH] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
        for i in 0..BATCH {
            let buf = &mut batch.buffers[i];
            iovecs[i] = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buf.len() };
            let h = &mut headers[i].msg_hdr;
            h.msg_name = &mut batch.names[i] as *mut _ as *mut _;
            h.msg_namelen = batch.names[i].size_of();
            h.msg_iov = &mut iovecs[i];
            h.msg_iovlen = 1;
        }
        // SAFETY: every header points at a buffer and an address slot of
        // `batch` that live across the call and are as long as declared.
        let n = unsafe {
            libc::recvmmsg(self.fd(), headers.as_mut_ptr(), BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for (i, header) in headers.iter().enumerate().take(n) {
            batch.lens[i] = header.msg_len as usize;
            // SAFETY: the kernel wrote a socket address of `msg_namelen`
            // bytes into the storage.
            let addr = unsafe {
                SockAddr::new(
                    std::mem::replace(&mut batch.names[i], SockAddrStorage::zeroed()),
                    header.msg_hdr.msg_namelen,
                )
            };
            batch.sources[i] = addr.as_socket();
        }
        Ok(n)
    }

    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

fn set_dont_fragment(socket: &Socket) -> io::Result<()> {
    let value: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid fd, and a pointer to an int of the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &value as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Buffers for one `recvmmsg`.
pub struct RecvBatch {
    buffers: Vec<Box<[u8]>>,
    names: Vec<SockAddrStorage>,
    lens: [usize; BATCH],
    sources: [Option<SocketAddr>; BATCH],
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            buffers: (0..BATCH).map(|_| vec![0u8; MAX_DATAGRAM_LEN].into_boxed_slice()).collect(),
            names: (0..BATCH).map(|_| SockAddrStorage::zeroed()).collect(),
            lens: [0; BATCH],
            sources: [None; BATCH],
        }
    }
}

impl RecvBatch {
    /// The `i`th datagram of the last receive and where it came from.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        Some((self.sources[i]?, &self.buffers[i][..self.lens[i]]))
    }

    pub fn get_mut(&mut self, i: usize) -> Option<(SocketAddr, &mut [u8])> {
        Some((self.sources[i]?, &mut self.buffers[i][..self.lens[i]]))
    }
}
