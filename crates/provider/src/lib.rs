//! Where a program's verbs run: the one seam between the front ends (the
//! Rust API, `libibverbs.so.1`, `librdmacm.so.1` through the former) and
//! a device. A [`Provider`] is either the engine in this process or a
//! client of softrnicd ([`client`]), chosen once from the environment
//! ([`socket_path::from_env`]); the front ends call its methods and never
//! ask which it is.
//!
//! ```text
//!  front ends ──> Provider ──┬─> softrnic_engine::Nic (in the process)
//!                            └─> client::Session ── socket, rings ──> softrnicd
//! ```

pub mod client;
mod held_writes;
pub mod launch;
mod pin;
pub mod provider;
pub mod remap;
pub mod socket_path;

pub use provider::{
    CompletionChannel, DeviceCq, DeviceEvent, DeviceQp, DeviceSrq, EngineHolder, OpenError, Provider, SendChain,
};
/// The storage blocks softrnicd's block offload parses (E7).
pub use softrnic_daemon_protocol::block;
