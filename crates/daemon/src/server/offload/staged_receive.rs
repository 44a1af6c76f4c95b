//! `softrnicd --rx per-connection` and `--rx in-cache`: a receive's
//! payload lands in a staging buffer of the daemon's first and is copied
//! into the program's buffer when it completes. The two differ in where
//! the buffers come from and when a receive takes one:
//! - `per-connection`: each QP has a ring of buffers of its own, one for
//!   each receive the program may post, taken as the program posts;
//! - `in-cache`: every QP of the daemon draws from one [`Pool`] of
//!   [`IN_CACHE_BUFFERS`], the most recently freed first, and a receive
//!   takes its buffer only when a message arrives for it.
//!
//! The block offload's placement ([`Placement`]) is a ring of the QP's own
//! whose buffers hold a whole block whatever the receive's length, and
//! whose messages are delivered as it says.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use softrnic_engine::Nic;
use softrnic_transport::memory::{AccessFault, MemoryTable};
use softrnic_transport::{
    Access, Completion, PdId, RecvWorkRequest, Result, Sge, SgeList, VerbsError, WcOpcode, WcStatus,
};

use super::blocks::Placement;
use super::counters::OffloadCounters;
use super::staging::{SLOT, Staging};
use super::{Moment, Post, ReceiveStage, Undo};

/// Buffers in the in-cache design's pool (the original's 1024 × 8448 B).
pub const IN_CACHE_BUFFERS: usize = 1024;

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

/// A QP's staged receives: the program's receives, matched in order with
/// the staging buffers the engine fills.
pub struct StagedReceives {
    buffers: Buffers,
    pd: PdId,
    /// The QP's receive depth: the most receives it holds, posted and
    /// waiting together (so a program that posts past it waits in its ring).
    depth: usize,
    posted: VecDeque<Posted>,
    /// The program's receives that wait for a buffer, in order.
    waiting: VecDeque<RecvWorkRequest>,
    next_token: u64,
    counters: Arc<OffloadCounters>,
    /// The block offload's store: each message goes through it.
    placement: Option<Placement>,
}

impl StagedReceives {
    /// `per-connection`: a ring of `depth` buffers for a QP of `pd`.
    pub fn own(nic: &Nic, pd: PdId, depth: u32, counters: &Arc<OffloadCounters>) -> Result<StagedReceives> {
        let staging = Staging::new(depth as usize, counters);
        let lkey = staging.register(nic, pd)?;
        Ok(StagedReceives::with(Buffers::Own { staging, lkey, free: (0..depth).collect() }, pd, depth, counters))
    }

    /// `in-cache`: the daemon's pool, for a QP of `pd` with `depth`
    /// receive requests.
    pub fn shared(
        nic: &Nic,
        pd: PdId,
        depth: u32,
        pool: &Arc<Pool>,
        counters: &Arc<OffloadCounters>,
    ) -> Result<StagedReceives> {
        let buffers = Buffers::Shared { pool: pool.clone(), lkey: pool.join(nic, pd)? };
        Ok(StagedReceives::with(buffers, pd, depth, counters))
    }

    /// The block offload with a store: a ring of `depth` whole-slot
    /// buffers for a QP of `pd`, each message delivered by `placement`.
    pub fn placing(
        nic: &Nic,
        pd: PdId,
        depth: u32,
        placement: Placement,
        counters: &Arc<OffloadCounters>,
    ) -> Result<StagedReceives> {
        let mut staged = StagedReceives::own(nic, pd, depth, counters)?;
        staged.placement = Some(placement);
        Ok(staged)
    }

    fn with(buffers: Buffers, pd: PdId, depth: u32, counters: &Arc<OffloadCounters>) -> StagedReceives {
        StagedReceives {
            buffers,
            pd,
            depth: depth as usize,
            posted: VecDeque::new(),
            waiting: VecDeque::new(),
            next_token: 0,
            counters: counters.clone(),
            placement: None,
        }
    }

    /// Whether a receive takes its buffer when a message arrives for it
    /// (the in-cache pool) rather than when the program posts it (a ring
    /// of the QP's own).
    fn binds_at_arrival(&self) -> bool {
        matches!(self.buffers, Buffers::Shared { .. })
    }

    /// In-cache, a message found no receive: the first waiting receive
    /// takes the pool's most recently freed buffer, for this message. With
    /// no free buffer (or a QP that takes no receives now) the receive
    /// waits on and the message is RNR NAKed: the pool bounds the working
    /// set.
    fn bind_one(&mut self, post: &mut Post<'_>) -> bool {
        let Some(request) = self.waiting.pop_front() else { return false };
        if matches!(self.try_post(post, &request), Ok(true)) {
            return true;
        }
        self.waiting.push_front(request);
        false
    }

