//! Selective repeat at the requester: which packets the responder holds,
//! which are lost, and what to send again.
//!
//! On a connection that negotiated selective repeat the responder keeps
//! what arrives beyond a gap and answers it with a selective NAK: a PSN
//! sequence NAK for the first missing PSN and a bitmap of the 512 PSNs
//! after it (`softrnic_wire::sack`). The requester keeps the latest such
//! report and declares a missing PSN lost once `DUPLICATE_THRESHOLD`
//! packets sent after it have arrived (RFC 6675's rule, so a packet
//! merely overtaken on the path is not sent twice), or every packet sent
//! after it has, when fewer follow it (RFC 5827's early retransmit: near
//! the end of a flight no more evidence will come). Each lost PSN goes
//! again once, and again only when `DUPLICATE_THRESHOLD` packets sent
//! after the repair have arrived and it has not (the repair was lost too,
//! and new data keeps the evidence coming); otherwise a lost repair is
//! the timer's, after which every hole may go again.
//!
//! READ responses and ATOMIC results travel the other way: the completer
//! places them in any order and reports a run of missing ones here, and
//! the requester asks for just that run again; a lost re-request goes
//! again on responses to later requests, or on responses still arriving a
//! round trip and a quarter after it left.

use std::collections::VecDeque;
use std::time::Duration;

use softrnic_wire::{Psn, sack};

use crate::time::Instant;

/// Packets that must arrive after a missing one before it counts as lost.
pub(super) const DUPLICATE_THRESHOLD: u32 = 3;

/// PSNs a selective-repeat responder accepts from the one it expects on:
/// that one and the 512 a selective NAK can describe. The requester keeps
/// no more than this in flight.
pub(super) const WINDOW: u32 = sack::BITS + 1;

/// Something to send again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resend {
    /// The request packet of this PSN.
    Request(Psn),
    /// The READ responses from this PSN on that have not arrived.
    Responses(Psn),
}

impl Resend {
    pub fn psn(self) -> Psn {
        match self {
            Resend::Request(psn) | Resend::Responses(psn) => psn,
        }
    }
}

/// A repair sent, and the evidence since that it was lost too.
#[derive(Debug, Clone, Copy)]
struct Repair {
    what: Resend,
    /// The PSN the next new packet had when the repair left: what is sent
    /// from it on left after the repair.
    since: Psn,
    /// READ responses to requests sent after the repair that arrived while
    /// its own did not (the responder answers in the order it is asked).
    later_responses: u32,
    /// When the repair left, once it has.
    sent_at: Option<Instant>,
    /// Times the repair timer has sent it again with nothing answered:
    /// each doubles the next wait, as a retransmission timer backs off.
    timer_repeats: u32,
}

/// The repair timer's wait doubles at most this many times (64 of its
/// waits, about a millisecond on a 10 µs path): a responder paced down to
/// a packet in half a millisecond answers a repeat only after the
/// responses queued before it, and asking it again every 20 µs sent
/// 281,203 packets from one host in seed 7011119.
const REPAIR_BACKOFF_MAX: u32 = 6;

impl Repair {
    fn new(what: Resend, since: Psn) -> Repair {
        Repair { what, since, later_responses: 0, sent_at: None, timer_repeats: 0 }
    }

    /// When the repair timer sends it again, waiting `wait` the first time.
    fn due(&self, wait: Duration) -> Option<Instant> {
        self.sent_at.map(|at| at + wait * (1 << self.timer_repeats.min(REPAIR_BACKOFF_MAX)))
    }
}

/// The requester's picture of the responder and its queue of repairs.
#[derive(Debug, Clone, Default)]
pub(super) struct Scoreboard {
    /// The latest selective NAK: the first PSN missing and what had
    /// arrived after it.
    report: Option<(Psn, sack::Repr)>,
    /// What went again since the last timeout: it goes again only on
    /// evidence from packets sent after it.
    resent: VecDeque<Repair>,
    /// What to send again, oldest first.
    queue: VecDeque<Resend>,
    /// When the last READ response or ATOMIC result arrived.
    last_response_at: Option<Instant>,
}

impl Scoreboard {
    /// Has the responder reported `psn` arrived?
    pub fn has_arrived(&self, psn: Psn) -> bool {
        let Some((missing, bitmap)) = &self.report else {
            return false;
        };
        let index = psn.distance_from(*missing) - 1;
        index >= 0 && bitmap.received(index as u32)
    }

    /// Is a gap known: has a selective NAK reported one that is still open?
    pub fn has_report(&self) -> bool {
        self.report.is_some()
    }

