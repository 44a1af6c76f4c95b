//! `Device`: one whole RNIC for a single thread, its [`Control`] plane and
//! one [`Shard`] holding every QP. The simulator and the tests drive it;
//! the engine composes the same two pieces with one shard per core.
//!
//! ```text
//!   verbs on device-wide objects ──> Control ──(memory snapshot)──> Shard
//!   handle_datagram / post_* / poll_transmit / timers ────────────> Shard
//!   poll_receives_wanted / receives_fetched ───────────────────────> Shard
//!   poll_cq(cq) <── the completion queue itself
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::completion::{Completion, CqId};
use crate::config::TransportConfig;
use crate::congestion::RecvMeta;
use crate::control::Control;
use crate::counters::Counters;
use crate::entropy::Entropy;
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::fetch_on_demand::ReceivesWanted;
use crate::memory::{MemoryTable, MrKeys, PdId, Registration, WindowType};
use crate::qp::{QpAttr, QpInitAttr, QueuePair, Transmit};
use crate::shard::Shard;
use crate::srq::{SharedReceiveQueue, SrqAttr, SrqId};
use crate::time::Instant;
use crate::work_request::{RecvWorkRequest, SendWorkRequest};

/// A software RNIC's transport state, driven by one thread.
#[derive(Debug)]
pub struct Device {
    control: Control,
    shard: Shard,
}

impl Device {
    /// A device drawing its keys and QP numbers from `entropy`.
    pub fn new(config: TransportConfig, entropy: Entropy) -> Device {
        let control = Control::new(config.clone(), 1, entropy);
        let shard = Shard::new(0, config, control.memory().clone());
        Device { control, shard }
    }

    pub fn config(&self) -> &TransportConfig {
        self.control.config()
    }

    /// The device's address (its GID).
    pub fn local_addr(&self) -> IpAddr {
        self.config().local_addr
    }

    pub fn counters(&self) -> &Counters {
        self.shard.counters()
    }

    pub fn memory(&self) -> &MemoryTable {
        self.control.memory()
    }

    /// Hands a changed memory table to the shard.
    fn sync_memory<T>(&mut self, out: T) -> T {
        if let Some(memory) = self.control.take_memory_update() {
            self.shard.set_memory(memory);
        }
        out
    }

    // ----- protection domains and memory regions -----

    /// How the shard reaches the memory that same-host peers' references
    /// name ([`Shard::set_peer_memory`]).
    pub fn set_peer_memory(&mut self, peers: Box<dyn crate::memory::PeerMemory>) {
        self.shard.set_peer_memory(peers);
    }

    /// Lets packets to devices on this host carry references in place of
    /// payloads ([`Shard::send_references`]).
    pub fn send_references(&mut self, sends: bool) {
        self.shard.send_references(sends);
    }

