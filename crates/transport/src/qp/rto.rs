//! The adaptive retransmission timeout: how long a requester waits for an
//! acknowledgement before it sends again, learned from the path.
//!
//! RoCE waits the QP's `timeout` attribute (4.096 µs × 2^timeout, 67 ms
//! for perftest's 14) whatever the path, so one lost tail packet on a
//! 10 µs path costs 67 ms. An adaptive QP times one packet at a time
//! (Karn's rule: never one that was sent twice), keeps a smoothed RTT and
//! its variation, and waits `srtt + 4·rttvar` (RFC 6298), no less than a
//! floor and never more than the attribute allows, doubling on each
//! expiry. The first expiry after new data is a tail-loss probe (RFC 8985
//! in spirit), due after two smoothed RTTs: only the last packet sent
//! goes again, which is all a lost tail needs and all a lost ACK needs to
//! be repeated.
//!
//! `retry_cnt` keeps its meaning: a retry is spent only when the QP's
//! full `timeout` has passed with no progress, so a QP fails no sooner
//! than a fixed-timer one would; the expiries before that are free.

use std::time::Duration;

use softrnic_wire::Psn;

use crate::time::Instant;

/// How a QP times retransmissions (`TransportConfig::retransmission`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retransmission {
    /// The IBTA's: wait the QP's `timeout` attribute.
    Fixed,
    /// Learned from the path, waiting at least `floor`.
    Adaptive { floor: Duration },
}

impl Retransmission {
    /// The adaptive timer with the floor softrnic recommends.
    pub const ADAPTIVE: Retransmission = Retransmission::Adaptive { floor: Duration::from_micros(100) };

    /// `fixed` or `adaptive`.
    pub fn parse(text: &str) -> Result<Retransmission, String> {
        match text {
            "fixed" => Ok(Retransmission::Fixed),
            "adaptive" => Ok(Retransmission::ADAPTIVE),
            other => Err(format!("`{other}` is not a retransmission timer; give fixed or adaptive")),
        }
    }
}

/// The most expiries back-off doubles for.
const MAX_BACKOFF: u32 = 16;

/// A QP's RTT estimate and back-off.
#[derive(Debug, Clone, Default)]
pub(super) struct RtoEstimator {
    srtt: Option<Duration>,
    /// The shortest round trip seen: the path without its queue.
    min_rtt: Option<Duration>,
    rttvar: Duration,
    /// Expiries since the last acknowledgement of new data.
    backoff: u32,
    /// The packet being timed: its PSN and when it left.
    timing: Option<(Psn, Instant)>,
    /// The tail-loss probe for the current flight went already.
    pub probed: bool,
}

impl RtoEstimator {
    /// A packet left for the first time.
    pub fn on_new_packet(&mut self, psn: Psn, now: Instant) {
        if self.timing.is_none() {
            self.timing = Some((psn, now));
        }
    }

    /// The packet of `psn` is going again. A timed packet at or after it
    /// goes again too (go-back-N resends in order from there), and its
    /// ACK will not say which copy it answers; one before it stays timed,
    /// so samples keep coming while the tail of a flight is repaired.
    pub fn on_retransmit(&mut self, psn: Psn) {
        if self.timing.is_some_and(|(timed, _)| !timed.is_before(psn)) {
            self.timing = None;
        }
    }

    /// Selective repeat sent the packet of `psn` alone again: only if it
    /// is the one timed does its ACK become ambiguous.
    pub fn on_repair(&mut self, psn: Psn) {
        if self.timing.is_some_and(|(timed, _)| timed == psn) {
            self.timing = None;
        }
    }

    /// The packet being timed, if one is.
    pub fn timed(&self) -> Option<Psn> {
        self.timing.map(|(psn, _)| psn)
    }

    /// Everything before `una` is acknowledged as of `now`. The ACK times
    /// the timed packet if it covers it, unless `gap` says a hole before
    /// it was only just repaired: then the wait was the repair's, not the
    /// path's, and selective repeat has timed it from the selective NAK
    /// that reported it ([`RtoEstimator::on_timed_arrival`]).
    pub fn on_progress(&mut self, una: Psn, now: Instant, gap: bool) {
        self.probed = false;
        let Some((psn, _)) = self.timing else {
            return;
        };
        if !psn.is_before(una) {
            return;
        }
        if gap {
            self.timing = None;
        } else {
            self.on_timed_arrival(now);
        }
    }

    /// The timed packet has arrived as of `now`: a sample.
    pub fn on_timed_arrival(&mut self, now: Instant) {
        let Some((_, sent)) = self.timing.take() else {
            return;
        };
        // Only a valid sample ends the back-off (Karn; RFC 6298 5.7): an
        // ACK of retransmitted packets says nothing of how long the path
        // now takes, and a timer reset on it fires early again and again
        // while a deep queue drains.
        self.backoff = 0;
        let sample = now - sent;
        self.min_rtt = Some(self.min_rtt.map_or(sample, |min| min.min(sample)));
        match self.srtt {
            None => {
                self.srtt = Some(sample);
                self.rttvar = sample / 2;
            }
            Some(srtt) => {
                // RFC 6298: beta = 1/4, alpha = 1/8.
                let error = srtt.abs_diff(sample);
                self.rttvar = (self.rttvar * 3 + error) / 4;
                self.srtt = Some((srtt * 7 + sample) / 8);
            }
        }
    }

