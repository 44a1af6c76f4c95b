//! End-to-end credits: the requester's count of the receives waiting at
//! the responder (IBTA 9.7.7.2).
//!
//! A SEND, or a WRITE with immediate, needs a receive work request at the
//! responder; one that finds none is answered with an RNR NAK, and a
//! program that set `rnr_retry` 0 sees its request fail. So the responder
//! says, in the AETH of every ACK and of the READ responses that carry
//! one, how many receives it holds beyond the message the ACK's MSN
//! counts: the requester may start messages up to that MSN plus those
//! credits (the limit), and holds any later one that needs a receive.
//!
//! - Message numbers: the responder's MSN counts every request message it
//!   has finished, and the requester numbers its messages the same way as
//!   it starts them (the first is 1), so a limit is a message number.
//!   Messages that need no receive (WRITE, READ, ATOMIC) take a number
//!   and need no credit; counting them against the limit only errs on the
//!   safe side.
//! - The limit only rises: receives are only added at the responder but
//!   by messages, so every limit it advertised still holds, and a stale
//!   ACK that arrives late says less, not something false.
//! - The probe: a requester at its limit learns of receives posted since
//!   only from the next acknowledgement, and none comes when nothing is in
//!   flight. So with nothing awaiting acknowledgement it may send one
//!   message beyond the limit; if the receive queue is still empty, the
//!   responder answers it RNR, as it would without credits. Only a probe
//!   can meet an RNR NAK on a QP whose responder counts credits.
//! - "Unlimited" (credit code 31): the responder does not count credits
//!   (a QP on an SRQ, or whose receives are fetched on demand, or a peer
//!   such as rxe that never counts); from then on the requester sends as
//!   if there were no limit.

use softrnic_wire::{Psn, aeth};

/// A message number: MSNs are 24 bits wide and wrap as PSNs do, and
/// `Psn`'s modular arithmetic orders them across the wrap.
type Msn = Psn;

/// What the requester knows of the responder's receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Credits {
    /// The number of the last message the responder holds a receive for
    /// (the IBTA's limit sequence number); `None` once it has said it
    /// does not count.
    limit: Option<Msn>,
    /// The number the next message started takes (its SSN).
    next: Msn,
    /// The number of the last message started that needs a receive.
    last_consuming: Msn,
}

impl Default for Credits {
    /// A new connection: nothing is known of the responder's receives, so
    /// the first message that needs one goes as a probe.
    fn default() -> Credits {
        Credits { limit: Some(Msn::new(0)), next: Msn::new(1), last_consuming: Msn::new(0) }
    }
}

/// Whether a message may start as far as credits go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// It needs no receive, or the responder holds one for it.
    Granted,
    /// It goes beyond the limit, alone, to learn of new receives.
    Probe,
    /// It waits for an acknowledgement to bring credits.
    Wait,
}

impl Credits {
    /// May the next message start? `consumes` says whether it needs a
    /// receive, `idle` whether nothing awaits acknowledgement.
    pub fn admit(&self, consumes: bool, idle: bool) -> Admission {
        match self.limit {
            _ if !consumes => Admission::Granted,
            None => Admission::Granted,
            Some(limit) if self.next.is_at_or_before(limit) => Admission::Granted,
            Some(_) if idle => Admission::Probe,
            Some(_) => Admission::Wait,
        }
    }

    /// The next message started, and took the next number.
    pub fn on_started(&mut self, consumes: bool) {
        if consumes {
            self.last_consuming = self.next;
        }
        self.next = self.next.next();
    }

    /// An AETH that acknowledges through message `msn` and grants the
    /// credits of `credit_code`.
    pub fn on_ack(&mut self, msn: u32, credit_code: u8) {
        let Some(limit) = self.limit else { return };
        match aeth::credits_of_code(credit_code) {
            None => self.limit = None,
            Some(credits) => {
                let advertised = Msn::new(msn).add(credits);
                if limit.is_before(advertised) {
                    self.limit = Some(advertised);
                }
            }
        }
    }

    /// Receives the responder holds beyond the messages started, as far as
    /// the requester knows: `None` if it does not count, and -1 while a
    /// probe is out (never less).
    pub fn available(&self) -> Option<i32> {
        self.limit.map(|limit| limit.distance_from(self.last_consuming))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credit code 4 grants 4 receives, 5 grants 6 (IBTA table 45).
    const FOUR: u8 = 4;

    #[test]
    fn the_first_message_that_needs_a_receive_is_a_probe() {
        let credits = Credits::default();
        assert_eq!(credits.admit(true, true), Admission::Probe);
        assert_eq!(credits.admit(true, false), Admission::Wait);
        assert_eq!(credits.admit(false, false), Admission::Granted, "a WRITE needs no receive");
    }

    #[test]
    fn an_ack_grants_messages_up_to_its_msn_plus_its_credits() {
        let mut credits = Credits::default();
        credits.on_started(true);
        // Message 1 done, four receives left: messages 2 to 5 may go.
        credits.on_ack(1, FOUR);
        for _ in 2..=5 {
            assert_eq!(credits.admit(true, false), Admission::Granted);
            credits.on_started(true);
        }
        assert_eq!(credits.available(), Some(0));
        assert_eq!(credits.admit(true, false), Admission::Wait, "message 6 has no receive yet");
        assert_eq!(credits.admit(true, true), Admission::Probe, "unless nothing is in flight");
        credits.on_started(true);
        assert_eq!(credits.available(), Some(-1), "the probe is the only overdraft");
    }

    #[test]
    fn a_stale_ack_never_lowers_the_limit() {
        let mut credits = Credits::default();
        credits.on_ack(3, FOUR);
        credits.on_ack(1, 0);
        assert_eq!(credits.available(), Some(7));
    }

    #[test]
    fn unlimited_credits_lift_the_limit_for_good() {
        let mut credits = Credits::default();
        credits.on_ack(1, aeth::CREDITS_UNLIMITED);
        credits.on_ack(2, 0);
        assert_eq!(credits.admit(true, false), Admission::Granted);
        assert_eq!(credits.available(), None);
    }

    #[test]
    fn message_numbers_wrap_at_24_bits() {
        let last = 0xff_ffff;
        let mut credits =
            Credits { limit: Some(Msn::new(last - 1)), next: Msn::new(last), last_consuming: Msn::new(last - 1) };
        credits.on_ack(last, FOUR);
        assert_eq!(credits.limit, Some(Msn::new(3)));
        for _ in 0..5 {
            assert_eq!(credits.admit(true, false), Admission::Granted);
            credits.on_started(true);
        }
        assert_eq!(credits.next, Msn::new(4));
        assert_eq!(credits.admit(true, false), Admission::Wait);
    }
}