    /// Takes a selective NAK for `missing`; queues every PSN before
    /// `sent_end` that it shows lost.
    pub fn on_report(&mut self, missing: Psn, bitmap: sack::Repr, sent_end: Psn) {
        self.report = Some((missing, bitmap));
        let Some(highest) = bitmap.highest() else {
            return;
        };
        // Everything sent after the holes arrived: no more evidence is coming.
        let all_arrived = missing.add(highest + 1).next() == sent_end;
        let threshold = |above| above >= DUPLICATE_THRESHOLD || all_arrived;
        // Walk down from the highest PSN that arrived, counting arrivals
        // above each hole.
        let mut lost = Vec::new();
        let mut above = 1;
        for index in (0..highest).rev() {
            if bitmap.received(index) {
                above += 1;
            } else if threshold(above) {
                lost.push(missing.add(index + 1));
            }
        }
        if threshold(above) {
            lost.push(missing);
        }
        for psn in lost.into_iter().rev() {
            if psn.is_before(sent_end) {
                self.lose_request(psn, sent_end);
            }
        }
    }

    /// Queues the request packet of `psn` to go again, unless it went
    /// since the last timeout and nothing sent after that has arrived
    /// enough to show the repair lost.
    fn lose_request(&mut self, psn: Psn, sent_end: Psn) {
        let what = Resend::Request(psn);
        match self.resent.iter().position(|r| r.what == what) {
            None => self.lose(what, sent_end),
            Some(i) if self.arrivals_from(self.resent[i].since) >= DUPLICATE_THRESHOLD => {
                self.resent[i].since = sent_end;
                self.queue.push_back(what);
            }
            Some(_) => {}
        }
    }

    /// Packets the latest report holds from PSN `first` on.
    fn arrivals_from(&self, first: Psn) -> u32 {
        let Some((missing, bitmap)) = &self.report else {
            return 0;
        };
        let start = (first.distance_from(*missing) - 1).max(0) as u32;
        (start..sack::BITS).filter(|&i| bitmap.received(i)).count() as u32
    }

    /// Queues `what` to go again, unless it went since the last timeout;
    /// `sent_end` is the PSN the next new packet takes.
    pub fn lose(&mut self, what: Resend, sent_end: Psn) {
        if !self.resent.iter().any(|r| r.what == what) {
            self.resent.push_back(Repair::new(what, sent_end));
            self.queue.push_back(what);
        }
    }

    /// The repair `what` left at `now`.
    pub fn on_sent(&mut self, what: Resend, now: Instant) {
        if let Some(repair) = self.resent.iter_mut().find(|r| r.what == what) {
            repair.sent_at = Some(now);
        }
    }

    /// A READ response or ATOMIC acknowledgement of `psn` arrived at
    /// `now`. Each repaired response still `missing` goes again once
    /// `DUPLICATE_THRESHOLD` responses to later requests have overtaken
    /// it, or once a response to a later request arrives `settle` (a round
    /// trip and a quarter) after the repair left (RFC 8985's rule by time:
    /// the later requests that would show it lost are few when the READ
    /// limit holds them back). Only responses to later requests count, as
    /// in RFC 8985: the responder answers in order, so the others left
    /// before the repair arrived, and a paced responder's backlog of them
    /// had the same hole asked for again every round trip, each asking
    /// deepening the backlog.
    pub fn on_response(
        &mut self,
        psn: Psn,
        sent_end: Psn,
        now: Instant,
        settle: Duration,
        missing: impl Fn(Psn) -> bool,
    ) {
        for repair in &mut self.resent {
            if !matches!(repair.what, Resend::Responses(_)) {
                continue;
            }
            if !psn.is_before(repair.since) {
                repair.later_responses += 1;
            }
            let overdue = repair.later_responses > 0 && repair.sent_at.is_some_and(|at| now - at >= settle);
            if (repair.later_responses >= DUPLICATE_THRESHOLD || overdue) && missing(repair.what.psn()) {
                *repair = Repair::new(repair.what, sent_end);
                self.queue.push_back(repair.what);
            }
        }
    }

    /// The next repair still worth sending now that everything before
    /// `una` is acknowledged.
    pub fn next(&mut self, una: Psn) -> Option<Resend> {
        while let Some(what) = self.queue.pop_front() {
            let wanted = match what {
                Resend::Request(psn) => !psn.is_before(una) && !self.has_arrived(psn),
                Resend::Responses(psn) => !psn.is_before(una),
            };
            if wanted {
                return Some(what);
            }
        }
        None
    }

    /// A READ response or ATOMIC result arrived at `now`.
    pub fn note_response(&mut self, now: Instant) {
        self.last_response_at = Some(now);
    }

    /// When the first repaired response in flight is due, if its answer
    /// should take no longer than `wait` (doubled for each time the timer
    /// sent it again).
    pub fn response_repair_due(&self, wait: Duration) -> Option<Instant> {
        self.resent.iter().filter(|r| matches!(r.what, Resend::Responses(_))).filter_map(|r| r.due(wait)).min()
    }

