//! librdmacm's structures in `abi.rs` against rdma-core's real
//! `<rdma/rdma_cma.h>` (Debian's librdmacm-dev, which CI installs).

use softrnic_rdmacm::abi::*;
use softrnic_verbs_abi::{c_layout, layout_check};

#[test]
fn structures_match_the_real_header() {
    let checks = c_layout! {
        rdma_ib_addr { sgid, dgid, pkey }
        rdma_addr { src_addr, dst_addr, addr }
        ibv_sa_path_rec { dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class, reversible,
            numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate, packet_life_time_selector, packet_life_time,
            preference }
        rdma_route { addr, path_rec, num_paths }
        rdma_event_channel { fd }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type }
        rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route, ai_connect_len, ai_connect,
            ai_next }
        rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
    };
    layout_check::compare_with_header("rdma/rdma_cma.h", "librdmacm-dev", &checks).unwrap();
}
