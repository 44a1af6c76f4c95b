//! Atomic Acknowledge Extended Transport Header (IBTA vol. 1 section 9.3.5.3,
//! 8 bytes): the value the target held before the atomic operation.

use crate::Result;
use crate::view::{get_u64, put_u64};

typed_view!(
    /// A view over an Atomic Acknowledge header.
    Header,
    8
);

impl<T: AsRef<[u8]>> Header<T> {
    pub fn original(&self) -> u64 {
        get_u64(self.buffer.as_ref())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    pub fn set_original(&mut self, value: u64) {
        put_u64(self.buffer.as_mut(), value)
    }
}

/// Parses the original remote value.
pub fn parse<T: AsRef<[u8]>>(header: &Header<T>) -> Result<u64> {
    header.check_len()?;
    Ok(header.original())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes() {
        let bytes = [0x01u8, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef];
        assert_eq!(parse(&Header::new_unchecked(&bytes[..])), Ok(0x0123_4567_89ab_cdef));
        let mut out = [0u8; 8];
        Header::new_unchecked(&mut out[..]).set_original(0x0123_4567_89ab_cdef);
        assert_eq!(out, bytes);
    }
}
