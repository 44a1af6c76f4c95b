//! Work completions (`ibv_wc`) and the completion queues that hold them.

use std::collections::VecDeque;
use std::net::IpAddr;

/// Completion status, with the values of `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
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
    /// The rkey a SEND with invalidate named.
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
}

impl Completion {
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
        }
    }
}

/// A completion queue's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// What `ibv_req_notify_cq` armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    No,
    NextCompletion,
    SolicitedOnly,
}

#[derive(Debug)]
struct CompletionQueue {
    entries: VecDeque<Completion>,
    capacity: usize,
    armed: Armed,
    overflowed: bool,
    /// QPs that post to this queue; a queue in use cannot be destroyed.
    users: u32,
}

/// Every completion queue of a device.
#[derive(Debug, Default)]
pub struct CompletionQueues {
    queues: Vec<Option<CompletionQueue>>,
    /// Queues whose armed notification fired, for the engine to signal.
    notifications: VecDeque<CqId>,
    /// Queues that overflowed since the last look (`IBV_EVENT_CQ_ERR`).
    overflows: VecDeque<CqId>,
}

impl CompletionQueues {
    pub fn create(&mut self, capacity: usize) -> CqId {
        self.queues.push(Some(CompletionQueue {
            entries: VecDeque::with_capacity(capacity.min(4096)),
            capacity: capacity.max(1),
            armed: Armed::No,
            overflowed: false,
            users: 0,
        }));
        CqId(self.queues.len() as u32 - 1)
    }

    fn get_mut(&mut self, cq: CqId) -> Option<&mut CompletionQueue> {
        self.queues.get_mut(cq.0 as usize).and_then(Option::as_mut)
    }

    pub fn exists(&self, cq: CqId) -> bool {
        matches!(self.queues.get(cq.0 as usize), Some(Some(_)))
    }

    pub fn destroy(&mut self, cq: CqId) -> crate::Result<()> {
        match self.queues.get_mut(cq.0 as usize) {
            Some(slot @ Some(_)) if slot.as_ref().is_some_and(|q| q.users == 0) => {
                *slot = None;
                Ok(())
            }
            Some(Some(_)) => Err(crate::VerbsError::Busy("completion queue")),
            _ => Err(crate::VerbsError::NotFound("completion queue")),
        }
    }

    pub(crate) fn add_user(&mut self, cq: CqId, delta: i32) {
        if let Some(q) = self.get_mut(cq) {
            q.users = q.users.saturating_add_signed(delta);
        }
    }

    /// Adds a completion; a full queue drops it and reports an overflow.
    pub(crate) fn push(&mut self, cq: CqId, completion: Completion) {
        let Some(queue) = self.queues.get_mut(cq.0 as usize).and_then(Option::as_mut) else {
            return;
        };
        if queue.entries.len() >= queue.capacity {
            if !queue.overflowed {
                queue.overflowed = true;
                self.overflows.push_back(cq);
            }
            return;
        }
        queue.entries.push_back(completion);
        let fire = match queue.armed {
            Armed::No => false,
            Armed::NextCompletion => true,
            // Errors always raise the event, as in verbs.
            Armed::SolicitedOnly => completion.solicited || completion.status != WcStatus::Success,
        };
        if fire {
            queue.armed = Armed::No;
            self.notifications.push_back(cq);
        }
    }

    /// Moves up to `max` completions into `out`; returns how many.
    pub fn poll(&mut self, cq: CqId, max: usize, out: &mut Vec<Completion>) -> usize {
        let Some(queue) = self.get_mut(cq) else {
            return 0;
        };
        let n = max.min(queue.entries.len());
        out.extend(queue.entries.drain(..n));
        n
    }

    /// Changes how many completions the queue holds; it may not shrink
    /// below what it holds now (`ibv_resize_cq`).
    pub fn resize(&mut self, cq: CqId, capacity: usize) -> crate::Result<()> {
        let queue = self.get_mut(cq).ok_or(crate::VerbsError::NotFound("completion queue"))?;
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
    pub fn request_notify(&mut self, cq: CqId, solicited_only: bool) -> crate::Result<()> {
        let queue = self.get_mut(cq).ok_or(crate::VerbsError::NotFound("completion queue"))?;
        queue.armed = if solicited_only { Armed::SolicitedOnly } else { Armed::NextCompletion };
        Ok(())
    }

    /// A queue whose armed notification fired.
    pub fn poll_notification(&mut self) -> Option<CqId> {
        self.notifications.pop_front()
    }

    /// A queue that overflowed.
    pub fn poll_overflow(&mut self) -> Option<CqId> {
        self.overflows.pop_front()
    }

    pub fn len(&self, cq: CqId) -> usize {
        self.queues.get(cq.0 as usize).and_then(Option::as_ref).map_or(0, |q| q.entries.len())
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
        cqs.push(cq, done(1));
        cqs.push(cq, done(2));
        assert!(cqs.resize(cq, 1).is_err(), "two entries wait");
        cqs.resize(cq, 3).unwrap();
        cqs.push(cq, done(3));
        assert_eq!(cqs.poll_overflow(), None);
        let mut out = Vec::new();
        assert_eq!(cqs.poll(cq, 8, &mut out), 3);
        assert!(cqs.resize(CqId(99), 4).is_err());
    }

    #[test]
    fn polls_in_order_and_reports_overflow() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(2);
        for id in 0..3 {
            cqs.push(cq, done(id));
        }
        assert_eq!(cqs.poll_overflow(), Some(cq));
        let mut out = Vec::new();
        assert_eq!(cqs.poll(cq, 8, &mut out), 2);
        assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn notification_fires_once_per_arming() {
        let mut cqs = CompletionQueues::default();
        let cq = cqs.create(8);
        cqs.push(cq, done(0));
        assert_eq!(cqs.poll_notification(), None);
        cqs.request_notify(cq, false).unwrap();
        cqs.push(cq, done(1));
        cqs.push(cq, done(2));
        assert_eq!(cqs.poll_notification(), Some(cq));
        assert_eq!(cqs.poll_notification(), None);
        cqs.request_notify(cq, true).unwrap();
        cqs.push(cq, done(3));
        assert_eq!(cqs.poll_notification(), None);
        cqs.push(cq, Completion { solicited: true, ..done(4) });
        assert_eq!(cqs.poll_notification(), Some(cq));
    }
}
