//! Base Transport Header (IBTA vol. 1 section 9.2, 12 bytes).
//!
//! ```text
//!  0               1               2               3
//! +---------------+-+-+---+-------+-------------------------------+
//! |    OpCode     |S|M|Pad| TVer  |            P_Key              |
//! +-+-+-----------+---------------+-------------------------------+
//! |F|B|   Resv6   |                   DestQP                      |
//! +-+-------------+-----------------------------------------------+
//! |A|   Resv7     |                     PSN                       |
//! +---------------+-----------------------------------------------+
//! ```
//! F and B are RoCEv2's FECN and BECN bits (annex A17.9.2).
//!
//! TVer is 0 in every IBTA packet. softrnic sends 1 on the SEND, WRITE and
//! selective-NAK packets of a connection that negotiated selective repeat,
//! which carry headers of its own ([`crate::sreth`], [`crate::sack`]): a
//! peer that does not speak them drops such a packet (IBTA 9.2.5) instead
//! of misreading it.

use crate::view::{get_u24, put_u24};
use crate::{Error, Opcode, Psn, Result};

/// The DestQP of a datagram sent to a multicast group: every UD QP
/// attached to the group takes it (IBTA 10.5.2.1).
pub const MULTICAST_QPN: u32 = 0xff_ffff;

