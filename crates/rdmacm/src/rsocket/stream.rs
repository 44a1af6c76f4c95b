//! A connected rsocket's verbs: its RC QP, one CQ with its completion
//! channel, and the registered buffers the stream's bytes pass through.
//!
//! Each side keeps `slots` receives posted, each a slot of `slot_bytes`
//! in one registered region. A sender copies at most the peer's slot size
//! into one of its own send slots and SENDs it with immediate data naming
//! the message's kind ([`Kind`]). Completions come in order on each
//! queue, so both kinds of slots are rings: sends by sequence number,
//! receives by slot index.
//!
//! **Credits.** A SEND needs a receive posted at the peer. The sender
//! counts them: the peer's `slots` at first, plus every slot the peer has
//! posted again since, which the peer RDMA WRITEs as a running count into
//! a word of the sender's memory (named in the connection's [`Hello`]),
//! as rdma-core's rsockets write their buffer updates. The peer reports
//! when a quarter of its slots came free, or when the sender may be down
//! to half its credits; a write needs no receive, so credit reports can
//! never deadlock behind data. A sender that had used every credit it
//! knew of may be asleep, so that report is a WRITE WITH IMMEDIATE
//! ([`Kind::Credit`]), whose completion wakes it: it takes the one
//! receive each side posts beyond its advertised slots, and it is posted
//! again (uncounted) before the sender can starve once more. A reader that stops reading so stops its writer, as
//! TCP's window does, and no SEND ever meets an empty receive queue: the
//! transport's own end-to-end credits would, after an RNR NAK, make the
//! writer wait out the responder's RNR timer (655 ms, the kernel CM's
//! value) where this waits one report.
//!
//! `riomap`/`riowrite` put a program's own buffer in the peer's reach: a
//! [`Kind::Map`] message gives the peer its address and rkey, and
//! `riowrite` is an RDMA WRITE into it, which the engine places with no
//! call from the program that mapped it.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};

use softrnic_verbs_abi::*;

use super::message::{self, Hello, Kind, Mapping};
use crate::abi::rdma_cm_id;
use crate::api::rdma_create_qp;
use crate::verbs;

/// The bytes a receive slot takes, unless the program's buffer is
/// smaller: four MTU-sized packets per message.
pub const SLOT_BYTES: usize = 16 * 1024;
/// The default `SO_SNDBUF`/`SO_RCVBUF`: 16 slots each way.
pub const DEFAULT_BUFFER: usize = 256 * 1024;
/// Never fewer slots than this, whatever the buffer size.
const MIN_SLOTS: usize = 4;
/// Never more: the device's work queues hold 16384 entries.
const MAX_SLOTS: usize = 4096;
/// The receives posted beyond the advertised slots: room for the one
/// waking credit report that can be outstanding.
const SPARE_RECEIVES: usize = 1;
/// A receive's work request ID carries this bit; a send's is its
/// sequence number (a flushed completion's opcode is not to be trusted,
/// so the ID says which queue it came from).
const RECEIVE: u64 = 1 << 63;

/// How a connection's buffers are sized (from the socket's options).
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    pub send_buffer: usize,
    pub receive_buffer: usize,
}

impl Sizes {
    fn slots(buffer: usize) -> usize {
        (buffer / SLOT_BYTES).clamp(MIN_SLOTS, MAX_SLOTS)
    }
}

/// One registered allocation (8-aligned), split into equal slots.
struct Region {
    bytes: *mut u8,
    words: usize,
    mr: *mut ibv_mr,
}

impl Region {
    fn new(pd: *mut ibv_pd, len: usize, access: c_uint) -> Result<Region, c_int> {
        let words = len.div_ceil(8);
        let bytes = Box::into_raw(vec![0u64; words].into_boxed_slice()).cast::<u8>();
        // SAFETY: `len` bytes just allocated, registered until drop.
        let mr = unsafe { verbs::ibv_reg_mr(pd, bytes.cast(), len, access as c_int) };
        let region = Region { bytes, words, mr };
        match mr.is_null() {
            true => Err(libc::ENOMEM),
            false => Ok(region),
        }
    }

