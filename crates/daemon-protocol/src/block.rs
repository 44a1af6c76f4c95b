//! Storage blocks, in the shape of Alibaba's Solar protocol (E7), the
//! format softrnicd's block offload parses: every request a self-contained
//! block, a 64-byte header and up to 4 KiB of payload with a CRC-32 over
//! it, answered by an 8-byte acknowledgement. Blocks are independent of
//! each other: nothing is reassembled, so their order does not matter.
//!
//! ```text
//!  0      1      2      4          8                16               24       28     32          64
//! | kind | flags| zero | volume   | offset         | sequence       | length | crc  | zero       |
//! ```
//!
//! Fields are big-endian, as on the wire. A program and a device that
//! offloads the CRC both follow [`BlockHeader`] (a typed view over the
//! bytes) and [`BlockRepr`] (what it says, parsed and emitted), as
//! smoltcp's `wire` does for each header.

use serde::{Deserialize, Serialize};

/// Bytes of a block's header.
pub const HEADER_LEN: usize = 64;
/// Bytes of a whole block's payload: the most one request carries.
pub const BLOCK_LEN: usize = 4096;
/// Bytes of an acknowledgement.
pub const ACK_LEN: usize = 8;

/// CRC-32 with polynomial 0xEDB88320 (reflected; IEEE 802.3's, zlib's),
/// the checksum a block carries over its payload.
pub fn crc32(payload: &[u8]) -> u32 {
    crc32fast::hash(payload)
}

/// CRC-32 over several pieces, in order, as if they were one.
pub fn crc32_of<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for piece in pieces {
        hasher.update(piece);
    }
    hasher.finalize()
}

/// What a block asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Store the payload at the offset; answered by an [`Ack`].
    Write = 1,
    /// Send back `length` bytes from the offset; no payload.
    Read = 2,
    /// A read's answer: the payload read.
    ReadData = 3,
}

impl BlockKind {
    /// Whether a block of this kind carries `length` bytes of payload.
    pub fn carries_payload(self) -> bool {
        matches!(self, BlockKind::Write | BlockKind::ReadData)
    }

    fn from_byte(byte: u8) -> Option<BlockKind> {
        [BlockKind::Write, BlockKind::Read, BlockKind::ReadData].into_iter().find(|k| *k as u8 == byte)
    }
}

/// The header's `flags`: the CRC field holds the sender's CRC, so a
/// device offloading the CRC leaves it as it is (a block an application
/// checksummed itself, or one relayed).
pub const FLAG_CRC_SET: u8 = 1;

mod field {
    use core::ops::Range;
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    pub const RESERVED_A: Range<usize> = 2..4;
    pub const VOLUME: Range<usize> = 4..8;
    pub const OFFSET: Range<usize> = 8..16;
    pub const SEQUENCE: Range<usize> = 16..24;
    pub const LENGTH: Range<usize> = 24..28;
    pub const CRC: Range<usize> = 28..32;
    pub const RESERVED_B: Range<usize> = 32..64;
}

/// Why bytes are not a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("shorter than a block's {HEADER_LEN}-byte header")]
    Truncated,
    #[error("kind {0} is no block's")]
    UnknownKind(u8),
    #[error("a reserved field is not zero")]
    Reserved,
    #[error("a payload of {0} bytes is more than a block's {BLOCK_LEN}")]
    TooLong(u32),
}

/// A typed view over a block header's bytes.
#[derive(Debug, Clone, Copy)]
pub struct BlockHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BlockHeader<T> {
    /// A view over `buffer`, which must hold a whole header.
    pub fn new_checked(buffer: T) -> Result<BlockHeader<T>, BlockError> {
        match buffer.as_ref().len() >= HEADER_LEN {
            true => Ok(BlockHeader { buffer }),
            false => Err(BlockError::Truncated),
        }
    }