    /// Posts the receives that waited for buffers of the QP's own ring, in
    /// order, while buffers last. Returns whether it posted any.
    fn post_waiting(&mut self, post: &mut Post<'_>) -> bool {
        let mut posted = false;
        while let Some(request) = self.waiting.pop_front() {
            // No free buffer, or the QP takes no receives now (RESET): it
            // waits on, in order.
            if !matches!(self.try_post(post, &request), Ok(true)) {
                self.waiting.push_front(request);
                break;
            }
            posted = true;
        }
        posted
    }

    /// The QP is in the error state: every receive the stage keeps goes to
    /// the engine as the program posted it, without a staging buffer, and
    /// flushes there with the program's `wr_id` (those posted with a buffer
    /// flush from the engine's queue and give the buffer back). In-cache
    /// receives wait for a message that will not come, so without this
    /// they would never complete.
    fn flush(&mut self, post: &mut Post<'_>) -> bool {
        let mut posted = false;
        while let Some(request) = self.waiting.pop_front() {
            if self.post_with(post, &request, None).is_err() {
                self.waiting.push_front(request);
                break;
            }
            posted = true;
        }
        posted
    }

    /// Posts `request` into a buffer of its own length, or as it is when
    /// it is larger than a buffer. Returns false when no buffer is free.
    fn try_post(&mut self, post: &mut Post<'_>, request: &RecvWorkRequest) -> Result<bool> {
        let len = request.sges.iter().map(|s| s.length as usize).sum::<usize>();
        let staging = if len > SLOT {
            self.counters.received_in_place();
            None
        } else {
            let Some(buffer) = self.take_buffer() else { return Ok(false) };
            // A placing receive takes a whole block into a header's room.
            Some((buffer, if self.placement.is_some() { SLOT } else { len }))
        };
        self.post_with(post, request, staging)?;
        Ok(true)
    }

    /// Posts `request` under a token of the stage's, into `staging` (a
    /// staging buffer and the request's length) or, without one, into the
    /// program's own buffers. A refused post gives the buffer back.
    fn post_with(
        &mut self,
        post: &mut Post<'_>,
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

    fn take_buffer(&mut self) -> Option<u32> {
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
}

impl ReceiveStage for StagedReceives {
    /// In-cache, a message that arrives while a receive already waits for
    /// it is that receive's: the program's ring, whose entries come after
    /// it, need not be read for it (the processor takes them on its pass).
    fn wants_new_receives(&self, moment: Moment) -> bool {
        !(moment == Moment::Arrival && self.binds_at_arrival() && !self.waiting.is_empty())
    }

    /// A ring of the QP's own posts a buffer for the receive at once if
    /// one is free; otherwise, and always in-cache, the receive waits.
    fn take(&mut self, request: RecvWorkRequest, post: &mut Post<'_>) -> Result<()> {
        if self.waiting.len() + self.posted.len() >= self.depth {
            return Err(VerbsError::OutOfResources("the receive queue is full".into()));
        }
        if self.waiting.is_empty() && !self.binds_at_arrival() && self.try_post(post, &request)? {
            return Ok(());
        }
        self.waiting.push_back(request);
        Ok(())
    }

    fn settle(&mut self, moment: Moment, post: &mut Post<'_>) -> bool {
        match moment {
            Moment::Flush => self.flush(post),
            // In-cache receives wait for their message.
            Moment::Pass if self.binds_at_arrival() => false,
            Moment::Arrival if self.binds_at_arrival() => self.bind_one(post),
            Moment::Pass | Moment::Arrival => self.post_waiting(post),
        }
    }

    fn complete(&mut self, completion: &mut Completion, memory: &MemoryTable) -> bool {
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
            let len = match &self.placement {
                Some(placement) => {
                    placement.deliver(&self.staging().buffer, buffer as usize * SLOT, completion, memory)
                }
                None => completion.byte_len as usize,
            };
            let room = posted.request.sges.iter().map(|s| s.length as usize).sum::<usize>();
            // A message longer than the receive failed on the staging
            // buffer, posted at the receive's length, unless a whole-slot
            // buffer took it for a placement that did not happen.
            if len > room {
                (completion.status, fine) = (WcStatus::LocLenErr, false);
            } else {
                match self.copy_out(buffer, len, &posted.request.sges, memory) {
                    Ok(()) => {
                        completion.byte_len = len as u32;
                        self.counters.received(len);
                    }
                    // The program's key, bounds or access failed.
                    Err(_) => (completion.status, fine) = (WcStatus::LocProtErr, false),
                }
            }
        }
        self.give_back(buffer);
        fine
    }

    fn reset(&mut self) {
        self.waiting.clear();
        for posted in std::mem::take(&mut self.posted) {
            if let Some(buffer) = posted.buffer {
                self.give_back(buffer);
            }
        }
    }

    fn release(&mut self) -> Undo {
        self.reset();
        match &self.buffers {
            Buffers::Own { lkey, .. } => {
                let lkey = *lkey;
                Box::new(move |nic| {
                    let _ = nic.deregister_memory(lkey);
                })
            }
            Buffers::Shared { pool, .. } => {
                let (pool, pd) = (pool.clone(), self.pd);
                Box::new(move |nic| pool.leave(nic, pd))
            }
        }
    }
}
