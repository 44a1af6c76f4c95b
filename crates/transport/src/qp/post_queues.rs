//! The program's end of a QP's send and receive queues.
//!
//! A NIC lets a program post without waiting for the NIC: rxe and mlx5
//! write work requests into rings the device reads when it gets to them,
//! and `ibv_post_send` checks only what the program's side can see (the
//! QP's capabilities, its state, room in the queue). [`PostQueues`] is that
//! end for softrnic. Posting takes this QP's own short lock (rxe's provider
//! serialises a queue's posters with a spinlock too), never the lock of the
//! shard that owns the QP, so a post does not wait while an engine core
//! handles a batch of other QPs' packets. The QP takes what was posted
//! ([`QueuePair::absorb_posts`](super::QueuePair)) whenever its shard next
//! runs it, in posting order.
//!
//! What the program cannot see from here, it learns as the verbs say it
//! should: a request posted as the QP fell into the error state completes
//! with `WR_FLUSH_ERR`.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};

use super::{QpCaps, QpState, QpType};
use crate::error::{Result, VerbsError};
use crate::work_request::{Payload, RecvWorkRequest, SendOp, SendWorkRequest};

/// The program's end of one QP's queues; the QP holds the other.
#[derive(Debug)]
pub struct PostQueues {
    qpn: u32,
    qp_type: QpType,
    caps: QpCaps,
    /// Whether the QP takes its receives from an SRQ.
    srq: bool,
    /// The QP's state as of its last change (written by the QP alone).
    state: AtomicU8,
    sends: Mutex<VecDeque<SendWorkRequest>>,
    recvs: Mutex<VecDeque<RecvWorkRequest>>,
    /// Send requests posted and not yet retired by the QP: the queue's
    /// occupancy against `max_send_wr`.
    sends_held: AtomicU32,
    recvs_held: AtomicU32,
    /// Sends, and receives, were posted that the QP has not taken yet.
    sends_pending: AtomicBool,
    recvs_pending: AtomicBool,
    /// The program's receives reach the QP only when its driver is asked
    /// ([`crate::fetch_on_demand`]).
    on_demand: AtomicBool,
}

/// What a successful post means for the shard that owns the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Posted {
    /// The QP had nothing waiting: its shard must be told to look.
    Tell,
    /// The shard has been told already.
    Queued,
}

impl PostQueues {
    pub(crate) fn new(qpn: u32, qp_type: QpType, caps: QpCaps, srq: bool) -> PostQueues {
        PostQueues {
            qpn,
            qp_type,
            caps,
            srq,
            state: AtomicU8::new(QpState::Reset as u8),
            sends: Mutex::new(VecDeque::new()),
            recvs: Mutex::new(VecDeque::new()),
            sends_held: AtomicU32::new(0),
            recvs_held: AtomicU32::new(0),
            sends_pending: AtomicBool::new(false),
            recvs_pending: AtomicBool::new(false),
            on_demand: AtomicBool::new(false),
        }
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// `ibv_post_send` for one request.
    pub fn post_send(&self, wr: SendWorkRequest) -> Result<Posted> {
        self.send_poster().post(wr)
    }

    /// Locks the send queue for posting a chain of requests under one
    /// lock, as `ibv_post_send` does with a linked list.
    pub fn send_poster(&self) -> SendPoster<'_> {
        SendPoster { queues: self, sends: lock(&self.sends), tell: false }
    }

    /// `ibv_post_recv` for one request.
    pub fn post_recv(&self, wr: RecvWorkRequest) -> Result<Posted> {
        check_recv(self.qpn, &self.caps, self.srq, self.state(), &wr)?;
        if !reserve(&self.recvs_held, self.caps.max_recv_wr) {
            return Err(VerbsError::OutOfResources(format!(
                "receive queue of QP {:#x} is full ({} requests)",
                self.qpn, self.caps.max_recv_wr
            )));
        }
        lock(&self.recvs).push_back(wr);
        // The shard hears of the first receive the QP has not taken, and
        // takes it with its next pass, before the SEND that needs it
        // arrives (or with that SEND, whichever is first). Taking them in
        // a pass, not at each packet, keeps the engine off this queue's
        // lock while the program posts (it halved the 64-byte message
        // rate on 16 cores).
        Ok(if self.recvs_pending.swap(true, Ordering::AcqRel) { Posted::Queued } else { Posted::Tell })
    }

