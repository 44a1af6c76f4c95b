//! The C API through softrnicd: a context opened with `SOFTRNIC_DAEMON`
//! gets its asynchronous events on its `async_fd`, from the daemon, as a
//! context with the engine inside gets them from the engine, and resizes
//! its CQs.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::time::Duration;

use softrnic_daemon::server::{Daemon, DaemonOptions};
use softrnic_ibverbs::abi::*;
use softrnic_ibverbs::{context, cq, device, memory, qp};

const ADDR: &str = "127.0.5.41";

/// RESET -> INIT -> RTR -> RTS towards QP `remote_qpn` on this device.
fn connect(q: *mut ibv_qp, remote_qpn: u32) {
    let v4: std::net::Ipv4Addr = ADDR.parse().unwrap();
    // SAFETY: plain data.
    let mut attrs: [ibv_qp_attr; 3] = unsafe { std::mem::zeroed() };
    attrs[0].qp_state = IBV_QPS_INIT;
    attrs[0].port_num = 1;
    attrs[0].qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    attrs[1].qp_state = IBV_QPS_RTR;
    attrs[1].path_mtu = 3;
    attrs[1].dest_qp_num = remote_qpn;
    attrs[1].max_dest_rd_atomic = 1;
    attrs[1].ah_attr.is_global = 1;
    attrs[1].ah_attr.port_num = 1;
    attrs[1].ah_attr.grh.dgid = ibv_gid { raw: v4.to_ipv6_mapped().octets() };
    attrs[2].qp_state = IBV_QPS_RTS;
    attrs[2].timeout = 14;
    attrs[2].retry_cnt = 7;
    attrs[2].rnr_retry = 7;
    attrs[2].max_rd_atomic = 1;
    let masks = [
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
    ];
    for (attr, mask) in attrs.iter_mut().zip(masks) {
        // SAFETY: a live QP and attributes.
        assert_eq!(unsafe { qp::ibv_modify_qp(q, attr, mask) }, 0);
    }
}

#[test]
fn through_the_daemon_a_bad_rkey_raises_the_responders_async_event_and_a_cq_resizes() {
    let socket = std::env::temp_dir().join(format!("softrnicd-ibverbs-{}.sock", std::process::id()));
    let options = DaemonOptions { socket, engine_threads: 1, config: Default::default(), designs: Default::default() };
    let daemon = Daemon::bind(options).unwrap().start().unwrap();
    // SAFETY: the only test of this binary, before anything reads the
    // environment.
    unsafe {
        std::env::set_var("SOFTRNIC_ADDR", ADDR);
        std::env::set_var("SOFTRNIC_DAEMON", daemon.socket());
    }
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let mut n = 0;
        let list = device::ibv_get_device_list(&mut n);
        let ctx = context::ibv_open_device(*list);
        assert!(!ctx.is_null());
        device::ibv_free_device_list(list);
        assert_eq!(daemon.tenants(), 1, "the context is the daemon's tenant");
        let pd = memory::ibv_alloc_pd(ctx);
        let cq = cq::ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        let (a, b) = (qp::ibv_create_qp(pd, &mut init), qp::ibv_create_qp(pd, &mut init));
        connect(a, (*b).qp_num);
        connect(b, (*a).qp_num);
        let mut bytes = vec![0u8; 64];
        let mr = memory::ibv_reg_mr(pd, bytes.as_mut_ptr() as *mut c_void, 64, IBV_ACCESS_LOCAL_WRITE as c_int);
        let mut sge = ibv_sge { addr: bytes.as_ptr() as u64, length: 8, lkey: (*mr).lkey };
        let mut wr: ibv_send_wr = std::mem::zeroed();
        (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode) = (9, &mut sge, 1, IBV_WR_RDMA_WRITE);
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: 0x1000, rkey: 0xdead_0000 };
        let mut bad = null_mut();
        assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut bad), 0);
        // The async_fd becomes readable, and names b, whose responder
        // refused the WRITE.
        let mut pfd = libc::pollfd { fd: (*ctx).async_fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, Duration::from_secs(10).as_millis() as c_int), 1, "no event in 10 s");
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(context::ibv_get_async_event(ctx, &mut event), 0);
        assert_eq!((event.element, event.event_type), (b as *mut c_void, IBV_EVENT_QP_ACCESS_ERR));
        context::ibv_ack_async_event(&mut event);
        let mut wc: ibv_wc = std::mem::zeroed();
        while ((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 0 {}
        assert_eq!((wc.wr_id, wc.status), (9, 10), "IBV_WC_REM_ACCESS_ERR at the requester");
        assert_eq!(cq::ibv_resize_cq(cq, 100), 0);
        assert_eq!((*cq).cqe, 128, "through the daemon a CQ holds a power of two");
        for q in [a, b] {
            assert_eq!(qp::ibv_destroy_qp(q), 0, "its event acknowledged, b can go");
        }
        assert_eq!(memory::ibv_dereg_mr(mr), 0);
        assert_eq!(cq::ibv_destroy_cq(cq), 0);
        assert_eq!(memory::ibv_dealloc_pd(pd), 0);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}