    fn slot(&self, index: usize, slot_bytes: usize) -> *mut u8 {
        debug_assert!((index + 1) * slot_bytes <= self.words * 8);
        // SAFETY: in bounds (the callers' indices are below the slot count).
        unsafe { self.bytes.add(index * slot_bytes) }
    }

    fn lkey(&self) -> u32 {
        // SAFETY: registered until drop.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: registered until drop.
        unsafe { (*self.mr).rkey }
    }

    /// The region's first word, which the peer writes (relaxed atomic
    /// stores, as the engine writes registered memory).
    fn first_word(&self) -> u64 {
        // SAFETY: 8-aligned and live until drop; the engine stores into
        // it atomically.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.bytes.cast::<u64>()) }
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the region's own registration and allocation; the QP
        // that used them is gone (the stream drops it first).
        unsafe {
            if !self.mr.is_null() {
                verbs::ibv_dereg_mr(self.mr);
            }
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.bytes.cast::<u64>(), self.words)));
        }
    }
}

/// Where a posted send goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// A SEND into the peer's next receive (needs a credit).
    Message,
    /// An RDMA WRITE to this address and rkey.
    Write((u64, u32)),
    /// An RDMA WRITE WITH IMMEDIATE, which takes the peer's spare receive.
    WakingWrite((u64, u32)),
}

/// A program's buffer the peer may write into (`riomap`).
struct LocalMap {
    offset: u64,
    addr: u64,
    len: u64,
    mr: *mut ibv_mr,
}

/// A message that came in, read from its slot as the program asks.
#[derive(Debug, Clone, Copy)]
struct Arrived {
    slot: usize,
    len: usize,
    read: usize,
}

pub struct Stream {
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    sends: Region,
    send_slots: usize,
    /// SENDs and WRITEs posted, and completed (in order).
    posted: u64,
    completed: u64,
    receives: Region,
    receive_slots: u64,
    arrived: VecDeque<Arrived>,
    /// Messages received, and their slots posted again (not counting the
    /// first posts), and the count the peer last heard of.
    received: u64,
    reposted: u64,
    reported: u64,
    /// The word the peer writes its `reposted` into (big-endian).
    credit: Region,
    /// What one message may carry to the peer; the receives it posted
    /// first; the SENDs this side has made; where its credit word is.
    peer_slot_bytes: usize,
    peer_slots: u64,
    sent: u64,
    peer_credit: (u64, u32),
    local_maps: Vec<LocalMap>,
    remote_maps: Vec<Mapping>,
    /// The peer sent [`Kind::Shutdown`]: the end of the stream, once
    /// what arrived before it is read.
    pub peer_done: bool,
    /// This side sent its [`Kind::Shutdown`].
    pub shut_write: bool,
    /// The connection broke (a completion failed): the errno to give.
    pub failed: Option<c_int>,
}

