//! BTH opcodes and what each one implies about the rest of the packet.
//!
//! The high three bits of an opcode name the transport (000 RC, 001 UC, 011
//! UD, 100 CNP in RoCEv2), the low five bits the operation (IBTA vol. 1,
//! table 38). A UC opcode's packet is laid out as its RC twin's, the same
//! low five bits ([`Opcode::rc_twin`]).

use crate::Error;

/// A BTH opcode that softrnic sends or accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastImm = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyImm = 0x05,
    RcWriteFirst = 0x06,
    RcWriteMiddle = 0x07,
    RcWriteLast = 0x08,
    RcWriteLastImm = 0x09,
    RcWriteOnly = 0x0a,
    RcWriteOnlyImm = 0x0b,
    RcReadRequest = 0x0c,
    RcReadResponseFirst = 0x0d,
    RcReadResponseMiddle = 0x0e,
    RcReadResponseLast = 0x0f,
    RcReadResponseOnly = 0x10,
    RcAck = 0x11,
    RcAtomicAck = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    RcSendLastInv = 0x16,
    RcSendOnlyInv = 0x17,
    /// IBTA 1.5's ATOMIC WRITE: 8 bytes stored whole at the RETH's
    /// address, answered by a READ RESPONSE ONLY without data.
    RcAtomicWrite = 0x1d,
    UcSendFirst = 0x20,
    UcSendMiddle = 0x21,
    UcSendLast = 0x22,
    UcSendLastImm = 0x23,
    UcSendOnly = 0x24,
    UcSendOnlyImm = 0x25,
    UcWriteFirst = 0x26,
    UcWriteMiddle = 0x27,
    UcWriteLast = 0x28,
    UcWriteLastImm = 0x29,
    UcWriteOnly = 0x2a,
    UcWriteOnlyImm = 0x2b,
    UdSendOnly = 0x64,
    UdSendOnlyImm = 0x65,
    /// RoCEv2 congestion notification packet (annex A17.9.3).
    Cnp = 0x81,
}

/// Where a packet sits in a multi-packet message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl Position {
    /// Does a message start with this packet?
    pub fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Does a message end with this packet?
    pub fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// Which extension headers follow the BTH, in wire order, and whether a
/// payload may follow them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    pub deth: bool,
    pub reth: bool,
    pub atomic_eth: bool,
    pub aeth: bool,
    pub atomic_ack_eth: bool,
    pub immdt: bool,
    pub ieth: bool,
    pub payload: bool,
    /// Reserved bytes after the BTH (the 16 of a CNP).
    pub reserved: usize,
}

impl Opcode {
    /// Every opcode, for tests and tables.
    pub const ALL: [Opcode; 39] = [
        Opcode::RcSendFirst,
        Opcode::RcSendMiddle,
        Opcode::RcSendLast,
        Opcode::RcSendLastImm,
        Opcode::RcSendOnly,
        Opcode::RcSendOnlyImm,
        Opcode::RcWriteFirst,
        Opcode::RcWriteMiddle,
        Opcode::RcWriteLast,
        Opcode::RcWriteLastImm,
        Opcode::RcWriteOnly,
        Opcode::RcWriteOnlyImm,
        Opcode::RcReadRequest,
        Opcode::RcReadResponseFirst,
        Opcode::RcReadResponseMiddle,
        Opcode::RcReadResponseLast,
        Opcode::RcReadResponseOnly,
        Opcode::RcAck,
        Opcode::RcAtomicAck,
        Opcode::RcCompareSwap,
        Opcode::RcFetchAdd,
        Opcode::RcSendLastInv,
        Opcode::RcSendOnlyInv,
        Opcode::RcAtomicWrite,
        Opcode::UcSendFirst,
        Opcode::UcSendMiddle,
        Opcode::UcSendLast,
        Opcode::UcSendLastImm,
        Opcode::UcSendOnly,
        Opcode::UcSendOnlyImm,
        Opcode::UcWriteFirst,
        Opcode::UcWriteMiddle,
        Opcode::UcWriteLast,
        Opcode::UcWriteLastImm,
        Opcode::UcWriteOnly,
        Opcode::UcWriteOnlyImm,
        Opcode::UdSendOnly,
        Opcode::UdSendOnlyImm,
        Opcode::Cnp,
    ];