    fn bytes<const N: usize>(&self, range: core::ops::Range<usize>) -> [u8; N] {
        self.buffer.as_ref()[range].try_into().expect("a field's width")
    }

    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    pub fn volume(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::VOLUME))
    }
    pub fn offset(&self) -> u64 {
        u64::from_be_bytes(self.bytes(field::OFFSET))
    }
    pub fn sequence(&self) -> u64 {
        u64::from_be_bytes(self.bytes(field::SEQUENCE))
    }
    pub fn length(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::LENGTH))
    }
    pub fn crc(&self) -> u32 {
        u32::from_be_bytes(self.bytes(field::CRC))
    }
    fn reserved_zero(&self) -> bool {
        let b = self.buffer.as_ref();
        b[field::RESERVED_A].iter().chain(&b[field::RESERVED_B]).all(|&x| x == 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BlockHeader<T> {
    fn put(&mut self, range: core::ops::Range<usize>, bytes: &[u8]) {
        self.buffer.as_mut()[range].copy_from_slice(bytes);
    }
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[field::FLAGS] = flags;
    }
    pub fn set_crc(&mut self, crc: u32) {
        self.put(field::CRC, &crc.to_be_bytes());
    }
}

/// What a block header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRepr {
    pub kind: BlockKind,
    /// The CRC field holds the sender's CRC ([`FLAG_CRC_SET`]).
    pub crc_set: bool,
    pub volume: u32,
    /// Byte offset into the volume.
    pub offset: u64,
    /// The request's number, echoed in its answer.
    pub sequence: u64,
    /// Payload bytes: those the block carries (writes, read data) or asks
    /// for (reads).
    pub length: u32,
    pub crc: u32,
}

impl BlockRepr {
    pub fn parse<T: AsRef<[u8]>>(header: &BlockHeader<T>) -> Result<BlockRepr, BlockError> {
        let kind = BlockKind::from_byte(header.kind()).ok_or(BlockError::UnknownKind(header.kind()))?;
        // Unknown flags are reserved too: a device must not guess at them.
        if !header.reserved_zero() || header.flags() & !FLAG_CRC_SET != 0 {
            return Err(BlockError::Reserved);
        }
        if header.length() as usize > BLOCK_LEN {
            return Err(BlockError::TooLong(header.length()));
        }
        Ok(BlockRepr {
            kind,
            crc_set: header.flags() & FLAG_CRC_SET != 0,
            volume: header.volume(),
            offset: header.offset(),
            sequence: header.sequence(),
            length: header.length(),
            crc: header.crc(),
        })
    }

    /// Parses the first [`HEADER_LEN`] bytes of `bytes`.
    pub fn parse_bytes(bytes: &[u8]) -> Result<BlockRepr, BlockError> {
        BlockRepr::parse(&BlockHeader::new_checked(bytes)?)
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) {
        let buffer = &mut buffer[..HEADER_LEN];
        buffer.fill(0);
        let mut header = BlockHeader { buffer };
        header.buffer[field::KIND] = self.kind as u8;
        header.set_flags(if self.crc_set { FLAG_CRC_SET } else { 0 });
        header.put(field::VOLUME, &self.volume.to_be_bytes());
        header.put(field::OFFSET, &self.offset.to_be_bytes());
        header.put(field::SEQUENCE, &self.sequence.to_be_bytes());
        header.put(field::LENGTH, &self.length.to_be_bytes());
        header.set_crc(self.crc);
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0; HEADER_LEN];
        self.emit(&mut bytes);
        bytes
    }

    /// Bytes of the whole message this block is: its header, and its
    /// payload if its kind carries one.
    pub fn message_len(&self) -> usize {
        HEADER_LEN + if self.kind.carries_payload() { self.length as usize } else { 0 }
    }
}

/// How a request ended, as its acknowledgement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckStatus {
    /// Stored (a write), or no error.
    Done = 0,
    /// The payload's CRC did not match: nothing was stored.
    CrcMismatch = 1,
    /// The range lies outside the volume: nothing was stored or read.
    OutOfRange = 2,
    /// The request was not a block the server takes.
    Malformed = 3,
}

/// An acknowledgement: the request's sequence (its low 32 bits) and how
/// it ended.
///
/// ```text
///  0          4        5        8
/// | sequence | status | zero   |
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    pub sequence: u32,
    pub status: AckStatus,
}

