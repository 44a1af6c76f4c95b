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
use crate::error::{Result, VerbsError};
use crate::memory::{MemoryTable, MrKeys, PdId, Registration};
use crate::qp::{QpInitAttr, QpQueues, QpType, QueuePair};
use crate::shard::shard_of;
use crate::srq::{SharedReceiveQueue, SharedReceiveQueues, SrqAttr, SrqId};
use softrnic_wire::mad::GSI_QPN;

/// The first QP number handed out; 0 and 1 are the special QPs of verbs.
const FIRST_QPN: u32 = 0x11;
const MAX_QPN: u32 = (1 << 24) - 1;

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
    cqs: CompletionQueues,
    srqs: SharedReceiveQueues,
    /// QP numbers in use.
    qpns: FxHashSet<u32>,
    /// Where the search for the next free QP number starts. QP numbers are
    /// not reused until the space wraps, so a late packet for a destroyed
    /// QP never lands on a new one.
    next_qpn: u32,
}

impl Control {
    /// The control plane of a device whose QPs are spread over `shards`.
    pub fn new(config: TransportConfig, shards: usize) -> Control {
        Control {
            config,
            shards: shards.max(1),
            memory: Arc::new(MemoryTable::new()),
            memory_changed: false,
            cqs: CompletionQueues::default(),
            srqs: SharedReceiveQueues::default(),
            qpns: FxHashSet::default(),
            next_qpn: FIRST_QPN,
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
        self.memory_mut().alloc_pd()
    }

    pub fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        self.memory_mut().dealloc_pd(pd)
    }

    pub fn register_memory(&mut self, r: Registration) -> Result<MrKeys> {
        self.memory_mut().register(r)
    }

    /// A new translation, PD or access for the region `lkey` names, under
    /// the same keys.
    pub fn reregister_memory(&mut self, lkey: u32, r: Registration) -> Result<MrKeys> {
        self.memory_mut().reregister(lkey, r)
    }

    pub fn deregister_memory(&mut self, lkey: u32) -> Result<()> {
        self.memory_mut().deregister(lkey)
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
        if !self.memory.pd_exists(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        let srq = self.srqs.create(pd, attr)?;
        self.memory_mut().pd_users(pd, 1)?;
        Ok(srq)
    }

    pub fn srq(&self, srq: SrqId) -> Result<&Arc<SharedReceiveQueue>> {
        self.srqs.get(srq)
    }

    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<()> {
        let pd = self.srqs.get(srq)?.pd();
        self.srqs.destroy(srq)?;
        self.memory_mut().pd_users(pd, -1)
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
    /// and belongs to `shard`) or else the next free one.
    fn create_numbered_qp(&mut self, init: QpInitAttr, shard: usize, qpn: Option<u32>) -> Result<QueuePair> {
        assert!(shard < self.shards, "shard {shard} of {}", self.shards);
        if !self.memory.pd_exists(init.pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        let (Some(send_cq), Some(recv_cq)) = (self.cqs.get(init.send_cq), self.cqs.get(init.recv_cq)) else {
            return Err(VerbsError::NotFound("completion queue"));
        };
        let srq = init.srq.map(|srq| self.srqs.get(srq).cloned()).transpose()?;
        if init.caps.max_send_wr == 0 && init.caps.max_recv_wr == 0 && init.srq.is_none() {
            return Err(VerbsError::invalid("a QP needs a send or a receive queue"));
        }
        let queues = QpQueues { send_cq: send_cq.clone(), recv_cq: recv_cq.clone(), srq };
        let qpn = match qpn {
            Some(qpn) => qpn,
            None => self.allocate_qpn(shard)?,
        };
        queues.send_cq.add_shard(shard);
        queues.recv_cq.add_shard(shard);
        self.memory_mut().pd_users(init.pd, 1)?;
        self.cqs.add_user(init.send_cq, 1);
        self.cqs.add_user(init.recv_cq, 1);
        if let Some(srq) = init.srq {
            self.srqs.add_user(srq, 1);
        }
        self.qpns.insert(qpn);
        Ok(QueuePair::new(qpn, init, queues))
    }

    /// The next free QP number that belongs to `shard`.
    fn allocate_qpn(&mut self, shard: usize) -> Result<u32> {
        let start = self.next_qpn;
        let mut qpn = start;
        loop {
            if shard_of(qpn, self.shards) == shard && !self.qpns.contains(&qpn) {
                self.next_qpn = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
                return Ok(qpn);
            }
            qpn = if qpn >= MAX_QPN { FIRST_QPN } else { qpn + 1 };
            if qpn == start {
                return Err(VerbsError::OutOfResources("queue pair numbers".into()));
            }
        }
    }

    /// Releases what a destroyed QP (taken back from its shard) held.
    pub fn destroy_qp(&mut self, qp: QueuePair) -> Result<()> {
        let init = *qp.init_attr();
        self.qpns.remove(&qp.qpn());
        self.memory_mut().pd_users(init.pd, -1)?;
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
    use crate::qp::{QpCaps, QpType};

    #[test]
    fn qp_numbers_land_on_the_shard_that_asked_and_are_not_reused_at_once() {
        let mut control = Control::new(TransportConfig::default(), 4);
        let pd = control.alloc_pd();
        let cq = control.create_cq(16).id();
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        };
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

    #[test]
    fn a_memory_change_is_handed_out_once() {
        let mut control = Control::new(TransportConfig::default(), 1);
        assert!(control.take_memory_update().is_none());
        let before = control.memory().clone();
        control.alloc_pd();
        let after = control.take_memory_update().expect("the table changed");
        assert!(!Arc::ptr_eq(&before, &after), "copy on write leaves the old snapshot intact");
        assert!(control.take_memory_update().is_none());
    }
}