    /// The extension headers this opcode carries, in the order of IBTA vol. 1
    /// section 9.2 (DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH).
    pub const fn layout(self) -> Layout {
        use Opcode::*;
        if self.is_uc() {
            return self.rc_twin().layout();
        }
        let mut l = Layout {
            deth: false,
            reth: false,
            atomic_eth: false,
            aeth: false,
            atomic_ack_eth: false,
            immdt: false,
            ieth: false,
            payload: false,
            reserved: 0,
        };
        match self {
            RcSendFirst | RcSendMiddle | RcSendLast | RcSendOnly | RcWriteMiddle | RcWriteLast => l.payload = true,
            UcSendFirst | UcSendMiddle | UcSendLast | UcSendLastImm | UcSendOnly | UcSendOnlyImm | UcWriteFirst
            // Laid out as their RC twins, above.
            | UcWriteMiddle | UcWriteLast | UcWriteLastImm | UcWriteOnly | UcWriteOnlyImm => {}
            RcSendLastImm | RcSendOnlyImm | RcWriteLastImm => {
                l.immdt = true;
                l.payload = true;
            }
            RcSendLastInv | RcSendOnlyInv => {
                l.ieth = true;
                l.payload = true;
            }
            RcWriteFirst | RcWriteOnly | RcAtomicWrite => {
                l.reth = true;
                l.payload = true;
            }
            RcWriteOnlyImm => {
                l.reth = true;
                l.immdt = true;
                l.payload = true;
            }
            RcReadRequest => l.reth = true,
            RcReadResponseFirst | RcReadResponseLast | RcReadResponseOnly => {
                l.aeth = true;
                l.payload = true;
            }
            RcReadResponseMiddle => l.payload = true,
            RcAck => l.aeth = true,
            RcAtomicAck => {
                l.aeth = true;
                l.atomic_ack_eth = true;
            }
            RcCompareSwap | RcFetchAdd => l.atomic_eth = true,
            UdSendOnly => {
                l.deth = true;
                l.payload = true;
            }
            UdSendOnlyImm => {
                l.deth = true;
                l.immdt = true;
                l.payload = true;
            }
            Cnp => l.reserved = crate::cnp::RESERVED_LEN,
        }
        l
    }

    /// Bytes of extension headers between the BTH and the payload.
    pub const fn extension_len(self) -> usize {
        let l = self.layout();
        (l.deth as usize) * crate::deth::Header::<&[u8]>::LEN
            + (l.reth as usize) * crate::reth::Header::<&[u8]>::LEN
            + (l.atomic_eth as usize) * crate::atomic_eth::Header::<&[u8]>::LEN
            + (l.aeth as usize) * crate::aeth::Header::<&[u8]>::LEN
            + (l.atomic_ack_eth as usize) * crate::atomic_ack_eth::Header::<&[u8]>::LEN
            + (l.immdt as usize) * crate::immdt::Header::<&[u8]>::LEN
            + (l.ieth as usize) * crate::ieth::Header::<&[u8]>::LEN
            + l.reserved
    }

