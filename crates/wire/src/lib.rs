//! RoCEv2 on the wire: every InfiniBand transport header that softrnic sends
//! or receives, as a typed view over bytes plus a `Repr` that parses and emits
//! it, and the invariant CRC that closes each packet.
//!
//! The layout follows smoltcp's `wire` module: `bth::Header<T>` wraps any
//! `AsRef<[u8]>` and reads fields in place; `bth::Repr` is the owned, checked
//! meaning of those bytes. [`packet`] puts the headers together in the order
//! each [`Opcode`] prescribes (IBTA vol. 1, ch. 9.2-9.5; RoCEv2 annex A17).
//!
//! Nothing here allocates, reads a clock or panics on hostile input: every
//! parser checks lengths before it reads.

#![forbid(unsafe_code)]

mod error;
#[macro_use]
mod view;

pub mod aeth;
pub mod aggregation;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod int;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;
pub mod sack;
pub mod sreth;

pub use error::{Error, Result};
pub use opcode::Opcode;
pub use packet::{Extensions, PacketRepr};
pub use psn::Psn;

/// The UDP destination port that identifies RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// The default partition key: full membership of the default partition.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Bytes of the Global Route Header, which the verbs place at the start
/// of every UD receive buffer (RoCEv2 over IPv4 puts the IP header in its
/// last 20).
pub const GRH_LEN: usize = 40;
