use core::fmt;

/// Why a buffer is not a well-formed RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the headers its opcode requires.
    Truncated,
    /// The BTH opcode is not one softrnic speaks.
    UnknownOpcode(u8),
    /// The BTH transport header version is neither 0 nor, on the packets
    /// that may carry them, softrnic's selective-repeat headers' 1.
    UnsupportedVersion(u8),
    /// The pad count makes the payload negative or misaligned.
    BadPadding,
    /// A field holds a value the specification reserves.
    Reserved,
    /// The invariant CRC does not match the packet's contents.
    BadIcrc,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "packet shorter than its headers"),
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::UnsupportedVersion(v) => write!(f, "unsupported transport header version {v}"),
            Error::BadPadding => write!(f, "pad count inconsistent with packet length"),
            Error::Reserved => write!(f, "reserved value in a header field"),
            Error::BadIcrc => write!(f, "invariant CRC mismatch"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = core::result::Result<T, Error>;
