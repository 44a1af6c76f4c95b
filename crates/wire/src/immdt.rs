//! Immediate Data Extended Transport Header (IBTA vol. 1 section 9.3.6,
//! 4 bytes): 32 bits delivered to the receiver's completion.

use crate::Result;
use crate::view::{get_u32, put_u32};

typed_view!(
    /// A view over an Immediate Data header.
    Header,
    4
);

impl<T: AsRef<[u8]>> Header<T> {
    /// The immediate value, in network byte order as the verbs API
    /// delivers it (`ibv_wc.imm_data` is big-endian too).
    pub fn immediate(&self) -> u32 {
        get_u32(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_immediate(&mut self, value: u32) {
        put_u32(self.buffer.as_mut(), value)
    }
}

/// Parses the immediate value.
pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<u32> {
    header.check_len()?;
    Ok(header.immediate())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes() {
        let bytes = [0x12u8, 0x34, 0x56, 0x78];
        assert_eq!(parse(&Header::new_unchecked(&bytes[..])), Ok(0x1234_5678));
        let mut out = [0u8; 4];
        Header::new_unchecked(&mut out[..]).set_immediate(0x1234_5678);
        assert_eq!(out, bytes);
        assert!(parse(&Header::new_unchecked(&bytes[..3])).is_err());
    }
}