    /// Says that the program's receives are written where the QP cannot
    /// see them (softrnicd's receive ring) and are posted here when the
    /// driver is asked: a message that finds none is held and
    /// [`ReceivesWanted`](crate::ReceivesWanted) raised, rather than
    /// answered "receiver not ready" (see [`crate::fetch_on_demand`]).
    pub fn fetch_on_demand(&self) {
        self.on_demand.store(true, Ordering::Release);
    }

    pub(crate) fn fetched_on_demand(&self) -> bool {
        self.on_demand.load(Ordering::Acquire)
    }

    /// The QP's state as of its last change: what a front end that holds
    /// the program's receives (softrnicd's staging designs) reads to know
    /// that they are to flush.
    pub fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn check_send(&self, wr: &SendWorkRequest) -> Result<()> {
        check_send(self.qpn, self.qp_type, &self.caps, self.state(), wr)
    }

    // ----- the QP's side -----

    /// Publishes the QP's new state to posters.
    pub(crate) fn set_state(&self, state: QpState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// Moves what was posted into the QP's own queues (the QP's side).
    /// False if nothing was waiting.
    pub(crate) fn take(&self, sends: &mut VecDeque<SendWorkRequest>, recvs: &mut VecDeque<RecvWorkRequest>) -> bool {
        // Each flag is cleared before its queue is read: a post that lands
        // after the read sets it again, and tells the shard again. (Looked
        // at first: the QP asks on every packet, and a look writes nothing.)
        let take = |pending: &AtomicBool| pending.load(Ordering::Acquire) && pending.swap(false, Ordering::AcqRel);
        let mut took = false;
        if take(&self.sends_pending) {
            sends.append(&mut lock(&self.sends));
            took = true;
        }
        if take(&self.recvs_pending) {
            recvs.append(&mut lock(&self.recvs));
            took = true;
        }
        took
    }

    /// A send request left the QP (completed or flushed).
    pub(crate) fn retire_send(&self) {
        release(&self.sends_held);
    }

    /// Receives posted and not yet consumed or flushed: what the responder
    /// advertises as end-to-end credits.
    pub(crate) fn receives_held(&self) -> u32 {
        self.recvs_held.load(Ordering::Acquire)
    }

    /// A receive request left the QP (consumed or flushed).
    pub(crate) fn retire_recv(&self) {
        release(&self.recvs_held);
    }

    /// RESET: whatever was posted and not taken vanishes with the rest.
    pub(crate) fn reset(&self) {
        let mut sends = lock(&self.sends);
        let mut recvs = lock(&self.recvs);
        sends.clear();
        recvs.clear();
        self.sends_held.store(0, Ordering::Release);
        self.recvs_held.store(0, Ordering::Release);
        self.sends_pending.store(false, Ordering::Release);
        self.recvs_pending.store(false, Ordering::Release);
    }
}

/// `ibv_post_send`'s checks of one request against what the QP was created
/// with and the state it is in. The engine's queues run them, and so does a
/// program whose queues the daemon serves, before it writes the request.
pub fn check_send(qpn: u32, qp_type: QpType, caps: &QpCaps, state: QpState, wr: &SendWorkRequest) -> Result<()> {
    match &wr.payload {
        Payload::Gather(sges) if sges.len() > caps.max_send_sge as usize => {
            return Err(VerbsError::invalid(format!("{} SGEs exceed max_send_sge {}", sges.len(), caps.max_send_sge)));
        }
        Payload::Inline(bytes) if bytes.len() > caps.max_inline_data as usize => {
            return Err(VerbsError::invalid(format!(
                "{} inline bytes exceed max_inline_data {}",
                bytes.len(),
                caps.max_inline_data
            )));
        }
        Payload::Inline(_) if wr.op.writes_locally() => {
            return Err(VerbsError::invalid("READ and ATOMIC results cannot go to inline data"));
        }
        _ => {}
    }
    if wr.payload.len() > 1 << 31 {
        return Err(VerbsError::invalid("a message is at most 2 GiB"));
    }
    match wr.op {
        SendOp::AtomicWrite { .. } if !wr.payload.is_empty() => {
            return Err(VerbsError::invalid("an ATOMIC WRITE carries its 8 bytes in the request, no data besides"));
        }
        SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } if wr.payload.len() != 8 => {
            return Err(VerbsError::invalid("an ATOMIC's local buffer must be exactly 8 bytes"));
        }
        _ => {}
    }
    if wr.op.is_local() && !wr.payload.is_empty() {
        return Err(VerbsError::invalid("a bind or local invalidate carries no data"));
    }
    match qp_type {
        QpType::Ud => {
            if !matches!(wr.op, SendOp::Send { .. }) {
                return Err(VerbsError::NotSupported("UD QPs only SEND".into()));
            }
            if wr.ud.is_none() {
                return Err(VerbsError::invalid("a UD send needs an address handle"));
            }
        }
        QpType::Uc => {
            if !(matches!(wr.op, SendOp::Send { .. } | SendOp::Write { .. }) || wr.op.is_local()) {
                return Err(VerbsError::NotSupported(
                    "UC QPs carry SENDs and WRITEs only; READ, ATOMIC and SEND with invalidate need an RC QP".into(),
                ));
            }
        }
        QpType::Rc => {}
    }
    match state {
        QpState::Reset | QpState::Init | QpState::Rtr => Err(VerbsError::invalid(format!(
            "QP {:#x} is in state {:?}; move it to RTS before posting sends",
            qpn, state
        ))),
        _ => Ok(()),
    }
}

