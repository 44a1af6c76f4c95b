//! The datapath: UDP sockets on port 4791 of the device's address, with
//! batched sends and receives (`sendmmsg`/`recvmmsg`).
//!
//! A device with several shards binds one socket per shard into an
//! `SO_REUSEPORT` group, and attaches a classic-BPF program that picks the
//! socket from the destination QP in the BTH: the kernel steers every
//! datagram to the shard that owns its QP, with no lock and no privileges
//! ([`steering_program`] computes [`shard_of`]).
//!
//! This is one of softrnic's `unsafe` edges: the batch calls take arrays of
//! C structures that point into our buffers.
//!
//! Datagrams leave ECN-capable (ECT(0)) unless `SOFTRNIC_ECN=off`, as a
//! RoCEv2 NIC sends them, so a congested switch marks them rather than
//! drops them; every receive reads the ECN field back (`IP_RECVTOS`,
//! `IPV6_RECVTCLASS`). UDP GRO merges only datagrams with equal TOS, so
//! a coalesced batch has one ECN field.
//!
//! CNPs leave with their own DSCP (`cnp_dscp`, 48 by default) so that a
//! switch can queue them ahead of data: the socket recognises them by
//! their opcode, as a NIC does, and sets the TOS of each one alone
//! (an `IP_TOS` or `IPV6_TCLASS` control message).
//!
//! A device that carries in-band telemetry (`INT`, for HPCC) has a second
//! group of sockets on UDP port 4792, where each datagram is the INT
//! header and then the RoCEv2 packet (`softrnic_wire::int`); its steering
//! program reads the destination QP past the header. Datagrams to a
//! peer's 4792 leave from the 4791 socket: only the destination port
//! tells a switch to record its path.
//!
//! IPv4 sockets set `IP_PMTUDISC_DO`: Linux then sends with DF and IPv4 ID
//! 0 from an unconnected socket, so every byte the ICRC covers is known
//! (docs/ARCHITECTURE.md, "Why the ICRC is exact").

use std::io;
use std::mem::{MaybeUninit, size_of, zeroed};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, Socket, Type};
use softrnic_account::{self as account, Cost};
use softrnic_transport::{MAX_DATAGRAM_LEN, shard_of};
use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::opcode::Opcode;

use crate::environment::{self, Ecn};
use crate::int::{roce_offset, roce_packet};

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
        "UDP port {1} of {0} is already in use, probably by another softrnic device; give each device its own address (127.0.0.2, 127.0.0.3, ...)"
    )]
    InUse(IpAddr, u16),
    #[error("cannot open a UDP socket on {0}: {1}")]
    Other(SocketAddr, io::Error),
}

/// The ECN codepoints softrnic sends and looks for (RFC 3168).
const ECT0: libc::c_int = 0b10;
const CE: u8 = 0b11;

/// The ECN field datagrams leave with (`SOFTRNIC_ECN`, which
/// [`EngineConfig::from_env`](crate::EngineConfig::from_env) has checked:
/// a value it refused is not met here).
fn ecn_codepoint() -> libc::c_int {
    match environment::ecn().unwrap_or(Ecn::Capable) {
        Ecn::Off => 0,
        Ecn::Capable => ECT0,
        Ecn::Congested => libc::c_int::from(CE),
    }
}

/// `UDP_SEGMENT` and `UDP_GRO` from `linux/udp.h` (not in libc for glibc).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// The largest UDP payload one GSO send may carry.
const GSO_MAX_BYTES: usize = 65_000;
/// A receive buffer: a whole GRO-coalesced batch, or one datagram.
const RECV_BUFFER: usize = 65_536;
/// Room for the control messages a receive carries (the GRO segment size,
/// the socket's drop count (`SO_RXQ_OVFL`) and the TOS or traffic class)
/// and those a send does (the GSO segment size and a CNP's TOS).
const CONTROL_LEN: usize = 64;

