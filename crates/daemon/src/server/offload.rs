//! The offloaded stack's designs (E4, E5): how softrnicd, an engine on
//! cores of its own that sends and receives on programs' behalf, moves a
//! payload between a program's memory and the wire.
//!
//! Transmit (`softrnicd --tx`):
//! - `header-only`: the engine builds the headers and gathers the payload
//!   straight from the program's memory into the packet; the daemon's own
//!   memory holds only headers.
//! - `bulk-copy`: the command processor first copies each payload whole
//!   into a staging buffer of the daemon's, one copy per gather entry (a
//!   DMA engine's bulk copy), and the engine sends from there.
//! - `engine-copy`: the engine itself pulls each payload into a staging
//!   buffer with an RDMA READ through a QP of the daemon's connected to
//!   itself ([`super::copy_engine`]), as the original's DPU pulls it across
//!   PCIe, and sends it from there once the READ completes.
//!
//! Receive (`softrnicd --rx`):
//! - `direct`: the engine scatters each payload straight into the buffers
//!   the program posted.
//! - `per-connection`: each QP has a ring of staging buffers of its own,
//!   one for each receive the program may post, used in turn; the payload
//!   lands there and is copied into the program's buffer when it completes.
//!   The buffers the engine writes grow with the connections.
//! - `in-cache`: every QP of the daemon draws from one pool of
//!   [`IN_CACHE_BUFFERS`] recycled buffers, the most recently freed first,
//!   and a receive takes its buffer only when a message arrives for it
//!   (the engine fetches it on demand, [`RxStage::message_arrived`]); the
//!   payload is copied on as it completes and the buffer goes back to the
//!   pool. So the buffers in use are the messages between arrival and
//!   copy, not the receives posted: the engine writes buffers that are
//!   still in cache, and the working set stays small however many
//!   connections there are and however many receives they post.
//!
//! A staging buffer is posted only for a receive the program posted, so a
//! sender still meets an RNR NAK where the program has none. Sends larger
//! than a buffer, READs, atomics and inline data go header-only; receives
//! larger than a buffer go direct; both are counted as passed through.
//! Staging buffers are registered for local access only: no key a peer
//! could learn reaches them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use softrnic_engine::Nic;
use softrnic_transport::memory::{AccessFault, MemoryTable};
use softrnic_transport::{
    Access, Completion, DmaBuffer, Payload, PdId, RecvWorkRequest, Result, SendOp, SendWorkRequest, Sge, SgeList,
    VerbsError, WcOpcode, WcStatus,
};

use super::copy_engine::CopyEngine;

/// Bytes of one staging buffer: an 8 KiB payload and its headers, the size
/// of the original's receive buffers.
pub const SLOT: usize = 8448;
/// Buffers in the in-cache design's pool (the original's 1024 × 8448 B).
pub const IN_CACHE_BUFFERS: usize = 1024;

/// How a send's payload reaches the engine (E4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TxDesign {
    /// Headers from the engine, the payload from the program's memory.
    #[default]
    HeaderOnly,
    /// Copied whole into the daemon's memory first.
    BulkCopy,
    /// Pulled into the daemon's memory by the engine's own RDMA READ.
    EngineCopy,
}

/// Where a receive's payload lands first (E5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RxDesign {
    /// In the program's buffer.
    #[default]
    Direct,
    /// In a ring of the QP's own, then copied.
    PerConnection,
    /// In a small pool shared by every QP, then copied while hot.
    InCache,
}

/// The names the flags take (`header-only`, `in-cache`).
macro_rules! display_as_flag {
    ($($design:ty),*) => {$(
        impl std::fmt::Display for $design {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let value = clap::ValueEnum::to_possible_value(self).expect("no design is hidden");
                f.write_str(value.get_name())
            }
        }
    )*};
}
display_as_flag!(TxDesign, RxDesign);

/// The daemon's designs, one of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Designs {
    pub tx: TxDesign,
    pub rx: RxDesign,
}

