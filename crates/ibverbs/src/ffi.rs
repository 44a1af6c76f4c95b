//! The C boundary's helpers (errno, the `SOFTRNIC_DEBUG` trace of refused
//! calls, panics kept out of C), shared with softrnic's librdmacm.

pub use softrnic_verbs_abi::ffi::*;
