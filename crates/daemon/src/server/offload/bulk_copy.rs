//! `softrnicd --tx bulk-copy`: the command processor copies each payload
//! whole into a staging slot of the daemon's, one copy per gather entry
//! (a DMA engine's bulk copy), and the engine sends from there.

use std::sync::Arc;

use softrnic_engine::Nic;
use softrnic_transport::memory::MemoryTable;
use softrnic_transport::{Access, Payload, PdId, Result, SendWorkRequest};

use super::SendStage;
use super::counters::OffloadCounters;
use super::staging::SendSlots;
use crate::server::processor::Sends;

/// A QP's bulk-copy stage.
pub struct BulkCopy {
    slots: SendSlots,
    /// Sends staged so far: the next one takes this slot.
    staged: u64,
    counters: Arc<OffloadCounters>,
}

impl BulkCopy {
    /// The stage of a QP of `pd` whose engine holds `depth` sends.
    pub fn new(nic: &Nic, pd: PdId, depth: u32, counters: &Arc<OffloadCounters>) -> Result<BulkCopy> {
        Ok(BulkCopy { slots: SendSlots::new(nic, pd, depth, 0, counters)?, staged: 0, counters: counters.clone() })
    }

    /// The send to post for `wr`, its payload copied whole into slot `n`,
    /// with the bytes copied; or `wr` as it was.
    fn stage(&self, wr: SendWorkRequest, memory: &MemoryTable, n: u64) -> (SendWorkRequest, Option<usize>) {
        let (Some(len), Payload::Gather(sges)) = (SendSlots::stageable_len(&wr), &wr.payload) else {
            return (wr, None);
        };
        // Each entry checked once, as it is copied; one that fails leaves
        // the request to the engine, which fails it (a slot half written
        // is no one's).
        let mut at = self.slots.offset(n);
        for sge in sges.iter() {
            let Ok(view) = memory.check(self.slots.pd, sge.lkey, sge.addr, sge.length as usize, Access::empty()) else {
                return (wr, None);
            };
            view.copy_to(&self.slots.staging.buffer, at);
            at += sge.length as usize;
        }
        (self.slots.sent_from_slot(&wr, n, len), Some(len))
    }
}

impl SendStage for BulkCopy {
    fn move_sends(&mut self, sends: &mut Sends<'_>) -> bool {
        sends.stage_each(|wr, memory, post| {
            let (wr, copied) = self.stage(wr, memory, self.staged);
            post(wr)?;
            // The slot is the next send's only once this one is posted.
            self.staged += u64::from(copied.is_some());
            self.counters.sent(copied);
            Ok(())
        })
    }

    fn release(self: Box<Self>, nic: &Nic) {
        self.slots.release(nic);
    }
}
