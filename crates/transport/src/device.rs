//! `Device`: one NIC's whole transport, sans IO. It owns the memory table,
//! the completion queues and the queue pairs; it takes datagrams and time
//! in, and gives datagrams, completions and its next deadline out.
//!
//! ```text
//!   handle_datagram(now, from, bytes) ──> ICRC, parse, demux by QPN ──> QP
//!   post_send / post_recv / modify_qp ─────────────────────────────────> QP
//!   poll_transmit(now, buf) <── round robin over QPs with output <───── QP
//!   poll_timeout() / handle_timeout(now) ── per-QP retransmission timers
//!   poll_cq(cq) <── completions
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use softrnic_wire::icrc::UdpFlow;
use softrnic_wire::packet::PacketRepr;
use softrnic_wire::{Opcode, ROCEV2_UDP_PORT};

use crate::completion::{Completion, CompletionQueues, CqId};
use crate::config::TransportConfig;
use crate::counters::Counters;
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::memory::{Access, DmaBuffer, MemoryTable, MrKeys, PdId};
use crate::qp::{Ctx, QpAttr, QpInitAttr, QueuePair, Transmit};
use crate::srq::{SharedReceiveQueues, SrqAttr, SrqId};
use crate::time::Instant;
use crate::work_request::{RecvWorkRequest, SendWorkRequest};

/// Bytes a datagram buffer passed to [`Device::poll_transmit`] must hold:
/// a 4096-byte payload and the largest set of headers, pad and ICRC.
pub const MAX_DATAGRAM_LEN: usize = 4096 + 64;

/// The first QP number handed out; 0 and 1 are the special QPs of verbs.
const FIRST_QPN: u32 = 0x11;
const MAX_QPN: u32 = (1 << 24) - 1;

#[derive(Debug)]
struct QpSlot {
    qp: QueuePair,
    /// In the ready queue already.
    ready: bool,
    /// The deadline the timer heap holds for this QP.
    scheduled: Option<Instant>,
}

/// A software RNIC's transport state.
#[derive(Debug)]
pub struct Device {
    config: TransportConfig,
    memory: MemoryTable,
    cqs: CompletionQueues,
    srqs: SharedReceiveQueues,
    /// Asynchronous events not yet taken by `poll_async_event`.
    events: VecDeque<AsyncEvent>,
    qps: HashMap<u32, QpSlot>,
    next_qpn: u32,
    /// QPs that may have something to send, served round robin.
    ready: VecDeque<u32>,
    /// Timer deadlines; an entry whose QP has since rescheduled is stale.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    counters: Counters,
}

macro_rules! ctx {
    ($self:ident, $now:expr) => {
        Ctx {
            now: $now,
            memory: &$self.memory,
            cqs: &mut $self.cqs,
            srqs: &mut $self.srqs,
            events: &mut $self.events,
            counters: &mut $self.counters,
            config: &$self.config,
        }
    };
}

impl Device {
    pub fn new(config: TransportConfig) -> Device {
        Device {
            config,
            memory: MemoryTable::new(),
            cqs: CompletionQueues::default(),
            srqs: SharedReceiveQueues::default(),
            events: VecDeque::new(),
            qps: HashMap::new(),
            next_qpn: FIRST_QPN,
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    /// The device's address (its GID).
    pub fn local_addr(&self) -> IpAddr {
        self.config.local_addr
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn memory(&self) -> &MemoryTable {
        &self.memory
    }

    // ----- protection domains and memory regions -----

    pub fn alloc_pd(&mut self) -> PdId {
        self.memory.alloc_pd()
    }

    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.memory.dealloc_pd(pd)
    }

    /// Registers `len` bytes of `buffer` from `offset`, addressed from `iova`.
    pub fn register_memory(
        &mut self,
        pd: PdId,
        buffer: Arc<DmaBuffer>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys> {
        self.memory.register(pd, buffer, offset, len, iova, access)
    }

    pub fn deregister_memory(&mut self, lkey: u32) -> Result<()> {
        self.memory.deregister(lkey)
    }

    // ----- completion queues -----

    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        self.cqs.create(capacity)
    }

    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        self.cqs.destroy(cq)
    }

    /// Moves up to `max` completions of `cq` into `out`.
    pub fn resize_cq(&mut self, cq: CqId, capacity: usize) -> Result<()> {
        self.cqs.resize(cq, capacity)
    }

    pub fn poll_cq(&mut self, cq: CqId, max: usize, out: &mut Vec<Completion>) -> usize {
        self.cqs.poll(cq, max, out)
    }

    pub fn request_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        self.cqs.request_notify(cq, solicited_only)
    }

