//! Receives fetched when a message needs one, as an event the shard
//! returns and never as a call out of it.
//!
//! A NIC reads a program's receive WQEs from the ring in host memory when
//! a message arrives and needs one, not only when the program rings the
//! doorbell: a receive posted a moment before the message is found. When
//! the receives reach the transport by another way, as through
//! softrnicd's command processor, which moves a program's ring into the
//! engine on its passes, a message that arrives between the program's post
//! and the next pass would find the queue empty, and the sender would get
//! an RNR NAK the program never asked for.
//!
//! A queue marked as fetched on demand
//! ([`PostQueues::fetch_on_demand`](crate::PostQueues::fetch_on_demand),
//! [`SharedReceiveQueue::fetch_on_demand`](crate::SharedReceiveQueue::fetch_on_demand))
//! closes that gap the way quinn-proto's endpoint and connections talk:
//! by events, each side driven by its owner.
//!
//! ```text
//!   a request finds no receive ──> the shard holds it (and every later
//!        request of that QP), and returns ReceivesWanted { qpn, srq }
//!   the driver, with the shard's lock released, posts what the program
//!        wrote, then calls receives_fetched(now, wanted)
//!   the shard takes the posts and hands the held requests to the QP
//!        again, in order; one that still finds none is answered RNR
//! ```
//!
//! A driver that never takes the question costs a message [`HOLD_FOR`] at
//! most: the shard then lets the requests go as if it had answered. One
//! that has taken it is waited for, however long: whoever polls a question
//! answers it (the engine does so in the same pass, microseconds later
//! unless its thread is preempted between the two, and a 2-core CI machine
//! once preempted it for 1.3 ms: a receive posted in time was RNR NAKed).
//! A QP entering the error
//! state asks too, holding nothing, so that the receives the program wrote
//! flush with the rest; an SRQ that falls below its armed limit asks, so
//! that the receives not yet given to it count, before the limit event is
//! raised.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::congestion::RecvMeta;
use crate::srq::SrqId;
use crate::time::Instant;

/// "QP `qpn` needs the receives its program wrote": in its own receive
/// queue, or in SRQ `srq`. The driver posts them and answers with
/// [`Shard::receives_fetched`](crate::Shard::receives_fetched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivesWanted {
    pub qpn: u32,
    pub srq: Option<SrqId>,
}

/// The longest requests wait for the driver to take their question. The
/// engine takes it within the pass that raised it; this bounds only a
/// driver that does not ask.
pub const HOLD_FOR: Duration = Duration::from_millis(1);

/// The most request packets held for one QP: more than a requester's
/// window of 4 KiB packets. Beyond it they are dropped (and counted), as a
/// full receive buffer drops them; the requester sends them again.
pub const HOLD_AT_MOST: usize = 1024;

/// One datagram as it arrived, kept to be handled again.
#[derive(Debug)]
pub(crate) struct HeldDatagram {
    pub from: SocketAddr,
    pub meta: RecvMeta,
    pub bytes: Box<[u8]>,
    /// Its payload came by reference (`bytes` holds it as read when held).
    pub by_reference: bool,
}

#[derive(Debug)]
struct Held {
    /// When the wait ends unanswered; `None` once the driver has taken the
    /// question, which it then answers.
    until: Option<Instant>,
    datagrams: VecDeque<HeldDatagram>,
}

/// The request packets each QP holds while its driver fetches receives.
#[derive(Debug, Default)]
pub(crate) struct HeldRequests {
    by_qp: FxHashMap<u32, Held>,
}

impl HeldRequests {
    pub fn holds(&self, qpn: u32) -> bool {
        self.by_qp.contains_key(&qpn)
    }

    /// Starts holding `first`, the request that asked, and what follows
    /// it, until `until`.
    pub fn start(&mut self, qpn: u32, until: Instant, datagrams: VecDeque<HeldDatagram>) {
        debug_assert!(!self.holds(qpn), "QP {qpn:#x} asked while it held requests");
        self.by_qp.insert(qpn, Held { until: Some(until), datagrams });
    }