impl Ack {
    pub fn parse(bytes: &[u8]) -> Result<Ack, BlockError> {
        let bytes: &[u8; ACK_LEN] =
            bytes.get(..ACK_LEN).and_then(|b| b.try_into().ok()).ok_or(BlockError::Truncated)?;
        let status = [AckStatus::Done, AckStatus::CrcMismatch, AckStatus::OutOfRange, AckStatus::Malformed]
            .into_iter()
            .find(|s| *s as u8 == bytes[4])
            .ok_or(BlockError::UnknownKind(bytes[4]))?;
        if bytes[5..].iter().any(|&b| b != 0) {
            return Err(BlockError::Reserved);
        }
        Ok(Ack { sequence: u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes")), status })
    }

    pub fn to_bytes(&self) -> [u8; ACK_LEN] {
        let mut bytes = [0; ACK_LEN];
        bytes[..4].copy_from_slice(&self.sequence.to_be_bytes());
        bytes[4] = self.status as u8;
        bytes
    }
}

/// What softrnicd does with the blocks of a QP that asks for it
/// (`CreateQp`'s `blocks`), as a storage NIC offloads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockOffload {
    /// Computes the CRC of each block sent (unless [`FLAG_CRC_SET`]) and
    /// checks it on each block received, saying what it found in the
    /// receive's completion.
    Crc,
    /// And places each received write's payload straight into the store,
    /// a region of the QP's domain (its lkey), at the block's offset, so
    /// that the program's receive gets the header only; a read's answer
    /// posted as a header alone gets its payload from the store.
    CrcAndPlacement { store: u32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of 4096 bytes at 1 MiB into volume 7, sequence 42, CRC set.
    const WRITE: [u8; HEADER_LEN] = {
        let mut b = [0u8; HEADER_LEN];
        b[0] = 1; // kind: write
        b[1] = 1; // flags: CRC set
        b[7] = 7; // volume
        b[13] = 0x10; // offset 0x100000
        b[23] = 42; // sequence
        b[26] = 0x10; // length 0x1000
        (b[28], b[29], b[30], b[31]) = (0xcb, 0xf4, 0x39, 0x26);
        b
    };

    #[test]
    fn crc32_is_the_ieee_polynomial() {
        // The check value of CRC-32/ISO-HDLC (zlib's crc32).
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_of([&b"1234"[..], b"56789"]), 0xCBF4_3926);
    }

    #[test]
    fn a_write_header_parses_from_bytes() {
        let repr = BlockRepr::parse_bytes(&WRITE).unwrap();
        assert_eq!(
            repr,
            BlockRepr {
                kind: BlockKind::Write,
                crc_set: true,
                volume: 7,
                offset: 1 << 20,
                sequence: 42,
                length: 4096,
                crc: 0xCBF4_3926,
            }
        );
        assert_eq!(repr.message_len(), HEADER_LEN + BLOCK_LEN);
    }

    #[test]
    fn a_header_emits_the_same_bytes() {
        assert_eq!(BlockRepr::parse_bytes(&WRITE).unwrap().to_bytes(), WRITE);
    }

    #[test]
    fn a_read_carries_no_payload() {
        let mut bytes = WRITE;
        bytes[0] = 2;
        assert_eq!(BlockRepr::parse_bytes(&bytes).unwrap().message_len(), HEADER_LEN);
    }

    #[test]
    fn the_crc_field_is_written_in_place() {
        let mut bytes = WRITE;
        let mut header = BlockHeader::new_checked(&mut bytes[..]).unwrap();
        header.set_crc(0x0102_0304);
        assert_eq!(header.crc(), 0x0102_0304);
        assert_eq!(&bytes[28..32], &[1, 2, 3, 4]);
    }

    #[test]
    fn what_is_not_a_block_says_why() {
        assert_eq!(BlockRepr::parse_bytes(&WRITE[..63]), Err(BlockError::Truncated));
        let with = |at: usize, value: u8| {
            let mut b = WRITE;
            b[at] = value;
            BlockRepr::parse_bytes(&b)
        };
        assert_eq!(with(0, 9), Err(BlockError::UnknownKind(9)));
        assert_eq!(with(1, 2), Err(BlockError::Reserved));
        assert_eq!(with(2, 1), Err(BlockError::Reserved));
        assert_eq!(with(63, 1), Err(BlockError::Reserved));
        assert_eq!(with(26, 0x11), Err(BlockError::TooLong(0x1100)));
    }

    #[test]
    fn an_ack_in_bytes() {
        let bytes = [0, 0, 1, 2, 1, 0, 0, 0];
        let ack = Ack::parse(&bytes).unwrap();
        assert_eq!(ack, Ack { sequence: 0x102, status: AckStatus::CrcMismatch });
        assert_eq!(ack.to_bytes(), bytes);
        assert_eq!(Ack::parse(&bytes[..7]), Err(BlockError::Truncated));
        assert_eq!(Ack::parse(&[0, 0, 0, 0, 9, 0, 0, 0]), Err(BlockError::UnknownKind(9)));
        assert_eq!(Ack::parse(&[0, 0, 0, 0, 0, 0, 1, 0]), Err(BlockError::Reserved));
    }
}