    pub fn alloc_pd(&mut self) -> PdId {
        let pd = self.control.alloc_pd();
        self.sync_memory(pd)
    }

    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        let out = self.control.dealloc_pd(pd);
        self.sync_memory(out)
    }

    pub fn register_memory(&mut self, r: Registration) -> Result<MrKeys> {
        let out = self.control.register_memory(r);
        self.sync_memory(out)
    }

    pub fn deregister_memory(&mut self, lkey: u32) -> Result<()> {
        let out = self.control.deregister_memory(lkey).map(drop);
        self.sync_memory(out)
    }

    pub fn alloc_window(&mut self, pd: PdId, kind: WindowType) -> Result<u32> {
        let out = self.control.alloc_window(pd, kind);
        self.sync_memory(out)
    }

    pub fn dealloc_window(&mut self, rkey: u32) -> Result<()> {
        let out = self.control.dealloc_window(rkey);
        self.sync_memory(out)
    }

    // ----- completion queues -----

    pub fn create_cq(&mut self, capacity: usize) -> CqId {
        self.control.create_cq(capacity).id()
    }

    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        self.control.destroy_cq(cq)
    }

    pub fn resize_cq(&mut self, cq: CqId, capacity: usize) -> Result<()> {
        self.control.cq(cq).ok_or(VerbsError::NotFound("completion queue"))?.resize(capacity)
    }

    /// Moves up to `max` completions of `cq` into `out`.
    pub fn poll_cq(&mut self, cq: CqId, max: usize, out: &mut Vec<Completion>) -> usize {
        self.control.cq(cq).map_or(0, |q| q.poll(max, out))
    }

    pub fn request_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> Result<()> {
        self.control.cq(cq).ok_or(VerbsError::NotFound("completion queue"))?.request_notify(solicited_only);
        Ok(())
    }

    /// A completion queue whose requested notification has fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqId> {
        self.shard.poll_cq_notification()
    }

    // ----- shared receive queues and asynchronous events -----

    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId> {
        let out = self.control.create_srq(pd, attr).map(|srq| srq.id());
        self.sync_memory(out)
    }

    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        let out = self.control.destroy_srq(srq);
        self.sync_memory(out)
    }

    /// Posts a receive to a shared receive queue (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWorkRequest) -> Result<()> {
        self.control.srq(srq)?.post(wr)
    }

    /// The SRQ itself, for its program's side (what posts the receives it
    /// fetches on demand).
    pub fn srq(&self, srq: SrqId) -> Result<&Arc<SharedReceiveQueue>> {
        self.control.srq(srq)
    }

    /// Arms the SRQ's limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn modify_srq_limit(&mut self, srq: SrqId, limit: u32) -> Result<()> {
        self.control.srq(srq)?.set_limit(limit)
    }

    /// The SRQ's attributes and how many receives it holds.
    pub fn query_srq(&self, srq: SrqId) -> Result<(SrqAttr, usize)> {
        Ok(self.control.srq(srq)?.query())
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.shard.poll_async_event()
    }

    // ----- queue pairs -----

    pub fn create_qp(&mut self, init: QpInitAttr) -> Result<u32> {
        let qp = self.control.create_qp(init, 0)?;
        let qpn = qp.qpn();
        self.shard.insert_qp(qp);
        Ok(self.sync_memory(qpn))
    }

    /// Destroys a QP; its outstanding work requests vanish without completions.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<()> {
        // A device in a simulation has no datapath to leave groups.
        let (qp, _) = self.shard.remove_qp(qpn)?;
        let out = self.control.destroy_qp(qp);
        self.sync_memory(out)
    }

    pub fn qp(&self, qpn: u32) -> Option<&QueuePair> {
        self.shard.qp(qpn)
    }

    /// Attaches UD QP `qpn` to multicast `group`. A device in a
    /// simulation has no datapath to join; its world delivers what is
    /// sent to a group (`RecvMeta::multicast_group`).
    pub fn attach_multicast(&mut self, qpn: u32, group: IpAddr) -> Result<()> {
        self.shard.attach_multicast(qpn, group).map(drop)
    }

    pub fn detach_multicast(&mut self, qpn: u32, group: IpAddr) -> Result<()> {
        self.shard.detach_multicast(qpn, group).map(drop)
    }

    pub fn modify_qp(&mut self, now: Instant, qpn: u32, attr: &QpAttr) -> Result<()> {
        self.shard.modify_qp(now, qpn, attr)
    }

    /// Limits the rate of a QP's requests (bits per second), or lifts the
    /// limit: the hook congestion control drives.
    pub fn set_qp_rate_limit(&mut self, now: Instant, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        self.shard.set_qp_rate_limit(now, qpn, bits_per_second)
    }

    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: SendWorkRequest) -> Result<()> {
        self.shard.post_send(now, qpn, wr)
    }

    pub fn post_recv(&mut self, now: Instant, qpn: u32, wr: RecvWorkRequest) -> Result<()> {
        self.shard.post_recv(now, qpn, wr)
    }

    // ----- the wire -----

    /// Consumes a datagram that arrived on UDP port 4791 from `from`.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, meta: RecvMeta, datagram: &[u8]) {
        self.shard.handle_datagram(now, from, meta, datagram)
    }

    /// Writes the next datagram to send into `buf` (at least
    /// [`MAX_DATAGRAM_LEN`](crate::MAX_DATAGRAM_LEN) bytes), ICRC included.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.shard.poll_transmit(now, buf)
    }

    /// As [`Device::poll_transmit`], leaving as `egress` says
    /// ([`Shard::poll_transmit_from`]).
    pub fn poll_transmit_from(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        egress: &mut dyn FnMut(std::net::IpAddr) -> crate::Egress,
    ) -> Option<Transmit> {
        self.shard.poll_transmit_from(now, buf, egress)
    }

    /// When [`Device::handle_timeout`] should next run.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.shard.poll_timeout()
    }

    /// Runs every QP timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.shard.handle_timeout(now)
    }

    /// The next QP that needs the receives its program wrote
    /// ([`crate::fetch_on_demand`]).
    pub fn poll_receives_wanted(&mut self) -> Option<ReceivesWanted> {
        self.shard.poll_receives_wanted()
    }

    /// The driver posted what the program wrote: the QP's held requests go
    /// on.
    pub fn receives_fetched(&mut self, now: Instant, wanted: ReceivesWanted) {
        self.shard.receives_fetched(now, wanted)
    }
}
