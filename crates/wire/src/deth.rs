//! Datagram Extended Transport Header (IBTA vol. 1 section 9.3.2, 8 bytes):
//! the Q_Key and source QP of an unreliable datagram.

use crate::Result;
use crate::view::{get_u24, get_u32, put_u24, put_u32};

mod field {
    use core::ops::Range;
    pub const QKEY: Range<usize> = 0..4;
    pub const SRC_QP: Range<usize> = 5..8;
}

typed_view!(
    /// A view over a Datagram Extended Transport Header.
    Header,
    8
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn qkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::QKEY])
    }
    pub fn src_qpn(&self) -> u32 {
        get_u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_qkey(&mut self, qkey: u32) {
        put_u32(&mut self.buffer.as_mut()[field::QKEY], qkey)
    }
    pub fn set_src_qpn(&mut self, qpn: u32) {
        self.buffer.as_mut()[4] = 0;
        put_u24(&mut self.buffer.as_mut()[field::SRC_QP], qpn)
    }
}

/// The meaning of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub qkey: u32,
    pub src_qpn: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        Ok(Repr { qkey: header.qkey(), src_qpn: header.src_qpn() })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_qkey(self.qkey);
        header.set_src_qpn(self.src_qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_emits_literal_bytes() {
        let bytes = [0x11u8, 0x11, 0x11, 0x11, 0x00, 0x00, 0x01, 0x2c];
        let repr = Repr { qkey: 0x1111_1111, src_qpn: 0x12c };
        assert_eq!(Repr::parse(&Header::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0xffu8; 8];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}
