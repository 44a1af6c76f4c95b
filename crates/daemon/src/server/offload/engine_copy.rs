//! `softrnicd --tx engine-copy`: the engine itself pulls each payload into
//! a staging slot with an RDMA READ through a QP of the daemon's connected
//! to itself ([`super::copy_engine`]), as the original's DPU pulls it
//! across PCIe, and sends it from there once the READ completes. A QP's
//! sends still go to the engine in the order the program posted them.

use std::collections::VecDeque;
use std::sync::Arc;

use softrnic_engine::{Nic, SendQueue};
use softrnic_transport::memory::MemoryTable;
use softrnic_transport::{Payload, PdId, Result, SendWorkRequest, VerbsError};

use super::SendStage;
use super::copy_engine::CopyEngine;
use super::counters::OffloadCounters;
use super::staging::SendSlots;
use crate::server::processor::Sends;

/// Sends of one QP whose payloads the copy engine may be pulling at once.
pub const PULLS_PER_QP: usize = 16;

/// A QP's engine-copy stage.
pub struct EngineCopy {
    slots: SendSlots,
    /// The device's copy engine, and the staging area's key in its domain.
    engine: Arc<CopyEngine>,
    copy_lkey: u32,
    /// Sends staged so far: the next one takes this slot.
    staged: u64,
    /// Sends whose payloads are being pulled, in the order posted.
    pulls: VecDeque<Pull>,
    counters: Arc<OffloadCounters>,
}

/// A send behind the others of its QP.
struct Pull {
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

impl EngineCopy {
    /// The stage of a QP of `pd` whose engine holds `depth` sends, pulling
    /// through `engine`.
    pub fn new(
        nic: &Nic,
        pd: PdId,
        depth: u32,
        engine: &Arc<CopyEngine>,
        counters: &Arc<OffloadCounters>,
    ) -> Result<EngineCopy> {
        let slots = SendSlots::new(nic, pd, depth, PULLS_PER_QP, counters)?;
        let copy_lkey = match engine.register_staging(nic, slots.staging.buffer.clone(), slots.staging.iova()) {
            Ok(key) => key,
            Err(e) => {
                slots.release(nic);
                return Err(e);
            }
        };
        Ok(EngineCopy {
            slots,
            engine: engine.clone(),
            copy_lkey,
            staged: 0,
            pulls: VecDeque::new(),
            counters: counters.clone(),
        })
    }

    /// Starts pulling `wr`'s payload into the next slot, or lets it
    /// through as it is (the engine's gather) when it is not stageable or
    /// a region has no twin.
    fn pull(&mut self, nic: &Nic, wr: SendWorkRequest, memory: &MemoryTable) -> Pull {
        let (Some(len), Payload::Gather(sges)) = (self.slots.checked_len(&wr, memory), &wr.payload) else {
            return Pull { token: None, pulled: None, staged: wr.clone(), original: wr, len: 0 };
        };
        let n = self.staged;
        self.staged += 1;
        let token = self.engine.pull(nic, sges, self.copy_lkey, self.slots.addr(n));
        Pull { token, pulled: None, staged: self.slots.sent_from_slot(&wr, n, len), original: wr, len }
    }

    /// Posts the sends at the front whose payloads are in place (or whose
    /// pulls failed: the program's own request then), in order, while the
    /// send queue takes them. Returns a send the engine refused outright.
    fn finish_pulls(&mut self, queue: &mut SendQueue<'_>) -> Option<(u64, VerbsError)> {
        while let Some(front) = self.pulls.front_mut() {
            if let (Some(token), None) = (front.token, front.pulled) {
                front.pulled = self.engine.take(token);
            }
            let (wr, copied) = match (front.token, front.pulled) {
                (Some(_), None) => break, // still pulling
                (Some(_), Some(true)) => (front.staged.clone(), Some(front.len)),
                _ => (front.original.clone(), None),
            };
            let wr_id = wr.wr_id;
            match queue.post(wr) {
                Ok(()) => self.counters.sent(copied),
                Err(VerbsError::OutOfResources(_)) => break,
                Err(e) => {
                    self.pulls.pop_front();
                    return Some((wr_id, e));
                }
            }
            self.pulls.pop_front();
        }
        None
    }
}

impl SendStage for EngineCopy {
    /// New sends start their pulls, and those whose payloads are in place
    /// go to the engine. The copy engine is driven (polled, posted to)
    /// before the QP's send queue is taken: with inline progress its calls
    /// drive the shard, which takes that queue.
    fn move_sends(&mut self, sends: &mut Sends<'_>) -> bool {
        if self.pulls.is_empty() && sends.is_empty() {
            return false;
        }
        let nic = sends.nic();
        self.engine.poll(nic);
        // Taken at the first new entry: most passes only finish pulls.
        let mut memory = None;
        let moved = sends.take(|wr| {
            if self.pulls.len() >= PULLS_PER_QP {
                return Err(VerbsError::OutOfResources("the copy engine is pulling enough for this QP".into()));
            }
            let memory = memory.get_or_insert_with(|| nic.memory());
            let pull = self.pull(nic, wr, memory);
            self.pulls.push_back(pull);
            Ok(())
        });
        let mut queue = nic.send_queue(sends.posts());
        let refused = self.finish_pulls(&mut queue);
        drop(queue);
        if let Some((wr_id, e)) = refused {
            sends.refuse(wr_id, e);
        }
        // While pulls are under way the processor keeps looking (no
        // sleep): their READs complete within microseconds.
        moved > 0 || !self.pulls.is_empty()
    }

    /// The pulls under way are forgotten and the registrations go.
    fn release(self: Box<Self>, nic: &Nic) {
        self.slots.release(nic);
        self.pulls.iter().filter_map(|p| p.token).for_each(|t| self.engine.abandon(t));
        let _ = nic.deregister_memory(self.copy_lkey);
    }
}
