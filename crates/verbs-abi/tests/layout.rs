//! The structures in `lib.rs` against rdma-core's real `<infiniband/verbs.h>`:
//! a C program compiled with the header prints every size and field offset,
//! and each must equal Rust's.
//!
//! Needs a C compiler and the header (Debian's libibverbs-dev, which CI
//! installs); without them the test says so and skips, except under CI,
//! where it fails.

use softrnic_verbs_abi::*;

#[test]
fn structures_match_the_real_header() {
    let mut checks = c_layout! {
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        ibv_device_attr { fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id, vendor_part_id,
            hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom,
            max_res_rd_atom, max_qp_init_rd_atom, atomic_cap, max_ah, max_srq, max_srq_wr, max_srq_sge, max_pkeys,
            local_ca_ack_delay, phys_port_cnt }
        ibv_device_attr_ex { orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock, extended,
            phys_port_cnt_ex }
        ibv_odp_caps { general_caps, per_transport_caps }
        ibv_values_ex { comp_mask, raw_clock }
        ibv_cq_ex { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll, read_opcode,
            read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
            read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns }
        ibv_poll_cq_attr { comp_mask }
        ibv_cq_init_attr_ex { cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, pkey_tbl_len, lid,
            sm_lid, lmc, max_vl_num, active_width, active_speed, phys_state, link_layer, flags, port_cap_flags2 }
        ibv_async_event { element, event_type }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags, pkey_index,
            slid, sl, dlid_path_bits }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid, dgid }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_srq_attr { max_wr, max_sge, srq_limit }
        ibv_srq_init_attr { srq_context, attr }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags }
        ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
            qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify,
            sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry,
            alt_port_num, alt_timeout, rate_limit }
        ibv_ece { vendor_id, options, comp_mask }
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr.rdma.remote_addr,
            wr.rdma.rkey, wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey, wr.ud.ah,
            wr.ud.remote_qpn, wr.ud.remote_qkey, bind_mw.mw, bind_mw.rkey, bind_mw.bind_info }
        ibv_mw { context, pd, rkey, handle }
        ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        ibv_mw_bind { wr_id, send_flags, bind_info }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond,
            events_completed }
        ibv_qp_ex { qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add, wr_bind_mw,
            wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send, wr_send_imm, wr_send_inv,
            wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn, wr_set_inline_data, wr_set_inline_data_list, wr_set_sge,
            wr_set_sge_list, wr_start, wr_complete, wr_abort, wr_atomic_write }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq { context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed }
        ibv_ah { context, pd, handle }
        ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops { _compat_query_device, _compat_query_port, alloc_mw, bind_mw, dealloc_mw, poll_cq,
            req_notify_cq, post_srq_recv, post_send, post_recv, _compat_async_event }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context { query_port, query_rt_values, create_cq_ex, priv_, query_device_ex, open_qp, create_qp_ex, close_xrcd, sz,
            context }
    };
    // Rust spells two names differently from C.
    for (expr, _) in &mut checks {
        *expr = expr
            .replace("priv_", "priv")
            .replace("sizeof(struct ibv_gid_global)", "")
            // The tail softrnic keeps opaque starts where the header's
            // `device_cap_flags_ex` does.
            .replace("ibv_device_attr_ex, extended)", "ibv_device_attr_ex, device_cap_flags_ex)");
    }
    layout_check::compare_with_header("infiniband/verbs.h", "libibverbs-dev", &checks).unwrap();
}