/// The device's UDP socket.
#[derive(Debug)]
pub struct RoceSocket {
    socket: UdpSocket,
    local: SocketAddr,
    /// The kernel segments runs of equal datagrams for us (UDP GSO).
    gso: bool,
    /// The kernel hands us coalesced runs of datagrams (UDP GRO).
    gro: bool,
    /// The TOS (or IPv6 traffic class) CNPs leave with, where it is not
    /// the socket's own.
    cnp_tos: Option<u8>,
    /// The peer a send-only socket is connected to ([`RoceSocket::connect`]):
    /// datagrams to it name no address, and the kernel reuses the route it
    /// found once.
    peer: Option<SocketAddr>,
}

impl RoceSocket {
    /// Binds UDP port 4791 of `addr`, non-blocking.
    pub fn bind(addr: IpAddr) -> Result<RoceSocket, BindError> {
        RoceSocket::bind_one(SocketAddr::new(addr, ROCEV2_UDP_PORT), false)
    }

    /// Binds `shards` sockets on UDP port `port` of `addr` (4791, or 4792
    /// for INT), the `i`th receiving the datagrams whose destination QP
    /// belongs to shard `i`.
    pub fn bind_group(addr: IpAddr, port: u16, shards: usize) -> Result<Vec<RoceSocket>, BindError> {
        let local = SocketAddr::new(addr, port);
        if shards <= 1 {
            return Ok(vec![RoceSocket::bind_one(local, false)?]);
        }
        // A group takes any socket of this user that asks to join, so
        // first make sure nobody holds the port: another device on this
        // address would otherwise silently share its datagrams with us.
        drop(RoceSocket::bind_one(local, false)?);
        let sockets = (0..shards).map(|_| RoceSocket::bind_one(local, true)).collect::<Result<Vec<_>, _>>()?;
        let program = steering_program(shards, roce_offset(port));
        let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut _ };
        // SAFETY: a valid fd, and a pointer to a `sock_fprog` whose filter
        // array lives across the call; the kernel copies it.
        let rc = unsafe {
            libc::setsockopt(
                sockets[0].fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_REUSEPORT_CBPF,
                &fprog as *const _ as *const libc::c_void,
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(BindError::Other(local, io::Error::last_os_error()));
        }
        Ok(sockets)
    }

