//! One switch port's frames: an `AF_PACKET` socket bound to a veth, with a
//! receive ring the kernel fills in place (`PACKET_RX_RING`) and sends that
//! bypass the qdisc. This is the lab's `unsafe` edge: the ring is memory
//! shared with the kernel.
//!
//! The ring is TPACKET_V2, frame by frame, not TPACKET_V3's blocks: V3
//! hands a block over only when it is full or its timer (at least 1 ms)
//! retires it, which would add up to a millisecond to every packet of a
//! latency test at low load; V2 hands each frame over as it lands.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes of one ring slot: the V2 header and a frame of the veth's MTU.
const FRAME_SIZE: u32 = 8192;
const FRAMES_PER_BLOCK: u32 = 8;
const BLOCKS: u32 = 128;

/// A port's packet socket and its receive ring.
pub struct PacketSocket {
    fd: OwnedFd,
    ring: *mut u8,
    ring_len: usize,
    frames: usize,
    next: usize,
    /// Frames longer than a ring slot, which arrived cut short: dropped.
    pub truncated: u64,
}

// SAFETY: the ring is owned by this socket alone; moving it to another
// thread moves the only reference.
unsafe impl Send for PacketSocket {}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

fn set_option<T>(fd: &OwnedFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of the size passed; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            name,
            value as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(rc).map(drop)
}

impl PacketSocket {
    /// Opens a socket on `interface` of the calling thread's network
    /// namespace.
    pub fn open(interface: &str) -> io::Result<PacketSocket> {
        let name = std::ffi::CString::new(interface).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a NUL-terminated name.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface {interface}")));
        }
        let protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2).
        let raw = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol)) })?;
        // SAFETY: `raw` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_option(&fd, libc::PACKET_VERSION, &(libc::tpacket_versions::TPACKET_V2 as libc::c_int))?;
        // Frames we send are not frames we received.
        set_option(&fd, libc::PACKET_IGNORE_OUTGOING, &1 as &libc::c_int)?;
        set_option(&fd, libc::PACKET_QDISC_BYPASS, &1 as &libc::c_int)?;
        let request = libc::tpacket_req {
            tp_block_size: FRAME_SIZE * FRAMES_PER_BLOCK,
            tp_block_nr: BLOCKS,
            tp_frame_size: FRAME_SIZE,
            tp_frame_nr: FRAMES_PER_BLOCK * BLOCKS,
        };
        set_option(&fd, libc::PACKET_RX_RING, &request)?;
        let ring_len = (FRAME_SIZE * FRAMES_PER_BLOCK * BLOCKS) as usize;
        // SAFETY: maps the ring the kernel just allocated for this socket.
        let ring = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ring == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let socket = PacketSocket {
            fd,
            ring: ring as *mut u8,
            ring_len,
            frames: (FRAMES_PER_BLOCK * BLOCKS) as usize,
            next: 0,
            truncated: 0,
        };
        // SAFETY: sockaddr_ll is plain data; zero is a valid start.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_protocol = protocol;
        address.sll_ifindex = index as i32;
        // SAFETY: binds to a sockaddr_ll of the size given.
        check(unsafe {
            libc::bind(
                socket.fd.as_raw_fd(),
                &address as *const libc::sockaddr_ll as *const libc::sockaddr,
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        Ok(socket)
    }

    /// The status word of ring slot `i`, which the kernel and we hand the
    /// slot back and forth with.
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: slot `i` lies within the mapping (i < frames) and starts
        // with a 4-byte aligned tpacket2_hdr whose first field is the
        // status; the kernel writes it concurrently, hence atomic access.
        unsafe { &*(self.ring.add(i * FRAME_SIZE as usize) as *const AtomicU32) }
    }

    /// Hands up to `max` received frames to `deliver`, in arrival order;
    /// returns how many.
    pub fn receive(&mut self, max: usize, mut deliver: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let slot = self.next;
            if self.status(slot).load(Ordering::Acquire) & libc::TP_STATUS_USER == 0 {
                break;
            }
            // SAFETY: the slot is ours until we store TP_STATUS_KERNEL; its
            // header says where the frame lies within the slot.
            unsafe {
                let base = self.ring.add(slot * FRAME_SIZE as usize);
                let header = &*(base as *const libc::tpacket2_hdr);
                let (offset, len) = (usize::from(header.tp_mac), header.tp_snaplen as usize);
                if header.tp_snaplen < header.tp_len || offset + len > FRAME_SIZE as usize {
                    self.truncated += 1;
                } else {
                    deliver(std::slice::from_raw_parts(base.add(offset), len));
                }
            }
            self.status(slot).store(libc::TP_STATUS_KERNEL, Ordering::Release);
            self.next = (slot + 1) % self.frames;
            n += 1;
        }
        n
    }

    /// Sends frames out of the port with one system call (`sendmmsg`);
    /// returns how many the kernel took. The rest are lost, as on a
    /// congested wire.
    pub fn send_batch<B: AsRef<[u8]>>(&self, frames: &[B]) -> usize {
        const MAX: usize = 64;
        let mut sent = 0;
        for chunk in frames.chunks(MAX) {
            let mut iovecs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; MAX];
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty value.
            let mut headers: [libc::mmsghdr; MAX] = unsafe { std::mem::zeroed() };
            for (i, frame) in chunk.iter().enumerate() {
                let frame = frame.as_ref();
                iovecs[i] = libc::iovec { iov_base: frame.as_ptr() as *mut libc::c_void, iov_len: frame.len() };
                headers[i].msg_hdr.msg_iov = &mut iovecs[i];
                headers[i].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: the headers point at iovecs over `frames`' bytes,
            // which outlive the call; the kernel only reads them.
            let n = unsafe {
                libc::sendmmsg(self.fd.as_raw_fd(), headers.as_mut_ptr(), chunk.len() as u32, libc::MSG_DONTWAIT)
            };
            if n <= 0 {
                break;
            }
            sent += n as usize;
            if (n as usize) < chunk.len() {
                break;
            }
        }
        sent
    }

    /// Sends one frame out of the port; false if the kernel would not take
    /// it now (the frame is lost, as on a congested wire).
    pub fn send(&self, frame: &[u8]) -> bool {
        // SAFETY: sends `frame`'s bytes on the bound socket.
        let rc = unsafe {
            libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), libc::MSG_DONTWAIT)
        };
        rc == frame.len() as isize
    }

    /// Frames the kernel dropped because the ring was full, since the
    /// last call.
    pub fn ring_drops(&self) -> u64 {
        let mut stats = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
        let mut len = size_of::<libc::tpacket_stats>() as libc::socklen_t;
        // SAFETY: reads a tpacket_stats of the size given.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut stats as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 { u64::from(stats.tp_drops) } else { 0 }
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: unmaps the ring mapped in `open`; nothing borrows it now.
        unsafe { libc::munmap(self.ring as *mut libc::c_void, self.ring_len) };
    }
}

/// Moves the calling thread into network namespace `name` (sockets it
/// opens afterwards live there).
pub fn enter_namespace(name: &str) -> io::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{name}"))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&file),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}
