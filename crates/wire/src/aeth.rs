//! ACK Extended Transport Header (IBTA vol. 1 section 9.3.5, 4 bytes): the
//! responder's verdict on a request, and its message sequence number.
//!
//! ```text
//! +-+---+---------+-----------------------------------------------+
//! |0|typ|  value  |                      MSN                      |
//! +-+---+---------+-----------------------------------------------+
//! ```
//! `typ` 00 is an ACK whose value is a credit count, 01 an RNR NAK whose
//! value is a timer, 11 a NAK whose value is its code.

use crate::view::{get_u24, put_u24};
use crate::{Error, Result};

mod field {
    use core::ops::Range;
    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

typed_view!(
    /// A view over an ACK Extended Transport Header.
    Header,
    4
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// Message sequence number: how many messages the responder completed.
    pub fn msn(&self) -> u32 {
        get_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_syndrome_byte(&mut self, syndrome: u8) {
        self.buffer.as_mut()[field::SYNDROME] = syndrome
    }
    pub fn set_msn(&mut self, msn: u32) {
        put_u24(&mut self.buffer.as_mut()[field::MSN], msn)
    }
}

/// Why a responder refused a request (the NAK codes of IBTA table 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// A packet arrived with a PSN later than expected: resend from the PSN.
    PsnSequenceError = 0,
    /// The request is malformed or not supported (fatal).
    InvalidRequest = 1,
    /// The rkey, bounds or access rights do not allow the access (fatal).
    RemoteAccessError = 2,
    /// The responder could not complete the request (fatal).
    RemoteOperationalError = 3,
    /// Invalid RD request (reliable datagram only).
    InvalidRdRequest = 4,
}

/// The AETH syndrome: an ACK, an RNR NAK or a NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with a 5-bit end-to-end credit code
    /// ([`CREDITS_UNLIMITED`] when the responder does not count credits).
    Ack { credit_code: u8 },
    /// Receiver not ready: no receive WQE was posted. `timer` is the 5-bit
    /// code of the minimum wait ([`rnr_timer_nanos`]).
    RnrNak { timer: u8 },
    /// Negative acknowledgement.
    Nak(NakCode),
}

/// The credit code meaning "no end-to-end flow control".
pub const CREDITS_UNLIMITED: u8 = 0x1f;

impl Syndrome {
    pub fn to_byte(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => credit_code & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code as u8,
        }
    }

    pub fn from_byte(byte: u8) -> Result<Syndrome> {
        let value = byte & 0x1f;
        match byte >> 5 {
            0b000 => Ok(Syndrome::Ack { credit_code: value }),
            0b001 => Ok(Syndrome::RnrNak { timer: value }),
            0b011 => match value {
                0 => Ok(Syndrome::Nak(NakCode::PsnSequenceError)),
                1 => Ok(Syndrome::Nak(NakCode::InvalidRequest)),
                2 => Ok(Syndrome::Nak(NakCode::RemoteAccessError)),
                3 => Ok(Syndrome::Nak(NakCode::RemoteOperationalError)),
                4 => Ok(Syndrome::Nak(NakCode::InvalidRdRequest)),
                _ => Err(Error::Reserved),
            },
            _ => Err(Error::Reserved),
        }
    }

    pub fn is_ack(self) -> bool {
        matches!(self, Syndrome::Ack { .. })
    }
}

/// The meaning of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub syndrome: Syndrome,
    pub msn: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        Ok(Repr { syndrome: Syndrome::from_byte(header.syndrome_byte())?, msn: header.msn() })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_syndrome_byte(self.syndrome.to_byte());
        header.set_msn(self.msn);
    }
}

/// End-to-end credits for each 5-bit credit code (IBTA table 45); the code
/// 31 means "unlimited".
const CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
    8192, 12288, 16384, 24576, 32768,
];

/// The largest credit code that does not promise more than `credits`
/// receive WQEs.
pub fn credit_code(credits: u32) -> u8 {
    CREDITS.iter().rposition(|&c| c <= credits).unwrap_or(0) as u8
}

/// The number of credits a code grants, `None` for [`CREDITS_UNLIMITED`].
pub fn credits_of_code(code: u8) -> Option<u32> {
    CREDITS.get(usize::from(code & 0x1f)).copied()
}

/// Minimum RNR NAK wait for each 5-bit timer code, in units of 10 µs
/// (IBTA table 45, "RNR NAK timer field"); code 0 is the longest.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
    6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The minimum wait an RNR NAK timer code asks for, in nanoseconds.
pub fn rnr_timer_nanos(code: u8) -> u64 {
    u64::from(RNR_TIMER_10US[usize::from(code & 0x1f)]) * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_match_the_specification_bytes() {
        assert_eq!(Syndrome::Nak(NakCode::PsnSequenceError).to_byte(), 0x60);
        assert_eq!(Syndrome::Nak(NakCode::InvalidRequest).to_byte(), 0x61);
        assert_eq!(Syndrome::Nak(NakCode::RemoteAccessError).to_byte(), 0x62);
        assert_eq!(Syndrome::Nak(NakCode::RemoteOperationalError).to_byte(), 0x63);
        assert_eq!(Syndrome::RnrNak { timer: 14 }.to_byte(), 0x2e);
        assert_eq!(Syndrome::Ack { credit_code: CREDITS_UNLIMITED }.to_byte(), 0x1f);
        for byte in 0..=0x7fu8 {
            if let Ok(s) = Syndrome::from_byte(byte) {
                assert_eq!(s.to_byte(), byte);
            }
        }
        assert_eq!(Syndrome::from_byte(0x40), Err(Error::Reserved));
        assert_eq!(Syndrome::from_byte(0x65), Err(Error::Reserved));
        assert_eq!(Syndrome::from_byte(0x80), Err(Error::Reserved));
    }

    #[test]
    fn parses_and_emits_literal_bytes() {
        let bytes = [0x62u8, 0x00, 0x01, 0x02];
        let repr = Repr { syndrome: Syndrome::Nak(NakCode::RemoteAccessError), msn: 0x102 };
        assert_eq!(Repr::parse(&Header::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0u8; 4];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn credit_codes_round_down() {
        assert_eq!(credit_code(0), 0);
        assert_eq!(credit_code(5), 4);
        assert_eq!(credits_of_code(credit_code(5)), Some(4));
        assert_eq!(credit_code(100_000), 30);
        assert_eq!(credits_of_code(CREDITS_UNLIMITED), None);
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_nanos(0), 655_360_000);
        assert_eq!(rnr_timer_nanos(1), 10_000);
        assert_eq!(rnr_timer_nanos(14), 1_280_000);
        assert_eq!(rnr_timer_nanos(31), 491_520_000);
    }
}