    /// A completion queue whose requested notification has fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqId> {
        self.cqs.poll_notification()
    }

    // ----- shared receive queues and asynchronous events -----

    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId> {
        if !self.memory.pd_exists(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        let srq = self.srqs.create(pd, attr)?;
        self.memory.pd_users(pd, 1)?;
        Ok(srq)
    }

    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        let pd = self.srqs.pd(srq)?;
        self.srqs.destroy(srq)?;
        self.memory.pd_users(pd, -1)
    }

    /// Posts a receive to a shared receive queue (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWorkRequest) -> Result<()> {
        self.srqs.post(srq, wr)
    }

    /// Arms the SRQ's limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn modify_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<()> {
        self.srqs.set_limit(srq, limit)
    }

    /// The SRQ's attributes and how many receives it holds.
    pub fn query_srq(&self, srq: SrqId) -> Result<(SrqAttr, usize)> {
        self.srqs.query(srq)
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        if let Some(cq) = self.cqs.poll_overflow() {
            return Some(AsyncEvent::CqError { cq });
        }
        self.events.pop_front()
    }

    // ----- queue pairs -----

    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<u32> {
        if !self.memory.pd_exists(init.pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if !self.cqs.exists(init.send_cq) || !self.cqs.exists(init.recv_cq) {
            return Err(VerbsError::NotFound("completion queue"));
        }
        if let Some(srq) = init.srq {
            self.srqs.query(srq)?;
        }
        if init.caps.max_send_wr == 0 && init.caps.max_recv_wr == 0 && init.srq.is_none() {
            return Err(VerbsError::invalid("a QP needs a send or a receive queue"));
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) {
            qpn = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
            if qpn == self.next_qpn {
                return Err(VerbsError::OutOfResources("queue pair numbers".into()));
            }
        }
        self.next_qpn = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
        self.memory.pd_users(init.pd, 1)?;
        self.cqs.add_user(init.send_cq, 1);
        self.cqs.add_user(init.recv_cq, 1);
        if let Some(srq) = init.srq {
            self.srqs.add_user(srq, 1);
        }
        self.qps.insert(qpn, QpSlot { qp: QueuePair::new(qpn, init), ready: false, scheduled: None });
        Ok(qpn)
    }

    /// Destroys a QP; its outstanding work requests vanish without completions.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        let slot = self.qps.remove(&qpn).ok_or(VerbsError::NotFound("queue pair"))?;
        let init = *slot.qp.init_attr();
        self.memory.pd_users(init.pd, -1)?;
        self.cqs.add_user(init.send_cq, -1);
        self.cqs.add_user(init.recv_cq, -1);
        if let Some(srq) = init.srq {
            self.srqs.add_user(srq, -1);
        }
        Ok(())
    }

    pub fn qp(&self, qpn: u32) -> Option<&QueuePair> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    pub fn modify_qp(&mut self, now: Instant, qpn: u32, attr: &QpAttr) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.modify(ctx, attr))
    }

    /// Limits the rate of a QP's requests (bits per second), or lifts the
    /// limit: the hook congestion control drives.
    pub fn set_qp_rate_limit(&mut self, now: Instant, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        if bits_per_second == Some(0) {
            return Err(VerbsError::invalid("a rate limit of 0 would stop the QP; give None to lift the limit"));
        }
        self.with_qp(now, qpn, |qp, _| {
            qp.set_rate_limit(bits_per_second);
            Ok(())
        })
    }

    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: SendWorkRequest) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_send(ctx, wr))
    }

    pub fn post_recv(&mut self, now: Instant, qpn: u32, wr: RecvWorkRequest) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_recv(ctx, wr))
    }

    /// Runs `f` on a QP, then brings its place in the ready queue and the
    /// timer heap up to date.
    fn with_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        f: impl FnOnce(&mut QueuePair, &mut Ctx) -> Result<()>,
    ) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("queue pair"))?;
        let mut ctx = ctx!(self, now);
        let out = f(&mut slot.qp, &mut ctx);
        self.reschedule(qpn);
        out
    }

    /// After an event on a QP: queue it for transmission if it may have
    /// something to send, and bring its timer up to date.
    fn reschedule(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !slot.ready && slot.qp.wants_to_transmit() {
            slot.ready = true;
            self.ready.push_back(qpn);
        }
        self.reschedule_timer(qpn);
    }

    fn reschedule_timer(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        let deadline = slot.qp.poll_timeout();
        if deadline != slot.scheduled {
            slot.scheduled = deadline;
            if let Some(at) = deadline {
                self.timers.push(Reverse((at, qpn)));
            }
        }
    }

    // ----- the wire -----

    /// Consumes a datagram that arrived on UDP port 4791 from `from`.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, datagram: &[u8]) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += datagram.len() as u64;
        let flow =
            UdpFlow { src: from.ip(), dst: self.config.local_addr, src_port: from.port(), dst_port: ROCEV2_UDP_PORT };
        if flow.verify(datagram).is_err() {
            self.counters.rx_icrc_errors += 1;
            return;
        }
        let Ok(packet) = PacketRepr::parse(datagram) else {
            self.counters.rx_malformed += 1;
            return;
        };
        if packet.headers.bth.opcode == Opcode::Cnp {
            self.counters.rx_cnps += 1;
            return;
        }
        let qpn = packet.headers.bth.dest_qpn;
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.counters.rx_unknown_qp += 1;
            return;
        };
        let mut ctx = ctx!(self, now);
        slot.qp.handle_packet(&mut ctx, from.ip(), &packet);
        self.reschedule(qpn);
    }

    /// Writes the next datagram to send into `buf` (at least
    /// [`MAX_DATAGRAM_LEN`] bytes), ICRC included.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        assert!(buf.len() >= MAX_DATAGRAM_LEN, "datagram buffer too small");
        while let Some(qpn) = self.ready.pop_front() {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.ready = false;
            let mut ctx = ctx!(self, now);
            let transmit = slot.qp.poll_transmit(&mut ctx, buf);
            // A QP that had nothing to send after all (its window, a fence
            // or the READ limit holds it back) leaves the ready queue until
            // a packet, a timer or a post gives it a reason to come back.
            if transmit.is_none() {
                self.reschedule_timer(qpn);
                continue;
            }
            self.reschedule(qpn);
            if let Some(t) = transmit {
                let flow = UdpFlow {
                    src: self.config.local_addr,
                    dst: t.dst,
                    src_port: ROCEV2_UDP_PORT,
                    dst_port: ROCEV2_UDP_PORT,
                };
                if flow.seal(&mut buf[..t.len]).is_err() {
                    // Address families differ: nothing can carry it.
                    self.counters.rx_dropped_foreign += 1;
                    continue;
                }
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += t.len as u64;
                return Some(t);
            }
        }
        None
    }

    /// The earliest deadline of any QP.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, qpn))) = self.timers.peek() {
            match self.qps.get(&qpn) {
                Some(slot) if slot.scheduled == Some(at) => return Some(at),
                _ => {
                    self.timers.pop();
                }
            }
        }
        None
    }

    /// Runs every QP timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(at) = self.poll_timeout() {
            if at > now {
                break;
            }
            let Reverse((_, qpn)) = self.timers.pop().expect("peeked");
            if let Some(slot) = self.qps.get_mut(&qpn) {
                slot.scheduled = None;
                let mut ctx = ctx!(self, now);
                slot.qp.handle_timeout(&mut ctx);
                self.reschedule(qpn);
            }
        }
    }
}
