//! What a program and softrnicd share, both sides of one host: the
//! control socket's messages ([`protocol`]), and the shared memory the data
//! path lives in: the queues' rings ([`queue`]), the work and completion
//! entries in their slots ([`wqe`]), the doorbells ([`doorbell`]), and the
//! memfds behind them all ([`shared_memory`]); and the storage blocks
//! softrnicd's block offload parses ([`block`]).
//!
//! The server (`softrnic-daemon`) and the client (`softrnic-provider`)
//! both build on this crate and on nothing of each other.

pub mod block;
pub mod doorbell;
pub mod peer;
pub mod protocol;
pub mod queue;
pub mod shared_memory;
pub mod wqe;

/// Where softrnicd listens unless told otherwise: `softrnicd.sock` in the
/// user's private runtime directory ([`softrnic_engine::runtime_dir`]),
/// `$XDG_RUNTIME_DIR/softrnic` or `/tmp/softrnic-<uid>`.
pub fn default_socket() -> std::path::PathBuf {
    softrnic_engine::runtime_dir::path().join("softrnicd.sock")
}

/// Makes the directory `socket` lies in: the runtime directory private
/// and checked ([`softrnic_engine::runtime_dir::make_private`]), any
/// other directory as the user named it.
pub fn make_socket_dir(socket: &std::path::Path) -> std::io::Result<()> {
    let Some(dir) = socket.parent() else { return Ok(()) };
    match dir == softrnic_engine::runtime_dir::path() {
        true => softrnic_engine::runtime_dir::make_private(dir),
        false => std::fs::create_dir_all(dir),
    }
}

/// Nanoseconds since the Unix epoch, the clock both sides share: a
/// device's clock is sent as its epoch on this one.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}
