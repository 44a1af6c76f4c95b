//! `Control`: a device's control plane. It owns what every shard shares
//! (protection domains and memory regions, completion queues, shared
//! receive queues, the QP number space) and runs the verbs that create and
//! destroy them. The data path never goes through it: queue pairs hold
//! their CQs and SRQs directly, and shards read the memory table through a
//! snapshot that the control plane replaces whenever it changes.

use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::completion::{CompletionQueue, CompletionQueues, CqId};
use crate::config::TransportConfig;
use crate::entropy::{Entropy, Recent};
use crate::error::{Result, VerbsError};
use crate::limits::MAX_QP;
use crate::memory::DmaBuffer;
use crate::memory::{MemoryTable, MrKeys, PdId, ProtectionDomains, Registration, WindowType, window_handle};
use crate::qp::{QpInitAttr, QpQueues, QpType, QueuePair};
use crate::shard::shard_of;
use crate::srq::{SharedReceiveQueue, SharedReceiveQueues, SrqAttr, SrqId};
use softrnic_wire::mad::GSI_QPN;

/// The first QP number handed out; 0 and 1 are the special QPs of verbs.
const FIRST_QPN: u32 = 0x11;
const MAX_QPN: u32 = (1 << 24) - 1;
/// Draws of a QP number that all find one taken before the space is
/// called full (each does with a chance of a quarter at most).
const DRAWS_BEFORE_GIVING_UP: usize = 64;

/// The device-wide objects of one RNIC.
#[derive(Debug)]
pub struct Control {
    config: TransportConfig,
    shards: usize,
    /// The current memory table. Copy-on-write: shards hold the snapshot
    /// they were given until [`Control::take_memory_update`] hands them
    /// the next one.
    memory: Arc<MemoryTable>,
    memory_changed: bool,
    pds: ProtectionDomains,
    cqs: CompletionQueues,
    srqs: SharedReceiveQueues,
    /// QP numbers in use.
    qpns: FxHashSet<u32>,
    /// Where keys and QP numbers are drawn from.
    entropy: Entropy,
    /// Keys and QP numbers of objects destroyed lately, not drawn again
    /// for a while: a stale rkey never names a new region, and a late
    /// packet for a destroyed QP never lands on a new one.
    recent_keys: Recent,
    recent_qpns: Recent,
}

impl Control {
    /// The control plane of a device whose QPs are spread over `shards`,
    /// drawing its keys and QP numbers from `entropy`.
    pub fn new(config: TransportConfig, shards: usize, entropy: Entropy) -> Control {
        Control {
            config,
            shards: shards.max(1),
            memory: Arc::new(MemoryTable::new()),
            memory_changed: false,
            pds: ProtectionDomains::default(),
            cqs: CompletionQueues::default(),
            srqs: SharedReceiveQueues::default(),
            qpns: FxHashSet::default(),
            entropy,
            recent_keys: Recent::default(),
            recent_qpns: Recent::default(),
        }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.config
    }

    pub fn shards(&self) -> usize {
        self.shards
    }

    /// The memory table as it stands.
    pub fn memory(&self) -> &Arc<MemoryTable> {
        &self.memory
    }

    /// The new memory table, once after each change, for the caller to
    /// install in every shard (before the verb that changed it returns).
    pub fn take_memory_update(&mut self) -> Option<Arc<MemoryTable>> {
        std::mem::take(&mut self.memory_changed).then(|| self.memory.clone())
    }

    fn memory_mut(&mut self) -> &mut MemoryTable {
        self.memory_changed = true;
        Arc::make_mut(&mut self.memory)
    }

    // ----- protection domains and memory regions -----

