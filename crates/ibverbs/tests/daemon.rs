//! The C API through softrnicd: a context opened with `SOFTRNIC_DAEMON`
//! re-registers its regions, gets its asynchronous events on its
//! `async_fd`, from the daemon, as a context with the engine inside gets
//! them from the engine, resizes its CQs, and shares receive queues.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::time::Duration;

use softrnic_daemon::server::{Daemon, DaemonOptions, Running};
use softrnic_ibverbs::abi::*;
use softrnic_ibverbs::{context, cq, device, memory, qp, srq};

const ADDR: &str = "127.0.5.41";
/// `ibv_wc_opcode`'s receive (verbs.h).
const IBV_WC_RECV: c_int = 1 << 7;

static DAEMON: OnceLock<Running> = OnceLock::new();

extern "C" fn remove_socket() {
    if let Some(daemon) = DAEMON.get() {
        let _ = std::fs::remove_file(daemon.socket());
    }
}

/// The daemon every test's contexts reach, started (and the environment
/// pointed at it) by the first test that asks.
fn daemon() -> &'static Running {
    DAEMON.get_or_init(|| {
        let socket = std::env::temp_dir().join(format!("softrnicd-ibverbs-{}.sock", std::process::id()));
        let daemon = Daemon::bind(DaemonOptions::at(socket)).unwrap().start().unwrap();
        // A static is never dropped: its socket goes when the tests exit.
        // SAFETY: registers a plain function of this file.
        unsafe { libc::atexit(remove_socket) };
        // SAFETY: before any context is opened (every test opens its own
        // after this), and nothing else of this binary reads it meanwhile.
        unsafe {
            std::env::set_var("SOFTRNIC_ADDR", ADDR);
            std::env::set_var("SOFTRNIC_DAEMON", daemon.socket());
        }
        daemon
    })
}

/// A context on the daemon's device.
fn open() -> *mut ibv_context {
    daemon();
    // SAFETY: the verbs' own sequence.
    unsafe {
        let mut n = 0;
        let list = device::ibv_get_device_list(&mut n);
        let ctx = context::ibv_open_device(*list);
        assert!(!ctx.is_null());
        device::ibv_free_device_list(list);
        ctx
    }
}

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

/// A PD, one CQ and two RC QPs of `ctx` connected to each other.
///
/// # Safety
/// `ctx` must be a live context.
unsafe fn rc_pair(ctx: *mut ibv_context) -> (*mut ibv_pd, *mut ibv_cq, *mut ibv_qp, *mut ibv_qp) {
    // SAFETY: the verbs' own sequence on a live context (caller).
    unsafe {
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
        (pd, cq, a, b)
    }
}