/// `ibv_post_recv`'s checks of one request.
pub fn check_recv(qpn: u32, caps: &QpCaps, srq: bool, state: QpState, wr: &RecvWorkRequest) -> Result<()> {
    if srq {
        return Err(VerbsError::invalid(format!("QP {qpn:#x} takes its receives from an SRQ; post them there")));
    }
    if wr.sges.len() > caps.max_recv_sge as usize {
        return Err(VerbsError::invalid(format!("{} SGEs exceed max_recv_sge {}", wr.sges.len(), caps.max_recv_sge)));
    }
    if state == QpState::Reset {
        return Err(VerbsError::invalid(format!("QP {qpn:#x} is in RESET; move it to INIT before posting receives")));
    }
    Ok(())
}

/// A QP's send queue locked for posting a chain of requests.
pub struct SendPoster<'a> {
    queues: &'a PostQueues,
    sends: std::sync::MutexGuard<'a, VecDeque<SendWorkRequest>>,
    tell: bool,
}

impl SendPoster<'_> {
    /// Posts one request of the chain; the result says whether the shard
    /// must be told (for the chain so far).
    pub fn post(&mut self, wr: SendWorkRequest) -> Result<Posted> {
        let q = self.queues;
        q.check_send(&wr)?;
        if !reserve(&q.sends_held, q.caps.max_send_wr) {
            return Err(VerbsError::OutOfResources(format!(
                "send queue of QP {:#x} is full ({} requests)",
                q.qpn, q.caps.max_send_wr
            )));
        }
        self.sends.push_back(wr);
        // The first send the QP has not been told of: its shard must hear.
        self.tell |= !q.sends_pending.swap(true, Ordering::AcqRel);
        Ok(if self.tell { Posted::Tell } else { Posted::Queued })
    }

    /// Whether the shard must be told of the chain.
    pub fn needs_telling(&self) -> bool {
        self.tell
    }
}

/// Takes one slot of a queue of `capacity`, if there is one.
fn reserve(held: &AtomicU32, capacity: u32) -> bool {
    held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < capacity).then_some(n + 1)).is_ok()
}

