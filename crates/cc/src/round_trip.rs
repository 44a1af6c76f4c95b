//! Rounds of data: a round ends once everything in flight when it began
//! has been acknowledged. Algorithms that act "once per RTT" (DCTCP's
//! alpha, HPCC's reference rate) count rounds this way, from the ACKs'
//! bytes and the bytes in flight they report, so nothing drifts however
//! long the QP runs or however often it retransmits.

/// Where the current round stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rounds {
    /// Bytes still to be acknowledged before the round ends; `None`
    /// before the first ACK.
    left: Option<u64>,
}

impl Rounds {
    /// An ACK of `acked` bytes left `in_flight` bytes outstanding. True
    /// when it ended a round (the first ACK ends the empty round before
    /// it); the next round waits for what is in flight now.
    pub fn on_ack(&mut self, acked: u64, in_flight: u64) -> bool {
        match self.left {
            Some(left) if acked < left => {
                self.left = Some(left - acked);
                false
            }
            _ => {
                self.left = Some(in_flight);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_ends_when_its_flight_is_acknowledged() {
        let mut r = Rounds::default();
        assert!(r.on_ack(1000, 4000), "the first ACK ends round zero");
        assert!(!r.on_ack(1000, 4000));
        assert!(!r.on_ack(2000, 4000));
        assert!(r.on_ack(1000, 3000), "4000 bytes acknowledged");
        assert!(!r.on_ack(2999, 0));
        assert!(r.on_ack(1, 0));
    }
}
