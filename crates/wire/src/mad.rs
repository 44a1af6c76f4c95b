//! The common header of a Management Datagram (IBTA vol. 1 section 13.4.2,
//! 24 bytes). A MAD is always 256 bytes; it travels as the payload of a UD
//! SEND to QP1 (the General Services Interface, Q_Key [`GSI_QKEY`]), on
//! RoCEv2 as on InfiniBand. softrnic speaks one class: the Communication
//! Manager's ([`crate::cm`]).

use crate::Result;
use crate::view::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

/// Every MAD is this long, header included.
pub const MAD_LEN: usize = 256;
/// The bytes after the header: the class's data.
pub const MAD_DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The QP number of the General Services Interface.
pub const GSI_QPN: u32 = 1;
/// The Q_Key every GSI datagram carries.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// `base_version` of every MAD.
pub const BASE_VERSION: u8 = 1;

/// Management classes softrnic knows.
pub mod class {
    /// The Communication Manager (ch. 12).
    pub const CM: u8 = 0x07;
}

/// Methods (the low seven bits of the method byte; the top bit marks a
/// response).
pub mod method {
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    /// What every CM message is sent as.
    pub const SEND: u8 = 0x03;
}

const HEADER_LEN: usize = 24;

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Range<usize> = 4..6;
    pub const CLASS_SPECIFIC: Range<usize> = 6..8;
    pub const TRANSACTION_ID: Range<usize> = 8..16;
    pub const ATTRIBUTE_ID: Range<usize> = 16..18;
    pub const ATTRIBUTE_MODIFIER: Range<usize> = 20..24;
}

typed_view!(
    /// A view over a common MAD header.
    Header,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[field::MGMT_CLASS]
    }
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[field::METHOD]
    }
    pub fn status(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::STATUS])
    }
    pub fn class_specific(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::CLASS_SPECIFIC])
    }
    pub fn transaction_id(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::TRANSACTION_ID])
    }
    pub fn attribute_id(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[field::ATTRIBUTE_ID])
    }
    pub fn attribute_modifier(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::ATTRIBUTE_MODIFIER])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    fn bytes(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    pub fn set_base_version(&mut self, v: u8) {
        self.bytes()[field::BASE_VERSION] = v
    }
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.bytes()[field::MGMT_CLASS] = v
    }
    pub fn set_class_version(&mut self, v: u8) {
        self.bytes()[field::CLASS_VERSION] = v
    }
    pub fn set_method(&mut self, v: u8) {
        self.bytes()[field::METHOD] = v
    }
    pub fn set_status(&mut self, v: u16) {
        put_u16(&mut self.bytes()[field::STATUS], v)
    }
    pub fn set_class_specific(&mut self, v: u16) {
        put_u16(&mut self.bytes()[field::CLASS_SPECIFIC], v)
    }
    pub fn set_transaction_id(&mut self, v: u64) {
        put_u64(&mut self.bytes()[field::TRANSACTION_ID], v)
    }
    pub fn set_attribute_id(&mut self, v: u16) {
        put_u16(&mut self.bytes()[field::ATTRIBUTE_ID], v);
        put_u16(&mut self.bytes()[18..20], 0);
    }
    pub fn set_attribute_modifier(&mut self, v: u32) {
        put_u32(&mut self.bytes()[field::ATTRIBUTE_MODIFIER], v)
    }
}

/// The meaning of a common MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub mgmt_class: u8,
    pub class_version: u8,
    pub method: u8,
    pub status: u16,
    pub transaction_id: u64,
    pub attribute_id: u16,
    pub attribute_modifier: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        if header.base_version() != BASE_VERSION {
            return Err(crate::Error::UnsupportedVersion(header.base_version()));
        }
        Ok(Repr {
            mgmt_class: header.mgmt_class(),
            class_version: header.class_version(),
            method: header.method(),
            status: header.status(),
            transaction_id: header.transaction_id(),
            attribute_id: header.attribute_id(),
            attribute_modifier: header.attribute_modifier(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_base_version(BASE_VERSION);
        header.set_mgmt_class(self.mgmt_class);
        header.set_class_version(self.class_version);
        header.set_method(self.method);
        header.set_status(self.status);
        header.set_class_specific(0);
        header.set_transaction_id(self.transaction_id);
        header.set_attribute_id(self.attribute_id);
        header.set_attribute_modifier(self.attribute_modifier);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_emits_literal_bytes() {
        // A CM REQ as Linux sends it: base version 1, class 7, class
        // version 2, method Send, transaction id 0x1234_5678_9abc_def0,
        // attribute 0x0010.
        let bytes = [
            0x01u8, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x00,
            0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let repr = Repr {
            mgmt_class: class::CM,
            class_version: 2,
            method: method::SEND,
            status: 0,
            transaction_id: 0x1234_5678_9abc_def0,
            attribute_id: 0x0010,
            attribute_modifier: 0,
        };
        assert_eq!(Repr::parse(&Header::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0xffu8; 24];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn refuses_short_buffers_and_other_versions() {
        assert_eq!(Header::new_checked(&[1u8; 23][..]).err(), Some(crate::Error::Truncated));
        let mut bytes = [0u8; 24];
        bytes[0] = 2;
        assert_eq!(Repr::parse(&Header::new_unchecked(&bytes[..])), Err(crate::Error::UnsupportedVersion(2)));
    }
}
