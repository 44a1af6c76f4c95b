//! A device served by softrnicd that stops under its program says so, as
//! the kernel says it of a device removed under its programs: the
//! context's `async_fd` turns readable, `ibv_get_async_event` gives
//! `IBV_EVENT_DEVICE_FATAL` once and `EIO` after, the receives it held
//! come back flushed, a wait on a completion channel ends, and a control verb fails at once rather than hang.
//! (Its own process: the other daemon tests share one that stays up.)

use std::ffi::{CStr, c_int};
use std::ptr::null_mut;
use std::time::Duration;

use softrnic_daemon::server::{Daemon, DaemonOptions};
use softrnic_ibverbs::abi::*;
use softrnic_ibverbs::{context, cq, device, memory, qp, strings};

const IBV_WC_WR_FLUSH_ERR: c_int = 5;

#[test]
fn a_daemon_that_stops_under_its_program_raises_device_fatal() {
    let socket = std::env::temp_dir().join(format!("softrnicd-gone-{}.sock", std::process::id()));
    let daemon = Daemon::bind(DaemonOptions::at(socket.clone())).unwrap().start().unwrap();
    // SAFETY: before the only context of this process is opened.
    unsafe {
        std::env::set_var("SOFTRNIC_ADDR", "127.0.5.43");
        std::env::set_var("SOFTRNIC_DAEMON", &socket);
    }
    // SAFETY: the verbs' own sequence, every object live while used.
    unsafe {
        let mut n = 0;
        let list = device::ibv_get_device_list(&mut n);
        let ctx = context::ibv_open_device(*list);
        device::ibv_free_device_list(list);
        assert!(!ctx.is_null());
        let pd = memory::ibv_alloc_pd(ctx);
        let channel = cq::ibv_create_comp_channel(ctx);
        let cq = cq::ibv_create_cq(ctx, 16, null_mut(), channel, 0);
        assert_eq!(((*ctx).ops.req_notify_cq.unwrap())(cq, 0), 0);
        let mut init = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: null_mut(),
            cap: ibv_qp_cap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        let q = qp::ibv_create_qp(pd, &mut init);
        assert!(!q.is_null());
        let mut attr: ibv_qp_attr = std::mem::zeroed();
        (attr.qp_state, attr.port_num, attr.qp_access_flags) = (IBV_QPS_INIT, 1, IBV_ACCESS_LOCAL_WRITE);
        let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(qp::ibv_modify_qp(q, &mut attr, mask), 0);
        let mut buffer = vec![0u8; 64];
        let mr = memory::ibv_reg_mr(pd, buffer.as_mut_ptr().cast(), 64, IBV_ACCESS_LOCAL_WRITE as c_int);
        let mut sge = ibv_sge { addr: buffer.as_ptr() as u64, length: 64, lkey: (*mr).lkey };
        let mut recv = ibv_recv_wr { wr_id: 77, next: null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = null_mut();
        assert_eq!(((*ctx).ops.post_recv.unwrap())(q, &mut recv, &mut bad), 0);

        drop(daemon);

        let mut pfd = libc::pollfd { fd: (*ctx).async_fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, Duration::from_secs(10).as_millis() as c_int), 1, "no word in 10 s");
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(context::ibv_get_async_event(ctx, &mut event), 0);
        assert_eq!(event.event_type, IBV_EVENT_DEVICE_FATAL);
        assert_eq!(event.element as usize as c_int, 1, "the element's port_num");
        let name = CStr::from_ptr(strings::ibv_event_type_str(event.event_type));
        assert_eq!(name, c"local catastrophic error");
        context::ibv_ack_async_event(&mut event);
        assert_eq!(context::ibv_get_async_event(ctx, &mut event), -1, "said once");
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EIO));

        // The receive the QP held comes back, flushed.
        let mut wc: ibv_wc = std::mem::zeroed();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while ((*ctx).ops.poll_cq.unwrap())(cq, 1, &mut wc) == 0 {
            assert!(std::time::Instant::now() < deadline, "the receive never flushed");
        }
        assert_eq!((wc.wr_id, wc.status), (77, IBV_WC_WR_FLUSH_ERR));
        // A program waiting on its completion channel is not left waiting:
        // after the notification the flush raised, if it came first, the
        // channel's read fails.
        let (mut cq_of_event, mut cq_context) = (null_mut(), null_mut());
        let mut notified = 0;
        while cq::ibv_get_cq_event(channel, &mut cq_of_event, &mut cq_context) == 0 {
            assert_eq!(cq_of_event, cq);
            notified += 1;
            assert!(notified <= 1, "one notification, for one arming");
        }
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EIO));
        cq::ibv_ack_cq_events(cq, notified);
        // A control verb fails with the device gone.
        assert!(memory::ibv_alloc_pd(ctx).is_null());
        // What the program held it may still let go of.
        qp::ibv_destroy_qp(q);
        memory::ibv_dereg_mr(mr);
        cq::ibv_destroy_cq(cq);
        cq::ibv_destroy_comp_channel(channel);
        memory::ibv_dealloc_pd(pd);
        context::ibv_close_device(ctx);
    }
    let _ = std::fs::remove_file(&socket);
}