    fn bind_one(local: SocketAddr, reuse_port: bool) -> Result<RoceSocket, BindError> {
        let addr = local.ip();
        let other = |e| BindError::Other(local, e);
        let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP)).map_err(other)?;
        socket.set_nonblocking(true).map_err(other)?;
        // Room for bursts of a window of 4 KiB datagrams; the kernel caps it.
        let _ = socket.set_recv_buffer_size(8 << 20);
        let _ = socket.set_send_buffer_size(8 << 20);
        let ecn = ecn_codepoint();
        if addr.is_ipv4() {
            set_int(&socket, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO).map_err(other)?;
            set_int(&socket, libc::IPPROTO_IP, libc::IP_TOS, ecn).map_err(other)?;
            set_int(&socket, libc::IPPROTO_IP, libc::IP_RECVTOS, 1).map_err(other)?;
        } else {
            socket.set_only_v6(true).map_err(other)?;
            set_int(&socket, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, ecn).map_err(other)?;
            set_int(&socket, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1).map_err(other)?;
        }
        if reuse_port {
            socket.set_reuse_port(true).map_err(other)?;
        }
        socket.bind(&SockAddr::from(local)).map_err(|e| match e.kind() {
            io::ErrorKind::AddrNotAvailable => BindError::NotLocal(addr),
            io::ErrorKind::AddrInUse => BindError::InUse(addr, local.port()),
            _ => other(e),
        })?;
        // What is sent to a multicast group leaves on the device's own
        // interface (and loops back to the host's members), never by the
        // default route; an IPv6 device whose interface cannot be named
        // keeps it on the host.
        match addr {
            IpAddr::V4(a) if !a.is_unspecified() => socket.set_multicast_if_v4(&a).map_err(other)?,
            IpAddr::V6(_) => match interface_index(addr) {
                Ok(index) => socket.set_multicast_if_v6(index).map_err(other)?,
                Err(_) => socket.set_multicast_hops_v6(0).map_err(other)?,
            },
            IpAddr::V4(_) => {}
        }
        // Offloads where the kernel has them; `SOFTRNIC_NO_GSO` turns them off.
        let offload = environment::offloads();
        let gso = offload && set_int(&socket, libc::SOL_UDP, UDP_SEGMENT, 0).is_ok();
        let gro = offload && set_int(&socket, libc::SOL_UDP, UDP_GRO, 1).is_ok();
        // Every receive then says how many datagrams the kernel dropped
        // for want of buffer space: loss that is not the network's.
        let _ = set_int(&socket, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1);
        Ok(RoceSocket { socket: socket.into(), local, gso, gro, cnp_tos: None, peer: None })
    }

    /// A socket that receives what is sent to multicast `group` on port
    /// 4791, joined on the interface of `local` (the device's address):
    /// bound to the group's address, so nothing else reaches it, and
    /// sharing it with every other device on the host that joined (the
    /// kernel gives each a copy).
    pub fn join(group: IpAddr, local: IpAddr) -> io::Result<RoceSocket> {
        let at = SocketAddr::new(group, ROCEV2_UDP_PORT);
        let socket = Socket::new(Domain::for_address(at), Type::DGRAM, Some(Protocol::UDP))?;
        socket.set_nonblocking(true)?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        let _ = socket.set_recv_buffer_size(8 << 20);
        match (group, local) {
            (IpAddr::V4(group), IpAddr::V4(local)) => {
                set_int(&socket, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
                socket.join_multicast_v4(&group, &local)?;
            }
            (IpAddr::V6(group), IpAddr::V6(_)) => {
                socket.set_only_v6(true)?;
                set_int(&socket, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
                socket.join_multicast_v6(&group, interface_index(local)?)?;
            }
            _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "a group of the device's address family")),
        }
        socket.bind(&SockAddr::from(at))?;
        Ok(RoceSocket { socket: socket.into(), local: at, gso: false, gro: false, cnp_tos: None, peer: None })
    }

    /// A socket to send this device's datagrams to `peer` from, connected
    /// to it, on a port of its own (the kernel's pick): an unconnected
    /// send looks its route up every time, a connected one reuses it (0.8
    /// to 1.2 µs a datagram, BENCHMARKS.md). Nothing is received on it:
    /// peers send to port 4791, and its receive buffer is the least the
    /// kernel allows, so what strays there costs a few KiB at most.
    pub fn connect(&self, peer: SocketAddr) -> io::Result<RoceSocket> {
        let local = SocketAddr::new(self.local.ip(), 0);
        let mut socket = RoceSocket::bind_one(local, false).map_err(|e| io::Error::other(e.to_string()))?;
        let raw = socket2::SockRef::from(&socket.socket);
        let _ = raw.set_recv_buffer_size(0);
        raw.connect(&SockAddr::from(peer))?;
        socket.local = raw.local_addr()?.as_socket().ok_or_else(|| io::Error::other("no local address"))?;
        socket.cnp_tos = self.cnp_tos;
        socket.peer = Some(peer);
        Ok(socket)
    }

    /// CNPs leave with DSCP `dscp` (and the ECN field data has).
    pub fn set_cnp_dscp(&mut self, dscp: u8) {
        let ecn = ecn_codepoint() as u8;
        self.cnp_tos = (dscp != 0).then_some(dscp << 2 | ecn);
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
    /// With GSO, a run of datagrams of one size to one destination QP (the
    /// last may be shorter) leaves in one message that the kernel cuts
    /// back into datagrams. One QP per run: the receiver's kernel steers
    /// a whole run by its first datagram.
    pub fn send_batch(&self, packets: &[(SocketAddr, &[u8])]) -> io::Result<usize> {
        let n = packets.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        // Only the entries a call uses are written (most sends are one or
        // two datagrams; zeroing every entry was 4 KiB a call).
        let mut names: [MaybeUninit<SockAddr>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        let mut iovecs: [MaybeUninit<libc::iovec>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        let mut controls: [MaybeUninit<[u64; CONTROL_LEN / 8]>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        let mut headers: [MaybeUninit<libc::mmsghdr>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        // Datagrams in each message, to turn messages sent into datagrams.
        let mut counts = [0usize; BATCH];
        let mut messages = 0;
        let mut i = 0;
        while i < n {
            let (dst, first) = packets[i];
            let tos = self.cnp_tos.filter(|_| is_cnp(dst, first));
            let mut end = i + 1;
            if self.gso {
                let mut bytes = first.len();
                while end < n
                    && packets[end].0 == dst
                    && same_dest_qp(dst, packets[end].1, first)
                    && is_cnp(dst, packets[end].1) == is_cnp(dst, first)
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
                iovecs[i + j].write(libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() });
            }
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
            let h = &mut headers[messages].write(unsafe { zeroed() }).msg_hdr;
            if self.peer != Some(dst) {
                let name = names[messages].write(SockAddr::from(dst));
                h.msg_name = name.as_ptr() as *mut _;
                h.msg_namelen = name.len();
            }
            h.msg_iov = iovecs[i].as_mut_ptr();
            h.msg_iovlen = end - i;
            let segment = (end - i > 1).then_some(first.len() as u16);
            if segment.is_some() || tos.is_some() {
                let control = controls[messages].write([0; CONTROL_LEN / 8]);
                h.msg_control = control.as_mut_ptr() as *mut _;
                h.msg_controllen = CONTROL_LEN;
                // SAFETY: the control buffer is CONTROL_LEN bytes, aligned
                // for cmsghdr, room for two headers and their ints; each
                // header is written where CMSG_FIRSTHDR/CMSG_NXTHDR put it,
                // within the length declared so far.
                unsafe {
                    let mut used = 0;
                    let mut cmsg = libc::CMSG_FIRSTHDR(h);
                    if let Some(size) = segment {
                        (*cmsg).cmsg_level = libc::SOL_UDP;
                        (*cmsg).cmsg_type = UDP_SEGMENT;
                        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut u16, size);
                        used += libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                        cmsg = libc::CMSG_NXTHDR(h, cmsg);
                    }
                    if let Some(tos) = tos {
                        let (level, kind) = match dst {
                            SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_TOS),
                            SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
                        };
                        (*cmsg).cmsg_level = level;
                        (*cmsg).cmsg_type = kind;
                        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, libc::c_int::from(tos));
                        used += libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
                    }
                    h.msg_controllen = used;
                }
            }
            counts[messages] = end - i;
            messages += 1;
            i = end;
        }
        let timer = account::timing();
        // SAFETY: `headers[..messages]` are written, and point at live
        // addresses (or none, to a connected socket's peer), written
        // iovecs that point into `packets`, and written control buffers,
        // all of which outlive the call; the kernel reads only those
        // `messages` headers and what they point at.
        let sent =
            unsafe { libc::sendmmsg(self.fd(), headers.as_mut_ptr().cast(), messages as u32, libc::MSG_DONTWAIT) };
        timer.stop(Cost::SendNanos);
        account::one(Cost::SendCalls);
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
        let datagrams: usize = counts[..sent as usize].iter().sum();
        account::add(Cost::DatagramsSent, datagrams as u64);
        account::add(Cost::BytesToKernel, packets[..datagrams].iter().map(|(_, bytes)| bytes.len() as u64).sum());
        Ok(datagrams)
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
        let timer = account::timing();
        // SAFETY: every header points at a buffer, an address slot and a
        // control buffer of `batch` that live across the call and are as
        // long as declared.
        let n = unsafe {
            libc::recvmmsg(self.fd(), headers.as_mut_ptr(), BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
        };
        batch.datagrams.clear();
        account::one(Cost::ReceiveCalls);
        if n <= 0 {
            timer.stop(Cost::EmptyReceiveNanos);
            account::one(Cost::EmptyReceives);
        } else {
            timer.stop(Cost::ReceiveNanos);
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(e),
            };
        }
        for (i, header) in headers.iter_mut().enumerate().take(n as usize) {
            let len = header.msg_len as usize;
            account::add(Cost::BytesFromKernel, len as u64);
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
            let mut tos = 0u8;
            // SAFETY: walks the control messages the kernel wrote, within
            // `msg_controllen` of the buffer it was given.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&header.msg_hdr);
                while !cmsg.is_null() {
                    let data = libc::CMSG_DATA(cmsg);
                    match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                        (libc::SOL_UDP, UDP_GRO) => {
                            segment = std::ptr::read_unaligned(data as *const libc::c_int) as usize;
                        }
                        (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                            batch.kernel_drops = std::ptr::read_unaligned(data as *const u32);
                        }
                        // IPv4 gives the TOS as a byte, IPv6 the class as an int.
                        (libc::IPPROTO_IP, libc::IP_TOS) => tos = *data,
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                            tos = std::ptr::read_unaligned(data as *const libc::c_int) as u8;
                        }
                        _ => {}
                    }
                    cmsg = libc::CMSG_NXTHDR(&header.msg_hdr, cmsg);
                }
            }
            let segment = segment.max(1);
            let mut offset = 0;
            while offset < len {
                let size = segment.min(len - offset);
                batch.datagrams.push((source, i, offset, size, Tos(tos)));
                batch.ce_marked += u64::from(Tos(tos).ce());
                offset += size;
            }
        }
        account::add(Cost::DatagramsReceived, batch.datagrams.len() as u64);
        Ok(batch.datagrams.len())
    }

    pub fn fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