    /// The repair timer: at `now`, with no answer for `wait` (the flight
    /// has drained, so nothing later will show a repair lost), each
    /// repaired response still `missing` and due goes again, and waits
    /// twice as long the next time. Responses still arriving leave the
    /// repairs to `on_response`.
    pub fn on_response_repair_timer(&mut self, now: Instant, wait: Duration, missing: impl Fn(Psn) -> bool) {
        if self.last_response_at.is_some_and(|at| now - at < wait) {
            return;
        }
        for repair in &mut self.resent {
            let overdue = repair.due(wait).is_some_and(|due| due <= now);
            if matches!(repair.what, Resend::Responses(_)) && overdue && missing(repair.what.psn()) {
                repair.sent_at = None;
                repair.later_responses = 0;
                repair.timer_repeats += 1;
                self.queue.push_back(repair.what);
            }
        }
    }

    /// Is a repair waiting?
    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Everything before `una` is acknowledged: forget it, and the report
    /// of a gap that has closed (the responder reports what is still
    /// missing afresh; a stale report would hide a packet whose
    /// acknowledgement was lost from the timer's repairs).
    pub fn on_progress(&mut self, una: Psn) {
        self.resent.retain(|r| !r.what.psn().is_before(una));
        if self.report.is_some_and(|(missing, _)| missing.is_before(una)) {
            self.report = None;
        }
    }

