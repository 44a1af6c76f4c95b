//! Time as an input. The transport never reads a clock: the engine passes
//! the wall clock in, the simulator its virtual one.

use core::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in nanoseconds since an epoch the driver chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed since `earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX)))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

/// The earliest of the deadlines that are set. Timers are asked for on
/// every packet a QP sends (a tenth of a 64 B sender's time went to
/// `[..].into_iter().flatten().min()` over them): an unset one reads as
/// the end of time, and the rest is a plain minimum.
pub fn earliest<const N: usize>(deadlines: [Option<Instant>; N]) -> Option<Instant> {
    let at = deadlines.iter().fold(u64::MAX, |at, deadline| at.min(deadline.map_or(u64::MAX, Instant::as_nanos)));
    (at != u64::MAX || deadlines.contains(&Some(Instant(u64::MAX)))).then_some(Instant(at))
}

/// The local ACK timeout that a QP's 5-bit `timeout` attribute encodes:
/// 4.096 µs × 2^timeout, `None` (wait forever) for 0 (IBTA 9.7.6.1.3).
pub fn ack_timeout(code: u8) -> Option<Duration> {
    match code {
        0 => None,
        c => Some(Duration::from_nanos(4096u64 << c.min(31))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_deadline_that_is_set() {
        let at = Instant::from_nanos;
        assert_eq!(earliest([None, Some(at(7)), Some(at(3))]), Some(at(3)));
        assert_eq!(earliest([None, None]), None);
        assert_eq!(earliest([Some(at(u64::MAX)), None]), Some(at(u64::MAX)));
        assert_eq!(earliest::<0>([]), None);
    }

    #[test]
    fn ack_timeout_encoding() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(67_108_864)));
    }

    #[test]
    fn instants_saturate() {
        let t = Instant::from_nanos(10);
        assert_eq!(t + Duration::from_nanos(5), Instant::from_nanos(15));
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_nanos(10));
    }
}
