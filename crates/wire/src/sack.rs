//! Selective Acknowledgement Extended Transport Header (softrnic's, 64
//! bytes): which request packets beyond a gap a responder holds.
//!
//! On a connection that negotiated selective repeat, a responder that
//! receives a packet beyond the PSN it expects answers with an RC ACK
//! whose BTH says transport version 1 ([`crate::bth`]), whose AETH is a
//! PSN sequence NAK for the first missing PSN `e` (so every PSN before
//! `e` is acknowledged, as a NAK always says), and which carries this
//! header after the AETH: a bitmap of the 512 PSNs after `e`. Bit `i`
//! (the most significant bit of byte 0 is bit 0) set means PSN
//! `e + 1 + i` has arrived; clear means it has not, or lies beyond what
//! the responder accepts.

use crate::Result;

/// PSNs the bitmap covers after the NAK's PSN.
pub const BITS: u32 = 512;

typed_view!(
    /// A view over a Selective Acknowledgement header.
    Header,
    64
);

impl<T: AsRef<[u8]>> Header<T> {
    /// Has the PSN `index + 1` after the NAK's arrived?
    pub fn received(&self, index: u32) -> bool {
        index < BITS && self.buffer.as_ref()[(index / 8) as usize] & (0x80 >> (index % 8)) != 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_received(&mut self, index: u32, on: bool) {
        let byte = &mut self.buffer.as_mut()[(index / 8) as usize];
        let mask = 0x80 >> (index % 8);
        *byte = if on { *byte | mask } else { *byte & !mask };
    }
}

/// What arrived after the first missing PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repr {
    /// Bit `i` of word `i / 64` (counting from the most significant bit)
    /// stands for PSN `e + 1 + i`.
    pub words: [u64; (BITS / 64) as usize],
}

impl Repr {
    /// Has the PSN `index + 1` after the NAK's arrived?
    pub fn received(&self, index: u32) -> bool {
        index < BITS && self.words[(index / 64) as usize] & (1 << (63 - index % 64)) != 0
    }

    /// Records that PSN `index + 1` after the NAK's arrived; an index
    /// beyond the bitmap is not recorded.
    pub fn set_received(&mut self, index: u32) {
        if index < BITS {
            self.words[(index / 64) as usize] |= 1 << (63 - index % 64);
        }
    }

    /// The highest index recorded, if any.
    pub fn highest(&self) -> Option<u32> {
        let (word, bits) = self.words.iter().enumerate().rev().find(|(_, w)| **w != 0)?;
        Some(word as u32 * 64 + 63 - bits.trailing_zeros())
    }

    pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<Repr> {
        header.check_len()?;
        let bytes = header.buffer.as_ref();
        let mut words = [0u64; (BITS / 64) as usize];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_be_bytes(chunk.try_into().expect("8 bytes"));
        }
        Ok(Repr { words })
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut Header<T>) {
        let bytes = &mut header.buffer.as_mut()[..Header::<&[u8]>::LEN];
        for (word, chunk) in self.words.iter().zip(bytes.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_zero_is_the_first_byte_high_bit() {
        let mut bytes = [0u8; 64];
        bytes[0] = 0x80 | 0x01; // PSN e+1 and e+8
        bytes[63] = 0x01; // PSN e+512
        let repr = Repr::parse(&Header::new_checked(&bytes[..]).unwrap()).unwrap();
        let arrived: Vec<u32> = (0..BITS).filter(|&i| repr.received(i)).collect();
        assert_eq!(arrived, [0, 7, 511]);
        assert_eq!(repr.highest(), Some(511));
        let view = Header::new_unchecked(&bytes[..]);
        assert!(view.received(0) && view.received(7) && !view.received(8) && !view.received(512));

        let mut built = Repr::default();
        for i in [0, 7, 511, 600] {
            built.set_received(i);
        }
        let mut out = [0xffu8; 64];
        built.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert_eq!(Repr::default().highest(), None);
        assert!(Header::new_checked(&bytes[..63]).is_err());
    }
}