/// The designs and what they share: handed to every device.
pub struct Offload {
    pub designs: Designs,
    pub counters: Arc<OffloadCounters>,
    /// The in-cache design's pool (allocated only for it).
    pool: Option<Arc<Pool>>,
}

impl Offload {
    pub fn new(designs: Designs) -> Offload {
        let counters = Arc::new(OffloadCounters::default());
        let pool = (designs.rx == RxDesign::InCache).then(|| Arc::new(Pool::new(&counters)));
        Offload { designs, counters, pool }
    }

    /// The stages of a new QP of `pd` with `depth` send and `recv_depth`
    /// receive requests, on a device with `copy` (for `engine-copy`).
    pub fn stages(
        &self,
        nic: &Nic,
        pd: PdId,
        (depth, recv_depth): (u32, u32),
        copy: Option<&Arc<CopyEngine>>,
    ) -> Result<(Option<TxStage>, Option<RxStage>)> {
        let tx = TxStage::create(self.designs.tx, nic, pd, depth, copy, &self.counters)?;
        let rx = match (self.designs.rx, &self.pool) {
            (RxDesign::InCache, Some(pool)) => RxStage::shared(nic, pd, recv_depth, pool).map(Some),
            (RxDesign::PerConnection, _) => RxStage::own(nic, pd, recv_depth, &self.counters).map(Some),
            _ => Ok(None),
        };
        match rx {
            Ok(rx) => Ok((tx, rx)),
            Err(e) => {
                if let Some(tx) = &tx {
                    tx.release(nic, VecDeque::new());
                }
                Err(e)
            }
        }
    }
}

/// What the designs copied: the engine's memory traffic as far as a
/// machine without hardware counters (a VM) lets it be measured.
#[derive(Debug, Default)]
pub struct OffloadCounters {
    tx_copied_bytes: AtomicU64,
    tx_staged: AtomicU64,
    tx_passed: AtomicU64,
    rx_copied_bytes: AtomicU64,
    rx_staged: AtomicU64,
    rx_passed: AtomicU64,
    staging_bytes: AtomicU64,
    staging_peak: AtomicU64,
}

/// A snapshot of [`OffloadCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Payload bytes the transmit design copied, and the sends it copied.
    pub tx_copied_bytes: u64,
    pub tx_staged: u64,
    /// Sends a copying design let through as they were.
    pub tx_passed: u64,
    /// The same for receives.
    pub rx_copied_bytes: u64,
    pub rx_staged: u64,
    pub rx_passed: u64,
    /// Staging memory held now, and the most held at once.
    pub staging_bytes: u64,
    pub staging_peak: u64,
}

impl OffloadCounters {
    pub fn snapshot(&self) -> OffloadStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OffloadStats {
            tx_copied_bytes: get(&self.tx_copied_bytes),
            tx_staged: get(&self.tx_staged),
            tx_passed: get(&self.tx_passed),
            rx_copied_bytes: get(&self.rx_copied_bytes),
            rx_staged: get(&self.rx_staged),
            rx_passed: get(&self.rx_passed),
            staging_bytes: get(&self.staging_bytes),
            staging_peak: get(&self.staging_peak),
        }
    }

    fn hold(&self, bytes: usize) {
        let now = self.staging_bytes.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.staging_peak.fetch_max(now, Ordering::Relaxed);
    }

    fn release(&self, bytes: usize) {
        self.staging_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
    }
}

impl std::fmt::Display for OffloadStats {
    /// The line softrnicd prints when it stops, read back by `softrnic exp`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "offload: tx copied {} bytes in {} sends, {} passed; rx copied {} bytes in {} receives, {} passed; \
             staging {} bytes, at most {}",
            self.tx_copied_bytes,
            self.tx_staged,
            self.tx_passed,
            self.rx_copied_bytes,
            self.rx_staged,
            self.rx_passed,
            self.staging_bytes,
            self.staging_peak
        )
    }
}