impl Stream {
    /// The verbs of a connection about to be made on `id` (whose
    /// context, and the rdma_cm device's PD, are used), receives posted.
    ///
    /// # Safety
    /// `id` is a live rdma_cm ID without a QP, that outlives the stream.
    pub unsafe fn new(id: *mut rdma_cm_id, pd: *mut ibv_pd, sizes: Sizes) -> Result<Stream, c_int> {
        let send_slots = Sizes::slots(sizes.send_buffer);
        let receive_slots = Sizes::slots(sizes.receive_buffer);
        // SAFETY: live (caller).
        let context = unsafe { (*id).verbs };
        // SAFETY: the ID's device context.
        let channel = unsafe { verbs::ibv_create_comp_channel(context) };
        if channel.is_null() {
            return Err(libc::ENOMEM);
        }
        // Drained without waiting: a woken poll reads every event there is.
        // SAFETY: the channel's own descriptor.
        unsafe {
            let fd = (*channel).fd;
            libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK);
        }
        let depth = (send_slots + receive_slots + SPARE_RECEIVES) as c_int;
        // SAFETY: the context and the channel just made.
        let cq = unsafe { verbs::ibv_create_cq(context, depth, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            // SAFETY: made above, unused.
            unsafe { verbs::ibv_destroy_comp_channel(channel) };
            return Err(libc::ENOMEM);
        }
        let regions = Region::new(pd, send_slots * SLOT_BYTES, IBV_ACCESS_LOCAL_WRITE).and_then(|s| {
            let receives = Region::new(pd, (receive_slots + SPARE_RECEIVES) * SLOT_BYTES, IBV_ACCESS_LOCAL_WRITE)?;
            Ok((s, receives, Region::new(pd, 8, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)?))
        });
        let mut attr = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: send_slots as u32,
                max_recv_wr: (receive_slots + SPARE_RECEIVES) as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        let qp_made = regions.is_ok() && {
            // SAFETY: live ID without a QP (caller); attributes above.
            unsafe { rdma_create_qp(id, pd, &mut attr) == 0 }
        };
        let Ok((sends, receives, credit)) = regions.and_then(|r| if qp_made { Ok(r) } else { Err(libc::ENOMEM) })
        else {
            // SAFETY: made above; no QP uses them.
            unsafe {
                verbs::ibv_destroy_cq(cq);
                verbs::ibv_destroy_comp_channel(channel);
            }
            return Err(libc::ENOMEM);
        };
        let mut stream = Stream {
            id,
            pd,
            channel,
            cq,
            sends,
            send_slots,
            posted: 0,
            completed: 0,
            receives,
            receive_slots: receive_slots as u64,
            arrived: VecDeque::with_capacity(receive_slots),
            received: 0,
            reposted: 0,
            reported: 0,
            credit,
            peer_slot_bytes: SLOT_BYTES,
            peer_slots: 0,
            sent: 0,
            peer_credit: (0, 0),
            local_maps: Vec::new(),
            remote_maps: Vec::new(),
            peer_done: false,
            shut_write: false,
            failed: None,
        };
        for slot in 0..receive_slots + SPARE_RECEIVES {
            stream.post_receive(slot)?;
        }
        Ok(stream)
    }

    /// What this side tells the peer when the connection is made.
    pub fn hello(&self) -> Hello {
        Hello {
            slot_bytes: SLOT_BYTES as u32,
            slots: self.receive_slots as u32,
            credit_addr: self.credit.bytes as u64,
            credit_rkey: self.credit.rkey(),
        }
    }

    /// What the peer said when the connection was made.
    pub fn hear(&mut self, peer: Hello) {
        self.peer_slot_bytes = (peer.slot_bytes as usize).min(SLOT_BYTES);
        self.peer_slots = peer.slots.into();
        self.peer_credit = (peer.credit_addr, peer.credit_rkey);
    }

    /// The completion channel's descriptor: readable once the CQ is armed
    /// ([`Stream::arm`]) and a completion has come.
    pub fn wake_fd(&self) -> c_int {
        // SAFETY: live until drop.
        unsafe { (*self.channel).fd }
    }

    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: the ID outlives the stream (new's contract).
        unsafe { (*self.id).qp }
    }