/// Orders a batch so that each destination QP's datagrams sit together
/// (in the order they were made), which lets [`RoceSocket::send_batch`]
/// send each QP's run as one GSO message. The transport serves its QPs
/// round robin, one packet each, so a batch for four QPs would otherwise
/// hold no run at all. An insertion sort: stable, no allocation, and a
/// batch is at most [`BATCH`] long.
pub fn group_runs(packets: &mut [(SocketAddr, &[u8])]) {
    let key = |p: &(SocketAddr, &[u8])| (p.0, softrnic_transport::dest_qpn(roce_packet(p.0, p.1)));
    for i in 1..packets.len() {
        let mut j = i;
        while j > 0 && key(&packets[j - 1]) > key(&packets[i]) {
            j -= 1;
        }
        packets[j..=i].rotate_right(1);
    }
}

/// Whether two datagrams to `dst` go to the same QP (BTH bytes 5..8).
fn same_dest_qp(dst: SocketAddr, a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (roce_packet(dst, a), roce_packet(dst, b));
    a.get(5..8).is_some() && a.get(5..8) == b.get(5..8)
}

/// Whether a datagram to `dst` is a CNP.
fn is_cnp(dst: SocketAddr, datagram: &[u8]) -> bool {
    roce_packet(dst, datagram).first() == Some(&(Opcode::Cnp as u8))
}

