//! Where softrnicd listens, and how a program finds it.
//!
//! `SOFTRNIC_DAEMON=PATH` names the socket; `SOFTRNIC_DAEMON=off` keeps
//! the engine in the program whatever runs; `SOFTRNIC_DAEMON=start` uses
//! the default socket, starting a daemon there if none listens
//! ([`crate::launch`]); unset, a program uses the daemon when the default
//! socket exists.

use std::ffi::OsString;
use std::path::PathBuf;

/// The variable that names the daemon's socket.
pub const ENV: &str = "SOFTRNIC_DAEMON";

pub use softrnic_daemon_protocol::default_socket as default_path;

/// The socket a program opening a device should use, if any.
pub fn from_env() -> Option<PathBuf> {
    choose(|key| std::env::var_os(key))
}

/// [`from_env`] over the variables `env` reads.
pub fn choose(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    match env(ENV) {
        Some(v) if v == "off" => None,
        Some(v) if v == "start" => {
            let socket = default_path();
            if let Err(e) = crate::launch::ensure(&socket, env) {
                // The connection that follows fails and says so too.
                eprintln!("softrnic: SOFTRNIC_DAEMON=start: {e}");
            }
            Some(socket)
        }
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => Some(default_path()).filter(|p| p.exists()),
    }
}
