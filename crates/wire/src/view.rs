//! The parts every typed header view shares: construction with or without a
//! length check, and big-endian field access.

/// Declares `$name<T: AsRef<[u8]>>`, a view over a buffer that starts with a
/// header of `$len` bytes, with the constructors smoltcp's views have.
macro_rules! typed_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of the header in bytes.
            pub const LEN: usize = $len;

            /// Wraps `buffer` without checking its length; field accessors
            /// panic if it is too short. Prefer [`Self::new_checked`].
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps `buffer`, failing with [`crate::Error::Truncated`] if
            /// it cannot hold the whole header.
            pub fn new_checked(buffer: T) -> crate::Result<Self> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Checks that the buffer holds the whole header.
            pub fn check_len(&self) -> crate::Result<()> {
                if self.buffer.as_ref().len() < Self::LEN {
                    Err(crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

pub(crate) fn get_u16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

pub(crate) fn put_u16(bytes: &mut [u8], value: u16) {
    bytes[..2].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn get_u24(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]])
}

pub(crate) fn put_u24(bytes: &mut [u8], value: u32) {
    bytes[..3].copy_from_slice(&value.to_be_bytes()[1..]);
}

pub(crate) fn get_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"))
}

pub(crate) fn put_u32(bytes: &mut [u8], value: u32) {
    bytes[..4].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn get_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"))
}

pub(crate) fn put_u64(bytes: &mut [u8], value: u64) {
    bytes[..8].copy_from_slice(&value.to_be_bytes());
}
