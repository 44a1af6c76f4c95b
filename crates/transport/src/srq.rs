//! Shared receive queues: one pool of receive work requests that many QPs
//! draw from (`ibv_create_srq`). A QP created with an SRQ takes its receives
//! from there in posting order, whichever QP a message arrives on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::memory::PdId;
use crate::work_request::RecvWorkRequest;

/// A shared receive queue's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqId(pub u32);

/// Sizes and the limit of an SRQ (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    /// When fewer than this many requests remain, raise
    /// [`AsyncEvent::SrqLimitReached`] once; 0 is disarmed.
    pub limit: u32,
}

#[derive(Debug)]
struct SrqState {
    attr: SrqAttr,
    wqes: VecDeque<RecvWorkRequest>,
}

/// A shared receive queue. QPs of different shards take from it while the
/// application posts to it, so its requests sit behind their own lock.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    id: SrqId,
    pd: PdId,
    state: Mutex<SrqState>,
    /// The program's receives reach the SRQ only when its driver is asked
    /// ([`crate::fetch_on_demand`]).
    on_demand: AtomicBool,
}

impl SharedReceiveQueue {
    pub fn id(&self) -> SrqId {
        self.id
    }

    pub fn pd(&self) -> PdId {
        self.pd
    }

    fn lock(&self) -> MutexGuard<'_, SrqState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts a receive (`ibv_post_srq_recv`).
    pub fn post(&self, wr: RecvWorkRequest) -> Result<()> {
        let mut srq = self.lock();
        if wr.sges.len() > srq.attr.max_sge as usize {
            return Err(VerbsError::invalid(format!(
                "{} SGEs exceed the SRQ's max_sge {}",
                wr.sges.len(),
                srq.attr.max_sge
            )));
        }
        if srq.wqes.len() >= srq.attr.max_wr as usize {
            return Err(VerbsError::OutOfResources(format!(
                "SRQ {} is full ({} requests)",
                self.id.0, srq.attr.max_wr
            )));
        }
        srq.wqes.push_back(wr);
        Ok(())
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`).
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        let mut srq = self.lock();
        if limit > srq.attr.max_wr {
            return Err(VerbsError::invalid(format!("srq_limit {limit} exceeds max_wr {}", srq.attr.max_wr)));
        }
        srq.attr.limit = limit;
        Ok(())
    }

    /// The attributes in force and how many receives are posted.
    pub fn query(&self) -> (SrqAttr, usize) {
        let srq = self.lock();
        (srq.attr, srq.wqes.len())
    }

    /// Says that the program's receives are written where the SRQ cannot
    /// see them (softrnicd's ring) and are posted here when the driver is
    /// asked (see [`crate::fetch_on_demand`]).
    pub fn fetch_on_demand(&self) {
        self.on_demand.store(true, Ordering::Release);
    }

    pub(crate) fn fetched_on_demand(&self) -> bool {
        self.on_demand.load(Ordering::Acquire)
    }

    /// Takes the oldest receive; with it, whether the queue is now below
    /// an armed limit (see [`SharedReceiveQueue::check_limit`]).
    pub(crate) fn take(&self) -> Option<(RecvWorkRequest, bool)> {
        let mut srq = self.lock();
        let wr = srq.wqes.pop_front()?;
        Some((wr, below_limit(&srq)))
    }

    /// Raises the limit event if the queue is below its armed limit, which
    /// disarms it, as in verbs. A queue fetched on demand is asked first,
    /// so that the receives the program wrote count.
    pub(crate) fn check_limit(&self, events: &mut VecDeque<AsyncEvent>) {
        let mut srq = self.lock();
        if below_limit(&srq) {
            srq.attr.limit = 0;
            events.push_back(AsyncEvent::SrqLimitReached { srq: self.id });
        }
    }
}

/// An armed limit the queue has fallen below.
fn below_limit(srq: &SrqState) -> bool {
    srq.attr.limit > 0 && (srq.wqes.len() as u32) < srq.attr.limit
}

#[derive(Debug)]
struct Registered {
    queue: Arc<SharedReceiveQueue>,
    /// QPs that take receives from it.
    users: u32,
}

/// Every SRQ of a device, by handle; QPs hold theirs directly.
#[derive(Debug, Default)]
pub struct SharedReceiveQueues {
    queues: Vec<Option<Registered>>,
}

impl SharedReceiveQueues {
    pub fn create(&mut self, pd: PdId, attr: SrqAttr) -> Result<Arc<SharedReceiveQueue>> {
        if attr.max_wr == 0 {
            return Err(VerbsError::invalid("an SRQ needs room for at least one receive (max_wr)"));
        }
        if attr.limit > attr.max_wr {
            return Err(VerbsError::invalid(format!("srq_limit {} exceeds max_wr {}", attr.limit, attr.max_wr)));
        }
        let id = SrqId(self.queues.len() as u32);
        let queue = Arc::new(SharedReceiveQueue {
            id,
            pd,
            state: Mutex::new(SrqState { attr, wqes: VecDeque::new() }),
            on_demand: AtomicBool::new(false),
        });
        self.queues.push(Some(Registered { queue: queue.clone(), users: 0 }));
        Ok(queue)
    }

    fn registered(&self, id: SrqId) -> Result<&Registered> {
        self.queues.get(id.0 as usize).and_then(Option::as_ref).ok_or(VerbsError::NotFound("shared receive queue"))
    }

    pub fn get(&self, id: SrqId) -> Result<&Arc<SharedReceiveQueue>> {
        Ok(&self.registered(id)?.queue)
    }

    pub fn destroy(&mut self, id: SrqId) -> Result<()> {
        if self.registered(id)?.users > 0 {
            return Err(VerbsError::Busy("shared receive queue"));
        }
        self.queues[id.0 as usize] = None;
        Ok(())
    }

    pub(crate) fn add_user(&mut self, id: SrqId, delta: i32) {
        if let Some(r) = self.queues.get_mut(id.0 as usize).and_then(Option::as_mut) {
            r.users = r.users.saturating_add_signed(delta);
        }
    }
}