    pub fn alloc_pd(&mut self) -> PdId {
        self.pds.alloc()
    }

    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.pds.dealloc(pd)
    }

    /// Registers `r` under two keys drawn at random (a peer that learns
    /// one rkey can infer no other key), never one let go of lately.
    pub fn register_memory(&mut self, r: Registration) -> Result<MrKeys> {
        self.pds.check(r.pd)?;
        let pd = r.pd;
        let (entropy, recent) = (&mut self.entropy, &self.recent_keys);
        let mut draw = || std::iter::repeat_with(|| entropy.u32()).find(|k| !recent.contains(*k)).unwrap();
        self.memory_changed = true;
        let keys = Arc::make_mut(&mut self.memory).register(r, &mut draw)?;
        self.pds.add_users(pd, 1)?;
        Ok(keys)
    }

    /// A new translation, PD or access for the region `lkey` names, under
    /// the same keys. Returns them, and the memory the region had, which
    /// the caller may keep for a while (as [`Control::deregister_memory`]'s).
    pub fn reregister_memory(&mut self, lkey: u32, r: Registration) -> Result<(MrKeys, Arc<DmaBuffer>)> {
        self.pds.check(r.pd)?;
        let pd = r.pd;
        let (keys, old) = self.memory_mut().reregister(lkey, r)?;
        self.pds.add_users(old.pd, -1)?;
        self.pds.add_users(pd, 1)?;
        Ok((keys, old.buffer))
    }

    /// Returns the region's memory, which the caller may keep for a while
    /// (peers on this host may still hold references to it in flight).
    pub fn deregister_memory(&mut self, lkey: u32) -> Result<Arc<DmaBuffer>> {
        let region = self.memory_mut().deregister(lkey)?;
        self.recent_keys.let_go(region.keys.lkey);
        self.recent_keys.let_go(region.keys.rkey);
        self.pds.add_users(region.pd, -1)?;
        Ok(region.buffer)
    }

    /// Allocates a memory window of `kind` in `pd` (`ibv_alloc_mw`),
    /// under an rkey drawn as a region's are, in a block no window freed
    /// lately had. Returns its first rkey.
    pub fn alloc_window(&mut self, pd: PdId, kind: WindowType) -> Result<u32> {
        self.pds.check(pd)?;
        let (entropy, recent) = (&mut self.entropy, &self.recent_keys);
        let mut draw =
            || std::iter::repeat_with(|| entropy.u32()).find(|&k| !recent.contains(window_handle(k))).unwrap();
        self.memory_changed = true;
        let rkey = Arc::make_mut(&mut self.memory).alloc_window(pd, kind, &mut draw)?;
        self.pds.add_users(pd, 1)?;
        Ok(rkey)
    }

    /// Frees the window `rkey` names (`ibv_dealloc_mw`), bound or not.
    pub fn dealloc_window(&mut self, rkey: u32) -> Result<()> {
        let window = self.memory_mut().dealloc_window(rkey)?;
        self.recent_keys.let_go(window_handle(window.rkey()));
        self.pds.add_users(window.pd, -1)
    }

    // ----- completion queues -----

    pub fn create_cq(&mut self, capacity: usize) -> Arc<CompletionQueue> {
        self.cqs.create(capacity)
    }

    pub fn cq(&self, cq: CqId) -> Option<&Arc<CompletionQueue>> {
        self.cqs.get(cq)
    }

    pub fn destroy_cq(&mut self, cq: CqId) -> Result<()> {
        self.cqs.destroy(cq)
    }

    // ----- shared receive queues -----

    pub fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Result<Arc<SharedReceiveQueue>> {
        self.pds.check(pd)?;
        let srq = self.srqs.create(pd, attr)?;
        self.pds.add_users(pd, 1)?;
        Ok(srq)
    }

    pub fn srq(&self, srq: SrqId) -> Result<&Arc<SharedReceiveQueue>> {
        self.srqs.get(srq)
    }

    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        let pd = self.srqs.get(srq)?.pd();
        self.srqs.destroy(srq)?;
        self.pds.add_users(pd, -1)
    }

    // ----- queue pairs -----

    /// Creates a QP for shard `shard`: its number is one the steering
    /// program sends to that shard. The caller hands it to the shard.
    pub fn create_qp(&mut self, init: QpInitAttr, shard: usize) -> Result<QueuePair> {
        self.create_numbered_qp(init, shard, None)
    }

    /// Creates the device's General Services Interface: the UD QP numbered
    /// 1 that CM agents (and every IBTA management agent) send their MADs
    /// to. Returns it with the shard it belongs to. A device has one.
    pub fn create_gsi_qp(&mut self, init: QpInitAttr) -> Result<(usize, QueuePair)> {
        if init.qp_type != QpType::Ud {
            return Err(VerbsError::invalid("the GSI QP is a UD QP"));
        }
        if self.qpns.contains(&GSI_QPN) {
            return Err(VerbsError::Busy("the device's GSI QP (QP1)"));
        }
        let shard = shard_of(GSI_QPN, self.shards);
        self.create_numbered_qp(init, shard, Some(GSI_QPN)).map(|qp| (shard, qp))
    }

    /// [`Control::create_qp`], with the number `qpn` if given (it is free
    /// and belongs to `shard`) or else one drawn.
    fn create_numbered_qp(&mut self, init: QpInitAttr, shard: usize, qpn: Option<u32>) -> Result<QueuePair> {
        assert!(shard < self.shards, "shard {shard} of {}", self.shards);
        self.pds.check(init.pd)?;
        let (Some(send_cq), Some(recv_cq)) = (self.cqs.get(init.send_cq), self.cqs.get(init.recv_cq)) else {
            return Err(VerbsError::NotFound("completion queue"));
        };
        let srq = init.srq.map(|srq| self.srqs.get(srq).cloned()).transpose()?;
        if init.caps.max_send_wr == 0 && init.caps.max_recv_wr == 0 && init.srq.is_none() {
            return Err(VerbsError::invalid("a QP needs a send or a receive queue"));
        }
        if self.qpns.len() >= MAX_QP as usize {
            return Err(VerbsError::OutOfResources(format!("queue pairs: the device has {MAX_QP}")));
        }
        let queues = QpQueues { send_cq: send_cq.clone(), recv_cq: recv_cq.clone(), srq };
        let qpn = match qpn {
            Some(qpn) => qpn,
            None => self.allocate_qpn(shard)?,
        };
        queues.send_cq.add_shard(shard);
        queues.recv_cq.add_shard(shard);
        self.pds.add_users(init.pd, 1)?;
        self.cqs.add_user(init.send_cq, 1);
        self.cqs.add_user(init.recv_cq, 1);
        if let Some(srq) = init.srq {
            self.srqs.add_user(srq, 1);
        }
        self.qpns.insert(qpn);
        Ok(QueuePair::new(qpn, init, queues))
    }

    /// A QP number of `shard`'s set, drawn at random from those free and
    /// not let go of lately, so that no one can guess a QP's number from
    /// another's.
    fn allocate_qpn(&mut self, shard: usize) -> Result<u32> {
        // The shard's set: every n in FIRST_QPN..=MAX_QPN with n % shards
        // == shard, at least 2^24 / 64 numbers, of which the device's
        // MAX_QP live and Recent::HELD held back use a quarter at most: a
        // draw finds a free one in under two tries on average.
        let shards = self.shards as u32;
        let first = FIRST_QPN + (shard as u32 + shards - FIRST_QPN % shards) % shards;
        let count = (MAX_QPN - first) / shards + 1;
        for _ in 0..DRAWS_BEFORE_GIVING_UP {
            let qpn = first + self.entropy.u32() % count * shards;
            debug_assert_eq!(shard_of(qpn, self.shards), shard);
            if !self.qpns.contains(&qpn) && !self.recent_qpns.contains(qpn) {
                return Ok(qpn);
            }
        }
        Err(VerbsError::OutOfResources("queue pair numbers".into()))
    }

    /// Releases what a destroyed QP (taken back from its shard) held.
    pub fn destroy_qp(&mut self, qp: QueuePair) -> Result<()> {
        let init = *qp.init_attr();
        self.qpns.remove(&qp.qpn());
        self.recent_qpns.let_go(qp.qpn());
        self.pds.add_users(init.pd, -1)?;
        self.cqs.add_user(init.send_cq, -1);
        self.cqs.add_user(init.recv_cq, -1);
        if let Some(srq) = init.srq {
            self.srqs.add_user(srq, -1);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Access;
    use crate::qp::{QpCaps, QpType};

    /// A control plane of `shards` seeded with `seed`, and what an RC QP
    /// of its first PD, on its first CQ, is created with.
    fn control_with_qp_init(shards: usize, seed: u64) -> (Control, QpInitAttr) {
        let mut control = Control::new(TransportConfig::default(), shards, Entropy::from_u64(seed));
        let pd = control.alloc_pd();
        let cq = control.create_cq(16).id();
        let caps = QpCaps::default();
        (control, QpInitAttr { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, srq: None, caps, sq_sig_all: false })
    }

    #[test]
    fn qp_numbers_land_on_the_shard_that_asked_and_are_not_reused_at_once() {
        let (mut control, init) = control_with_qp_init(4, 4);
        let cq = init.send_cq;
        let mut seen = Vec::new();
        for shard in [0, 3, 3, 1, 2, 0] {
            let qp = control.create_qp(init, shard).unwrap();
            assert_eq!(shard_of(qp.qpn(), 4), shard);
            assert!(!seen.contains(&qp.qpn()));
            seen.push(qp.qpn());
            control.destroy_qp(qp).unwrap();
        }
        assert!(control.cq(cq).unwrap().shards() == 0b1111, "every shard posts to the CQ");
    }

    /// A QP's number tells nothing of the next one's: numbers are drawn
    /// over the whole of a shard's set, never repeat while in use or soon
    /// after, and the device refuses QPs beyond its limit.
    #[test]
    fn qp_numbers_are_drawn_over_the_shards_set() {
        let (mut control, init) = control_with_qp_init(4, 9);
        let qps: Vec<QueuePair> = (0..256).map(|_| control.create_qp(init, 2).unwrap()).collect();
        let numbers: FxHashSet<u32> = qps.iter().map(|qp| qp.qpn()).collect();
        assert_eq!(numbers.len(), 256);
        assert!(numbers.iter().all(|&n| shard_of(n, 4) == 2 && (FIRST_QPN..=MAX_QPN).contains(&n)));
        let (low, high) = (numbers.iter().min().unwrap(), numbers.iter().max().unwrap());
        assert!(high - low > MAX_QPN / 2, "spread over the space: {low:#x}..{high:#x}");
        // Destroyed and created again, many times over: a number let go
        // of is not drawn again within the next Recent::HELD.
        let mut history = Vec::new();
        for qp in qps {
            history.push(qp.qpn());
            control.destroy_qp(qp).unwrap();
        }
        for _ in 0..Recent::HELD {
            let qp = control.create_qp(init, 2).unwrap();
            history.push(qp.qpn());
            control.destroy_qp(qp).unwrap();
        }
        let window: FxHashSet<u32> = history[history.len() - Recent::HELD..].iter().copied().collect();
        assert_eq!(window.len(), Recent::HELD, "no number twice among the last HELD");
        // The device's limit, however the numbers fall.
        let live: Vec<QueuePair> = (0..MAX_QP).map(|_| control.create_qp(init, 2).unwrap()).collect();
        let refused = control.create_qp(init, 2).map(|_| ()).unwrap_err();
        assert!(refused.to_string().contains("queue pairs"), "{refused}");
        assert_eq!(live.iter().map(|qp| qp.qpn()).collect::<FxHashSet<_>>().len(), MAX_QP as usize);
    }

    #[test]
    fn memory_keys_let_go_of_are_not_drawn_again_soon() {
        let mut control = Control::new(TransportConfig::default(), 1, Entropy::from_u64(3));
        let pd = control.alloc_pd();
        let buffer = Arc::new(crate::DmaBuffer::new(8));
        let r = || Registration { pd, buffer: buffer.clone(), offset: 0, len: 8, iova: 0, access: Access::REMOTE_READ };
        let mut keys = Vec::new();
        for _ in 0..Recent::HELD / 2 {
            let k = control.register_memory(r()).unwrap();
            assert_ne!(k.lkey, k.rkey);
            keys.extend([k.lkey, k.rkey]);
            control.deregister_memory(k.lkey).unwrap();
        }
        let distinct: FxHashSet<u32> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), keys.len(), "every key fresh");
    }

    /// A PD counts its regions, QPs and SRQs, wherever a reregistration
    /// moves a region, and is not deallocated while one uses it.
    #[test]
    fn a_pd_in_use_stays() {
        let mut control = Control::new(TransportConfig::default(), 1, Entropy::from_u64(5));
        let (pd, other) = (control.alloc_pd(), control.alloc_pd());
        let buffer = Arc::new(crate::DmaBuffer::new(8));
        let r = |pd| Registration { pd, buffer: buffer.clone(), offset: 0, len: 8, iova: 0, access: Access::empty() };
        let gone = PdId(9);
        assert_eq!(control.register_memory(r(gone)).unwrap_err(), VerbsError::NotFound("protection domain"));
        let keys = control.register_memory(r(pd)).unwrap();
        assert_eq!(control.dealloc_pd(pd), Err(VerbsError::Busy("protection domain")));
        assert_eq!(
            control.reregister_memory(keys.lkey, r(gone)).unwrap_err(),
            VerbsError::NotFound("protection domain")
        );
        assert_eq!(control.reregister_memory(keys.lkey, r(other)).map(|(keys, _)| keys), Ok(keys));
        assert_eq!(control.dealloc_pd(other), Err(VerbsError::Busy("protection domain")));
        control.dealloc_pd(pd).unwrap();
        control.deregister_memory(keys.lkey).unwrap();
        control.dealloc_pd(other).unwrap();
    }

    #[test]
    fn a_memory_change_is_handed_out_once() {
        let mut control = Control::new(TransportConfig::default(), 1, Entropy::from_u64(1));
        assert!(control.take_memory_update().is_none());
        let before = control.memory().clone();
        let pd = control.alloc_pd();
        assert!(control.take_memory_update().is_none(), "a PD is the control plane's alone");
        let buffer = Arc::new(crate::DmaBuffer::new(8));
        control
            .register_memory(Registration { pd, buffer, offset: 0, len: 8, iova: 0, access: Access::empty() })
            .unwrap();
        let after = control.take_memory_update().expect("the table changed");
        assert!(!Arc::ptr_eq(&before, &after), "copy on write leaves the old snapshot intact");
        assert!(control.take_memory_update().is_none());
    }
}