    fn post_receive(&mut self, slot: usize) -> Result<(), c_int> {
        let mut sge = ibv_sge {
            addr: self.receives.slot(slot, SLOT_BYTES) as u64,
            length: SLOT_BYTES as u32,
            lkey: self.receives.lkey(),
        };
        let mut wr =
            ibv_recv_wr { wr_id: RECEIVE | slot as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        // SAFETY: the stream's live QP; the request and its SGE live
        // across the call (the engine copies them).
        match unsafe { verbs::post_recv(self.qp(), &mut wr) } {
            0 => Ok(()),
            rc => Err(self.broke(rc.abs().max(libc::EIO))),
        }
    }

    /// Posts a read slot again, to be reported to the peer.
    fn repost(&mut self, slot: usize) {
        if self.post_receive(slot).is_ok() {
            self.reposted += 1;
        }
    }

    /// Tells the peer of the slots posted again, when a quarter of them
    /// are, or when it may be down to half its credits.
    fn report(&mut self) {
        let fresh = self.reposted - self.reported;
        let peer_credits_left = (self.receive_slots + self.reported).saturating_sub(self.received);
        let due = fresh >= (self.receive_slots / 4).max(1) || peer_credits_left <= self.receive_slots / 2;
        if fresh == 0 || !due || !self.can_send() || self.failed.is_some() {
            return;
        }
        let count = self.reposted;
        let target = match peer_credits_left {
            0 => Target::WakingWrite(self.peer_credit),
            _ => Target::Write(self.peer_credit),
        };
        if self.post(Kind::Credit, &count.to_be_bytes(), target).is_ok() {
            self.reported = count;
        }
    }

    fn broke(&mut self, errno: c_int) -> c_int {
        *self.failed.get_or_insert(errno)
    }

    /// Takes every completion there is; whether there were any.
    pub fn progress(&mut self) -> bool {
        // Not zeroed: every call polls (spins included), and poll_cq
        // writes each completion it returns.
        let mut wcs = [const { std::mem::MaybeUninit::<ibv_wc>::uninit() }; 32];
        let mut any = false;
        loop {
            // SAFETY: the stream's live CQ; room for 32.
            let n = unsafe { verbs::poll_cq(self.cq, wcs.len() as c_int, wcs.as_mut_ptr().cast()) };
            if n <= 0 {
                self.report();
                return any;
            }
            any = true;
            for wc in &wcs[..n as usize] {
                // SAFETY: the first `n` were written by poll_cq.
                let wc = unsafe { wc.assume_init_ref() };
                match wc.wr_id & RECEIVE != 0 {
                    true => self.received(wc),
                    false => self.sent(wc),
                }
            }
        }
    }

    fn sent(&mut self, wc: &ibv_wc) {
        self.completed += 1;
        if wc.status != IBV_WC_SUCCESS && !self.peer_done {
            self.broke(libc::ECONNRESET);
        }
    }

    fn received(&mut self, wc: &ibv_wc) {
        let slot = (wc.wr_id & !RECEIVE) as usize;
        if wc.status != IBV_WC_SUCCESS {
            // Flushed as the connection goes down: an error only if the
            // peer had not said it was done.
            if !self.peer_done {
                self.broke(libc::ECONNRESET);
            }
            return;
        }
        let kind = match wc.wc_flags & IBV_WC_WITH_IMM != 0 {
            true => Kind::from_immediate(u32::from_be(wc.imm_data)),
            false => None,
        };
        let len = (wc.byte_len as usize).min(SLOT_BYTES);
        // SAFETY: the engine placed `len` bytes in the slot before the
        // completion that says so; nothing writes the slot until it is
        // posted again.
        let payload = unsafe { std::slice::from_raw_parts(self.receives.slot(slot, SLOT_BYTES), len) };
        if kind == Some(Kind::Credit) {
            // The spare receive, for a report whose word is already in
            // place: posted again uncounted, and now the sender looks.
            let _ = self.post_receive(slot);
            return;
        }
        self.received += 1;
        match kind {
            Some(Kind::Data) if len > 0 => {
                self.arrived.push_back(Arrived { slot, len, read: 0 });
                return;
            }
            Some(Kind::Data) => {}
            Some(Kind::Map) => match Mapping::parse(payload) {
                Some(map) => {
                    self.remote_maps.retain(|m| m.offset != map.offset);
                    self.remote_maps.push(map);
                }
                None => {
                    self.broke(libc::EPROTO);
                }
            },
            Some(Kind::Unmap) => match message::parse_unmap(payload) {
                Some(offset) => self.remote_maps.retain(|m| m.offset != offset),
                None => {
                    self.broke(libc::EPROTO);
                }
            },
            Some(Kind::Shutdown) => self.peer_done = true,
            Some(Kind::Credit) | None => {
                self.broke(libc::EPROTO);
            }
        }
        self.repost(slot);
    }

    /// Whether a send slot is free (for a WRITE).
    pub fn can_send(&self) -> bool {
        self.posted - self.completed < self.send_slots as u64
    }

    /// Whether a send slot is free and the peer has a receive for a SEND.
    pub fn can_send_message(&self) -> bool {
        let peer_reposted = u64::from_be(self.credit.first_word());
        self.can_send() && self.sent < self.peer_slots + peer_reposted
    }

    /// Whether everything posted has completed.
    pub fn all_sent(&self) -> bool {
        self.posted == self.completed
    }

    /// Whether [`Stream::receive`] has bytes to give.
    pub fn readable(&self) -> bool {
        !self.arrived.is_empty()
    }

    /// Copies `bytes` into the next send slot and posts it to `target`.
    fn post(&mut self, kind: Kind, bytes: &[u8], target: Target) -> Result<(), c_int> {
        debug_assert!(bytes.len() <= SLOT_BYTES);
        debug_assert!(match target {
            Target::Message => self.can_send_message(),
            _ => self.can_send(),
        });
        let slot = self.sends.slot((self.posted % self.send_slots as u64) as usize, SLOT_BYTES);
        // SAFETY: the slot is free (its last use completed) and holds
        // SLOT_BYTES; the program's bytes do not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot, bytes.len()) };
        let mut sge = ibv_sge { addr: slot as u64, length: bytes.len() as u32, lkey: self.sends.lkey() };
        let (opcode, (remote_addr, rkey)) = match target {
            Target::Message => (IBV_WR_SEND_WITH_IMM, (0, 0)),
            Target::Write(at) => (IBV_WR_RDMA_WRITE, at),
            Target::WakingWrite(at) => (IBV_WR_RDMA_WRITE_WITH_IMM, at),
        };
        let wr = ibv_send_wr_wr { rdma: ibv_send_wr_rdma { remote_addr, rkey } };
        let mut request = ibv_send_wr {
            wr_id: self.posted,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode,
            send_flags: IBV_SEND_SIGNALED,
            imm_data: kind.immediate().to_be(),
            wr,
            remote_srqn: 0,
            // SAFETY: plain data; zero is "no window".
            bind_mw: unsafe { std::mem::zeroed() },
        };
        // SAFETY: the stream's live QP; the request lives across the call.
        match unsafe { verbs::post_send(self.qp(), &mut request) } {
            0 => {
                self.posted += 1;
                self.sent += u64::from(matches!(target, Target::Message));
                Ok(())
            }
            rc => Err(self.broke(rc.abs().max(libc::EIO))),
        }
    }

    /// Sends as much of `bytes` as there are free slots for: how much.
    pub fn send(&mut self, bytes: &[u8]) -> Result<usize, c_int> {
        let mut sent = 0;
        while sent < bytes.len() && self.can_send_message() {
            let chunk = (bytes.len() - sent).min(self.peer_slot_bytes);
            self.post(Kind::Data, &bytes[sent..sent + chunk], Target::Message)?;
            sent += chunk;
        }
        Ok(sent)
    }

    /// Sends a control message (needs a free slot).
    pub fn send_control(&mut self, kind: Kind, payload: &[u8]) -> Result<(), c_int> {
        self.post(kind, payload, Target::Message)
    }

    /// Copies what has arrived into `buf`; a slot read to its end is
    /// posted again. With `peek`, nothing is consumed.
    pub fn receive(&mut self, buf: &mut [u8], peek: bool) -> usize {
        let mut copied = 0;
        let mut index = 0;
        while copied < buf.len() {
            let Some(&msg) = self.arrived.get(index) else { break };
            let n = (msg.len - msg.read).min(buf.len() - copied);
            // SAFETY: the slot's bytes were placed before its completion
            // and stay until it is posted again (below, once read).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.receives.slot(msg.slot, SLOT_BYTES).add(msg.read),
                    buf[copied..].as_mut_ptr(),
                    n,
                )
            };
            copied += n;
            if peek {
                index += 1;
                continue;
            }
            let front = self.arrived.front_mut().expect("the message just read");
            front.read += n;
            if front.read == front.len {
                let slot = front.slot;
                self.arrived.pop_front();
                self.repost(slot);
            }
        }
        if !peek {
            self.report();
        }
        copied
    }

    /// Arms the CQ's notification, then takes what came meanwhile:
    /// whether anything did (then the caller should not sleep).
    pub fn arm(&mut self) -> bool {
        // SAFETY: the stream's live CQ.
        unsafe { verbs::req_notify_cq(self.cq) };
        self.progress()
    }

    /// Reads the completion channel's events (without waiting) and acks
    /// them.
    pub fn drain_wakeups(&mut self) {
        let mut events = 0;
        loop {
            let (mut cq, mut context) = (std::ptr::null_mut(), std::ptr::null_mut::<c_void>());
            // SAFETY: the stream's channel, non-blocking.
            if unsafe { verbs::ibv_get_cq_event(self.channel, &mut cq, &mut context) } != 0 {
                break;
            }
            events += 1;
        }
        if events > 0 {
            // SAFETY: the events just taken, for this CQ.
            unsafe { verbs::ibv_ack_cq_events(self.cq, events) };
        }
    }

    /// Registers `len` bytes at `addr` for the peer to write, at `offset`
    /// of this side's map (the first free offset when `None`), and tells
    /// the peer (needs a free slot). Returns the offset.
    pub fn map(&mut self, addr: u64, len: u64, offset: Option<u64>) -> Result<u64, c_int> {
        let offset = offset.unwrap_or_else(|| self.local_maps.iter().map(|m| m.offset + m.len).max().unwrap_or(0));
        if self.local_maps.iter().any(|m| offset < m.offset + m.len && m.offset < offset + len) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's buffer (riomap's contract: it stays until
        // riounmap), registered for the peer's writes.
        let mr = unsafe {
            verbs::ibv_reg_mr(
                self.pd,
                addr as *mut c_void,
                len as usize,
                (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int,
            )
        };
        if mr.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: just registered.
        let rkey = unsafe { (*mr).rkey };
        let mapping = Mapping { offset, addr, len, rkey };
        if let Err(e) = self.send_control(Kind::Map, &mapping.emit()) {
            // SAFETY: registered above, never shown to the peer.
            unsafe { verbs::ibv_dereg_mr(mr) };
            return Err(e);
        }
        self.local_maps.push(LocalMap { offset, addr, len, mr });
        Ok(offset)
    }

    /// The number of buffers mapped.
    pub fn maps(&self) -> usize {
        self.local_maps.len()
    }

    /// Ends the mapping of the buffer at `addr`, telling the peer first
    /// when `tell` (that needs a free slot and a credit). A connection
    /// that broke or whose peer left ends it all the same.
    pub fn unmap(&mut self, addr: u64, tell: bool) -> Result<(), c_int> {
        let Some(at) = self.local_maps.iter().position(|m| m.addr == addr) else {
            return Err(libc::EINVAL);
        };
        if tell && self.failed.is_none() {
            let _ = self.send_control(Kind::Unmap, &self.local_maps[at].offset.to_be_bytes());
        }
        let map = self.local_maps.swap_remove(at);
        // SAFETY: the mapping's own registration.
        unsafe { verbs::ibv_dereg_mr(map.mr) };
        Ok(())
    }

    /// Whether the peer has mapped `offset`.
    pub fn peer_mapped(&self, offset: u64) -> bool {
        self.remote_maps.iter().any(|m| m.holds(offset))
    }

    /// Writes as much of `bytes` into the peer's map at `offset` as one
    /// slot carries and the mapping holds: how much.
    pub fn write(&mut self, bytes: &[u8], offset: u64) -> Result<usize, c_int> {
        let Some(map) = self.remote_maps.iter().find(|m| m.holds(offset)).copied() else {
            return Err(libc::EINVAL);
        };
        let room = (map.offset + map.len - offset) as usize;
        let n = bytes.len().min(room).min(SLOT_BYTES);
        self.post(Kind::Data, &bytes[..n], Target::Write((map.addr + (offset - map.offset), map.rkey)))?;
        Ok(n)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream's own QP (destroyed through its ID), CQ,
        // channel and registrations; the regions go after the QP.
        unsafe {
            crate::api::rdma_destroy_qp(self.id);
            for map in self.local_maps.drain(..) {
                verbs::ibv_dereg_mr(map.mr);
            }
            self.drain_wakeups();
            verbs::ibv_destroy_cq(self.cq);
            verbs::ibv_destroy_comp_channel(self.channel);
        }
    }
}
