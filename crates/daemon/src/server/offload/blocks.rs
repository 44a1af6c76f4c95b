//! The block offload (E7): softrnicd as a storage NIC that knows the
//! blocks a QP carries ([`softrnic_daemon_protocol::block`]), asked for
//! QP by QP (`CreateQp`'s `blocks`), whatever the daemon's designs.
//!
//! - Sending ([`BlockSends`]): a block that carries a payload and whose
//!   CRC field is not the sender's own gets its CRC computed here, over
//!   the payload as it lies in the program's memory, and written into a
//!   copy of its header in a staging slot; the send gathers that header
//!   and the program's payload, which is read once and never copied.
//!   With a store, a read's answer posted as a header alone gathers its
//!   payload from the store at the block's offset.
//! - Receiving, CRC only ([`CheckedReceives`]): the engine writes each
//!   message straight into the program's buffer, and its completion says
//!   whether a block's CRC matched ([`BlockOutcome`]).
//! - Receiving with a store ([`Placement`], a staged receive): a message
//!   lands in a staging buffer; a write whose CRC matches has its payload
//!   placed into the store at its offset and the program's receive gets
//!   the header alone; a corrupt one stores nothing. Anything else is
//!   copied whole into the program's buffer, as a staged receive is.
//!
//! The offload parses what it knows and passes what it does not as it
//! came: a program's own messages (acknowledgements, its CRC already set)
//! go through untouched.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use softrnic_daemon_protocol::block::{BLOCK_LEN, BlockKind, BlockRepr, HEADER_LEN, crc32};
use softrnic_engine::Nic;
use softrnic_transport::memory::{AccessFault, MemoryTable};
use softrnic_transport::{
    Access, BlockOutcome, Completion, DmaBuffer, Payload, PdId, RecvWorkRequest, Result, SendOp, SendWorkRequest, Sge,
    SgeList, VerbsError, WcOpcode, WcStatus,
};

use super::staging::SendSlots;
use super::{Moment, Post, ReceiveStage, SendStage, Undo};
use crate::server::processor::Sends;

/// What the block offload did, for the line softrnicd prints as it stops.
#[derive(Debug, Default)]
pub struct BlockCounters {
    /// CRCs computed for blocks sent.
    computed: AtomicU64,
    /// CRCs checked on blocks received, and those that did not match.
    checked: AtomicU64,
    corrupt: AtomicU64,
    /// Payload bytes placed into stores, and gathered from them.
    placed_bytes: AtomicU64,
    gathered_bytes: AtomicU64,
}

impl BlockCounters {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Whether the offload has done anything at all.
    pub fn is_idle(&self) -> bool {
        self.computed.load(Ordering::Relaxed) == 0 && self.checked.load(Ordering::Relaxed) == 0
    }
}

impl std::fmt::Display for BlockCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "blocks: {} CRCs computed, {} checked, {} corrupt; {} bytes placed, {} gathered from stores",
            get(&self.computed),
            get(&self.checked),
            get(&self.corrupt),
            get(&self.placed_bytes),
            get(&self.gathered_bytes)
        )
    }
}

/// A region of the QP's domain that blocks are placed into and read from.
#[derive(Debug, Clone, Copy)]
pub struct Store {
    lkey: u32,
    pd: PdId,
}

impl Store {
    /// The region `lkey`, checked to be one the QP of `pd` may write.
    pub fn new(nic: &Nic, pd: PdId, lkey: u32) -> Result<Store> {
        let memory = nic.memory();
        let region = memory.lookup(lkey).ok_or(VerbsError::NotFound("store memory region"))?;
        if region.pd != pd || !region.access.contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::invalid(
                "a block store must be a region of the QP's protection domain with local write access",
            ));
        }
        Ok(Store { lkey, pd })
    }

    /// The store's `len` bytes at `offset`, if it has them and still grants
    /// `access` (the region may have been deregistered since), and the
    /// gather entry that names them.
    fn range<'m>(
        &self,
        memory: &'m MemoryTable,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Option<(softrnic_transport::memory::MemoryView<'m>, Sge)> {
        let addr = memory.lookup(self.lkey)?.iova.checked_add(offset)?;
        let view = memory.check(self.pd, self.lkey, addr, len, access).ok()?;
        Some((view, Sge { addr, length: len as u32, lkey: self.lkey }))
    }
}

/// Reads `out.len()` bytes of a scatter/gather list, from byte `skip` on.
fn read_list(
    memory: &MemoryTable,
    pd: PdId,
    sges: &SgeList,
    skip: usize,
    out: &mut [u8],
) -> std::result::Result<(), AccessFault> {
    let (mut skip, mut at) = (skip, 0);
    for sge in sges.iter() {
        if at == out.len() {
            break;
        }
        let length = sge.length as usize;
        if skip >= length {
            skip -= length;
            continue;
        }
        let take = (length - skip).min(out.len() - at);
        memory.check(pd, sge.lkey, sge.addr + skip as u64, take, Access::empty())?.read(&mut out[at..at + take]);
        (at, skip) = (at + take, 0);
    }
    match at == out.len() {
        true => Ok(()),
        false => Err(AccessFault::OutOfBounds),
    }
}