/// The classic-BPF program that steers a datagram to socket
/// `shard_of(dest_qpn, shards)` of a reuseport group. It runs on the UDP
/// payload, whose RoCEv2 packet starts at `bth_at`: the BTH's second word
/// holds the destination QP in its low 24 bits. A datagram too short for
/// a BTH aborts the program, and the kernel then picks a socket by hash;
/// that shard routes it on (or drops it).
pub fn steering_program(shards: usize, bth_at: usize) -> [libc::sock_filter; 4] {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
    const MOD_K: u16 = (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16;
    const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
    let op = |code, k| libc::sock_filter { code, jt: 0, jf: 0, k };
    [op(LD_W_ABS, bth_at as u32 + 4), op(AND_K, 0x00ff_ffff), op(MOD_K, shards.max(1) as u32), op(RET_A, 0)]
}

/// What [`steering_program`] computes, run the way the kernel runs it: for
/// the tests, which prove that it agrees with [`shard_of`].
pub fn run_steering_program(program: &[libc::sock_filter], payload: &[u8]) -> Option<u32> {
    let mut a: u32 = 0;
    for insn in program {
        match insn.code as u32 {
            c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                let at = insn.k as usize;
                a = u32::from_be_bytes(payload.get(at..at + 4)?.try_into().ok()?);
            }
            c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => a &= insn.k,
            c if c == libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K => a %= insn.k,
            c if c == libc::BPF_RET | libc::BPF_A => return Some(a),
            _ => return None,
        }
    }
    None
}

