//! Selective Repeat Extended Transport Header (softrnic's, 24 bytes).
//!
//! On a connection that negotiated selective repeat, every RC SEND and
//! WRITE packet carries this header after its opcode's own extension
//! headers, and its BTH says transport version 1 ([`crate::bth`]). It
//! makes each packet self-describing, so the responder can place a packet
//! that arrives before the ones ahead of it, as IRN (SIGCOMM 2018) does:
//! a WRITE lands at `virtual_address + offset` under `rkey`, a SEND at
//! `offset` within the receive work request numbered `receive_number`.
//!
//! ```text
//!  0                               4                               8
//! +-------------------------------+-------------------------------+
//! |          virtual address of the message's first byte          |
//! +-------------------------------+-------------------------------+
//! |             R_Key             |        message length         |
//! +-------------------------------+-------------------------------+
//! |    offset of this payload     |        receive number         |
//! +-------------------------------+-------------------------------+
//! ```
//!
//! The virtual address and key are a WRITE's (zero for a SEND). The
//! receive number counts the messages of the connection that consume a
//! receive work request (SEND, WRITE with immediate) from 0; other
//! messages carry the number the next such message will take.

use crate::Result;
use crate::view::{get_u32, get_u64, put_u32, put_u64};

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const LENGTH: Range<usize> = 12..16;
    pub const OFFSET: Range<usize> = 16..20;
    pub const RECEIVE_NUMBER: Range<usize> = 20..24;
}

typed_view!(
    /// A view over a Selective Repeat Extended Transport Header.
    Header,
    24
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn virtual_address(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::VA])
    }
    pub fn rkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RKEY])
    }
    pub fn message_length(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::LENGTH])
    }
    pub fn offset(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::OFFSET])
    }
    pub fn receive_number(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RECEIVE_NUMBER])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_virtual_address(&mut self, va: u64) {
        put_u64(&mut self.buffer.as_mut()[field::VA], va)
    }
    pub fn set_rkey(&mut self, rkey: u32) {
        put_u32(&mut self.buffer.as_mut()[field::RKEY], rkey)
    }
    pub fn set_message_length(&mut self, len: u32) {
        put_u32(&mut self.buffer.as_mut()[field::LENGTH], len)
    }
    pub fn set_offset(&mut self, offset: u32) {
        put_u32(&mut self.buffer.as_mut()[field::OFFSET], offset)
    }
    pub fn set_receive_number(&mut self, number: u32) {
        put_u32(&mut self.buffer.as_mut()[field::RECEIVE_NUMBER], number)
    }
}

/// Where a packet of a SEND or WRITE belongs in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// WRITE: the remote address of the message's first byte.
    pub virtual_address: u64,
    /// WRITE: the remote key.
    pub rkey: u32,
    /// Length of the whole message.
    pub message_length: u32,
    /// Where this packet's payload starts within the message.
    pub offset: u32,
    /// Which receive work request the message consumes, counted from 0.
    pub receive_number: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        Ok(Repr {
            virtual_address: header.virtual_address(),
            rkey: header.rkey(),
            message_length: header.message_length(),
            offset: header.offset(),
            receive_number: header.receive_number(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_virtual_address(self.virtual_address);
        header.set_rkey(self.rkey);
        header.set_message_length(self.message_length);
        header.set_offset(self.offset);
        header.set_receive_number(self.receive_number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const BYTES: [u8; 24] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, // virtual address
        0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00, 0x00, // rkey, length 65536
        0x00, 0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x05, // offset 12288, receive 5
    ];
    const REPR: Repr = Repr {
        virtual_address: 0x7f12_3456_7000,
        rkey: 0xdead_beef,
        message_length: 65536,
        offset: 12288,
        receive_number: 5,
    };

    #[test]
    fn parses_and_emits_literal_bytes() {
        assert_eq!(Repr::parse(&Header::new_checked(&BYTES[..]).unwrap()), Ok(REPR));
        let mut bytes = [0xaau8; 24];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert!(Header::new_checked(&BYTES[..23]).is_err());
    }
}