/// The entries of `sges` after its first `skip` bytes.
fn after(sges: &SgeList, skip: usize) -> SgeList {
    let mut skip = skip as u64;
    let mut rest = SgeList::new();
    for sge in sges.iter() {
        let length = u64::from(sge.length);
        if skip >= length {
            skip -= length;
            continue;
        }
        rest.push(Sge { addr: sge.addr + skip, length: (length - skip) as u32, lkey: sge.lkey });
        skip = 0;
    }
    rest
}

/// The header of a message held in a scatter/gather list, if it is a
/// block whose payload follows it in full (`len` the message's bytes).
fn block_with_payload(memory: &MemoryTable, pd: PdId, sges: &SgeList, len: usize) -> Option<BlockRepr> {
    let mut header = [0u8; HEADER_LEN];
    read_list(memory, pd, sges, 0, &mut header).ok()?;
    let repr = BlockRepr::parse_bytes(&header).ok()?;
    (repr.kind.carries_payload() && repr.message_len() == len).then_some(repr)
}

/// Whether `payload` is what `repr` says was sent.
fn verdict(repr: &BlockRepr, payload: &[u8], counters: &BlockCounters) -> BlockOutcome {
    BlockCounters::add(&counters.checked, 1);
    // A block nobody checksummed is as untrustworthy as a corrupt one.
    if repr.crc_set && crc32(payload) == repr.crc {
        BlockOutcome::Verified
    } else {
        BlockCounters::add(&counters.corrupt, 1);
        BlockOutcome::Corrupt
    }
}

/// A QP's sends, their blocks checksummed on the way out.
pub struct BlockSends {
    slots: SendSlots,
    /// Sends staged so far: the next one takes this slot.
    staged: u64,
    store: Option<Store>,
    counters: Arc<BlockCounters>,
}

impl BlockSends {
    /// The stage of a QP of `pd` whose engine holds `depth` sends.
    pub fn new(
        nic: &Nic,
        pd: PdId,
        depth: u32,
        store: Option<Store>,
        counters: (&Arc<super::OffloadCounters>, &Arc<BlockCounters>),
    ) -> Result<BlockSends> {
        let slots = SendSlots::new(nic, pd, depth, 0, counters.0)?;
        Ok(BlockSends { slots, staged: 0, store, counters: counters.1.clone() })
    }

    /// The send to post for `wr`, its header (with the CRC) from slot `n`;
    /// or `wr` as it was, and whether it took the slot.
    fn stage(&self, wr: SendWorkRequest, memory: &MemoryTable, n: u64) -> (SendWorkRequest, bool) {
        let (SendOp::Send { .. }, Payload::Gather(sges)) = (&wr.op, &wr.payload) else { return (wr, false) };
        let len = wr.payload.len() as usize;
        let pd = self.slots.pd;
        let mut header = [0u8; HEADER_LEN];
        if len < HEADER_LEN || read_list(memory, pd, sges, 0, &mut header).is_err() {
            return (wr, false);
        }
        let Ok(repr) = BlockRepr::parse_bytes(&header) else { return (wr, false) };
        if !repr.kind.carries_payload() || repr.crc_set {
            return (wr, false);
        }
        let mut payload = [0u8; BLOCK_LEN];
        let payload = &mut payload[..repr.length as usize];
        let gather = if len == repr.message_len() {
            // The program's payload, read once for its CRC.
            if read_list(memory, pd, sges, HEADER_LEN, payload).is_err() {
                return (wr, false);
            }
            after(sges, HEADER_LEN)
        } else if let (HEADER_LEN, BlockKind::ReadData, Some(store)) = (len, repr.kind, &self.store) {
            // A read's answer as a header alone: its payload from the store.
            let Some((range, sge)) = store.range(memory, repr.offset, payload.len(), Access::empty()) else {
                // Out of the store: sent as posted, which its receiver
                // refuses as a block without its payload.
                return (wr, false);
            };
            range.read(payload);
            BlockCounters::add(&self.counters.gathered_bytes, payload.len());
            SgeList::from_iter([sge])
        } else {
            return (wr, false);
        };
        BlockCounters::add(&self.counters.computed, 1);
        let mut header = repr;
        (header.crc, header.crc_set) = (crc32(payload), true);
        let slot = self.slots.offset(n);
        self.slots.staging.buffer.write(slot, &header.to_bytes());
        let head = Sge { addr: self.slots.addr(n), length: HEADER_LEN as u32, lkey: self.slots.lkey };
        let mut staged = wr;
        staged.payload = Payload::Gather(std::iter::once(head).chain(gather).collect());
        (staged, true)
    }
}

impl SendStage for BlockSends {
    fn move_sends(&mut self, sends: &mut Sends<'_>) -> bool {
        sends.stage_each(|wr, memory, post| {
            let (wr, took_slot) = self.stage(wr, memory, self.staged);
            post(wr)?;
            self.staged += u64::from(took_slot);
            Ok(())
        })
    }

