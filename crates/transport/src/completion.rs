//! Work completions (`ibv_wc`) and the completion queues that hold them.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::Instant;

/// Completion status, with the values of `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    FatalErr = 19,
    GeneralErr = 21,
}

impl WcStatus {
    /// The text `ibv_wc_status_str` gives.
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::FatalErr => "fatal error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

/// What completed, with the values of `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    CompSwap = 3,
    FetchAdd = 4,
    BindMw = 5,
    LocalInv = 6,
    AtomicWrite = 9,
    Recv = 128,
    RecvRdmaWithImm = 129,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Bytes received (receive completions; for UD including the 40-byte
    /// GRH) or transferred.
    pub byte_len: u32,
    pub imm_data: Option<u32>,
    /// The rkey a SEND with invalidate invalidated here (receives).
    pub invalidated_rkey: Option<u32>,
    /// The local QP.
    pub qp_num: u32,
    /// The remote QP (UD receive completions).
    pub src_qp: u32,
    /// The sender's address (UD receive completions), as the GRH has it.
    pub source: Option<IpAddr>,
    /// The first 40 bytes of the buffer hold a GRH (UD receives).
    pub grh: bool,
    /// The sender set the solicited-event bit.
    pub solicited: bool,
    /// When the completion entered its queue, in the driver's time (the
    /// engine's: nanoseconds since the device opened). Verbs' completion
    /// timestamp.
    pub timestamp: Instant,
    /// What a device that parses storage blocks found in the message
    /// received (softrnicd's block offload, E7), as a NIC with checksum
    /// offload reports a packet's checksum; `None` where nothing parsed it.
    pub block: Option<BlockOutcome>,
}

/// What a block offload did with a block received: the receive
/// completes successfully whatever it found, and this says whether the
/// payload can be trusted and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockOutcome {
    /// Its CRC matched; the payload is where the receive put it.
    Verified = 1,
    /// Its CRC matched and its payload went straight into the store at
    /// its offset: the receive holds the header only.
    Placed = 2,
    /// Its CRC did not match: nothing was stored.
    Corrupt = 3,
    /// Its CRC matched but its range lies outside the store: nothing was
    /// stored.
    OutOfRange = 4,
}

impl Completion {
    /// Whether it raises a CQ armed for solicited completions only: the
    /// sender asked for the event, or it is an error, as in verbs.
    pub fn raises_solicited_only(&self) -> bool {
        self.solicited || self.status != WcStatus::Success
    }

    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: 0,
            source: None,
            grh: false,
            solicited: false,
            timestamp: Instant::ZERO,
            block: None,
        }
    }
}

/// A completion queue's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CqId(pub u32);

/// What `ibv_req_notify_cq` armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    No,
    NextCompletion,
    SolicitedOnly,
}

/// What became of a completion handed to [`CompletionQueue::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Pushed {
    /// Stored; nobody asked to be told.
    Stored,
    /// Stored, and the armed notification fired: tell the completion
    /// channel.
    Notify,
    /// The queue was full: the completion is lost and, the first time,
    /// the device raises `IBV_EVENT_CQ_ERR`.
    Overflowed,
    /// The queue overflowed before; dropped without a second event.
    Dropped,
}

#[derive(Debug)]
struct CqState {
    entries: VecDeque<Completion>,
    capacity: usize,
    armed: Armed,
    overflowed: bool,
}

/// A completion queue. QPs of any shard push into it and application
/// threads poll it at the same time, so its entries sit behind their own
/// lock: the only lock a completion and a poll share, as the rxe driver's
/// `cq_lock` is.
#[derive(Debug)]
pub struct CompletionQueue {
    id: CqId,
    state: Mutex<CqState>,
    /// Which shards have QPs that post here (bit `i` for shard `i`): the
    /// ones a thread polling this queue drives.
    shards: AtomicU64,
}

impl CompletionQueue {
    fn new(id: CqId, capacity: usize) -> CompletionQueue {
        CompletionQueue {
            id,
            state: Mutex::new(CqState {
                entries: VecDeque::with_capacity(capacity.min(4096)),
                capacity: capacity.max(1),
                armed: Armed::No,
                overflowed: false,
            }),
            shards: AtomicU64::new(0),
        }
    }

