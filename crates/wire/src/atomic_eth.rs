//! Atomic Extended Transport Header (IBTA vol. 1 section 9.3.4, 28 bytes):
//! the target of a compare-and-swap or fetch-and-add and its operands.

use crate::Result;
use crate::view::{get_u32, get_u64, put_u32, put_u64};

mod field {
    use core::ops::Range;
    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const SWAP_ADD: Range<usize> = 12..20;
    pub const COMPARE: Range<usize> = 20..28;
}

typed_view!(
    /// A view over an Atomic Extended Transport Header.
    Header,
    28
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn virtual_address(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::VA])
    }
    pub fn rkey(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[field::RKEY])
    }
    /// The value to swap in (CMP_SWAP) or to add (FETCH_ADD).
    pub fn swap_or_add(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    /// The value to compare with (CMP_SWAP only).
    pub fn compare(&self) -> u64 {
        get_u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_virtual_address(&mut self, va: u64) {
        put_u64(&mut self.buffer.as_mut()[field::VA], va)
    }
    pub fn set_rkey(&mut self, rkey: u32) {
        put_u32(&mut self.buffer.as_mut()[field::RKEY], rkey)
    }
    pub fn set_swap_or_add(&mut self, value: u64) {
        put_u64(&mut self.buffer.as_mut()[field::SWAP_ADD], value)
    }
    pub fn set_compare(&mut self, value: u64) {
        put_u64(&mut self.buffer.as_mut()[field::COMPARE], value)
    }
}

/// An atomic operation's target and operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub virtual_address: u64,
    pub rkey: u32,
    pub swap_or_add: u64,
    pub compare: u64,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        Ok(Repr {
            virtual_address: header.virtual_address(),
            rkey: header.rkey(),
            swap_or_add: header.swap_or_add(),
            compare: header.compare(),
        })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        header.set_virtual_address(self.virtual_address);
        header.set_rkey(self.rkey);
        header.set_swap_or_add(self.swap_or_add);
        header.set_compare(self.compare);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_emits_literal_bytes() {
        let bytes: [u8; 28] = [
            0, 0, 0, 0, 0, 0, 0x10, 0x08, // va
            0, 0, 0x03, 0x01, // rkey
            0, 0, 0, 0, 0, 0, 0, 0x2a, // swap/add
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, // compare
        ];
        let repr = Repr { virtual_address: 0x1008, rkey: 0x301, swap_or_add: 42, compare: u64::MAX - 1 };
        assert_eq!(Repr::parse(&Header::new_checked(&bytes[..]).unwrap()), Ok(repr));
        let mut out = [0u8; 28];
        repr.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(Header::new_checked(&bytes[..27]).is_err());
    }
}
