//! How long a chunk takes from its first send to its answer: the resend
//! timer (RFC 6298's smoothed mean and deviation) and the job's health γ,
//! the fastest time seen over the smoothed one. (A resend backs off its
//! own chunk's timer, `worker`: one lost chunk does not slow the others.) A chunk waits for every
//! worker of its job, so a straggler shows here as a long wait.

use std::time::Duration;

/// The resend timer never waits longer than this.
pub const MAX_RTO: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
pub struct RttEstimator {
    smoothed: Option<Duration>,
    deviation: Duration,
    fastest: Duration,
    min_rto: Duration,
    initial_rto: Duration,
    /// Smoothed wait for a step's first answer.
    step_wait: Option<Duration>,
}

impl RttEstimator {
    /// `initial_rto` until the first answer.
    pub fn new(min_rto: Duration, initial_rto: Duration) -> RttEstimator {
        RttEstimator {
            smoothed: None,
            deviation: Duration::ZERO,
            fastest: Duration::MAX,
            min_rto,
            initial_rto,
            step_wait: None,
        }
    }

    pub fn sample(&mut self, rtt: Duration) {
        self.fastest = self.fastest.min(rtt);
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

    /// A step's first answer came `wait` after the step began.
    pub fn step_sample(&mut self, wait: Duration) {
        self.step_wait = Some(self.step_wait.map_or(wait, |w| (w * 3 + wait) / 4));
    }

    /// γ in (0, 1]: the fastest answer over the smoothed wait for a
    /// step's first.
    pub fn health(&self) -> f64 {
        match self.step_wait {
            Some(wait) if !wait.is_zero() => (self.fastest.as_secs_f64() / wait.as_secs_f64()).clamp(0.01, 1.0),
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
            r.step_sample(Duration::from_micros(100));
        }
        assert!(r.health() > 0.99);
        assert_eq!(r.rto(), Duration::from_millis(1), "the floor");
        for _ in 0..40 {
            r.sample(Duration::from_millis(2));
            r.step_sample(Duration::from_millis(2));
        }
        assert!(r.health() < 0.1, "steps wait twenty times the fastest answer: {}", r.health());
        assert!(r.rto() >= Duration::from_millis(2));
    }
}
