//! What softrnic's librdmacm refuses, with the error rdma_cm programs
//! check for and a line on stderr that says what is missing: ECE (there is
//! nothing to negotiate).

use std::ffi::{c_int, c_void};

use softrnic_verbs_abi::ffi::{refuse, set_errno};

use crate::abi::rdma_cm_id;

/// Refuses `call` with `errno`; said on stderr once per call site even
/// without `SOFTRNIC_DEBUG`: a program that needs it cannot work.
fn refused(call: &str, errno: c_int, what: &str) -> c_int {
    eprintln!("softrnic librdmacm: {call}: {what} is not supported");
    set_errno(refuse(call, errno, what));
    -1
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    refused("rdma_set_local_ece", libc::EOPNOTSUPP, "enhanced connection establishment (ECE)")
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    refused("rdma_get_remote_ece", libc::EOPNOTSUPP, "enhanced connection establishment (ECE)")
}
