//! What every exported verb needs: errno, the `SOFTRNIC_DEBUG` trace of
//! refused calls, and C strings.

use std::ffi::{c_char, c_int};
use std::sync::OnceLock;

/// Sets the calling thread's `errno`.
pub fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, which
    // is always valid to write.
    unsafe { *libc::__errno_location() = value };
}

/// Whether `SOFTRNIC_DEBUG` asks for a line on each refused verb.
fn debugging() -> bool {
    static DEBUG: OnceLock<bool> = OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("SOFTRNIC_DEBUG").is_some_and(|v| v != "0"))
}

/// Notes that `verb` failed with `errno` and why, when `SOFTRNIC_DEBUG` is
/// set; returns `errno` for the caller to hand back.
pub fn refuse(verb: &str, errno: c_int, why: impl std::fmt::Display) -> c_int {
    if debugging() {
        eprintln!("softrnic: {verb}: {why} ({})", std::io::Error::from_raw_os_error(errno));
    }
    errno
}

/// [`refuse`] for a verb that reports failure as NULL with `errno` set.
pub fn refuse_null<T>(verb: &str, errno: c_int, why: impl std::fmt::Display) -> *mut T {
    set_errno(refuse(verb, errno, why));
    std::ptr::null_mut()
}

/// A verb softrnic does not implement: EOPNOTSUPP, and a line under
/// `SOFTRNIC_DEBUG`.
pub fn unsupported(verb: &str) -> c_int {
    refuse(verb, libc::EOPNOTSUPP, "not supported by softrnic")
}

/// Copies `s` into a fixed C `char` array, truncating and terminating it.
pub fn copy_c_string(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}
