//! Where softrnicd listens, and how a program finds it.
//!
//! `SOFTRNIC_DAEMON=PATH` names the socket; `SOFTRNIC_DAEMON=off` keeps
//! the engine in the program whatever runs; unset, a program uses the
//! daemon when the default socket exists.

use std::path::PathBuf;

/// The variable that names the daemon's socket.
pub const ENV: &str = "SOFTRNIC_DAEMON";

/// `<runtime dir>/softrnicd.sock`: `$XDG_RUNTIME_DIR/softrnic/softrnicd.sock`,
/// or under `/tmp/softrnic` without a runtime directory.
pub fn default_path() -> PathBuf {
    softrnic_engine::counters_file::runtime_dir().join("softrnicd.sock")
}

/// The socket a program opening a device should use, if any.
pub fn from_env() -> Option<PathBuf> {
    match std::env::var_os(ENV) {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(default_path()).filter(|p| p.exists()),
    }
}
