//! Invalidate Extended Transport Header (IBTA vol. 1 section 9.3.7,
//! 4 bytes): the R_Key that a SEND with invalidate asks the responder to
//! invalidate.

use crate::Result;
use crate::view::{get_u32, put_u32};

typed_view!(
    /// A view over an Invalidate header.
    Header,
    4
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_rkey(&mut self, rkey: u32) {
        put_u32(self.buffer.as_mut(), rkey)
    }
}

/// Parses the R_Key to invalidate.
pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<u32> {
    header.check_len()?;
    Ok(header.rkey())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes() {
        let bytes = [0x00u8, 0x00, 0x12, 0x01];
        assert_eq!(parse(&Header::new_unchecked(&bytes[..])), Ok(0x1201));
        let mut out = [0xffu8; 4];
        Header::new_unchecked(&mut out[..]).set_rkey(0x1201);
        assert_eq!(out, bytes);
    }
}