    pub fn id(&self) -> CqId {
        self.id
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        // The state is consistent between calls; a panic elsewhere must
        // not wedge the queue.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a completion; a full queue drops it.
    pub(crate) fn push(&self, completion: Completion) -> Pushed {
        let mut queue = self.lock();
        if queue.entries.len() >= queue.capacity {
            return if std::mem::replace(&mut queue.overflowed, true) { Pushed::Dropped } else { Pushed::Overflowed };
        }
        queue.entries.push_back(completion);
        let fire = match queue.armed {
            Armed::No => false,
            Armed::NextCompletion => true,
            Armed::SolicitedOnly => completion.raises_solicited_only(),
        };
        if fire {
            queue.armed = Armed::No;
            Pushed::Notify
        } else {
            Pushed::Stored
        }
    }

    /// Moves up to `max` completions into `out`; returns how many.
    pub fn poll(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        let mut queue = self.lock();
        let n = max.min(queue.entries.len());
        out.extend(queue.entries.drain(..n));
        n
    }

    /// Changes how many completions the queue holds; it may not shrink
    /// below what it holds now (`ibv_resize_cq`).
    pub fn resize(&self, capacity: usize) -> crate::Result<()> {
        let mut queue = self.lock();
        if capacity == 0 || capacity < queue.entries.len() {
            return Err(crate::VerbsError::invalid(format!(
                "cannot resize to {capacity} entries while {} wait to be polled",
                queue.entries.len()
            )));
        }
        queue.capacity = capacity;
        Ok(())
    }

    /// Arms the queue to notify on its next completion (or next solicited
    /// one).
    pub fn request_notify(&self, solicited_only: bool) {
        self.lock().armed = if solicited_only { Armed::SolicitedOnly } else { Armed::NextCompletion };
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes the completions of QP `qpn` (a QP moved to RESET or
    /// destroyed takes its completions with it, as hardware and rxe do).
    pub(crate) fn discard_qp(&self, qpn: u32) {
        self.lock().entries.retain(|c| c.qp_num != qpn);
    }

    /// The shards whose QPs post here, as a bit set.
    pub fn shards(&self) -> u64 {
        self.shards.load(Ordering::Acquire)
    }

    pub(crate) fn add_shard(&self, shard: usize) {
        self.shards.fetch_or(1 << (shard % 64), Ordering::AcqRel);
    }
}

/// Every completion queue of a device, by handle: the registry verbs
/// create and destroy through. Queue pairs hold their queues directly.
#[derive(Debug, Default)]
pub struct CompletionQueues {
    queues: Vec<Option<Registered>>,
}

#[derive(Debug)]
struct Registered {
    queue: Arc<CompletionQueue>,
    /// QPs that post to this queue; a queue in use cannot be destroyed.
    users: u32,
}

impl CompletionQueues {
    pub fn create(&mut self, capacity: usize) -> Arc<CompletionQueue> {
        let id = CqId(self.queues.len() as u32);
        let queue = Arc::new(CompletionQueue::new(id, capacity));
        self.queues.push(Some(Registered { queue: queue.clone(), users: 0 }));
        queue
    }

    pub fn get(&self, cq: CqId) -> Option<&Arc<CompletionQueue>> {
        self.queues.get(cq.0 as usize).and_then(Option::as_ref).map(|r| &r.queue)
    }

    pub fn exists(&self, cq: CqId) -> bool {
        self.get(cq).is_some()
    }

    pub fn destroy(&mut self, cq: CqId) -> crate::Result<()> {
        match self.queues.get_mut(cq.0 as usize) {
            Some(slot @ Some(_)) if slot.as_ref().is_some_and(|r| r.users == 0) => {
                *slot = None;
                Ok(())
            }
            Some(Some(_)) => Err(crate::VerbsError::Busy("completion queue")),
            _ => Err(crate::VerbsError::NotFound("completion queue")),
        }
    }

    pub(crate) fn add_user(&mut self, cq: CqId, delta: i32) {
        if let Some(r) = self.queues.get_mut(cq.0 as usize).and_then(Option::as_mut) {
            r.users = r.users.saturating_add_signed(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(wr_id: u64) -> Completion {
        Completion::new(wr_id, WcStatus::Success, WcOpcode::Send, 1)
    }

    #[test]
    fn resizing_keeps_entries_and_never_drops_below_them() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(2);
        assert_eq!(cq.push(done(1)), Pushed::Stored);
        assert_eq!(cq.push(done(2)), Pushed::Stored);
        assert!(cq.resize(1).is_err(), "two entries wait");
        cq.resize(3).unwrap();
        assert_eq!(cq.push(done(3)), Pushed::Stored);
        let mut out = Vec::new();
        assert_eq!(cq.poll(8, &mut out), 3);
        assert!(cqs.get(CqId(99)).is_none());
    }

    #[test]
    fn polls_in_order_and_reports_overflow_once() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(2);
        let pushed: Vec<Pushed> = (0..4).map(|id| cq.push(done(id))).collect();
        assert_eq!(pushed, [Pushed::Stored, Pushed::Stored, Pushed::Overflowed, Pushed::Dropped]);
        let mut out = Vec::new();
        assert_eq!(cq.poll(8, &mut out), 2);
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn notification_fires_once_per_arming() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(8);
        assert_eq!(cq.push(done(0)), Pushed::Stored);
        cq.request_notify(false);
        assert_eq!(cq.push(done(1)), Pushed::Notify);
        assert_eq!(cq.push(done(2)), Pushed::Stored);
        cq.request_notify(true);
        assert_eq!(cq.push(done(3)), Pushed::Stored);
        assert_eq!(cq.push(Completion { solicited: true, ..done(4) }), Pushed::Notify);
    }

    #[test]
    fn a_queue_in_use_is_not_destroyed() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(1).id();
        cqs.add_user(cq, 1);
        assert!(matches!(cqs.destroy(cq), Err(crate::VerbsError::Busy(_))));
        cqs.add_user(cq, -1);
        cqs.destroy(cq).unwrap();
        assert!(matches!(cqs.destroy(cq), Err(crate::VerbsError::NotFound(_))));
    }
}