    /// The driver has taken `qpn`'s question: its requests wait for the
    /// answer, with no deadline.
    pub fn question_taken(&mut self, qpn: u32) {
        if let Some(held) = self.by_qp.get_mut(&qpn) {
            held.until = None;
        }
    }

    /// Holds a request that arrived behind one held already; false (and
    /// the datagram is let go) when the QP holds all it may.
    pub fn push(&mut self, qpn: u32, datagram: HeldDatagram) -> bool {
        let held = self.by_qp.get_mut(&qpn).expect("pushed only to a QP that holds requests");
        if held.datagrams.len() >= HOLD_AT_MOST {
            return false;
        }
        held.datagrams.push_back(datagram);
        true
    }

    /// What `qpn` holds, in arrival order; it holds nothing after.
    pub fn release(&mut self, qpn: u32) -> VecDeque<HeldDatagram> {
        self.by_qp.remove(&qpn).map(|held| held.datagrams).unwrap_or_default()
    }

    /// The QPs whose wait has ended by `now`.
    pub fn expired(&self, now: Instant) -> Vec<u32> {
        let ended = |held: &Held| held.until.is_some_and(|until| until <= now);
        self.by_qp.iter().filter(|(_, held)| ended(held)).map(|(&qpn, _)| qpn).collect()
    }

    /// When the first wait ends.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.by_qp.values().filter_map(|held| held.until).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(tag: u8) -> HeldDatagram {
        HeldDatagram {
            from: "127.0.0.2:4791".parse().unwrap(),
            meta: RecvMeta::default(),
            bytes: Box::new([tag]),
            by_reference: false,
        }
    }

    #[test]
    fn held_requests_come_back_in_arrival_order() {
        let mut held = HeldRequests::default();
        assert!(!held.holds(7));
        held.start(7, Instant::from_nanos(100), VecDeque::from([datagram(1)]));
        assert!(held.push(7, datagram(2)) && held.push(7, datagram(3)));
        assert!(held.holds(7));
        let order: Vec<u8> = held.release(7).iter().map(|d| d.bytes[0]).collect();
        assert_eq!(order, [1, 2, 3]);
        assert!(!held.holds(7) && held.release(7).is_empty(), "nothing is held after a release");
    }

    #[test]
    fn a_qp_holds_at_most_its_share() {
        let mut held = HeldRequests::default();
        held.start(7, Instant::from_nanos(100), VecDeque::from([datagram(0)]));
        let taken = (1..HOLD_AT_MOST + 10).filter(|_| held.push(7, datagram(0))).count();
        assert_eq!(taken, HOLD_AT_MOST - 1, "the one that asked counts");
        assert_eq!(held.release(7).len(), HOLD_AT_MOST);
    }

    #[test]
    fn each_wait_ends_at_its_own_deadline() {
        let mut held = HeldRequests::default();
        assert_eq!(held.next_deadline(), None);
        held.start(1, Instant::from_nanos(300), VecDeque::new());
        held.start(2, Instant::from_nanos(100), VecDeque::new());
        assert_eq!(held.next_deadline(), Some(Instant::from_nanos(100)));
        assert!(held.expired(Instant::from_nanos(99)).is_empty());
        assert_eq!(held.expired(Instant::from_nanos(100)), [2]);
        let mut both = held.expired(Instant::from_nanos(300));
        both.sort();
        assert_eq!(both, [1, 2]);
    }

    #[test]
    fn a_question_taken_waits_for_its_answer() {
        let mut held = HeldRequests::default();
        held.start(1, Instant::from_nanos(100), VecDeque::from([datagram(1)]));
        held.start(2, Instant::from_nanos(200), VecDeque::new());
        held.question_taken(1);
        assert_eq!(held.next_deadline(), Some(Instant::from_nanos(200)));
        assert_eq!(held.expired(Instant::from_nanos(1_000_000)), [2]);
        assert!(held.holds(1));
        assert_eq!(held.release(1).len(), 1);
    }
}