    /// The timer ran out.
    pub fn on_expiry(&mut self) {
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
    }

    /// How long to wait for an acknowledgement: the learned timeout,
    /// backed off, within `floor` and `ceiling`; `ceiling` itself before
    /// the first sample.
    pub fn timeout(&self, floor: Duration, ceiling: Duration) -> Duration {
        let Some(srtt) = self.srtt else {
            return ceiling;
        };
        let base = (srtt + self.rttvar * 4).max(floor);
        base.saturating_mul(1 << self.backoff).min(ceiling)
    }

    /// How long to wait before the tail-loss probe: two smoothed RTTs
    /// (RFC 8985's PTO), at least a quarter of `floor` and at most
    /// `ceiling`, not backed off. A probe is one packet, so it may come
    /// sooner than a retransmission may: a lost 64-byte message on a 5 µs
    /// path waited out the whole 100 µs floor, and waiting out the
    /// variation of a path whose queue swings by milliseconds stalled a
    /// lossy flight for all of it.
    pub fn probe_timeout(&self, floor: Duration, ceiling: Duration) -> Duration {
        let Some(srtt) = self.srtt else {
            return ceiling;
        };
        (srtt * 2).max(floor / 4).min(ceiling)
    }

    /// How long an answer may take before a later one shows it lost: a
    /// smoothed RTT and a quarter (RFC 8985's reordering window), or, with
    /// no sample yet, for ever.
    pub fn settle_time(&self) -> Duration {
        self.srtt.map_or(Duration::MAX, |srtt| srtt + srtt / 4)
    }

    /// The shortest round trip seen, if any.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    #[cfg(test)]
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);
    const CEILING: Duration = Duration::from_millis(67);

    fn at(us: u64) -> Instant {
        Instant::from_nanos(us * 1000)
    }

    #[test]
    fn waits_the_attribute_until_it_has_a_sample() {
        let rto = RtoEstimator::default();
        assert_eq!(rto.timeout(100 * US, CEILING), CEILING);
    }

    #[test]
    fn learns_the_path_and_keeps_the_floor() {
        let mut rto = RtoEstimator::default();
        rto.on_new_packet(Psn::new(10), at(0));
        rto.on_progress(Psn::new(11), at(20), false);
        // srtt 20, rttvar 10: 20 + 40 = 60 µs, under the floor.
        assert_eq!(rto.timeout(100 * US, CEILING), 100 * US);
        assert_eq!(rto.timeout(10 * US, CEILING), 60 * US);
        // A steady path narrows the variation.
        for i in 1..50 {
            rto.on_new_packet(Psn::new(10 + i), at(100 * u64::from(i)));
            rto.on_progress(Psn::new(11 + i), at(100 * u64::from(i) + 20), false);
        }
        assert!(rto.timeout(US, CEILING) < 25 * US);
        assert_eq!(rto.srtt(), Some(20 * US));
    }

    #[test]
    fn karn_never_times_a_retransmitted_packet() {
        let mut rto = RtoEstimator::default();
        rto.on_new_packet(Psn::new(1), at(0));
        rto.on_retransmit(Psn::new(1));
        rto.on_progress(Psn::new(2), at(5000), false);
        assert_eq!(rto.srtt(), None, "an ACK of a packet sent twice says nothing of the path");
        // Repairing what follows the timed packet leaves it timed.
        rto.on_new_packet(Psn::new(2), at(6000));
        rto.on_retransmit(Psn::new(5));
        rto.on_progress(Psn::new(3), at(6030), false);
        assert_eq!(rto.srtt(), Some(30 * US));
    }

    #[test]
    fn backs_off_to_the_ceiling_and_resets_on_progress() {
        let mut rto = RtoEstimator::default();
        rto.on_new_packet(Psn::new(1), at(0));
        rto.on_progress(Psn::new(2), at(200), false);
        let base = rto.timeout(100 * US, CEILING);
        rto.on_expiry();
        assert_eq!(rto.timeout(100 * US, CEILING), base * 2);
        for _ in 0..40 {
            rto.on_expiry();
        }
        assert_eq!(rto.timeout(100 * US, CEILING), CEILING);
        // An ACK of packets sent twice keeps the back-off (Karn)...
        rto.on_retransmit(Psn::new(1));
        rto.on_progress(Psn::new(2), at(300), false);
        assert_eq!(rto.timeout(100 * US, CEILING), CEILING);
        // ...and the next timed packet's ACK ends it: 200 µs again, so
        // the variation shrinks (200 + 4 × 75).
        rto.on_new_packet(Psn::new(3), at(400));
        rto.on_progress(Psn::new(4), at(600), false);
        assert_eq!((base, rto.timeout(100 * US, CEILING)), (600 * US, 500 * US));
    }

    #[test]
    fn selective_repeat_times_a_packet_when_it_is_reported_not_when_a_hole_closes() {
        let mut rto = RtoEstimator::default();
        rto.on_new_packet(Psn::new(5), at(0));
        // A selective NAK reports packet 5 held 20 µs later...
        rto.on_timed_arrival(at(20));
        assert_eq!(rto.srtt(), Some(20 * US));
        // ...and a hole before the next timed packet closes only after a
        // repair: the ACK that then covers it is no sample.
        rto.on_new_packet(Psn::new(9), at(100));
        rto.on_progress(Psn::new(10), at(5100), true);
        assert_eq!((rto.srtt(), rto.timed()), (Some(20 * US), None));
    }
}