impl OffloadStats {
    /// Reads the line [`OffloadStats`]'s `Display` writes.
    pub fn parse(line: &str) -> Option<OffloadStats> {
        let numbers: Vec<u64> = line
            .split_once("offload: ")?
            .1
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        let [tx_copied_bytes, tx_staged, tx_passed, rx_copied_bytes, rx_staged, rx_passed, staging_bytes, staging_peak] =
            numbers[..]
        else {
            return None;
        };
        Some(OffloadStats {
            tx_copied_bytes,
            tx_staged,
            tx_passed,
            rx_copied_bytes,
            rx_staged,
            rx_passed,
            staging_bytes,
            staging_peak,
        })
    }
}

/// Daemon memory payloads pass through: `slots` buffers of [`SLOT`] bytes.
struct Staging {
    buffer: Arc<DmaBuffer>,
    counters: Arc<OffloadCounters>,
}

impl Staging {
    fn new(slots: usize, counters: &Arc<OffloadCounters>) -> Staging {
        counters.hold(slots * SLOT);
        Staging { buffer: Arc::new(DmaBuffer::new(slots * SLOT)), counters: counters.clone() }
    }

    /// Its IOVA is its address, so each registration names it the same way.
    fn iova(&self) -> u64 {
        self.buffer.as_ptr() as u64
    }

    /// Registers it in `pd` for local access only.
    fn register(&self, nic: &Nic, pd: PdId) -> Result<u32> {
        let len = self.buffer.len();
        Ok(nic
            .register_memory(softrnic_transport::Registration {
                pd,
                buffer: self.buffer.clone(),
                offset: 0,
                len,
                iova: self.iova(),
                access: Access::LOCAL_WRITE,
            })?
            .lkey)
    }

    fn sge(&self, lkey: u32, slot: usize, length: usize) -> Sge {
        Sge { addr: self.iova() + (slot * SLOT) as u64, length: length as u32, lkey }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.counters.release(self.buffer.len());
    }
}

/// Sends of one QP whose payloads the copy engine may be pulling at once.
pub const PULLS_PER_QP: usize = 16;

/// A QP's transmit design: a staging slot for each send the engine may
/// hold, one for each pull under way, plus one. The engine completes a
/// QP's sends in order and accepts no more than its depth, so when a send
/// is staged, the one that last used its slot (that many stagings ago) is
/// done with it; and a post that fails (the queue full) leaves the slot to
/// the same send's retry.
pub struct TxStage {
    staging: Staging,
    lkey: u32,
    pd: PdId,
    slots: usize,
    /// `engine-copy`: the device's copy engine, and the staging area's key
    /// in its domain.
    copy: Option<(Arc<CopyEngine>, u32)>,
}

/// The payload's length if a design may stage `wr`: a SEND or WRITE
/// gathering 1 to [`SLOT`] bytes.
fn stageable_len(wr: &SendWorkRequest) -> Option<usize> {
    let len = wr.payload.len() as usize;
    let kind = matches!(wr.op, SendOp::Send { .. } | SendOp::Write { .. });
    (kind && matches!(wr.payload, Payload::Gather(_)) && (1..=SLOT).contains(&len)).then_some(len)
}

/// A send of an `engine-copy` QP, in order behind the others.
pub struct Pull {
    /// The copy engine's pull, if its payload is being pulled.
    token: Option<u64>,
    /// How the pull ended, once known.
    pulled: Option<bool>,
    /// The send from the staging slot, and the program's own (posted when
    /// the pull failed or never began).
    staged: SendWorkRequest,
    original: SendWorkRequest,
    len: usize,
}

