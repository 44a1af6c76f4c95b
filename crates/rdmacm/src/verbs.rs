//! The libibverbs functions librdmacm calls, as rdma-core's librdmacm
//! does: through the C ABI of the `libibverbs.so.1` the process loaded
//! (softrnic's, so the engine is the one the program's own verbs use).
//! The header's inline verbs (`ibv_post_send`, `ibv_poll_cq`, ...) go
//! through the context's ops table, as the header's inline functions do.

use std::ffi::c_int;

use softrnic_verbs_abi::*;

#[link(name = "ibverbs")]
unsafe extern "C" {
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    pub fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
    pub fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int;
    pub fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    pub fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    pub fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut std::ffi::c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_get_cq_event(
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut std::ffi::c_void,
    ) -> c_int;
    pub fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: std::ffi::c_uint);
    pub fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut std::ffi::c_void, length: usize, access: c_int) -> *mut ibv_mr;
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    pub fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    pub fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
    pub fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int;
    pub fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    pub fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    /// softrnic's own: the device's QP1 (see the libibverbs crate).
    pub fn softrnic_create_gsi_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
}

/// `ibv_poll_cq`, the header's inline verb.
///
/// # Safety
/// `cq` is a live CQ and `wc` has room for `n` completions.
pub unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ's context and ops table (caller).
    unsafe { ((*(*cq).context).ops.poll_cq.expect("poll_cq"))(cq, n, wc) }
}

/// `ibv_req_notify_cq`.
///
/// # Safety
/// `cq` is a live CQ.
pub unsafe fn req_notify_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: as above.
    unsafe { ((*(*cq).context).ops.req_notify_cq.expect("req_notify_cq"))(cq, 0) }
}

/// `ibv_post_send`.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain.
pub unsafe fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> c_int {
    let mut bad = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe { ((*(*qp).context).ops.post_send.expect("post_send"))(qp, wr, &mut bad) }
}

/// `ibv_post_recv`.
///
/// # Safety
/// `qp` is a live QP; `wr` a valid chain.
pub unsafe fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr) -> c_int {
    let mut bad = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe { ((*(*qp).context).ops.post_recv.expect("post_recv"))(qp, wr, &mut bad) }
}
