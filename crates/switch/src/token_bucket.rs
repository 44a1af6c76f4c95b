//! A port's line rate: a token bucket that lets a packet go whenever it
//! holds a token, and charges the whole packet, running into debt. The debt
//! holds the next packet back exactly as long as the last one would take on
//! the wire, so the average rate is the configured one to the byte, and
//! `burst` bounds what an idle port may send back to back.

use crate::Time;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    bytes_per_sec: f64,
    burst: f64,
    /// Bytes the port may still send; negative while in debt.
    tokens: f64,
    last: Time,
}

impl TokenBucket {
    pub fn new(rate_bps: u64, burst: u64) -> TokenBucket {
        let burst = burst as f64;
        TokenBucket { bytes_per_sec: rate_bps as f64 / 8.0, burst, tokens: burst, last: Time::ZERO }
    }

    fn refill(&mut self, now: Time) {
        if now > self.last {
            let earned = (now - self.last).as_secs_f64() * self.bytes_per_sec;
            self.tokens = (self.tokens + earned).min(self.burst);
            self.last = now;
        }
    }

    /// When the next packet may go.
    pub fn ready_at(&self) -> Time {
        if self.tokens >= 0.0 {
            self.last
        } else {
            // Round up, so a driver that sleeps until then finds it ready.
            self.last + Time::from_nanos((-self.tokens / self.bytes_per_sec * 1e9).ceil() as u64)
        }
    }

    /// Charges `len` bytes if a packet may go at `now`.
    pub fn try_send(&mut self, now: Time, len: usize) -> bool {
        self.refill(now);
        if self.tokens < 0.0 {
            return false;
        }
        self.tokens -= len as f64;
        true
    }

    /// How long `len` bytes take on the wire at this rate.
    pub fn wire_time(&self, len: usize) -> Time {
        Time::from_secs_f64(len as f64 / self.bytes_per_sec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends 1500-byte packets as fast as the bucket allows, for `secs`,
    /// looking at it every `step`; returns the rate achieved in bits/s.
    fn achieved(rate: u64, burst: u64, step: Time, secs: f64) -> f64 {
        let mut bucket = TokenBucket::new(rate, burst);
        let end = Time::from_secs_f64(secs);
        let (mut now, mut bytes) = (Time::ZERO, 0u64);
        while now < end {
            while bucket.try_send(now, 1500) {
                bytes += 1500;
            }
            now += step;
        }
        bytes as f64 * 8.0 / secs
    }

    /// Accurate as long as the driver looks within the time the burst
    /// takes on the wire (7.4 µs for 9 KiB at 10 Gb/s): that is what the
    /// burst is for.
    #[test]
    fn the_rate_is_accurate_when_the_driver_looks_within_a_burst() {
        for rate in [1_000_000_000u64, 10_000_000_000, 100_000_000_000] {
            let burst_ns = 9_216 * 8 * 1_000_000_000 / rate;
            for step_ns in [1, 97, burst_ns / 2, burst_ns * 9 / 10] {
                let got = achieved(rate, 9_216, Time::from_nanos(step_ns), 0.01);
                let error = (got - rate as f64).abs() / rate as f64;
                assert!(error < 0.01, "{rate} b/s looked at every {step_ns} ns: {got:.0} b/s");
            }
        }
    }

    #[test]
    fn debt_holds_the_next_packet_for_its_wire_time() {
        let mut bucket = TokenBucket::new(8_000_000_000, 0); // 1 byte per ns
        assert!(bucket.try_send(Time::ZERO, 1000));
        assert_eq!(bucket.ready_at(), Time::from_nanos(1000));
        assert!(!bucket.try_send(Time::from_nanos(999), 1000));
        assert!(bucket.try_send(Time::from_nanos(1000), 1000));
        assert_eq!(bucket.wire_time(1000), Time::from_nanos(1000));
    }
}