mod field {
    use core::ops::Range;
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    pub const ECN: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    pub const ACK_REQ: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

const SOLICITED: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u8 = 4;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQUEST: u8 = 0x80;
/// The transport version of softrnic's selective-repeat packets.
const SELECTIVE_REPEAT_VERSION: u8 = 1;

typed_view!(
    /// A view over a Base Transport Header.
    Header,
    12
);

impl<T: AsRef<[u8]>> Header<T> {
    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The raw opcode byte.
    pub fn opcode_byte(&self) -> u8 {
        self.bytes()[field::OPCODE]
    }
    pub fn solicited(&self) -> bool {
        self.bytes()[field::FLAGS] & SOLICITED != 0
    }
    pub fn migration(&self) -> bool {
        self.bytes()[field::FLAGS] & MIG_REQ != 0
    }
    /// Bytes of padding between the payload and the ICRC (0..=3).
    pub fn pad_count(&self) -> u8 {
        (self.bytes()[field::FLAGS] >> PAD_SHIFT) & 0x3
    }
    pub fn transport_version(&self) -> u8 {
        self.bytes()[field::FLAGS] & TVER_MASK
    }
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.bytes()[field::PKEY.start], self.bytes()[field::PKEY.start + 1]])
    }
    pub fn fecn(&self) -> bool {
        self.bytes()[field::ECN] & FECN != 0
    }
    pub fn becn(&self) -> bool {
        self.bytes()[field::ECN] & BECN != 0
    }
    pub fn dest_qpn(&self) -> u32 {
        get_u24(&self.bytes()[field::DEST_QP])
    }
    pub fn ack_request(&self) -> bool {
        self.bytes()[field::ACK_REQ] & ACK_REQUEST != 0
    }
    pub fn psn(&self) -> Psn {
        Psn::new(get_u24(&self.bytes()[field::PSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }

    fn set_bit(&mut self, index: usize, mask: u8, on: bool) {
        let byte = &mut self.bytes_mut()[index];
        *byte = if on { *byte | mask } else { *byte & !mask };
    }

    pub fn set_opcode(&mut self, opcode: Opcode) {
        self.bytes_mut()[field::OPCODE] = opcode as u8;
    }
    pub fn set_solicited(&mut self, on: bool) {
        self.set_bit(field::FLAGS, SOLICITED, on)
    }
    pub fn set_migration(&mut self, on: bool) {
        self.set_bit(field::FLAGS, MIG_REQ, on)
    }
    pub fn set_pad_count(&mut self, pad: u8) {
        let byte = &mut self.bytes_mut()[field::FLAGS];
        *byte = (*byte & !(0x3 << PAD_SHIFT)) | ((pad & 0x3) << PAD_SHIFT);
    }
    pub fn set_transport_version(&mut self, version: u8) {
        let byte = &mut self.bytes_mut()[field::FLAGS];
        *byte = (*byte & !TVER_MASK) | (version & TVER_MASK);
    }
    pub fn set_pkey(&mut self, pkey: u16) {
        self.bytes_mut()[field::PKEY].copy_from_slice(&pkey.to_be_bytes());
    }
    pub fn set_fecn(&mut self, on: bool) {
        self.set_bit(field::ECN, FECN, on)
    }
    pub fn set_becn(&mut self, on: bool) {
        self.set_bit(field::ECN, BECN, on)
    }
    pub fn set_dest_qpn(&mut self, qpn: u32) {
        put_u24(&mut self.bytes_mut()[field::DEST_QP], qpn)
    }
    pub fn set_ack_request(&mut self, on: bool) {
        self.set_bit(field::ACK_REQ, ACK_REQUEST, on)
    }
    pub fn set_psn(&mut self, psn: Psn) {
        put_u24(&mut self.bytes_mut()[field::PSN], psn.value())
    }
}

/// The meaning of a Base Transport Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub opcode: Opcode,
    /// Solicited event: the receiver should raise a completion event.
    pub solicited: bool,
    pub migration: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination queue pair number (24 bits).
    pub dest_qpn: u32,
    /// The requester asks the responder to acknowledge this packet.
    pub ack_request: bool,
    pub psn: Psn,
    /// Transport version 1: the packet carries softrnic's selective-repeat
    /// headers.
    pub selective_repeat: bool,
}

impl Repr {
    /// A BTH in the default partition with every flag clear.
    pub const fn new(opcode: Opcode, dest_qpn: u32, psn: Psn) -> Repr {
        Repr {
            opcode,
            solicited: false,
            migration: false,
            pad_count: 0,
            pkey: crate::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qpn,
            ack_request: false,
            psn,
            selective_repeat: false,
        }
    }

    /// Parses a BTH, rejecting unknown opcodes and transport versions.
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        let selective_repeat = match header.transport_version() {
            0 => false,
            SELECTIVE_REPEAT_VERSION => true,
            other => return Err(Error::UnsupportedVersion(other)),
        };
        Ok(Repr {
            opcode: Opcode::try_from(header.opcode_byte())?,
            solicited: header.solicited(),
            migration: header.migration(),
            pad_count: header.pad_count(),
            pkey: header.pkey(),
            fecn: header.fecn(),
            becn: header.becn(),
            dest_qpn: header.dest_qpn(),
            ack_request: header.ack_request(),
            psn: header.psn(),
            selective_repeat,
        })
    }

    /// Writes the header, clearing every reserved bit.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.bytes_mut()[..Header::<&[u8]>::LEN].fill(0);
        header.set_opcode(self.opcode);
        header.set_solicited(self.solicited);
        header.set_migration(self.migration);
        header.set_pad_count(self.pad_count);
        header.set_transport_version(if self.selective_repeat { SELECTIVE_REPEAT_VERSION } else { 0 });
        header.set_pkey(self.pkey);
        header.set_fecn(self.fecn);
        header.set_becn(self.becn);
        header.set_dest_qpn(self.dest_qpn);
        header.set_ack_request(self.ack_request);
        header.set_psn(self.psn);
    }

    pub const fn buffer_len(&self) -> usize {
        Header::<&[u8]>::LEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // RC SEND_ONLY to QP 0x11, PSN 0x123456, AckReq set, default P_Key.
    const BYTES: [u8; 12] = [0x04, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56];

    fn repr() -> Repr {
        Repr {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            migration: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qpn: 0x11,
            ack_request: true,
            psn: Psn::new(0x123456),
            selective_repeat: false,
        }
    }

    #[test]
    fn parses_literal_bytes() {
        let header = Header::new_checked(&BYTES[..]).unwrap();
        assert_eq!(Repr::parse(&header), Ok(repr()));
    }

    #[test]
    fn emits_literal_bytes() {
        let mut bytes = [0xaau8; 12];
        repr().emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn every_flag_lands_in_its_bit() {
        let r = Repr {
            opcode: Opcode::RcWriteLastImm,
            solicited: true,
            migration: true,
            pad_count: 3,
            pkey: 0x8001,
            fecn: true,
            becn: true,
            dest_qpn: 0xabcdef,
            ack_request: false,
            psn: Psn::new(0xfedcba),
            selective_repeat: true,
        };
        let mut bytes = [0u8; 12];
        r.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, [0x09, 0xf1, 0x80, 0x01, 0xc0, 0xab, 0xcd, 0xef, 0x00, 0xfe, 0xdc, 0xba]);
        assert_eq!(Repr::parse(&Header::new_unchecked(&bytes[..])), Ok(r));
    }

    #[test]
    fn rejects_short_buffers_versions_and_opcodes() {
        assert_eq!(Header::new_checked(&BYTES[..11]).unwrap_err(), Error::Truncated);
        let mut bytes = BYTES;
        bytes[1] = 0x02;
        assert_eq!(Repr::parse(&Header::new_unchecked(&bytes[..])), Err(Error::UnsupportedVersion(2)));
        bytes[1] = 0;
        bytes[0] = 0x15;
        assert_eq!(Repr::parse(&Header::new_unchecked(&bytes[..])), Err(Error::UnknownOpcode(0x15)));
    }
}
