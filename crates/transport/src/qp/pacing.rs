//! Pacing: the hook congestion control uses to set a QP's sending rate
//! (the shape of `ibv_modify_qp_rate_limit`). The requester may send a
//! packet once the previous packets' bytes have drained at the rate;
//! until then the QP reports when it may send again as a deadline.

use std::time::Duration;

use crate::time::Instant;

/// Spaces packets to a rate in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacer {
    bits_per_second: u64,
    /// The earliest time the next packet may leave.
    next_at: Instant,
}

impl Pacer {
    pub fn new(bits_per_second: u64) -> Pacer {
        Pacer { bits_per_second: bits_per_second.max(1), next_at: Instant::ZERO }
    }

    /// Changes the rate from the next packet on; the packet already
    /// scheduled keeps its departure time.
    pub fn set_rate(&mut self, bits_per_second: u64) {
        self.bits_per_second = bits_per_second.max(1);
    }

    pub fn rate(&self) -> u64 {
        self.bits_per_second
    }

    /// When the next packet may leave.
    pub fn ready_at(&self) -> Instant {
        self.next_at
    }

    pub fn may_send(&self, now: Instant) -> bool {
        self.next_at <= now
    }

    /// Accounts for a packet of `bytes` sent at `now`. Time spent idle is
    /// not saved up: a paced QP never bursts above its rate.
    pub fn on_send(&mut self, now: Instant, bytes: usize) {
        self.next_at = self.next_at.max(now) + self.gap(bytes);
    }

    /// How long a packet of `bytes` holds back the next one.
    pub fn gap(&self, bytes: usize) -> Duration {
        Duration::from_nanos((bytes as u128 * 8 * 1_000_000_000 / u128::from(self.bits_per_second)) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_packets_at_the_rate() {
        let mut p = Pacer::new(8_000_000_000); // 1 byte per ns
        assert!(p.may_send(Instant::ZERO));
        p.on_send(Instant::ZERO, 1000);
        assert_eq!(p.ready_at(), Instant::from_nanos(1000));
        assert!(!p.may_send(Instant::from_nanos(999)));
        // Idle time is not banked.
        p.on_send(Instant::from_nanos(5000), 500);
        assert_eq!(p.ready_at(), Instant::from_nanos(5500));
    }
}
