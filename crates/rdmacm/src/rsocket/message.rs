//! What two softrnic rsockets say to each other, as typed views over
//! bytes with literal-byte tests: the connection's private data, and the
//! control messages that travel beside the stream's bytes.
//!
//! The stream rides RC SENDs with immediate data: the immediate names the
//! message's kind, the payload is the stream's bytes (for [`Kind::Data`])
//! or a control message's fields. Every number is big-endian, as on the
//! wire. This is softrnic's own framing, not rdma-core's (which writes
//! into a ring of the peer's memory and returns credits in immediate
//! data): both ends of an rsocket connection must be softrnic's
//! librdmacm.

/// The version this library speaks; a peer with another is refused.
pub const VERSION: u8 = 1;

/// The connection's private data, each side's (in the REQ and the REP):
/// how large a message its receive slots take, how many it posts, and
/// the word of its memory where the peer reports the slots it has posted
/// again since ([`Stream`](super::stream::Stream)'s credits).
///
/// ```text
/// 0       1       2               4                               8
/// +-------+-------+---------------+-------------------------------+
/// |version| flags |   reserved    |          slot bytes           |
/// +-------+-------+---------------+-------------------------------+
/// |             slots             |             rkey              |
/// +-------------------------------+-------------------------------+
/// |                      credit word's address                    |
/// +---------------------------------------------------------------+ 24
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The most bytes one message may carry to this side.
    pub slot_bytes: u32,
    /// The receives this side keeps posted: the sender's first credits.
    pub slots: u32,
    /// Where the peer RDMA WRITEs its count of receives posted again.
    pub credit_addr: u64,
    pub credit_rkey: u32,
}

impl Hello {
    pub const LEN: usize = 24;

    pub fn emit(&self) -> [u8; Hello::LEN] {
        let mut bytes = [0u8; Hello::LEN];
        bytes[0] = VERSION;
        bytes[4..8].copy_from_slice(&self.slot_bytes.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.slots.to_be_bytes());
        bytes[12..16].copy_from_slice(&self.credit_rkey.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.credit_addr.to_be_bytes());
        bytes
    }

    /// The peer's hello, or why it cannot be used.
    pub fn parse(bytes: &[u8]) -> Result<Hello, String> {
        let Some(bytes) = bytes.get(..Hello::LEN) else {
            return Err(format!("{} bytes of private data, not an rsocket's {}", bytes.len(), Hello::LEN));
        };
        if bytes[0] != VERSION {
            return Err(format!("rsocket protocol version {}, this library speaks {VERSION}", bytes[0]));
        }
        let word = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("four bytes"));
        let hello = Hello {
            slot_bytes: word(4),
            slots: word(8),
            credit_rkey: word(12),
            credit_addr: u64::from_be_bytes(bytes[16..24].try_into().expect("eight bytes")),
        };
        if hello.slot_bytes == 0 || hello.slots == 0 {
            return Err(format!("a peer that takes {} slots of {} bytes", hello.slots, hello.slot_bytes));
        }
        Ok(hello)
    }
}

/// A message's kind, the top byte of its immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The stream's next bytes.
    Data = 1,
    /// The sender's buffer at an offset of its I/O map (`riomap`).
    Map = 2,
    /// An offset no longer mapped (`riounmap`).
    Unmap = 3,
    /// The sender writes no more (`rshutdown(SHUT_WR)`, `rclose`): end
    /// of stream once what came before is read.
    Shutdown = 4,
    /// A credit report that wakes its reader: the RDMA WRITE WITH
    /// IMMEDIATE of the credit word to a peer that had none left.
    Credit = 5,
}

impl Kind {
    /// The immediate data (host order; the verbs take it big-endian).
    pub fn immediate(self) -> u32 {
        (self as u32) << 24
    }

    pub fn from_immediate(imm: u32) -> Option<Kind> {
        match imm >> 24 {
            1 => Some(Kind::Data),
            2 => Some(Kind::Map),
            3 => Some(Kind::Unmap),
            4 => Some(Kind::Shutdown),
            5 => Some(Kind::Credit),
            _ => None,
        }
    }
}

/// A mapping of the sender's memory the receiver may `riowrite` into:
/// `len` bytes at `addr` under `rkey`, at `offset` of the sender's map.
///
/// ```text
/// 0               8               16              24      28
/// +---------------+---------------+---------------+-------+
/// |    offset     |     addr      |      len      | rkey  |
/// +---------------+---------------+---------------+-------+
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub offset: u64,
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