#[test]
fn through_the_daemon_a_region_reregisters_a_refused_write_raises_an_async_event_and_a_cq_resizes() {
    let ctx = open();
    assert!(daemon().tenants() >= 1, "the context is the daemon's tenant");
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let (pd, cq, a, b) = rc_pair(ctx);
        let mut bytes = b"moved\0\0\0".to_vec();
        let mr = memory::ibv_reg_mr(pd, bytes.as_mut_ptr() as *mut c_void, 8, IBV_ACCESS_LOCAL_WRITE as c_int);
        let mut wc: ibv_wc = std::mem::zeroed();
        let mut sge = ibv_sge { addr: bytes.as_ptr() as u64, length: 5, lkey: (*mr).lkey };
        let mut wr: ibv_send_wr = std::mem::zeroed();
        (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode) = (8, &mut sge, 1, IBV_WR_RDMA_WRITE);
        let mut bad = null_mut();
        // A target region moved (ibv_rereg_mr) keeps its keys: a WRITE
        // under its rkey lands in the new memory, not the old.
        let (mut old_home, mut new_home) = (vec![0u8; 64], vec![0u8; 64]);
        let access = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        let target = memory::ibv_reg_mr(pd, old_home.as_mut_ptr() as *mut c_void, 64, access);
        let (lkey, rkey) = ((*target).lkey, (*target).rkey);
        let moved = new_home.as_mut_ptr() as *mut c_void;
        assert_eq!(memory::ibv_rereg_mr(target, IBV_REREG_MR_CHANGE_TRANSLATION, null_mut(), moved, 64, 0), 0);
        assert_eq!(((*target).lkey, (*target).rkey, (*target).addr), (lkey, rkey, moved));
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: moved as u64 + 8, rkey };
        assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut bad), 0);
        while ((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 0 {}
        assert_eq!((wc.wr_id, wc.status), (8, 0));
        let landed: Vec<u8> = (8..13).map(|i| std::ptr::read_volatile(new_home.as_ptr().add(i))).collect();
        assert_eq!(landed, b"moved");
        assert_eq!(old_home, [0; 64], "the old memory is no longer the region's");
        // Its access taken back (remote writes no more): the same WRITE is
        // refused.
        let local = IBV_ACCESS_LOCAL_WRITE as c_int;
        assert_eq!(memory::ibv_rereg_mr(target, IBV_REREG_MR_CHANGE_ACCESS, null_mut(), null_mut(), 0, local), 0);
        wr.wr_id = 9;
        assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut bad), 0);
        // The async_fd becomes readable, and names b, whose responder
        // refused the WRITE.
        let mut pfd = libc::pollfd { fd: (*ctx).async_fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, Duration::from_secs(10).as_millis() as c_int), 1, "no event in 10 s");
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(context::ibv_get_async_event(ctx, &mut event), 0);
        assert_eq!((event.element, event.event_type), (b as *mut c_void, IBV_EVENT_QP_ACCESS_ERR));
        context::ibv_ack_async_event(&mut event);
        while ((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 0 {}
        assert_eq!((wc.wr_id, wc.status), (9, 10), "IBV_WC_REM_ACCESS_ERR at the requester");
        assert_eq!(cq::ibv_resize_cq(cq, 100), 0);
        assert_eq!((*cq).cqe, 128, "through the daemon a CQ holds a power of two");
        for q in [a, b] {
            assert_eq!(qp::ibv_destroy_qp(q), 0, "its event acknowledged, b can go");
        }
        assert_eq!(memory::ibv_dereg_mr(mr), 0);
        assert_eq!(memory::ibv_dereg_mr(target), 0);
        assert_eq!(cq::ibv_destroy_cq(cq), 0);
        assert_eq!(memory::ibv_dealloc_pd(pd), 0);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}

/// Receives from many QPs, through one ring the daemon fills the engine's
/// SRQ from: each QP's message lands in the next receive posted, a QP on
/// the SRQ refuses receives of its own, and taking the SRQ below its limit
/// raises the event on the owner's `async_fd`.
#[test]
fn through_the_daemon_two_qps_share_a_receive_queue_and_its_limit_event_comes() {
    let ctx = open();
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let pd = memory::ibv_alloc_pd(ctx);
        let cq = cq::ibv_create_cq(ctx, 32, null_mut(), null_mut(), 0);
        let mut srq_init =
            ibv_srq_init_attr { srq_context: null_mut(), attr: ibv_srq_attr { max_wr: 16, max_sge: 1, srq_limit: 0 } };
        let shared = srq::ibv_create_srq(pd, &mut srq_init);
        assert!(!shared.is_null(), "ibv_create_srq through the daemon");
        let mut inboxes = vec![0u8; 4 * 16];
        let mr = memory::ibv_reg_mr(pd, inboxes.as_mut_ptr() as *mut c_void, 64, IBV_ACCESS_LOCAL_WRITE as c_int);
        for i in 0..4 {
            let mut sge = ibv_sge { addr: inboxes.as_ptr() as u64 + 16 * i, length: 16, lkey: (*mr).lkey };
            let mut wr = ibv_recv_wr { wr_id: 100 + i, next: null_mut(), sg_list: &mut sge, num_sge: 1 };
            let mut bad = null_mut();
            assert_eq!(((*ctx).ops.post_srq_recv.unwrap())(shared, &mut wr, &mut bad), 0);
        }
        let caps = ibv_qp_cap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: caps,
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        let senders = [qp::ibv_create_qp(pd, &mut init), qp::ibv_create_qp(pd, &mut init)];
        init.srq = shared;
        let receivers = [qp::ibv_create_qp(pd, &mut init), qp::ibv_create_qp(pd, &mut init)];
        for (s, r) in senders.iter().zip(&receivers) {
            assert!(!s.is_null() && !r.is_null());
            connect(*s, (**r).qp_num);
            connect(*r, (**s).qp_num);
        }
        // A QP on an SRQ takes no receives of its own.
        let mut sge = ibv_sge { addr: inboxes.as_ptr() as u64, length: 16, lkey: (*mr).lkey };
        let mut own = ibv_recv_wr { wr_id: 1, next: null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = null_mut();
        assert_ne!(((*ctx).ops.post_recv.unwrap())(receivers[0], &mut own, &mut bad), 0);
        let send = |from: *mut ibv_qp, wr_id: u64, text: &[u8]| {
            let mut inline = ibv_sge { addr: text.as_ptr() as u64, length: text.len() as u32, lkey: 0 };
            let mut wr: ibv_send_wr = std::mem::zeroed();
            (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode, wr.send_flags) =
                (wr_id, &mut inline, 1, IBV_WR_SEND, IBV_SEND_INLINE);
            let mut bad = null_mut();
            assert_eq!(((*ctx).ops.post_send.unwrap())(from, &mut wr, &mut bad), 0);
        };
        // Takes `count` completions; returns the receives among them.
        let take = |count: usize| {
            let (mut got, mut receives) = (0, Vec::new());
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while got < count {
                assert!(std::time::Instant::now() < deadline, "completions missing after 10 s");
                let mut wc: ibv_wc = std::mem::zeroed();
                if ((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 1 {
                    assert_eq!(wc.status, 0, "wr {} failed", wc.wr_id);
                    if wc.opcode == IBV_WC_RECV {
                        receives.push((wc.wr_id, wc.qp_num, wc.byte_len));
                    }
                    got += 1;
                }
            }
            receives
        };
        // One message from each sender, one after the other: each takes the
        // SRQ's next receive, whichever QP it came to.
        send(senders[0], 1, b"first");
        let mut received = take(2);
        send(senders[1], 2, b"second!");
        received.extend(take(2));
        let rq = |i: usize| (*receivers[i]).qp_num;
        assert_eq!(received, [(100, rq(0), 5), (101, rq(1), 7)]);
        assert_eq!(&inboxes[..5], b"first");
        assert_eq!(&inboxes[16..23], b"second!");
        // Armed at 2 with 2 left: the next message leaves 1, and the
        // owner hears of it.
        let mut limit = ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: 2 };
        assert_eq!(srq::ibv_modify_srq(shared, &mut limit, IBV_SRQ_LIMIT), 0);
        send(senders[0], 3, b"third");
        assert_eq!(take(2), [(102, (*receivers[0]).qp_num, 5)]);
        let mut pfd = libc::pollfd { fd: (*ctx).async_fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, 10_000), 1, "no SRQ limit event in 10 s");
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(context::ibv_get_async_event(ctx, &mut event), 0);
        assert_eq!((event.element, event.event_type), (shared as *mut c_void, IBV_EVENT_SRQ_LIMIT_REACHED));
        context::ibv_ack_async_event(&mut event);
        let mut now = ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: 9 };
        assert_eq!(srq::ibv_query_srq(shared, &mut now), 0);
        assert_eq!((now.max_wr, now.max_sge, now.srq_limit), (16, 1, 0), "the event disarmed the limit");
        for q in senders.into_iter().chain(receivers) {
            assert_eq!(qp::ibv_destroy_qp(q), 0);
        }
        assert_eq!(srq::ibv_destroy_srq(shared), 0);
        assert_eq!(memory::ibv_dereg_mr(mr), 0);
        assert_eq!(cq::ibv_destroy_cq(cq), 0);
        assert_eq!(memory::ibv_dealloc_pd(pd), 0);
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}

/// Memory windows through the daemon's rings: the bind and the SEND with
/// invalidate travel as send WQEs, the completions as CQEs (the bind's
/// opcode, the invalidated key and its flag), and the daemon frees a
/// tenant's windows before its regions when the context closes.
#[test]
fn through_the_daemon_a_window_is_bound_written_through_and_invalidated() {
    let ctx = open();
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let (pd, cq, a, b) = rc_pair(ctx);
        let mut source = b"windowed".to_vec();
        let mut target = vec![0u8; 256];
        let src = memory::ibv_reg_mr(pd, source.as_mut_ptr() as *mut c_void, 8, IBV_ACCESS_LOCAL_WRITE as c_int);
        let access = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND) as c_int;
        let dst = memory::ibv_reg_mr(pd, target.as_mut_ptr() as *mut c_void, 256, access);
        assert!(!dst.is_null());
        let mw = ((*ctx).ops.alloc_mw.unwrap())(pd, IBV_MW_TYPE_2);
        assert!(!mw.is_null());
        let rkey = ((*mw).rkey & !0xff) | 0x42;
        let (mut wc, mut bad): (ibv_wc, _) = (std::mem::zeroed(), null_mut());
        let poll = |wc: &mut ibv_wc| while ((*ctx).ops.poll_cq.unwrap())(cq, 1, wc) == 0 {};

        let mut wr: ibv_send_wr = std::mem::zeroed();
        (wr.wr_id, wr.opcode) = (1, IBV_WR_BIND_MW);
        let bind_info = ibv_mw_bind_info {
            mr: dst,
            addr: target.as_ptr() as u64 + 128,
            length: 64,
            mw_access_flags: IBV_ACCESS_REMOTE_WRITE,
        };
        wr.bind_mw = ibv_send_wr_bind_mw { mw, rkey, bind_info };
        assert_eq!(((*ctx).ops.post_send.unwrap())(b, &mut wr, &mut bad), 0);
        poll(&mut wc);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (1, 0, 5), "IBV_WC_BIND_MW");

        let mut sge = ibv_sge { addr: source.as_ptr() as u64, length: 8, lkey: (*src).lkey };
        let mut wr: ibv_send_wr = std::mem::zeroed();
        (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode) = (2, &mut sge, 1, IBV_WR_RDMA_WRITE);
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: target.as_ptr() as u64 + 130, rkey };
        assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut bad), 0);
        poll(&mut wc);
        assert_eq!((wc.wr_id, wc.status), (2, 0));
        let landed: Vec<u8> = (130..138).map(|i| std::ptr::read_volatile(target.as_ptr().add(i))).collect();
        assert_eq!(landed, b"windowed");

        let mut recv_sge = ibv_sge { addr: target.as_ptr() as u64, length: 64, lkey: (*dst).lkey };
        let mut recv = ibv_recv_wr { wr_id: 3, next: null_mut(), sg_list: &mut recv_sge, num_sge: 1 };
        assert_eq!(((*ctx).ops.post_recv.unwrap())(b, &mut recv, &mut null_mut()), 0);
        let mut wr: ibv_send_wr = std::mem::zeroed();
        (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode, wr.imm_data) = (4, &mut sge, 1, IBV_WR_SEND_WITH_INV, rkey);
        assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut bad), 0);
        let mut seen = Vec::new();
        while seen.len() < 2 {
            poll(&mut wc);
            seen.push((wc.wr_id, wc.status, wc.opcode, wc.wc_flags & IBV_WC_WITH_INV != 0, wc.imm_data));
        }
        seen.sort();
        assert_eq!(seen, [(3, 0, IBV_WC_RECV, true, rkey), (4, 0, 0, false, 0)]);
        // Closing the context with the window still allocated and the
        // regions registered: the daemon takes them down in order.
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}

