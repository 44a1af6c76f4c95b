//! RDMA Extended Transport Header (IBTA vol. 1 section 9.3.3, 16 bytes):
//! the remote virtual address, key and length of a WRITE or READ.

use crate::Result;
use crate::view::{get_u32, get_u64, put_u32, put_u64};

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
}

typed_view!(
    /// A view over an RDMA Extended Transport Header.
    Header,
    16
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn virtual_address(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::VA])
    }
    pub fn rkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RKEY])
    }
    pub fn dma_length(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_virtual_address(&mut self, va: u64) {
        put_u64(&mut self.buffer.as_mut()[field::VA], va)
    }
    pub fn set_rkey(&mut self, rkey: u32) {
        put_u32(&mut self.buffer.as_mut()[field::RKEY], rkey)
    }
    pub fn set_dma_length(&mut self, len: u32) {
        put_u32(&mut self.buffer.as_mut()[field::DMA_LEN], len)
    }
}

/// Where in the responder's memory a WRITE lands or a READ reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub virtual_address: u64,
    pub rkey: u32,
    /// Length of the whole message, not of this packet.
    pub dma_length: u32,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        Ok(Repr { virtual_address: header.virtual_address(), rkey: header.rkey(), dma_length: header.dma_length() })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_virtual_address(self.virtual_address);
        header.set_rkey(self.rkey);
        header.set_dma_length(self.dma_length);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BYTES: [u8; 16] =
        [0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00, 0x00];
    const REPR: Repr = Repr { virtual_address: 0x7f12_3456_7800, rkey: 0xdead_beef, dma_length: 65536 };

    #[test]
    fn parses_and_emits_literal_bytes() {
        assert_eq!(Repr::parse(&Header::new_checked(&BYTES[..]).unwrap()), Ok(REPR));
        let mut bytes = [0u8; 16];
        REPR.emit(&mut Header::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        assert!(Header::new_checked(&BYTES[..15]).is_err());
    }
}