impl Mapping {
    pub const LEN: usize = 28;

    pub fn emit(&self) -> [u8; Mapping::LEN] {
        let mut bytes = [0u8; Mapping::LEN];
        bytes[0..8].copy_from_slice(&self.offset.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.addr.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.len.to_be_bytes());
        bytes[24..28].copy_from_slice(&self.rkey.to_be_bytes());
        bytes
    }

    pub fn parse(bytes: &[u8]) -> Option<Mapping> {
        let bytes = bytes.get(..Mapping::LEN)?;
        let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        Some(Mapping {
            offset: word(0),
            addr: word(8),
            len: word(16),
            rkey: u32::from_be_bytes(bytes[24..28].try_into().expect("four bytes")),
        })
    }

    /// Whether `offset` falls in this mapping.
    pub fn holds(&self, offset: u64) -> bool {
        offset >= self.offset && offset - self.offset < self.len
    }
}

/// An [`Kind::Unmap`]'s payload: the offset whose mapping ends.
pub fn parse_unmap(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_is_twenty_four_bytes_version_first() {
        let hello = Hello { slot_bytes: 16384, slots: 32, credit_addr: 0x7f12_3456_7000, credit_rkey: 0x0102_0304 };
        let bytes = [
            1, 0, 0, 0, // version, flags, reserved
            0x00, 0x00, 0x40, 0x00, // slot bytes
            0x00, 0x00, 0x00, 0x20, // slots
            0x01, 0x02, 0x03, 0x04, // rkey
            0, 0, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, // credit word
        ];
        assert_eq!(hello.emit(), bytes);
        // The REQ's private data is longer: what follows is ignored.
        let mut padded = bytes.to_vec();
        padded.extend_from_slice(&[0; 32]);
        assert_eq!(Hello::parse(&padded), Ok(hello));
    }

    #[test]
    fn a_hello_from_another_version_or_too_short_is_refused() {
        let hello = Hello { slot_bytes: 4096, slots: 8, credit_addr: 64, credit_rkey: 1 };
        let mut bytes = hello.emit();
        assert!(Hello::parse(&bytes[..23]).unwrap_err().contains("23 bytes"));
        bytes[0] = 2;
        assert!(Hello::parse(&bytes).unwrap_err().contains("version 2"));
        let empty = Hello { slot_bytes: 0, ..hello }.emit();
        assert!(Hello::parse(&empty).is_err());
    }

    #[test]
    fn the_kind_rides_the_immediates_top_byte() {
        assert_eq!(Kind::Data.immediate(), 0x0100_0000);
        assert_eq!(Kind::Shutdown.immediate(), 0x0400_0000);
        for kind in [Kind::Data, Kind::Map, Kind::Unmap, Kind::Shutdown, Kind::Credit] {
            assert_eq!(Kind::from_immediate(kind.immediate()), Some(kind));
        }
        assert_eq!(Kind::from_immediate(0), None);
        assert_eq!(Kind::from_immediate(0x0600_0000), None);
    }

    #[test]
    fn a_mapping_is_offset_addr_len_rkey() {
        let mapping = Mapping { offset: 0x1000, addr: 0x7f00_0000_1234, len: 65536, rkey: 0xdead_beef };
        let bytes = [
            0, 0, 0, 0, 0, 0, 0x10, 0x00, // offset
            0, 0, 0x7f, 0, 0, 0, 0x12, 0x34, // addr
            0, 0, 0, 0, 0, 1, 0, 0, // len
            0xde, 0xad, 0xbe, 0xef, // rkey
        ];
        assert_eq!(mapping.emit(), bytes);
        assert_eq!(Mapping::parse(&bytes), Some(mapping));
        assert_eq!(Mapping::parse(&bytes[..27]), None);
        assert!(mapping.holds(0x1000) && mapping.holds(0x1000 + 65535));
        assert!(!mapping.holds(0xfff) && !mapping.holds(0x1000 + 65536));
        assert_eq!(parse_unmap(&[0, 0, 0, 0, 0, 0, 0x10, 0]), Some(0x1000));
        assert_eq!(parse_unmap(&[0; 7]), None);
    }
}