    /// The position of this packet in its message, for opcodes that belong
    /// to a segmented message (SEND, WRITE, READ response).
    pub const fn position(self) -> Option<Position> {
        use Opcode::*;
        if self.is_uc() {
            return self.rc_twin().position();
        }
        match self {
            RcSendFirst | RcWriteFirst | RcReadResponseFirst => Some(Position::First),
            RcSendMiddle | RcWriteMiddle | RcReadResponseMiddle => Some(Position::Middle),
            RcSendLast | RcSendLastImm | RcSendLastInv | RcWriteLast | RcWriteLastImm | RcReadResponseLast => {
                Some(Position::Last)
            }
            RcSendOnly | RcSendOnlyImm | RcSendOnlyInv | RcWriteOnly | RcWriteOnlyImm | RcReadResponseOnly
            | RcReadRequest | RcCompareSwap | RcFetchAdd | RcAtomicWrite | UdSendOnly | UdSendOnlyImm => {
                Some(Position::Only)
            }
            RcAck | RcAtomicAck | Cnp => None,
            // As their RC twins, above.
            UcSendFirst | UcSendMiddle | UcSendLast | UcSendLastImm | UcSendOnly | UcSendOnlyImm | UcWriteFirst
            | UcWriteMiddle | UcWriteLast | UcWriteLastImm | UcWriteOnly | UcWriteOnlyImm => None,
        }
    }

    /// Is this an unreliable-connected opcode?
    pub const fn is_uc(self) -> bool {
        matches!(self as u8, 0x20..=0x2b)
    }

    /// The RC opcode with the same operation: a UC opcode's, itself for
    /// any other.
    pub const fn rc_twin(self) -> Opcode {
        use Opcode::*;
        match self {
            UcSendFirst => RcSendFirst,
            UcSendMiddle => RcSendMiddle,
            UcSendLast => RcSendLast,
            UcSendLastImm => RcSendLastImm,
            UcSendOnly => RcSendOnly,
            UcSendOnlyImm => RcSendOnlyImm,
            UcWriteFirst => RcWriteFirst,
            UcWriteMiddle => RcWriteMiddle,
            UcWriteLast => RcWriteLast,
            UcWriteLastImm => RcWriteLastImm,
            UcWriteOnly => RcWriteOnly,
            UcWriteOnlyImm => RcWriteOnlyImm,
            other => other,
        }
    }

    /// The UC opcode with the same operation, for an RC SEND or WRITE
    /// (`None` for operations UC does not carry).
    pub const fn uc_twin(self) -> Option<Opcode> {
        use Opcode::*;
        Some(match self {
            RcSendFirst => UcSendFirst,
            RcSendMiddle => UcSendMiddle,
            RcSendLast => UcSendLast,
            RcSendLastImm => UcSendLastImm,
            RcSendOnly => UcSendOnly,
            RcSendOnlyImm => UcSendOnlyImm,
            RcWriteFirst => UcWriteFirst,
            RcWriteMiddle => UcWriteMiddle,
            RcWriteLast => UcWriteLast,
            RcWriteLastImm => UcWriteLastImm,
            RcWriteOnly => UcWriteOnly,
            RcWriteOnlyImm => UcWriteOnlyImm,
            _ => return None,
        })
    }

    /// Is this a SEND of any kind (RC, UC or UD)?
    pub const fn is_send(self) -> bool {
        let rc = self.rc_twin();
        (rc as u8) <= 0x05 || matches!(rc, Opcode::RcSendLastInv | Opcode::RcSendOnlyInv) || self.is_ud()
    }

    /// Is this an RDMA WRITE packet (RC or UC)?
    pub const fn is_write(self) -> bool {
        matches!(self.rc_twin() as u8, 0x06..=0x0b)
    }

    /// Is this a READ response packet?
    pub const fn is_read_response(self) -> bool {
        matches!(self as u8, 0x0d..=0x10)
    }

    /// Is this an ATOMIC request (compare-and-swap or fetch-and-add)?
    pub const fn is_atomic(self) -> bool {
        matches!(self, Opcode::RcCompareSwap | Opcode::RcFetchAdd)
    }

    /// Is this packet sent by a requester (as opposed to a responder's
    /// acknowledgement, read response or atomic acknowledgement)?
    pub const fn is_request(self) -> bool {
        !matches!(self as u8, 0x0d..=0x12) && !matches!(self, Opcode::Cnp)
    }

