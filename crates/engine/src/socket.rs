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

/// `UDP_SEGMENT` and `UDP_GRO` from `linux/udp.h` (not in libc for glibc).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// The largest UDP payload one GSO send may carry.
const GSO_MAX_BYTES: usize = 65_000;
/// A receive buffer: a whole GRO-coalesced batch, or one datagram.
const RECV_BUFFER: usize = 65_536;
/// Room for one `cmsghdr` carrying an `int` (the segment size).
const CONTROL_LEN: usize = 32;

/// The device's UDP socket.
#[derive(Debug)]
pub struct RoceSocket {
    socket: UdpSocket,
    local: SocketAddr,
    /// The kernel segments runs of equal datagrams for us (UDP GSO).
    gso: bool,
    /// The kernel hands us coalesced runs of datagrams (UDP GRO).
    gro: bool,
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
            set_int(&socket, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO).map_err(other)?;
        } else {
            socket.set_only_v6(true).map_err(other)?;
        }
        socket.bind(&SockAddr::from(local)).map_err(|e| match e.kind() {
            io::ErrorKind::AddrNotAvailable => BindError::NotLocal(addr),
            io::ErrorKind::AddrInUse => BindError::InUse(addr),
            _ => other(e),
        })?;
        // Offloads where the kernel has them; `SOFTRNIC_NO_GSO` turns them off.
        let offload = std::env::var_os("SOFTRNIC_NO_GSO").is_none();
        let gso = offload && set_int(&socket, libc::SOL_UDP, UDP_SEGMENT, 0).is_ok();
        let gro = offload && set_int(&socket, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        Ok(RoceSocket { socket: socket.into(), local, gso, gro })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether sends and receives use UDP segmentation offloads.
    pub fn offloads(&self) -> (bool, bool) {
        (self.gso, self.gro)
    }

    /// Sends each `(destination, bytes)`; returns how many the kernel took.
    /// A full send buffer stops the batch early (the transport retransmits
    /// what is lost, as it would on a real link).
    ///
    /// With GSO, a run of datagrams of one size to one destination (the
    /// last may be shorter) leaves in one message that the kernel cuts
    /// back into datagrams.
    pub fn send_batch(&self, packets: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
        let n = packets.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut names: [MaybeUninit<SockAddr>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        let mut iovecs: [libc::iovec; BATCH] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
        let mut controls = [[0u64; CONTROL_LEN / 8]; BATCH];
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        // Datagrams in each message, to turn messages sent into datagrams.
        let mut counts = [0usize; BATCH];
        let mut messages = 0;
        let mut i = 0;
        while i < n {
            let (dst, first) = packets[i];
            let mut end = i + 1;
            if self.gso {
                let mut bytes = first.len();
                while end < n
                    && packets[end].0 == dst
                    && packets[end].1.len() <= first.len()
                    && bytes + packets[end].1.len() <= GSO_MAX_BYTES
                {
                    bytes += packets[end].1.len();
                    end += 1;
                    // Only the last datagram of a run may be shorter.
                    if packets[end - 1].1.len() < first.len() {
                        break;
                    }
                }
            }
            for (j, (_, bytes)) in packets[i..end].iter().enumerate() {
                iovecs[i + j] = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
            }
            let name = names[messages].write(SockAddr::from(dst));
            let h = &mut headers[messages].msg_hdr;
            h.msg_name = name.as_ptr() as *mut _;
            h.msg_namelen = name.len();
            h.msg_iov = &mut iovecs[i];
            h.msg_iovlen = end - i;
            if end - i > 1 {
                let control = &mut controls[messages];
                h.msg_control = control.as_mut_ptr() as *mut _;
                h.msg_controllen = CONTROL_LEN;
                // SAFETY: the control buffer is CONTROL_LEN bytes, aligned
                // for cmsghdr, enough for one header and a u16.
                unsafe {
                    let cmsg = libc::CMSG_FIRSTHDR(h);
                    (*cmsg).cmsg_level = libc::SOL_UDP;
                    (*cmsg).cmsg_type = UDP_SEGMENT;
                    (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut u16, first.len() as u16);
                    h.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                }
            }
            counts[messages] = end - i;
            messages += 1;
            i = end;
        }
        // SAFETY: `headers[..messages]` point at live addresses, iovecs that
        // point into `packets`, and control buffers, all of which outlive
        // the call; the kernel only reads them.
        let sent = unsafe { libc::sendmmsg(self.fd(), headers.as_mut_ptr(), messages as u32, libc::MSG_DONTWAIT) };
        if sent < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                // A peer that is gone answers with ICMP; the transport's
                // timers deal with it.
                io::ErrorKind::ConnectionRefused
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable => Ok(counts[0]),
                _ => Err(e),
            };
        }
        Ok(counts[..sent as usize].iter().sum())
    }

    /// Receives up to [`BATCH`] messages into `batch` without blocking;
    /// returns how many datagrams they held ([`RecvBatch::get`]).
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
        let mut headers: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut iovecs: [libc::iovec; BATCH] = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; BATCH];
        let buffer_len = if self.gro { RECV_BUFFER } else { MAX_DATAGRAM_LEN };
        for i in 0..BATCH {
            let buf = &mut batch.buffers[i];
            iovecs[i] = libc::iovec { iov_base: buf.as_mut_ptr() as *mut _, iov_len: buffer_len };
            let h = &mut headers[i].msg_hdr;
            h.msg_name = &mut batch.names[i] as *mut _ as *mut _;
            h.msg_namelen = batch.names[i].size_of();
            h.msg_iov = &mut iovecs[i];
            h.msg_iovlen = 1;
            h.msg_control = batch.controls[i].as_mut_ptr() as *mut _;
            h.msg_controllen = CONTROL_LEN;
        }
        // SAFETY: every header points at a buffer, an address slot and a
        // control buffer of `batch` that live across the call and are as
        // long as declared.
        let n = unsafe {
            libc::recvmmsg(self.fd(), headers.as_mut_ptr(), BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        batch.datagrams.clear();
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(e),
            };
        }
        for (i, header) in headers.iter_mut().enumerate().take(n as usize) {
            let len = header.msg_len as usize;
            // SAFETY: the kernel wrote a socket address of `msg_namelen`
            // bytes into the storage.
            let addr = unsafe {
                SockAddr::new(
                    std::mem::replace(&mut batch.names[i], SockAddrStorage::zeroed()),
                    header.msg_hdr.msg_namelen,
                )
            };
            let Some(source) = addr.as_socket() else { continue };
            // A GRO batch says the size of its datagrams in a control message.
            let mut segment = len;
            // SAFETY: walks the control messages the kernel wrote, within
            // `msg_controllen` of the buffer it was given.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&header.msg_hdr);
                while !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == UDP_GRO {
                        segment = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::c_int) as usize;
                    }
                    cmsg = libc::CMSG_NXTHDR(&header.msg_hdr, cmsg);
                }
            }
            let segment = segment.max(1);
            let mut offset = 0;
            while offset < len {
                let size = segment.min(len - offset);
                batch.datagrams.push((source, i, offset, size));
                offset += size;
            }
        }
        Ok(batch.datagrams.len())
    }

    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

fn set_int(socket: &Socket, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid fd, and a pointer to an int of the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            &value as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Buffers for one `recvmmsg`, and where each datagram lies in them.
pub struct RecvBatch {
    buffers: Vec<Box<[u8]>>,
    names: Vec<SockAddrStorage>,
    controls: Vec<[u64; CONTROL_LEN / 8]>,
    /// (source, buffer, offset, length) of every datagram received.
    datagrams: Vec<(SocketAddr, usize, usize, usize)>,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            buffers: (0..BATCH).map(|_| vec![0u8; RECV_BUFFER].into_boxed_slice()).collect(),
            names: (0..BATCH).map(|_| SockAddrStorage::zeroed()).collect(),
            controls: vec![[0; CONTROL_LEN / 8]; BATCH],
            datagrams: Vec::with_capacity(BATCH * 16),
        }
    }
}

impl RecvBatch {
    /// The `i`th datagram of the last receive and where it came from.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, &[u8])> {
        let &(source, buffer, offset, len) = self.datagrams.get(i)?;
        Some((source, &self.buffers[buffer][offset..offset + len]))
    }
}