/// A program that posts and destroys its QP at once (mckey's sender does)
/// through the daemon: what it posted still goes before the QP does, as
/// with the engine in the process. The processor had not always taken the
/// ring's last entries when the destroy arrived, and they vanished.
#[test]
fn through_the_daemon_requests_posted_just_before_a_destroy_still_go() {
    let ctx = open();
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let mut bytes = vec![0u8; 64];
        bytes[..4].copy_from_slice(b"last");
        for round in 0..20u64 {
            // A fresh pair each round; its sender destroyed right after
            // its post.
            let (pd, cq, a, b) = rc_pair(ctx);
            let mr = memory::ibv_reg_mr(pd, bytes.as_mut_ptr() as *mut c_void, 64, IBV_ACCESS_LOCAL_WRITE as c_int);
            let mut recv_sge = ibv_sge { addr: bytes.as_ptr() as u64 + 32, length: 32, lkey: (*mr).lkey };
            let mut recv = ibv_recv_wr { wr_id: round, next: null_mut(), sg_list: &mut recv_sge, num_sge: 1 };
            assert_eq!(((*ctx).ops.post_recv.unwrap())(b, &mut recv, &mut null_mut()), 0);
            let mut sge = ibv_sge { addr: bytes.as_ptr() as u64, length: 4, lkey: (*mr).lkey };
            let mut wr: ibv_send_wr = std::mem::zeroed();
            (wr.wr_id, wr.sg_list, wr.num_sge, wr.opcode) = (round, &mut sge, 1, IBV_WR_SEND);
            assert_eq!(((*ctx).ops.post_send.unwrap())(a, &mut wr, &mut null_mut()), 0);
            assert_eq!(qp::ibv_destroy_qp(a), 0);
            let mut wc: ibv_wc = std::mem::zeroed();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !(((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 1 && wc.opcode == IBV_WC_RECV) {
                assert!(std::time::Instant::now() < deadline, "round {round}: the SEND never arrived");
            }
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (round, 0, 4));
            assert_eq!(qp::ibv_destroy_qp(b), 0);
            assert_eq!(memory::ibv_dereg_mr(mr), 0);
            assert_eq!(cq::ibv_destroy_cq(cq), 0);
            assert_eq!(memory::ibv_dealloc_pd(pd), 0);
        }
        assert_eq!(context::ibv_close_device(ctx), 0);
    }
}
