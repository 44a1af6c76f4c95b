//! The allreduce as a C ABI, for ML code in any language (the Python
//! example loads it with ctypes). `include/softrnic_aggregation.h`
//! declares it. No panic crosses it: each call catches one and reports it
//! as an error.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::udp::Allreduce;
use crate::worker::WorkerConfig;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: &str) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
}

/// Runs `f`, turning an error or a panic into -1 and the thread's last
/// error.
fn guarded(f: impl FnOnce() -> Result<c_int, String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            set_error(&e);
            -1
        }
        Err(_) => {
            set_error("softrnic aggregation panicked (a bug: please report it)");
            -1
        }
    }
}

/// An address from C: "IP" or "IP:PORT".
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn address(text: *const c_char, what: &str) -> Result<SocketAddr, String> {
    if text.is_null() {
        return Err(format!("the {what} address is NULL"));
    }
    // SAFETY: the caller passes a NUL-terminated string, per the header.
    let text = unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| format!("the {what} address is not UTF-8"))?;
    text.parse::<SocketAddr>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 0)))
        .map_err(|_| format!("{text:?} is no {what} address: give an IP, or IP:PORT"))
}

/// Opens worker `worker` of `workers` in job `job`, at `local`, whose
/// parameter server is at `server`. NULL on error
/// (`softrnic_agg_last_error` says why).
///
/// # Safety
/// `local` and `server` are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softrnic_agg_open(
    local: *const c_char,
    server: *const c_char,
    job: u16,
    worker: u8,
    workers: u8,
) -> *mut Allreduce {
    let mut handle = std::ptr::null_mut();
    guarded(|| {
        // SAFETY: the caller's strings, per this function's contract.
        let (local, server) = unsafe { (address(local, "local")?, address(server, "server")?) };
        let allreduce = Allreduce::new(local, server, WorkerConfig::new(job, worker, workers))?;
        handle = Box::into_raw(Box::new(allreduce));
        Ok(0)
    });
    handle
}

/// Replaces `values[0..len]` with their sum over the job's workers. 0: done
/// exactly; 1: done, but a sum saturated; -1: failed.
///
/// # Safety
/// `handle` came from `softrnic_agg_open` and is not closed; `values`
/// points to `len` writable int32s no other thread touches meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softrnic_agg_allreduce_i32(handle: *mut Allreduce, values: *mut i32, len: usize) -> c_int {
    guarded(|| {
        if handle.is_null() || (values.is_null() && len > 0) {
            return Err("a NULL handle or buffer".into());
        }
        // SAFETY: a live handle and an exclusive buffer of `len`, per the
        // contract; an empty one is never dereferenced.
        let (allreduce, values) =
            unsafe { (&mut *handle, if len == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(values, len) }) };
        allreduce.sum_i32(values).map(c_int::from)
    })
}

/// The same for floats, summed in fixed point with `frac_bits` fractional
/// bits: each sum is within workers · 2^-(frac_bits+1) of the exact one.
///
/// # Safety
/// As `softrnic_agg_allreduce_i32`, for `len` floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softrnic_agg_allreduce_f32(
    handle: *mut Allreduce,
    values: *mut f32,
    len: usize,
    frac_bits: u32,
) -> c_int {
    guarded(|| {
        if handle.is_null() || (values.is_null() && len > 0) {
            return Err("a NULL handle or buffer".into());
        }
        // SAFETY: as in softrnic_agg_allreduce_i32.
        let (allreduce, values) =
            unsafe { (&mut *handle, if len == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(values, len) }) };
        allreduce.sum_f32(values, frac_bits).map(c_int::from)
    })
}

/// Why the calling thread's last call failed; valid until its next call.
#[unsafe(no_mangle)]
pub extern "C" fn softrnic_agg_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Closes a handle (NULL is fine).
///
/// # Safety
/// `handle` came from `softrnic_agg_open` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn softrnic_agg_close(handle: *mut Allreduce) {
    if !handle.is_null() {
        // SAFETY: the handle is ours (Box::into_raw) and closed once.
        drop(unsafe { Box::from_raw(handle) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_errors_not_crashes() {
        // SAFETY: NUL-terminated literals; NULL handles are checked.
        unsafe {
            let handle = softrnic_agg_open(c"not an address".as_ptr(), c"127.0.0.1".as_ptr(), 1, 0, 2);
            assert!(handle.is_null());
            let why = CStr::from_ptr(softrnic_agg_last_error()).to_string_lossy().into_owned();
            assert!(why.contains("no local address"), "{why}");
            let handle = softrnic_agg_open(c"127.0.0.1".as_ptr(), c"127.0.0.1".as_ptr(), 1, 5, 2);
            assert!(handle.is_null());
            assert!(CStr::from_ptr(softrnic_agg_last_error()).to_string_lossy().contains("numbered from 0"));
            assert_eq!(softrnic_agg_allreduce_i32(std::ptr::null_mut(), std::ptr::null_mut(), 0), -1);
            softrnic_agg_close(std::ptr::null_mut());
        }
    }
}