/// `shard_of` as the steering program sees a datagram.
pub fn steered_shard(datagram: &[u8], shards: usize) -> Option<usize> {
    softrnic_transport::dest_qpn(datagram).map(|qpn| shard_of(qpn, shards))
}

/// The index of the interface `addr` lives on, which IPv6 multicast
/// names its interface by.
fn interface_index(addr: IpAddr) -> io::Result<u32> {
    crate::interface::interface_of(addr)
        .map(|(_, index)| index)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {addr}")))
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
    /// (source, buffer, offset, length, TOS) of every datagram received.
    datagrams: Vec<(SocketAddr, usize, usize, usize, Tos)>,
    /// Datagrams the kernel dropped on this socket since it opened, for
    /// want of buffer space, as of the last receive.
    kernel_drops: u32,
    /// Datagrams received with ECN CE (a congested switch marked them),
    /// over every receive into this batch.
    ce_marked: u64,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            buffers: (0..BATCH).map(|_| vec![0u8; RECV_BUFFER].into_boxed_slice()).collect(),
            names: (0..BATCH).map(|_| SockAddrStorage::zeroed()).collect(),
            controls: vec![[0; CONTROL_LEN / 8]; BATCH],
            datagrams: Vec::with_capacity(BATCH * 16),
            kernel_drops: 0,
            ce_marked: 0,
        }
    }
}

impl RecvBatch {
    /// Datagrams the kernel dropped on the socket for want of buffer
    /// space, since it opened (as of the last receive that said).
    pub fn kernel_drops(&self) -> u32 {
        self.kernel_drops
    }

    /// Datagrams that arrived marked CE, over every receive so far.
    pub fn ce_marked(&self) -> u64 {
        self.ce_marked
    }

    /// The `i`th datagram of the last receive, where it came from, and
    /// the TOS (or traffic class) it arrived with.
    pub fn get(&self, i: usize) -> Option<(SocketAddr, Tos, &[u8])> {
        let &(source, buffer, offset, len, tos) = self.datagrams.get(i)?;
        Some((source, tos, &self.buffers[buffer][offset..offset + len]))
    }
}

/// An IPv4 TOS byte or IPv6 traffic class: DSCP and ECN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tos(pub u8);

impl Tos {
    /// A switch on the way was congested.
    pub fn ce(self) -> bool {
        self.0 & 0b11 == CE
    }

    pub fn dscp(self) -> u8 {
        self.0 >> 2
    }
}

#[cfg(test)]
mod tests {
    use softrnic_wire::int::{self, INT_UDP_PORT};

    use super::*;

