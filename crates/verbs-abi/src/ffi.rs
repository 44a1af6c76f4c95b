//! What every exported function of softrnic's C libraries (libibverbs,
//! librdmacm) needs: errno, the `SOFTRNIC_DEBUG` trace of refused calls,
//! panics kept out of C, and C strings.

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

/// What a verb returns when softrnic panicked inside it: a failure in the
/// verb's own terms, with `errno` set to EIO.
pub trait OnPanic {
    fn on_panic() -> Self;
}

impl OnPanic for c_int {
    /// Negative: a failure whether the verb returns an errno (`ibv_modify_qp`),
    /// -1 (`ibv_get_cq_event`) or a count (`ibv_poll_cq`).
    fn on_panic() -> c_int {
        set_errno(libc::EIO);
        -libc::EIO
    }
}

impl<T> OnPanic for *mut T {
    fn on_panic() -> *mut T {
        set_errno(libc::EIO);
        std::ptr::null_mut()
    }
}

impl<T> OnPanic for *const T {
    fn on_panic() -> *const T {
        set_errno(libc::EIO);
        std::ptr::null()
    }
}

impl OnPanic for isize {
    fn on_panic() -> isize {
        set_errno(libc::EIO);
        -(libc::EIO as isize)
    }
}

/// rsockets' `riomap` (an `off_t`) and `riowrite` (a `size_t`): -1.
impl OnPanic for i64 {
    fn on_panic() -> i64 {
        set_errno(libc::EIO);
        -1
    }
}

impl OnPanic for usize {
    fn on_panic() -> usize {
        set_errno(libc::EIO);
        usize::MAX
    }
}

/// The extended CQ's `read_*` accessors have no way to fail: a zero.
macro_rules! zero_on_panic {
    ($($t:ty),*) => {$(
        impl OnPanic for $t {
            fn on_panic() -> $t {
                0
            }
        }
    )*};
}
zero_on_panic!(u8, u16, u32, u64);

impl OnPanic for () {
    fn on_panic() {}
}

/// Runs the body of an exported function: a panic must not unwind into
/// the C program (that is undefined behaviour, or an abort), so it becomes
/// the verb's failure and a line on stderr.
pub fn guard<R: OnPanic>(verb: &str, body: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            eprintln!("softrnic: {verb} failed on an internal error ({why}); please report it");
            R::on_panic()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_verbs_failure() {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let status: c_int = guard("ibv_test", || panic!("boom"));
        let pointer: *mut u8 = guard("ibv_test", || panic!("boom"));
        std::panic::set_hook(quiet);
        assert_eq!(status, -libc::EIO);
        assert!(pointer.is_null());
        // SAFETY: this thread's errno.
        assert_eq!(unsafe { *libc::__errno_location() }, libc::EIO);
        assert_eq!(guard("ibv_test", || 7 as c_int), 7, "no panic, no change");
    }
}