    /// Is this an unreliable-datagram opcode?
    pub const fn is_ud(self) -> bool {
        matches!(self, Opcode::UdSendOnly | Opcode::UdSendOnlyImm)
    }

    /// Does the packet carry immediate data?
    pub const fn has_immediate(self) -> bool {
        self.layout().immdt
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;

    fn try_from(value: u8) -> Result<Self, Error> {
        Opcode::ALL.iter().copied().find(|op| *op as u8 == value).ok_or(Error::UnknownOpcode(value))
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_round_trips_through_its_byte() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::try_from(op as u8), Ok(op));
        }
    }

    #[test]
    fn unassigned_bytes_are_rejected() {
        for byte in [0x15u8, 0x18, 0x1f, 0x2c, 0x63, 0x66, 0x80, 0xff] {
            assert_eq!(Opcode::try_from(byte), Err(Error::UnknownOpcode(byte)));
        }
    }

    #[test]
    fn extension_lengths_match_the_specification() {
        assert_eq!(Opcode::RcSendOnly.extension_len(), 0);
        assert_eq!(Opcode::RcWriteOnlyImm.extension_len(), 16 + 4);
        assert_eq!(Opcode::RcReadRequest.extension_len(), 16);
        assert_eq!(Opcode::RcAtomicAck.extension_len(), 4 + 8);
        assert_eq!(Opcode::RcCompareSwap.extension_len(), 28);
        assert_eq!(Opcode::UdSendOnlyImm.extension_len(), 8 + 4);
        assert_eq!(Opcode::RcSendOnlyInv.extension_len(), 4);
        assert_eq!(Opcode::RcAtomicWrite.extension_len(), 16, "a RETH, then the 8 bytes as payload");
        assert!(Opcode::RcAtomicWrite.layout().payload);
        assert_eq!(Opcode::Cnp.extension_len(), 16);
    }

    #[test]
    fn classification() {
        assert!(Opcode::RcSendLastInv.is_send());
        assert!(Opcode::UdSendOnly.is_send());
        assert!(!Opcode::RcWriteOnly.is_send());
        assert!(Opcode::RcWriteLastImm.is_write());
        assert!(Opcode::RcReadResponseMiddle.is_read_response());
        assert!(!Opcode::RcReadResponseOnly.is_request());
        assert!(!Opcode::RcAck.is_request());
        assert!(Opcode::RcReadRequest.is_request());
        assert!(Opcode::RcFetchAdd.is_atomic());
        let atomic_write = Opcode::RcAtomicWrite;
        assert!(atomic_write.is_request() && !atomic_write.is_write() && !atomic_write.is_atomic());
        assert_eq!((atomic_write as u8, atomic_write.position()), (0x1d, Some(Position::Only)));
    }

    #[test]
    fn a_uc_opcode_is_its_rc_twin_on_the_wire_but_for_the_transport_bits() {
        let uc: Vec<Opcode> = Opcode::ALL.iter().copied().filter(|op| op.is_uc()).collect();
        assert_eq!(uc.len(), 12, "SEND and WRITE, first to only, with immediate");
        for op in uc {
            let rc = op.rc_twin();
            assert_eq!(op as u8, 0x20 | rc as u8, "{op:?}");
            assert_eq!(rc.uc_twin(), Some(op));
            assert_eq!((op.layout(), op.position()), (rc.layout(), rc.position()), "{op:?}");
            assert_eq!((op.is_send(), op.is_write(), op.is_request()), (rc.is_send(), rc.is_write(), true), "{op:?}");
        }
        assert_eq!(Opcode::UcWriteOnlyImm.extension_len(), 16 + 4);
        for rc in [Opcode::RcReadRequest, Opcode::RcFetchAdd, Opcode::RcSendOnlyInv, Opcode::RcAck] {
            assert_eq!(rc.uc_twin(), None, "UC carries no {rc:?}");
        }
    }
}