    /// The timer expired: whatever was sent again may have been lost too.
    pub fn on_timeout(&mut self) {
        self.resent.clear();
        self.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(arrived: &[u32]) -> sack::Repr {
        let mut bitmap = sack::Repr::default();
        for &i in arrived {
            bitmap.set_received(i);
        }
        bitmap
    }

    fn drain(board: &mut Scoreboard, una: Psn) -> Vec<Resend> {
        std::iter::from_fn(|| board.next(una)).collect()
    }

    #[test]
    fn a_hole_is_lost_once_three_later_packets_arrived() {
        let mut board = Scoreboard::default();
        // 100 missing; 101 and 102 arrived: maybe only overtaken.
        board.on_report(Psn::new(100), report(&[0, 1]), Psn::new(200));
        assert_eq!(drain(&mut board, Psn::new(100)), []);
        // 103 too: lost. 104 missing with 105..=107 above: lost; 108
        // missing with one above: not yet.
        board.on_report(Psn::new(100), report(&[0, 1, 2, 4, 5, 6, 8]), Psn::new(200));
        assert_eq!(drain(&mut board, Psn::new(100)), [Resend::Request(Psn::new(100)), Resend::Request(Psn::new(104))]);
        assert!(board.has_arrived(Psn::new(105)) && !board.has_arrived(Psn::new(104)));
        // The same evidence again sends nothing twice.
        board.on_report(Psn::new(100), report(&[0, 1, 2, 4, 5, 6, 8, 9, 10]), Psn::new(200));
        assert_eq!(drain(&mut board, Psn::new(100)), [Resend::Request(Psn::new(108))]);
        // Three packets sent after the repairs (from 200 on) arrived and 100
        // and 104 have not: their repairs were lost too.
        let arrived: Vec<u32> = (0..=101).filter(|&i| i != 3).collect();
        board.on_report(Psn::new(100), report(&arrived), Psn::new(210));
        assert_eq!(drain(&mut board, Psn::new(100)), [Resend::Request(Psn::new(100)), Resend::Request(Psn::new(104))]);
        // After a timeout every hole may go again; what was acknowledged
        // meanwhile does not.
        board.on_timeout();
        board.on_progress(Psn::new(105));
        board.on_report(Psn::new(108), report(&[0, 1, 2]), Psn::new(200));
        assert_eq!(drain(&mut board, Psn::new(108)), [Resend::Request(Psn::new(108))]);
    }

    #[test]
    fn repairs_overtaken_by_acknowledgements_are_dropped() {
        let mut board = Scoreboard::default();
        board.on_report(Psn::new(10), report(&[0, 1, 2, 3]), Psn::new(20));
        board.lose(Resend::Responses(Psn::new(12)), Psn::new(20));
        assert!(board.has_queued());
        assert_eq!(drain(&mut board, Psn::new(15)), []);
        // Nothing beyond what was sent is ever lost.
        board.on_report(Psn::new(30), report(&[0, 1, 2]), Psn::new(30));
        assert_eq!(drain(&mut board, Psn::new(30)), []);
    }

    #[test]
    fn a_repaired_response_goes_again_once_later_requests_are_answered() {
        let mut board = Scoreboard::default();
        board.lose(Resend::Responses(Psn::new(40)), Psn::new(60));
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        let (settle, t) = (Duration::from_micros(100), |us: u64| Instant::from_nanos(us * 1000));
        board.on_sent(Resend::Responses(Psn::new(40)), t(0));
        // Responses to requests sent before the repair say nothing, while
        // the repair may still be on its way.
        for psn in 50..60 {
            board.on_response(Psn::new(psn), Psn::new(70), t(10), settle, |_| true);
        }
        assert!(!board.has_queued());
        // Three to requests sent after it do.
        for psn in 60..63 {
            board.on_response(Psn::new(psn), Psn::new(70), t(20), settle, |_| true);
        }
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        // So does a response to a later request that arrives a round trip
        // and a quarter after the repair left...
        board.on_sent(Resend::Responses(Psn::new(40)), t(30));
        board.on_response(Psn::new(70), Psn::new(75), t(100), settle, |_| true);
        assert!(!board.has_queued());
        board.on_response(Psn::new(71), Psn::new(75), t(130), settle, |_| true);
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        // ...but not the responder's backlog of answers to requests sent
        // before the repair, however late they come.
        board.on_sent(Resend::Responses(Psn::new(40)), t(140));
        for (i, psn) in (41..60).enumerate() {
            board.on_response(Psn::new(psn), Psn::new(75), t(300 + 50 * i as u64), settle, |_| true);
        }
        assert!(!board.has_queued());
        // Nor when the repair's response came meanwhile.
        board.on_sent(Resend::Responses(Psn::new(40)), t(1400));
        for psn in 70..80 {
            board.on_response(Psn::new(psn), Psn::new(90), t(1700), settle, |_| false);
        }
        assert!(!board.has_queued());
    }

    #[test]
    fn the_repair_timer_resends_only_on_a_drained_flight() {
        let mut board = Scoreboard::default();
        let (wait, t) = (Duration::from_micros(30), |us: u64| Instant::from_nanos(us * 1000));
        board.lose(Resend::Responses(Psn::new(40)), Psn::new(60));
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        board.on_sent(Resend::Responses(Psn::new(40)), t(100));
        assert_eq!(board.response_repair_due(wait), Some(t(130)));
        // Responses still arriving: the time rule of `on_response` decides.
        board.note_response(t(120));
        board.on_response_repair_timer(t(130), wait, |_| true);
        assert!(!board.has_queued());
        // Drained: it goes again.
        board.on_response_repair_timer(t(160), wait, |_| true);
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        assert_eq!(board.response_repair_due(wait), None, "not sent since");
    }

    #[test]
    fn each_repeat_by_the_timer_waits_twice_as_long() {
        let mut board = Scoreboard::default();
        let (wait, t) = (Duration::from_micros(20), |us: u64| Instant::from_nanos(us * 1000));
        board.lose(Resend::Responses(Psn::new(40)), Psn::new(60));
        let mut sent = 0;
        // Unanswered, it goes again after 20, 40, 80 ... µs, then every
        // 64 waits: a slow responder is asked every 1.28 ms, not every 20 µs.
        for expected in [20, 40, 80, 160, 320, 640, 1280, 1280] {
            assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
            board.on_sent(Resend::Responses(Psn::new(40)), t(sent));
            assert_eq!(board.response_repair_due(wait), Some(t(sent + expected)));
            board.on_response_repair_timer(t(sent + expected - 1), wait, |_| true);
            assert!(!board.has_queued(), "not before {expected} µs");
            sent += expected;
            board.on_response_repair_timer(t(sent), wait, |_| true);
        }
        // Evidence from later requests' responses starts it afresh.
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        board.on_sent(Resend::Responses(Psn::new(40)), t(sent));
        for psn in 60..63 {
            board.on_response(Psn::new(psn), Psn::new(70), t(sent + 5), wait, |_| true);
        }
        assert_eq!(drain(&mut board, Psn::new(40)), [Resend::Responses(Psn::new(40))]);
        board.on_sent(Resend::Responses(Psn::new(40)), t(sent + 10));
        assert_eq!(board.response_repair_due(wait), Some(t(sent + 30)));
    }

    #[test]
    fn at_the_end_of_a_flight_one_later_arrival_is_enough() {
        let mut board = Scoreboard::default();
        // 50 missing, 51 arrived, and 51 was the last packet sent.
        board.on_report(Psn::new(50), report(&[0]), Psn::new(52));
        assert_eq!(drain(&mut board, Psn::new(50)), [Resend::Request(Psn::new(50))]);
        // With more in flight, one arrival is not enough.
        board.on_report(Psn::new(60), report(&[0]), Psn::new(70));
        assert_eq!(drain(&mut board, Psn::new(60)), []);
    }
}
