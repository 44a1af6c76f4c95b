//! What a program and softrnicd share, both sides of one host: the
//! control socket's messages ([`protocol`]), and the shared memory the data
//! path lives in: the queues' rings ([`queue`]), the work and completion
//! entries in their slots ([`wqe`]), the doorbells ([`doorbell`]), and the
//! memfds behind them all ([`shared_memory`]).
//!
//! The server (`softrnic-daemon`) and the client (`softrnic-provider`)
//! both build on this crate and on nothing of each other.

pub mod doorbell;
pub mod protocol;
pub mod queue;
pub mod shared_memory;
pub mod wqe;

/// Where softrnicd listens unless told otherwise:
/// `$XDG_RUNTIME_DIR/softrnic/softrnicd.sock`, or under `/tmp/softrnic`
/// without a runtime directory.
pub fn default_socket() -> std::path::PathBuf {
    softrnic_engine::counters_file::runtime_dir().join("softrnicd.sock")
}

/// Nanoseconds since the Unix epoch, the clock both sides share: a
/// device's clock is sent as its epoch on this one.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
