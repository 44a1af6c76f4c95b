//! The daemon's memory that payloads pass through in the copying designs:
//! buffers of [`SLOT`] bytes, registered for local access only, so no key
//! a peer could learn reaches them.

use std::sync::Arc;

use softrnic_engine::Nic;
use softrnic_transport::memory::MemoryTable;
use softrnic_transport::{
    Access, DmaBuffer, Payload, PdId, Registration, Result, SendOp, SendWorkRequest, Sge, SgeList,
};

use super::counters::OffloadCounters;

/// Bytes of one staging buffer: an 8 KiB payload and its headers, the size
/// of the original's receive buffers.
pub const SLOT: usize = 8448;

/// `slots` buffers of [`SLOT`] bytes, counted as held while they live.
pub struct Staging {
    pub buffer: Arc<DmaBuffer>,
    counters: Arc<OffloadCounters>,
}

impl Staging {
    pub fn new(slots: usize, counters: &Arc<OffloadCounters>) -> Staging {
        counters.hold(slots * SLOT);
        Staging { buffer: Arc::new(DmaBuffer::new(slots * SLOT)), counters: counters.clone() }
    }

    /// Its IOVA is its address, so each registration names it the same way.
    pub fn iova(&self) -> u64 {
        self.buffer.as_ptr() as u64
    }

    /// Registers it in `pd` for local access only. Returns the lkey.
    pub fn register(&self, nic: &Nic, pd: PdId) -> Result<u32> {
        let len = self.buffer.len();
        let registration = Registration {
            pd,
            buffer: self.buffer.clone(),
            offset: 0,
            len,
            iova: self.iova(),
            access: Access::LOCAL_WRITE,
        };
        Ok(nic.register_memory(registration)?.lkey)
    }

    /// The first `length` bytes of buffer `slot`, under `lkey`.
    pub fn sge(&self, lkey: u32, slot: usize, length: usize) -> Sge {
        Sge { addr: self.iova() + (slot * SLOT) as u64, length: length as u32, lkey }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        self.counters.release(self.buffer.len());
    }
}

/// A QP's staging slots for sends, registered in its PD, used in turn: a
/// slot for each send the engine may hold, one for each send being
/// prepared, plus one. The engine completes a QP's sends in order and
/// accepts no more than its depth, so when a send takes slot `n`, the one
/// that last used it (that many sends ago) is done with it; and a post
/// that fails (the queue full) leaves the slot to the same send's retry.
pub struct SendSlots {
    pub staging: Staging,
    pub lkey: u32,
    pub pd: PdId,
    slots: usize,
}

impl SendSlots {
    /// `depth` sends the engine may hold and `preparing` more, for a QP of
    /// `pd`.
    pub fn new(
        nic: &Nic,
        pd: PdId,
        depth: u32,
        preparing: usize,
        counters: &Arc<OffloadCounters>,
    ) -> Result<SendSlots> {
        let slots = depth as usize + preparing + 1;
        let staging = Staging::new(slots, counters);
        let lkey = staging.register(nic, pd)?;
        Ok(SendSlots { staging, lkey, pd, slots })
    }

    /// Where the `n`th staged send's payload goes, as a byte offset.
    pub fn offset(&self, n: u64) -> usize {
        self.slot(n) * SLOT
    }

    /// Where the `n`th staged send's payload goes, as an address under
    /// the staging area's registrations.
    pub fn addr(&self, n: u64) -> u64 {
        self.staging.iova() + self.offset(n) as u64
    }

    fn slot(&self, n: u64) -> usize {
        (n % self.slots as u64) as usize
    }

    /// The payload's length if a design may stage `wr`: a SEND or WRITE
    /// gathering 1 to [`SLOT`] bytes. Larger sends, READs, atomics and
    /// inline data go as the program posted them.
    pub fn stageable_len(wr: &SendWorkRequest) -> Option<usize> {
        let len = wr.payload.len() as usize;
        let kind = matches!(wr.op, SendOp::Send { .. } | SendOp::Write { .. });
        (kind && matches!(wr.payload, Payload::Gather(_)) && (1..=SLOT).contains(&len)).then_some(len)
    }

    /// [`SendSlots::stageable_len`], for a send whose memory also checks
    /// out in the QP's domain. Anything else is the engine's to gather
    /// (and to fail, as it fails any request whose memory does not check
    /// out).
    pub fn checked_len(&self, wr: &SendWorkRequest, memory: &MemoryTable) -> Option<usize> {
        let Payload::Gather(sges) = &wr.payload else { return None };
        let fine =
            sges.iter().all(|s| memory.check(self.pd, s.lkey, s.addr, s.length as usize, Access::empty()).is_ok());
        Self::stageable_len(wr).filter(|_| fine)
    }

    /// `wr` sent from the `n`th staged send's slot, `len` bytes.
    pub fn sent_from_slot(&self, wr: &SendWorkRequest, n: u64, len: usize) -> SendWorkRequest {
        let mut staged = wr.clone();
        staged.payload = Payload::Gather(SgeList::from_iter([self.staging.sge(self.lkey, self.slot(n), len)]));
        staged
    }

    /// The staging area's registration goes (the QP is gone).
    pub fn release(&self, nic: &Nic) {
        let _ = nic.deregister_memory(self.lkey);
    }
}
