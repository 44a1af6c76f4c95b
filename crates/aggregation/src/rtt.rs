//! How long a chunk takes from its first send to its answer: the resend
//! timer (RFC 6298's smoothed mean and deviation; a resend backs off its
//! own chunk's timer, in `worker`, so one lost chunk does not slow the
//! others); and the job's health γ = q / (q + w): q a chunk's quick
//! answer time (a floor that falls at once to a faster answer and creeps
//! up to slower ones), w the smoothed time the switch's aggregators waited
//! for the job's last worker (the answers carry it). A healthy job's
//! workers send together (w near 0, γ near 1); a straggler's aggregators
//! wait for it (γ small), and every worker of the job sees the same.

use std::time::Duration;

/// The resend timer never waits longer than this.
pub const MAX_RTO: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    smoothed: Option<Duration>,
    deviation: Duration,
    min_rto: Duration,
    initial_rto: Duration,
    /// The quick answer time, and the smoothed aggregator wait.
    quick: Option<Duration>,
    aggregator_wait: Option<Duration>,
}

impl RttEstimator {
    /// `initial_rto` until the first answer.
    pub fn new(min_rto: Duration, initial_rto: Duration) -> RttEstimator {
        RttEstimator {
            smoothed: None,
            deviation: Duration::ZERO,
            min_rto,
            initial_rto,
            quick: None,
            aggregator_wait: None,
        }
    }

    pub fn sample(&mut self, rtt: Duration) {
        self.quick = Some(match self.quick {
            Some(q) if rtt > q => q + (rtt - q) / 64,
            _ => rtt,
        });
        match self.smoothed {
            None => {
                self.smoothed = Some(rtt);
                self.deviation = rtt / 2;
            }
            Some(srtt) => {
                let error = srtt.abs_diff(rtt);
                self.deviation = (self.deviation * 3 + error) / 4;
                self.smoothed = Some((srtt * 7 + rtt) / 8);
            }
        }
    }

    pub fn rto(&self) -> Duration {
        let base = match self.smoothed {
            None => self.initial_rto,
            Some(srtt) => (srtt + 4 * self.deviation).max(self.min_rto),
        };
        base.min(MAX_RTO)
    }

    /// An answer said its chunk's aggregator waited `wait` for the last
    /// worker.
    pub fn aggregator_sample(&mut self, wait: Duration) {
        self.aggregator_wait = Some(self.aggregator_wait.map_or(wait, |w| (w * 7 + wait) / 8));
    }

    /// γ in (0, 1].
    pub fn health(&self) -> f64 {
        match (self.quick, self.aggregator_wait) {
            (Some(q), Some(w)) if !(q + w).is_zero() => (q.as_secs_f64() / (q + w).as_secs_f64()).clamp(0.01, 1.0),
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_that_grow_lower_health_and_lengthen_the_timer() {
        let mut r = RttEstimator::new(Duration::from_millis(1), Duration::from_millis(200));
        assert_eq!(r.rto(), Duration::from_millis(200));
        for _ in 0..20 {
            r.sample(Duration::from_micros(100));
            r.aggregator_sample(Duration::ZERO);
        }
        assert!(r.health() > 0.99);
        assert_eq!(r.rto(), Duration::from_millis(1), "the floor");
        for _ in 0..400 {
            r.sample(Duration::from_millis(2));
        }
        assert!(r.health() > 0.99, "slower everywhere alike is no straggler");
        for _ in 0..40 {
            r.aggregator_sample(Duration::from_millis(40));
        }
        assert!(r.health() < 0.1, "aggregators wait twenty times a chunk's answer: {}", r.health());
        assert!(r.rto() >= Duration::from_millis(2));
    }
}
