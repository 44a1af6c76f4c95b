//! Shared receive queues: one pool of receive work requests that many QPs
//! draw from (`ibv_create_srq`). A QP created with an SRQ takes its receives
//! from there in posting order, whichever QP a message arrives on.

use std::collections::VecDeque;

use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::memory::PdId;
use crate::work_request::RecvWorkRequest;

/// A shared receive queue's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// Sizes and the limit of an SRQ (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    /// When fewer than this many requests remain, raise
    /// [`AsyncEvent::SrqLimitReached`] once; 0 is disarmed.
    pub limit: u32,
}

#[derive(Debug)]
struct Srq {
    pd: PdId,
    attr: SrqAttr,
    wqes: VecDeque<RecvWorkRequest>,
    /// QPs that take receives from it.
    users: u32,
}

/// Every SRQ of a device.
#[derive(Debug, Default)]
pub struct SharedReceiveQueues {
    queues: Vec<Option<Srq>>,
}

impl SharedReceiveQueues {
    pub fn create(&mut self, pd: PdId, attr: SrqAttr) -> Result<SrqId> {
        if attr.max_wr == 0 {
            return Err(VerbsError::invalid("an SRQ needs room for at least one receive (max_wr)"));
        }
        if attr.limit > attr.max_wr {
            return Err(VerbsError::invalid(format!("srq_limit {} exceeds max_wr {}", attr.limit, attr.max_wr)));
        }
        self.queues.push(Some(Srq { pd, attr, wqes: VecDeque::new(), users: 0 }));
        Ok(SrqId(self.queues.len() as u32 - 1))
    }

    fn get(&self, id: SrqId) -> Result<&Srq> {
        self.queues.get(id.0 as usize).and_then(Option::as_ref).ok_or(VerbsError::NotFound("shared receive queue"))
    }

    fn get_mut(&mut self, id: SrqId) -> Result<&mut Srq> {
        self.queues.get_mut(id.0 as usize).and_then(Option::as_mut).ok_or(VerbsError::NotFound("shared receive queue"))
    }

    pub fn destroy(&mut self, id: SrqId) -> Result<()> {
        if self.get(id)?.users > 0 {
            return Err(VerbsError::Busy("shared receive queue"));
        }
        self.queues[id.0 as usize] = None;
        Ok(())
    }

    pub fn pd(&self, id: SrqId) -> Result<PdId> {
        Ok(self.get(id)?.pd)
    }

    pub(crate) fn add_user(&mut self, id: SrqId, delta: i32) {
        if let Ok(srq) = self.get_mut(id) {
            srq.users = srq.users.saturating_add_signed(delta);
        }
    }

    /// Posts a receive (`ibv_post_srq_recv`).
    pub fn post(&mut self, id: SrqId, wr: RecvWorkRequest) -> Result<()> {
        let srq = self.get_mut(id)?;
        if wr.sges.len() > srq.attr.max_sge as usize {
            return Err(VerbsError::invalid(format!(
                "{} SGEs exceed the SRQ's max_sge {}",
                wr.sges.len(),
                srq.attr.max_sge
            )));
        }
        if srq.wqes.len() >= srq.attr.max_wr as usize {
            return Err(VerbsError::OutOfResources(format!("SRQ {} is full ({} requests)", id.0, srq.attr.max_wr)));
        }
        srq.wqes.push_back(wr);
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn set_limit(&mut self, id: SrqId, limit: u32) -> Result<()> {
        let srq = self.get_mut(id)?;
        if limit > srq.attr.max_wr {
            return Err(VerbsError::invalid(format!("srq_limit {limit} exceeds max_wr {}", srq.attr.max_wr)));
        }
        srq.attr.limit = limit;
        Ok(())
    }

    /// The attributes in force and how many receives are posted.
    pub fn query(&self, id: SrqId) -> Result<(SrqAttr, usize)> {
        let srq = self.get(id)?;
        Ok((srq.attr, srq.wqes.len()))
    }

    pub(crate) fn is_empty(&self, id: SrqId) -> bool {
        self.get(id).map_or(true, |s| s.wqes.is_empty())
    }

    /// Takes the oldest receive; raises the limit event when it leaves the
    /// queue below an armed limit (which disarms it, as in verbs).
    pub(crate) fn take(&mut self, id: SrqId, events: &mut VecDeque<AsyncEvent>) -> Option<RecvWorkRequest> {
        let srq = self.get_mut(id).ok()?;
        let wr = srq.wqes.pop_front()?;
        if srq.attr.limit > 0 && (srq.wqes.len() as u32) < srq.attr.limit {
            srq.attr.limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached { srq: id });
        }
        Some(wr)
    }
}
