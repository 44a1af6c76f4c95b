//! Verbs softrnic does not implement, and the provider interface of
//! `IBVERBS_PRIVATE_34`.
//!
//! Each answers the way libibverbs answers on a device without the
//! feature (EOPNOTSUPP, or NULL with errno), never with a silent success;
//! `SOFTRNIC_DEBUG=1` names the verb on stderr.
//!
//! The private symbols exist because Debian's perftest links libmlx5 and
//! libefa, whose constructors register their drivers through them and
//! whose imports the dynamic linker resolves at start-up. softrnic is the
//! only device, so registration is accepted and ignored, and the driver
//! commands (`ibv_cmd_*`, which would talk to a kernel) fail.

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicBool;

use crate::ffi::{refuse_null, unsupported};

/// Exports verbs that return an errno-style `int` and take arguments
/// softrnic ignores (C callers clean up their own arguments).
macro_rules! failing_with_errno {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> c_int {
    crate::ffi::guard(stringify!($name), || {
            unsupported(stringify!($name))
    })
}
    )*};
}

/// Exports verbs that return an object pointer, NULL with errno here.
macro_rules! failing_with_null {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() -> *mut c_void {
    crate::ffi::guard(stringify!($name), || {
            refuse_null(stringify!($name), libc::EOPNOTSUPP, "not supported by softrnic")
    })
}
    )*};
}

/// Exports `void` verbs that undo something softrnic never does.
macro_rules! doing_nothing {
    ($($name:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "C" fn $name() {
    crate::ffi::guard(stringify!($name), || {
            unsupported(stringify!($name));
    })
}
    )*};
}

failing_with_errno!(ibv_resolve_eth_l2_from_gid, ibv_read_ibdev_sysfs_file, execute_ioctl,);

failing_with_null!(ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_import_dm, ibv_reg_dmabuf_mr);

doing_nothing!(
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
    // Conversions from the kernel's structures, which only librdmacm's
    // kernel path uses; that path fails before reaching them.
    ibv_copy_ah_attr_from_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
);

/// `ibv_query_qp_data_in_order`: 0, "no ordering promised", which is
/// always a correct answer.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
    crate::ffi::guard("ibv_query_qp_data_in_order", || 0)
}

// ----- IBVERBS_PRIVATE_34: the provider interface -----

/// The pre-2017 way a provider registered itself; ignored like the new.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_register_driver(_name: *const std::ffi::c_char, _init: *const c_void) {}

/// A provider's constructor registers its driver; softrnic needs none.
#[unsafe(no_mangle)]
pub extern "C" fn verbs_register_driver_34(_driver: *const c_void) {}

#[unsafe(no_mangle)]
pub extern "C" fn verbs_set_ops(_context: *mut c_void, _ops: *const c_void) {}

#[unsafe(no_mangle)]
pub extern "C" fn verbs_uninit_context(_context: *mut c_void) {}

#[unsafe(no_mangle)]
pub extern "C" fn verbs_init_cq(
    _cq: *mut c_void,
    _context: *mut c_void,
    _channel: *mut c_void,
    _cq_context: *mut c_void,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn __ioctl_final_num_attrs(_num_attrs: u32, _link: *mut c_void) {}

/// Provider log lines; the format's arguments are ignored.
#[unsafe(no_mangle)]
pub extern "C" fn __verbs_log(_context: *mut c_void, _level: u32, _format: *const std::ffi::c_char) {}

/// Read by providers when a device is unplugged under them.
#[unsafe(no_mangle)]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

failing_with_null!(_verbs_init_and_alloc_context, verbs_open_device);

failing_with_errno!(
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);