impl TxStage {
    /// The stage for a QP of `pd` with `depth` send requests, if the
    /// design copies.
    fn create(
        design: TxDesign,
        nic: &Nic,
        pd: PdId,
        depth: u32,
        copy: Option<&Arc<CopyEngine>>,
        counters: &Arc<OffloadCounters>,
    ) -> Result<Option<TxStage>> {
        let pulls = match design {
            TxDesign::HeaderOnly => return Ok(None),
            TxDesign::BulkCopy => 0,
            TxDesign::EngineCopy => PULLS_PER_QP,
        };
        let slots = depth as usize + pulls + 1;
        let staging = Staging::new(slots, counters);
        let lkey = staging.register(nic, pd)?;
        let copy = match (design, copy) {
            (TxDesign::EngineCopy, Some(engine)) => {
                match engine.register_staging(nic, staging.buffer.clone(), staging.iova()) {
                    Ok(key) => Some((engine.clone(), key)),
                    Err(e) => {
                        let _ = nic.deregister_memory(lkey);
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        Ok(Some(TxStage { staging, lkey, pd, slots, copy }))
    }

    /// Whether sends wait for the copy engine (`engine-copy`).
    pub fn pulls(&self) -> bool {
        self.copy.is_some()
    }

    /// The payload's length if the design stages `wr`: a SEND or WRITE
    /// gathering 1 to [`SLOT`] bytes from memory that checks out in the
    /// QP's domain. Anything else is the engine's to gather (and to fail,
    /// as it fails any request whose memory does not check out).
    fn stages(&self, wr: &SendWorkRequest, memory: &MemoryTable) -> Option<usize> {
        let Payload::Gather(sges) = &wr.payload else { return None };
        let fine =
            sges.iter().all(|s| memory.check(self.pd, s.lkey, s.addr, s.length as usize, Access::empty()).is_ok());
        stageable_len(wr).filter(|_| fine)
    }

    /// `wr` sent from slot `n` (modulo the slots) of the staging area.
    fn sent_from_slot(&self, wr: &SendWorkRequest, n: u64, len: usize) -> SendWorkRequest {
        let slot = (n % self.slots as u64) as usize;
        let mut staged = wr.clone();
        staged.payload = Payload::Gather(SgeList::from_iter([self.staging.sge(self.lkey, slot, len)]));
        staged
    }

    /// `bulk-copy`: the send to post for `wr`, its payload copied whole
    /// into slot `n`, with the bytes copied; or `wr` as it was.
    pub fn stage(&self, wr: SendWorkRequest, memory: &MemoryTable, n: u64) -> (SendWorkRequest, Option<usize>) {
        let (Some(len), Payload::Gather(sges)) = (stageable_len(&wr), &wr.payload) else { return (wr, None) };
        // Each entry checked once, as it is copied; one that fails leaves
        // the request to the engine, which fails it (a slot half written
        // is no one's).
        let mut at = (n % self.slots as u64) as usize * SLOT;
        for sge in sges.iter() {
            let Ok(view) = memory.check(self.pd, sge.lkey, sge.addr, sge.length as usize, Access::empty()) else {
                return (wr, None);
            };
            view.copy_to(&self.staging.buffer, at);
            at += sge.length as usize;
        }
        (self.sent_from_slot(&wr, n, len), Some(len))
    }

    /// `engine-copy`: starts pulling `wr`'s payload into slot `n`.
    pub fn pull(&self, nic: &Nic, wr: SendWorkRequest, memory: &MemoryTable, n: u64) -> Pull {
        let (Some((engine, copy_lkey)), Some(len), Payload::Gather(sges)) =
            (&self.copy, self.stages(&wr, memory), &wr.payload)
        else {
            return Pull { token: None, pulled: None, staged: wr.clone(), original: wr, len: 0 };
        };
        let slot = (n % self.slots as u64) as usize;
        let token = engine.pull(nic, sges, *copy_lkey, self.staging.sge(*copy_lkey, slot, len).addr);
        Pull { token, pulled: None, staged: self.sent_from_slot(&wr, n, len), original: wr, len }
    }

    /// Collects the copy engine's finished pulls. Call it with no lock of
    /// a QP of the device held: with inline progress it drives the shards.
    pub fn collect_pulls(&self, nic: &Nic) {
        if let Some((engine, _)) = &self.copy {
            engine.poll(nic);
        }
    }

    /// Posts the sends at the front of `pulls` whose payloads are in
    /// place (or whose pulls failed: the program's own request then), in
    /// order, while the send queue takes them. Returns a send the engine
    /// refused outright, for the caller to fail the QP with.
    pub fn finish_pulls(
        &self,
        pulls: &mut VecDeque<Pull>,
        queue: &mut softrnic_engine::SendQueue<'_>,
        counters: &OffloadCounters,
    ) -> Option<(u64, VerbsError)> {
        let Some((engine, _)) = &self.copy else { return None };
        while let Some(front) = pulls.front_mut() {
            if let (Some(token), None) = (front.token, front.pulled) {
                front.pulled = engine.take(token);
            }
            let (wr, copied) = match (front.token, front.pulled) {
                (Some(_), None) => break, // still pulling
                (Some(_), Some(true)) => (front.staged.clone(), Some(front.len)),
                _ => (front.original.clone(), None),
            };
            let wr_id = wr.wr_id;
            match queue.post(wr) {
                Ok(()) => self.posted(copied, counters),
                Err(VerbsError::OutOfResources(_)) => break,
                Err(e) => {
                    pulls.pop_front();
                    return Some((wr_id, e));
                }
            }
            pulls.pop_front();
        }
        None
    }

    /// Counts a send that was posted.
    pub fn posted(&self, copied: Option<usize>, counters: &OffloadCounters) {
        match copied {
            Some(bytes) => {
                counters.tx_copied_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                counters.tx_staged.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                counters.tx_passed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Frees the registrations, and the pulls under way (the QP is gone).
    pub fn release(&self, nic: &Nic, pulls: VecDeque<Pull>) {
        let _ = nic.deregister_memory(self.lkey);
        if let Some((engine, copy_lkey)) = &self.copy {
            pulls.iter().filter_map(|p| p.token).for_each(|t| engine.abandon(t));
            let _ = nic.deregister_memory(*copy_lkey);
        }
    }
}

/// The in-cache design's pool: one per daemon, registered in each PD that
/// has a QP using it.
pub struct Pool {
    staging: Staging,
    /// Free buffers, the most recently freed last (taken first).
    free: Mutex<Vec<u32>>,
    /// The pool's key in each PD (of each device: PD numbers are a
    /// device's own), and how many QPs use it.
    keys: Mutex<HashMap<(usize, PdId), (u32, usize)>>,
}

impl Pool {
    pub fn new(counters: &Arc<OffloadCounters>) -> Pool {
        Pool {
            staging: Staging::new(IN_CACHE_BUFFERS, counters),
            // Reversed so that buffer 0 is taken first.
            free: Mutex::new((0..IN_CACHE_BUFFERS as u32).rev().collect()),
            keys: Mutex::new(HashMap::new()),
        }
    }

    fn join(&self, nic: &Nic, pd: PdId) -> Result<u32> {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((lkey, users)) = keys.get_mut(&(device_key(nic), pd)) {
            *users += 1;
            return Ok(*lkey);
        }
        let lkey = self.staging.register(nic, pd)?;
        keys.insert((device_key(nic), pd), (lkey, 1));
        Ok(lkey)
    }

    fn leave(&self, nic: &Nic, pd: PdId) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let key = (device_key(nic), pd);
        if let Some((lkey, users)) = keys.get_mut(&key) {
            *users -= 1;
            if *users == 0 {
                let _ = nic.deregister_memory(*lkey);
                keys.remove(&key);
            }
        }
    }

    fn take(&self) -> Option<u32> {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, buffer: u32) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
    }
}

/// Names a device while it is open (a device's last QP leaves the pool
/// before the device closes).
fn device_key(nic: &Nic) -> usize {
    nic as *const Nic as usize
}

/// Where a QP's staging buffers come from.
enum Buffers {
    /// A ring of its own: its free buffers, oldest first.
    Own { staging: Staging, lkey: u32, free: VecDeque<u32> },
    /// The daemon's pool, under the key it has in the QP's PD.
    Shared { pool: Arc<Pool>, lkey: u32 },
}

/// A receive posted to the engine on the program's behalf.
struct Posted {
    /// The engine's `wr_id` for it.
    token: u64,
    request: RecvWorkRequest,
    /// The staging buffer it lands in; `None` when posted as it was.
    buffer: Option<u32>,
}

/// A QP's receive design: the program's receives, matched in order with
/// the staging buffers the engine fills.
pub struct RxStage {
    buffers: Buffers,
    pd: PdId,
    /// The QP's receive depth: the most receives it holds, posted and
    /// waiting together (so a program that posts past it waits in its ring).
    depth: usize,
    posted: VecDeque<Posted>,
    /// The program's receives that wait for a pool buffer, in order.
    waiting: VecDeque<RecvWorkRequest>,
    next_token: u64,
}

impl RxStage {
    /// `per-connection`: a ring of `depth` buffers for a QP of `pd`.
    fn own(nic: &Nic, pd: PdId, depth: u32, counters: &Arc<OffloadCounters>) -> Result<RxStage> {
        let staging = Staging::new(depth as usize, counters);
        let lkey = staging.register(nic, pd)?;
        Ok(RxStage::with(Buffers::Own { staging, lkey, free: (0..depth).collect() }, pd, depth))
    }

    /// `in-cache`: the daemon's pool, for a QP of `pd` with `depth`
    /// receive requests.
    fn shared(nic: &Nic, pd: PdId, depth: u32, pool: &Arc<Pool>) -> Result<RxStage> {
        Ok(RxStage::with(Buffers::Shared { pool: pool.clone(), lkey: pool.join(nic, pd)? }, pd, depth))
    }

    fn with(buffers: Buffers, pd: PdId, depth: u32) -> RxStage {
        RxStage { buffers, pd, depth: depth as usize, posted: VecDeque::new(), waiting: VecDeque::new(), next_token: 0 }
    }

    /// Whether a receive takes its buffer when a message arrives for it
    /// (the in-cache pool) rather than when the program posts it (a ring
    /// of the QP's own).
    fn binds_at_arrival(&self) -> bool {
        matches!(self.buffers, Buffers::Shared { .. })
    }

    /// Takes the program's receive `request`: posts a staging buffer for
    /// it to the QP through `post` (the processor's `ibv_post_recv` to the
    /// engine, or the engine's fetch on demand's), or keeps it until one frees;
    /// in-cache, until a message arrives for it.
    pub fn post(
        &mut self,
        post: &mut impl FnMut(RecvWorkRequest) -> Result<()>,
        request: RecvWorkRequest,
        counters: &OffloadCounters,
    ) -> Result<()> {
        if self.waiting.len() + self.posted.len() >= self.depth {
            return Err(VerbsError::OutOfResources("the receive queue is full".into()));
        }
        if self.waiting.is_empty() && !self.binds_at_arrival() && self.try_post(post, &request, counters)? {
            return Ok(());
        }
        self.waiting.push_back(request);
        Ok(())
    }

    /// Whether an in-cache receive already waits for the next message:
    /// then the program's ring, whose entries come after it, need not be
    /// read for this one (the processor takes them on its pass).
    pub fn has_a_receive_for_arrival(&self) -> bool {
        self.binds_at_arrival() && !self.waiting.is_empty()
    }

    /// The engine's fetch on demand, for a message that found no receive:
    /// in-cache, the first waiting receive takes the pool's most recently
    /// freed buffer, for this message; with a ring of the QP's own, every
    /// waiting receive its free buffers allow is posted.
    pub fn message_arrived(
        &mut self,
        post: &mut impl FnMut(RecvWorkRequest) -> Result<()>,
        counters: &OffloadCounters,
    ) {
        if !self.binds_at_arrival() {
            self.post_waiting(post, counters);
            return;
        }
        let Some(request) = self.waiting.pop_front() else { return };
        // With no free buffer (or a QP that takes no receives now) the
        // receive waits on and the message is RNR NAKed: the pool bounds
        // the working set.
        if !matches!(self.try_post(post, &request, counters), Ok(true)) {
            self.waiting.push_front(request);
        }
    }

    /// Posts the receives that waited for buffers of the QP's own ring, in
    /// order, while buffers last (in-cache receives wait for their
    /// message instead). Returns whether it posted any.
    pub fn post_waiting(
        &mut self,
        post: &mut impl FnMut(RecvWorkRequest) -> Result<()>,
        counters: &OffloadCounters,
    ) -> bool {
        if self.binds_at_arrival() {
            return false;
        }
        let mut posted = false;
        while let Some(request) = self.waiting.pop_front() {
            // No free buffer, or the QP takes no receives now (RESET): it
            // waits on, in order.
            if !matches!(self.try_post(post, &request, counters), Ok(true)) {
                self.waiting.push_front(request);
                break;
            }
            posted = true;
        }
        posted
    }

    /// The QP is in the error state: every receive the stage keeps goes
    /// to the engine as the program posted it, without a staging buffer,
    /// and flushes there with the program's `wr_id` (those posted with a
    /// buffer flush from the engine's queue and give the buffer back).
    /// In-cache receives wait for a message that will not come, so
    /// without this they would never complete.
    pub fn flush(&mut self, post: &mut impl FnMut(RecvWorkRequest) -> Result<()>) {
        while let Some(request) = self.waiting.pop_front() {
            if self.post_with(post, &request, None).is_err() {
                self.waiting.push_front(request);
                break;
            }
        }
    }

    fn try_post(
        &mut self,
        post: &mut impl FnMut(RecvWorkRequest) -> Result<()>,
        request: &RecvWorkRequest,
        counters: &OffloadCounters,
    ) -> Result<bool> {
        let len = request.sges.iter().map(|s| s.length as usize).sum::<usize>();
        let staging = if len > SLOT {
            counters.rx_passed.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            let Some(buffer) = self.take() else { return Ok(false) };
            Some((buffer, len))
        };
        self.post_with(post, request, staging)?;
        Ok(true)
    }

    /// Posts `request` under a token of the stage's, into `staging` (a
    /// staging buffer and the request's length) or, without one, into the
    /// program's own buffers. A refused post gives the buffer back.
    fn post_with(
        &mut self,
        post: &mut impl FnMut(RecvWorkRequest) -> Result<()>,
        request: &RecvWorkRequest,
        staging: Option<(u32, usize)>,
    ) -> Result<()> {
        let token = self.next_token;
        let (sges, buffer) = match staging {
            Some((buffer, len)) => (SgeList::from_iter([self.sge(buffer, len)]), Some(buffer)),
            None => (request.sges.clone(), None),
        };
        if let Err(e) = post(RecvWorkRequest { wr_id: token, sges }) {
            if let Some(buffer) = buffer {
                self.give_back(buffer);
            }
            return Err(e);
        }
        self.next_token += 1;
        self.posted.push_back(Posted { token, request: request.clone(), buffer });
        Ok(())
    }

    /// Turns the engine's completion of a staged receive into the
    /// program's: its payload copied into the program's buffers, its own
    /// `wr_id`. The buffer is free again. Returns false when the program's
    /// buffers fail their check (the completion then says so, as the
    /// engine's would, and the QP must move to the error state).
    pub fn complete(&mut self, completion: &mut Completion, memory: &MemoryTable, counters: &OffloadCounters) -> bool {
        let Some(at) = self.posted.iter().position(|p| p.token == completion.wr_id) else {
            return true; // not one of the stage's: nothing to translate
        };
        let posted = self.posted.remove(at).expect("a position found above");
        completion.wr_id = posted.request.wr_id;
        let Some(buffer) = posted.buffer else { return true };
        let mut fine = true;
        // A WRITE with immediate consumes the receive but lands in place:
        // its byte_len is the WRITE's, and nothing is in the buffer.
        if completion.status == WcStatus::Success && completion.opcode == WcOpcode::Recv {
            let len = completion.byte_len as usize;
            match self.copy_out(buffer, len, &posted.request.sges, memory) {
                Ok(()) => {
                    counters.rx_copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
                    counters.rx_staged.fetch_add(1, Ordering::Relaxed);
                }
                // A message longer than the receive failed on the staging
                // buffer, posted at the receive's length; here the
                // program's key, bounds or access failed.
                Err(_) => (completion.status, fine) = (WcStatus::LocProtErr, false),
            }
        }
        self.give_back(buffer);
        fine
    }

    /// Copies `len` bytes of staging buffer `buffer` into the scatter list.
    fn copy_out(
        &self,
        buffer: u32,
        len: usize,
        sges: &SgeList,
        memory: &MemoryTable,
    ) -> std::result::Result<(), AccessFault> {
        let staging = self.staging();
        let mut from = buffer as usize * SLOT;
        let mut left = len;
        for sge in sges.iter() {
            if left == 0 {
                break;
            }
            let take = left.min(sge.length as usize);
            memory.check(self.pd, sge.lkey, sge.addr, take, Access::LOCAL_WRITE)?.copy_from(&staging.buffer, from);
            (from, left) = (from + take, left - take);
        }
        Ok(())
    }

    fn staging(&self) -> &Staging {
        match &self.buffers {
            Buffers::Own { staging, .. } => staging,
            Buffers::Shared { pool, .. } => &pool.staging,
        }
    }

    fn sge(&self, buffer: u32, length: usize) -> Sge {
        let lkey = match &self.buffers {
            Buffers::Own { lkey, .. } | Buffers::Shared { lkey, .. } => *lkey,
        };
        self.staging().sge(lkey, buffer as usize, length)
    }

    fn take(&mut self) -> Option<u32> {
        match &mut self.buffers {
            Buffers::Own { free, .. } => free.pop_front(),
            Buffers::Shared { pool, .. } => pool.take(),
        }
    }

    fn give_back(&mut self, buffer: u32) {
        match &mut self.buffers {
            Buffers::Own { free, .. } => free.push_back(buffer),
            Buffers::Shared { pool, .. } => pool.give_back(buffer),
        }
    }

    /// RESET: the engine discarded the receives posted to it, and the
    /// ones the stage keeps go too; every staging buffer is free again.
    pub fn reset(&mut self) {
        self.waiting.clear();
        for posted in std::mem::take(&mut self.posted) {
            if let Some(buffer) = posted.buffer {
                self.give_back(buffer);
            }
        }
    }

    /// Frees the QP's buffers (the QP is gone). Returns the registration,
    /// which the caller undoes once it has let the stage's lock go: the
    /// engine's fetch on demand waits for that lock in whichever thread
    /// drives the QP's shard, so no one calls into the engine under it
    /// beyond posting receives (which never waits for a shard's pass).
    pub fn release(&mut self) -> Registration {
        self.reset();
        match &self.buffers {
            Buffers::Own { lkey, .. } => Registration::Own(*lkey),
            Buffers::Shared { pool, .. } => Registration::Pool(pool.clone(), self.pd),
        }
    }
}

/// A receive stage's registration, undone when its QP is gone.
pub enum Registration {
    /// Its own ring's key.
    Own(u32),
    /// Its PD's share of the pool.
    Pool(Arc<Pool>, PdId),
}

impl Registration {
    pub fn undo(self, nic: &Nic) {
        match self {
            Registration::Own(lkey) => {
                let _ = nic.deregister_memory(lkey);
            }
            Registration::Pool(pool, pd) => pool.leave(nic, pd),
        }
    }
}

/// Whether a completion is a receive's, which a staged QP must translate.
pub fn is_receive(completion: &Completion) -> bool {
    matches!(completion.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_line_reads_back() {
        let stats = OffloadStats {
            tx_copied_bytes: 1 << 40,
            tx_staged: 2,
            tx_passed: 3,
            rx_copied_bytes: 4,
            rx_staged: 5,
            rx_passed: 6,
            staging_bytes: 7,
            staging_peak: 8,
        };
        let line = format!("softrnicd: {stats}");
        assert_eq!(
            line,
            "softrnicd: offload: tx copied 1099511627776 bytes in 2 sends, 3 passed; rx copied 4 bytes in 5 \
             receives, 6 passed; staging 7 bytes, at most 8"
        );
        assert_eq!(OffloadStats::parse(&line), Some(stats));
        assert_eq!(OffloadStats::parse("offload: tx copied 1 bytes"), None);
    }
}