/// Gives a slot back. Saturating: a post that reserved its slot just
/// before a RESET zeroed the count must not wrap it.
fn release(held: &AtomicU32) {
    let _ = held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poster that panicked left the queue consistent: each push is one
    // call.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::work_request::SendOp;

    fn queues(max_send_wr: u32) -> PostQueues {
        let caps = QpCaps { max_send_wr, ..QpCaps::default() };
        let q = PostQueues::new(7, QpType::Rc, caps, false);
        q.set_state(QpState::Rts);
        q
    }

    fn send(wr_id: u64) -> SendWorkRequest {
        SendWorkRequest::new(wr_id, SendOp::Send { imm: None }, Payload::Inline(Default::default()))
    }

    #[test]
    fn posts_follow_the_qp_state_the_qp_published() {
        let q = PostQueues::new(7, QpType::Rc, QpCaps::default(), false);
        assert!(q.post_send(send(1)).is_err(), "RESET refuses sends");
        assert!(q.post_recv(RecvWorkRequest { wr_id: 1, sges: Default::default() }).is_err());
        q.set_state(QpState::Init);
        let recv = || RecvWorkRequest { wr_id: 1, sges: Default::default() };
        assert_eq!(q.post_recv(recv()).unwrap(), Posted::Tell);
        assert!(q.post_send(send(1)).is_err(), "INIT refuses sends");
        q.set_state(QpState::Rts);
        assert_eq!(q.post_send(send(2)).unwrap(), Posted::Tell);
        assert_eq!(q.post_send(send(3)).unwrap(), Posted::Queued, "told already");
        let (mut sends, mut recvs) = (VecDeque::new(), VecDeque::new());
        assert!(q.take(&mut sends, &mut recvs));
        assert_eq!((sends.len(), recvs.len()), (2, 1));
        assert!(!q.take(&mut sends, &mut recvs), "nothing new");
        assert_eq!(q.post_send(send(4)).unwrap(), Posted::Tell);
        assert_eq!(q.post_recv(recv()).unwrap(), Posted::Tell);
        assert_eq!(q.post_recv(recv()).unwrap(), Posted::Queued);
    }

    #[test]
    fn a_full_queue_refuses_until_a_request_retires() {
        let q = queues(2);
        let _ = q.post_send(send(1)).unwrap();
        let _ = q.post_send(send(2)).unwrap();
        assert!(matches!(q.post_send(send(3)), Err(VerbsError::OutOfResources(_))));
        q.retire_send();
        let _ = q.post_send(send(3)).unwrap();
        // RESET empties the queue; a late retirement does not wrap the count.
        q.reset();
        q.retire_send();
        for i in 0..2 {
            let _ = q.post_send(send(i)).unwrap();
        }
        assert!(q.post_send(send(9)).is_err());
    }

    /// Several posting threads and a QP taking concurrently, the QP taking
    /// only when a post told it to (as its shard does): every request
    /// arrives once, each thread's in its posting order, and none is left
    /// untaken once the posters are done.
    #[test]
    fn concurrent_posters_lose_and_reorder_nothing() {
        const THREADS: u64 = 4;
        const EACH: u64 = 20_000;
        let q = queues(u32::MAX);
        let told = AtomicU32::new(0);
        let posting = AtomicU32::new(THREADS as u32);
        let mut seen = vec![0u64; THREADS as usize];
        let mut taken = 0;
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (q, told, posting) = (&q, &told, &posting);
                scope.spawn(move || {
                    for i in 0..EACH {
                        let mut poster = q.send_poster();
                        let _ = poster.post(send(t << 32 | i)).unwrap();
                        let tell = poster.needs_telling();
                        drop(poster);
                        if tell {
                            told.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    posting.fetch_sub(1, Ordering::AcqRel);
                });
            }
            let (mut sends, mut recvs) = (VecDeque::new(), VecDeque::new());
            loop {
                let done = posting.load(Ordering::Acquire) == 0;
                if told.swap(0, Ordering::AcqRel) > 0 {
                    q.take(&mut sends, &mut recvs);
                    for wr in sends.drain(..) {
                        let (t, i) = ((wr.wr_id >> 32) as usize, wr.wr_id & 0xffff_ffff);
                        assert_eq!(i, seen[t], "thread {t}'s requests in order");
                        seen[t] += 1;
                        taken += 1;
                    }
                } else if done {
                    break;
                }
            }
        });
        assert_eq!(taken, THREADS * EACH, "every request taken, and only once told");
    }
}