    fn release(self: Box<Self>, nic: &Nic) {
        self.slots.release(nic);
    }
}

/// A QP's receives written straight into the program's buffers, each
/// block's CRC checked as it completes.
pub struct CheckedReceives {
    pd: PdId,
    depth: usize,
    /// The receives in the engine, under the stage's tokens, in order.
    posted: VecDeque<(u64, RecvWorkRequest)>,
    next_token: u64,
    counters: Arc<BlockCounters>,
}

impl CheckedReceives {
    pub fn new(pd: PdId, depth: u32, counters: &Arc<BlockCounters>) -> CheckedReceives {
        CheckedReceives {
            pd,
            depth: depth as usize,
            posted: VecDeque::new(),
            next_token: 0,
            counters: counters.clone(),
        }
    }
}

impl ReceiveStage for CheckedReceives {
    fn take(&mut self, request: RecvWorkRequest, post: &mut Post<'_>) -> Result<()> {
        if self.posted.len() >= self.depth {
            return Err(VerbsError::OutOfResources("the receive queue is full".into()));
        }
        post(RecvWorkRequest { wr_id: self.next_token, sges: request.sges.clone() })?;
        self.posted.push_back((self.next_token, request));
        self.next_token += 1;
        Ok(())
    }

    /// Every receive goes to the engine as it is taken: none are kept.
    fn settle(&mut self, _moment: Moment, _post: &mut Post<'_>) -> bool {
        false
    }

    fn complete(&mut self, completion: &mut Completion, memory: &MemoryTable) -> bool {
        let Some(at) = self.posted.iter().position(|(token, _)| *token == completion.wr_id) else { return true };
        let (_, request) = self.posted.remove(at).expect("a position found above");
        completion.wr_id = request.wr_id;
        if completion.status != WcStatus::Success || completion.opcode != WcOpcode::Recv {
            return true;
        }
        let len = completion.byte_len as usize;
        if let Some(repr) = block_with_payload(memory, self.pd, &request.sges, len) {
            let mut payload = [0u8; BLOCK_LEN];
            let payload = &mut payload[..repr.length as usize];
            if read_list(memory, self.pd, &request.sges, HEADER_LEN, payload).is_ok() {
                completion.block = Some(verdict(&repr, payload, &self.counters));
            }
        }
        true
    }

    fn reset(&mut self) {
        self.posted.clear();
    }

    fn release(&mut self) -> Undo {
        self.reset();
        Box::new(|_| {})
    }
}

/// A staged receive's delivery when its QP has a store: what of the
/// message in the staging buffer the program's receive gets.
pub struct Placement {
    pub store: Store,
    pub counters: Arc<BlockCounters>,
}

impl Placement {
    /// Looks at the message of `completion` (`byte_len` bytes of
    /// `staging` from `from`): a write's payload is checked and placed,
    /// and the outcome set. Returns how many bytes of the message the
    /// program's buffers get.
    pub fn deliver(
        &self,
        staging: &DmaBuffer,
        from: usize,
        completion: &mut Completion,
        memory: &MemoryTable,
    ) -> usize {
        let len = completion.byte_len as usize;
        let mut bytes = [0u8; HEADER_LEN + BLOCK_LEN];
        if len < HEADER_LEN || len > bytes.len() {
            return len;
        }
        staging.read(from, &mut bytes[..len]);
        let Ok(repr) = BlockRepr::parse_bytes(&bytes) else { return len };
        if !repr.kind.carries_payload() || repr.message_len() != len {
            return len;
        }
        let payload = &bytes[HEADER_LEN..len];
        let outcome = verdict(&repr, payload, &self.counters);
        if repr.kind != BlockKind::Write {
            // A read's answer is the program's to keep: checked, not placed.
            completion.block = Some(outcome);
            return len;
        }
        completion.block = Some(match outcome {
            BlockOutcome::Verified => match self.store.range(memory, repr.offset, payload.len(), Access::LOCAL_WRITE) {
                Some((range, _)) => {
                    range.write(payload);
                    BlockCounters::add(&self.counters.placed_bytes, payload.len());
                    BlockOutcome::Placed
                }
                None => BlockOutcome::OutOfRange,
            },
            other => other,
        });
        HEADER_LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrnic_transport::smallvec;

    #[test]
    fn after_skips_whole_and_partial_entries() {
        let sges: SgeList = smallvec![
            Sge { addr: 0x1000, length: 40, lkey: 1 },
            Sge { addr: 0x2000, length: 100, lkey: 2 },
            Sge { addr: 0x3000, length: 8, lkey: 3 }
        ];
        let rest = after(&sges, 64);
        assert_eq!(
            rest.as_slice(),
            [Sge { addr: 0x2018, length: 76, lkey: 2 }, Sge { addr: 0x3000, length: 8, lkey: 3 }]
        );
        assert_eq!(after(&sges, 148).len(), 0);
        assert_eq!(after(&sges, 0).as_slice(), sges.as_slice());
    }
}