    #[test]
    fn the_steering_program_computes_shard_of() {
        for shards in [1, 2, 3, 4, 8, 16] {
            let program = steering_program(shards, 0);
            for qpn in [0x11u32, 0x12, 0x13, 0x100, 0xab_cdef, 0xff_ffff] {
                let mut bth = [0u8; 12];
                bth[4] = 0xff; // the FECN/BECN byte must not leak into the QPN
                bth[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
                assert_eq!(run_steering_program(&program, &bth), Some(shard_of(qpn, shards) as u32));
                assert_eq!(steered_shard(&bth, shards), Some(shard_of(qpn, shards)));
            }
            assert_eq!(run_steering_program(&program, &[0u8; 7]), None, "too short: the kernel hashes");
        }
    }

    /// On the INT port the destination QP sits past the INT header.
    #[test]
    fn the_int_ports_steering_program_reads_past_the_header() {
        let program = steering_program(4, roce_offset(INT_UDP_PORT));
        for qpn in [0x11u32, 0x12, 0x13, 0xab_cdef] {
            let mut datagram = vec![0xffu8; int::HEADER_LEN];
            datagram.extend_from_slice(&[0, 0, 0, 0, 0xff, 0, 0, 0, 0, 0, 0, 0]);
            datagram[int::HEADER_LEN + 5..int::HEADER_LEN + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            assert_eq!(run_steering_program(&program, &datagram), Some(shard_of(qpn, 4) as u32));
        }
    }

    #[test]
    fn gso_runs_hold_one_destination_qp() {
        let plain: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        let mut a = [0u8; 12];
        let mut b = [0u8; 12];
        a[5..8].copy_from_slice(&[0, 0, 0x11]);
        b[5..8].copy_from_slice(&[0, 0, 0x12]);
        assert!(same_dest_qp(plain, &a, &a));
        assert!(!same_dest_qp(plain, &a, &b));
        assert!(!same_dest_qp(plain, &a[..4], &a[..4]));
        // Behind INT headers whose records differ, the QPs still decide.
        let with_int = |bth: &[u8], records: u8| [&[records; int::HEADER_LEN][..], bth].concat();
        let int: SocketAddr = SocketAddr::new(plain.ip(), INT_UDP_PORT);
        assert!(same_dest_qp(int, &with_int(&a, 1), &with_int(&a, 2)));
        assert!(!same_dest_qp(int, &with_int(&a, 1), &with_int(&b, 1)));
    }

    #[test]
    fn runs_are_grouped_per_qp_keeping_each_qps_order() {
        let peer: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        let datagram = |qpn: u8, seq: u8| {
            let mut d = [0u8; 13];
            d[7] = qpn;
            d[12] = seq;
            d
        };
        let made: Vec<[u8; 13]> = (0..12).map(|i| datagram(0x11 + i % 3, i)).collect();
        let mut batch: Vec<(SocketAddr, &[u8])> = made.iter().map(|d| (peer, &d[..])).collect();
        group_runs(&mut batch);
        let order: Vec<(u8, u8)> = batch.iter().map(|(_, d)| (d[7], d[12])).collect();
        assert_eq!(
            order,
            [(0x11, 0), (0x11, 3), (0x11, 6), (0x11, 9), (0x12, 1), (0x12, 4), (0x12, 7), (0x12, 10)]
                .into_iter()
                .chain([(0x13, 2), (0x13, 5), (0x13, 8), (0x13, 11)])
                .collect::<Vec<_>>()
        );
    }

    /// A datagram a switch marked CE is counted; an unmarked one is not.
    /// (On loopback the sender's TOS arrives unchanged, so a socket that
    /// sends with CE stands in for the switch.)
    #[test]
    fn ce_marked_datagrams_are_counted() {
        let addr: IpAddr = "127.0.0.61".parse().unwrap();
        let receiver = RoceSocket::bind(addr).unwrap();
        let sender = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
        sender.bind(&SockAddr::from(SocketAddr::new("127.0.0.62".parse().unwrap(), 0))).unwrap();
        let to = SockAddr::from(receiver.local_addr());
        set_int(&sender, libc::IPPROTO_IP, libc::IP_TOS, i32::from(CE)).unwrap();
        sender.send_to(&[1; 40], &to).unwrap();
        set_int(&sender, libc::IPPROTO_IP, libc::IP_TOS, ECT0).unwrap();
        sender.send_to(&[2; 40], &to).unwrap();
        let mut batch = RecvBatch::default();
        let mut received = 0;
        for _ in 0..1000 {
            received += receiver.recv_batch(&mut batch).unwrap();
            if received == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(received, 2);
        assert_eq!(batch.ce_marked(), 1);
    }

    /// Receives `count` datagrams on `socket`: (TOS, bytes) of each.
    fn receive(socket: &RoceSocket, count: usize) -> Vec<(Tos, Vec<u8>)> {
        let mut batch = RecvBatch::default();
        let mut got = Vec::new();
        for _ in 0..1000 {
            let n = socket.recv_batch(&mut batch).unwrap();
            got.extend((0..n).map(|i| batch.get(i).map(|(_, tos, bytes)| (tos, bytes.to_vec())).unwrap()));
            if got.len() >= count {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        got
    }

    /// A CNP leaves with the CNP DSCP, data beside it with the socket's
    /// own TOS; both keep the ECN field data has.
    #[test]
    fn cnps_leave_with_their_own_dscp() {
        let receiver = RoceSocket::bind("127.0.0.63".parse().unwrap()).unwrap();
        let mut sender = RoceSocket::bind("127.0.0.64".parse().unwrap()).unwrap();
        sender.set_cnp_dscp(48);
        let to = receiver.local_addr();
        let mut cnp = [0u8; 32];
        cnp[0] = Opcode::Cnp as u8;
        let data = [0x0au8; 32];
        assert_eq!(sender.send_batch(&[(to, &cnp), (to, &data), (to, &cnp)]).unwrap(), 3);
        let got: Vec<(Tos, u8)> = receive(&receiver, 3).into_iter().map(|(tos, bytes)| (tos, bytes[0])).collect();
        let ecn = ecn_codepoint() as u8;
        let cnp_tos = Tos(48 << 2 | ecn);
        assert_eq!(got, [(cnp_tos, Opcode::Cnp as u8), (Tos(ecn), 0x0a), (cnp_tos, Opcode::Cnp as u8)]);
    }

    /// The kernel steers INT datagrams by the QP past their header: each
    /// reaches the socket of its QP's shard.
    #[test]
    fn int_datagrams_reach_their_qps_shard() {
        let addr: IpAddr = "127.0.0.65".parse().unwrap();
        let group = RoceSocket::bind_group(addr, INT_UDP_PORT, 2).unwrap();
        let sender = RoceSocket::bind("127.0.0.66".parse().unwrap()).unwrap();
        let to = SocketAddr::new(addr, INT_UDP_PORT);
        let datagrams: Vec<Vec<u8>> = [0x11u8, 0x12, 0x13, 0x14]
            .iter()
            .map(|&qpn| {
                let mut d = vec![0u8; int::HEADER_LEN + 12];
                int::Repr::default().emit(&mut d).unwrap();
                d[int::HEADER_LEN + 7] = qpn;
                d
            })
            .collect();
        let batch: Vec<(SocketAddr, &[u8])> = datagrams.iter().map(|d| (to, &d[..])).collect();
        assert_eq!(sender.send_batch(&batch).unwrap(), 4);
        for (shard, socket) in group.iter().enumerate() {
            let mut got: Vec<u32> =
                receive(socket, 2).into_iter().map(|(_, bytes)| u32::from(bytes[int::HEADER_LEN + 7])).collect();
            got.sort();
            let expected: Vec<u32> = (0x11..=0x14).filter(|&qpn| shard_of(qpn, 2) == shard).collect();
            assert_eq!(got, expected, "shard {shard}");
        }
    }
}
