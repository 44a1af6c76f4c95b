//! The C API as a verbs program uses it, called through the exported
//! functions and the context's ops exactly as `<infiniband/verbs.h>`'s
//! inline functions call them: devices and ports, RC operations with both
//! posting APIs, completion channels, asynchronous events, and errors.
//!
//! One process has one softrnic0 on one address, so every test shares one
//! context and connects pairs of QPs on it to each other.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use softrnic_ibverbs::abi::*;
use softrnic_ibverbs::{ah, context, cq, device, ece, memory, multicast, qp, srq, unsupported};

const ADDR: &str = "127.0.5.1";
/// An address where nobody listens: a peer that died.
const DEAD_ADDR: &str = "127.0.5.99";

struct Fixture {
    ctx: usize,
    pd: usize,
}

fn fixture() -> (*mut ibv_context, *mut ibv_pd) {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    let f = FIXTURE.get_or_init(|| {
        // SAFETY: set once, before the first device lookup reads it; no
        // other thread of this test binary reads the environment.
        unsafe { std::env::set_var("SOFTRNIC_ADDR", ADDR) };
        // SAFETY: the verbs' own sequence: list, open, allocate.
        unsafe {
            let mut n = 0;
            let list = device::ibv_get_device_list(&mut n);
            assert_eq!(n, 1);
            let ctx = context::ibv_open_device(*list);
            assert!(!ctx.is_null(), "open failed");
            device::ibv_free_device_list(list);
            let pd = memory::ibv_alloc_pd(ctx);
            Fixture { ctx: ctx as usize, pd: pd as usize }
        }
    });
    (f.ctx as *mut ibv_context, f.pd as *mut ibv_pd)
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

fn gid_of(addr: &str) -> ibv_gid {
    let v4: std::net::Ipv4Addr = addr.parse().unwrap();
    ibv_gid { raw: v4.to_ipv6_mapped().octets() }
}

/// A registered buffer that outlives the test.
struct Buffer {
    bytes: Vec<u8>,
    mr: *mut ibv_mr,
}

fn buffer(len: usize) -> Buffer {
    let (_, pd) = fixture();
    let mut bytes = vec![0u8; len];
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    // SAFETY: the buffer lives as long as the region (both in `Buffer`).
    let mr = unsafe { memory::ibv_reg_mr(pd, bytes.as_mut_ptr() as *mut c_void, len, access as c_int) };
    assert!(!mr.is_null());
    Buffer { bytes, mr }
}

impl Buffer {
    fn sge(&self, offset: usize, len: u32) -> ibv_sge {
        // SAFETY: a live MR.
        ibv_sge { addr: self.bytes.as_ptr() as u64 + offset as u64, length: len, lkey: unsafe { (*self.mr).lkey } }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: a live MR.
        unsafe { (*self.mr).rkey }
    }
    fn addr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }
    /// Reads what the NIC wrote (volatile: the NIC is another agent).
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        // SAFETY: in bounds of the live buffer.
        (offset..offset + len).map(|i| unsafe { std::ptr::read_volatile(self.bytes.as_ptr().add(i)) }).collect()
    }
}

fn create_cq(channel: *mut ibv_comp_channel) -> *mut ibv_cq {
    let (ctx, _) = fixture();
    // SAFETY: a live context.
    let cq = unsafe { cq::ibv_create_cq(ctx, 64, 0x5eed as *mut c_void, channel, 0) };
    assert!(!cq.is_null());
    cq
}

fn create_qp(cq: *mut ibv_cq, qp_type: c_int) -> *mut ibv_qp {
    create_qp_in(fixture().1, cq, qp_type)
}

/// A QP in `pd`, whichever context it belongs to.
fn create_qp_in(pd: *mut ibv_pd, cq: *mut ibv_cq, qp_type: c_int) -> *mut ibv_qp {
    let mut init = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv_qp_cap { max_send_wr: 32, max_recv_wr: 32, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 },
        qp_type,
        sq_sig_all: 1,
    };
    // SAFETY: live PD and CQ.
    let qp = unsafe { qp::ibv_create_qp(pd, &mut init) };
    assert!(!qp.is_null(), "create_qp: errno {}", errno());
    qp
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: plain data.
    unsafe { std::mem::zeroed() }
}

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at `remote`.
fn connect(q: *mut ibv_qp, remote: &str, remote_qpn: u32, timeout: u8, retry: u8) {
    let mut a = zeroed_attr();
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    // SAFETY: a live QP and attributes.
    let rc =
        unsafe { qp::ibv_modify_qp(q, &mut a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) };
    assert_eq!(rc, 0);
    let mut a = zeroed_attr();
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = 3;
    a.dest_qp_num = remote_qpn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = gid_of(remote);
    let mask = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    // SAFETY: as above.
    assert_eq!(unsafe { qp::ibv_modify_qp(q, &mut a, mask) }, 0);
    let mut a = zeroed_attr();
    a.qp_state = IBV_QPS_RTS;
    a.timeout = timeout;
    a.retry_cnt = retry;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    let mask =
        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    // SAFETY: as above.
    assert_eq!(unsafe { qp::ibv_modify_qp(q, &mut a, mask) }, 0);
    // SAFETY: a live QP.
    assert_eq!(unsafe { (*q).state }, IBV_QPS_RTS, "verbs keeps ibv_qp.state current");
}

/// Two RC QPs on the fixture's device, connected to each other.
fn rc_pair() -> (*mut ibv_qp, *mut ibv_qp, *mut ibv_cq, *mut ibv_cq) {
    let (cq_a, cq_b) = (create_cq(null_mut()), create_cq(null_mut()));
    let (a, b) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_b, IBV_QPT_RC));
    // SAFETY: live QPs.
    let (qpn_a, qpn_b) = unsafe { ((*a).qp_num, (*b).qp_num) };
    connect(a, ADDR, qpn_b, 14, 7);
    connect(b, ADDR, qpn_a, 14, 7);
    (a, b, cq_a, cq_b)
}

/// Polls through the context's ops, as `ibv_poll_cq` does.
fn poll_one(cq: *mut ibv_cq) -> ibv_wc {
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: plain data.
    let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: a live CQ whose context's ops are softrnic's.
        let n = unsafe { ((*(*cq).context).ops.poll_cq.unwrap())(cq, 1, &mut wc) };
        if n == 1 {
            return wc;
        }
        assert!(Instant::now() < deadline, "no completion within 10 s");
    }
}

fn post_send(q: *mut ibv_qp, wr: &mut ibv_send_wr) -> c_int {
    let mut bad = null_mut();
    // SAFETY: a live QP and a valid request.
    unsafe { ((*(*q).context).ops.post_send.unwrap())(q, wr, &mut bad) }
}

fn post_recv(q: *mut ibv_qp, sge: &mut ibv_sge, wr_id: u64) {
    let mut wr = ibv_recv_wr { wr_id, next: null_mut(), sg_list: sge, num_sge: 1 };
    let mut bad = null_mut();
    // SAFETY: a live QP and a valid request.
    assert_eq!(unsafe { ((*(*q).context).ops.post_recv.unwrap())(q, &mut wr, &mut bad) }, 0);
}

fn send_wr(wr_id: u64, opcode: c_int, sge: &mut ibv_sge) -> ibv_send_wr {
    // SAFETY: plain data.
    let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = wr_id;
    wr.opcode = opcode;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr
}

#[test]
fn the_device_its_port_and_gid_table() {
    let (ctx, _) = fixture();
    // SAFETY: the verbs' calls on a live context, with outputs on the stack.
    unsafe {
        let name = CStr::from_ptr(device::ibv_get_device_name((*ctx).device));
        assert_eq!(name.to_str().unwrap(), "softrnic0");
        let mut port: ibv_port_attr = std::mem::zeroed();
        assert_eq!(context::ibv_query_port(ctx, 1, &mut port), 0);
        assert_eq!(port.state, IBV_PORT_ACTIVE);
        assert_eq!(port.link_layer, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(port.gid_tbl_len, 1);
        assert_eq!(context::ibv_query_port(ctx, 2, &mut port), libc::EINVAL);
        let mut gid = ibv_gid { raw: [0; 16] };
        assert_eq!(context::ibv_query_gid(ctx, 1, 0, &mut gid), 0);
        assert_eq!(gid.raw, gid_of(ADDR).raw);
        assert_eq!(context::ibv_query_gid(ctx, 1, 1, &mut gid), -1, "index 1 does not exist");
        let mut entry: ibv_gid_entry = std::mem::zeroed();
        assert_eq!(context::_ibv_query_gid_ex(ctx, 1, 0, &mut entry, 0, size_of::<ibv_gid_entry>()), 0);
        assert_eq!(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!(context::_ibv_query_gid_ex(ctx, 1, 3, &mut entry, 0, size_of::<ibv_gid_entry>()), libc::EINVAL);
        let mut attr: ibv_device_attr = std::mem::zeroed();
        assert_eq!(context::ibv_query_device(ctx, &mut attr), 0);
        assert_eq!(attr.atomic_cap, IBV_ATOMIC_HCA);
        assert_eq!(attr.phys_port_cnt, 1);
        // The extended context the header's inline functions look for.
        assert_eq!((*ctx).abi_compat, VERBS_ABI_IS_EXTENDED);
        assert_ne!(attr.vendor_id, 0, "a vendor, as UCX and ECE read it");
        // The command descriptor is real: it dups, and polls as quiet.
        let copy = libc::dup((*ctx).cmd_fd);
        assert!(copy >= 0, "dup(cmd_fd): errno {}", errno());
        let mut pfd = libc::pollfd { fd: copy, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, 0), 0, "never readable");
        libc::close(copy);
    }
}

#[test]
fn rc_operations_through_ibv_post_send() {
    let (a, b, cq_a, cq_b) = rc_pair();
    let (src, dst) = (buffer(4096), buffer(4096));
    // SEND with immediate into a posted receive.
    post_recv(b, &mut dst.sge(0, 4096), 7);
    // SAFETY: the source buffer is ours to fill before posting.
    unsafe { std::ptr::copy_nonoverlapping(b"hello verbs".as_ptr(), src.bytes.as_ptr() as *mut u8, 11) };
    let mut sge = src.sge(0, 11);
    let mut wr = send_wr(1, IBV_WR_SEND_WITH_IMM, &mut sge);
    wr.imm_data = 0x1234_5678u32.to_be();
    assert_eq!(post_send(a, &mut wr), 0);
    let sent = poll_one(cq_a);
    assert_eq!((sent.wr_id, sent.status, sent.opcode), (1, 0, 0));
    let got = poll_one(cq_b);
    assert_eq!((got.wr_id, got.status, got.byte_len), (7, 0, 11));
    assert_eq!(got.opcode, 128, "IBV_WC_RECV");
    assert_ne!(got.wc_flags & IBV_WC_WITH_IMM, 0);
    assert_eq!(u32::from_be(got.imm_data), 0x1234_5678);
    // SAFETY: a live QP.
    assert_eq!(got.qp_num, unsafe { (*b).qp_num });
    assert_eq!(dst.read(0, 11), b"hello verbs");

    // RDMA WRITE (inline), then READ it back.
    let payload = *b"written inline";
    let mut inline = ibv_sge { addr: payload.as_ptr() as u64, length: payload.len() as u32, lkey: 0 };
    let mut wr = send_wr(2, IBV_WR_RDMA_WRITE, &mut inline);
    wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr() + 100, rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!(poll_one(cq_a).status, 0);
    assert_eq!(dst.read(100, payload.len()), payload);
    let mut sge = src.sge(200, payload.len() as u32);
    let mut wr = send_wr(3, IBV_WR_RDMA_READ, &mut sge);
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr() + 100, rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), 0);
    let read = poll_one(cq_a);
    assert_eq!((read.wr_id, read.status, read.opcode), (3, 0, 2));
    assert_eq!(src.read(200, payload.len()), payload);

    // FETCH_AND_ADD then COMPARE_AND_SWAP on an aligned word.
    let mut sge = src.sge(512, 8);
    let mut wr = send_wr(4, IBV_WR_ATOMIC_FETCH_AND_ADD, &mut sge);
    wr.wr.atomic = ibv_send_wr_atomic { remote_addr: dst.addr() + 1024, compare_add: 5, swap: 0, rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!(poll_one(cq_a).status, 0);
    let mut wr = send_wr(5, IBV_WR_ATOMIC_CMP_AND_SWP, &mut sge);
    wr.wr.atomic = ibv_send_wr_atomic { remote_addr: dst.addr() + 1024, compare_add: 5, swap: 99, rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!(poll_one(cq_a).status, 0);
    assert_eq!(src.read(512, 8), 5u64.to_ne_bytes(), "the swap returns the original value");
    assert_eq!(dst.read(1024, 8), 99u64.to_ne_bytes());
}

/// UC through the verbs: connected with UC's attributes only (no READ
/// depth, RNR timer, timeout or retries), a SEND with immediate and a
/// WRITE with immediate land; a READ is refused at post, and so is a
/// `send_ops_flags` asking for one.
#[test]
fn uc_sends_and_writes_through_ibv_post_send() {
    let (ctx, pd) = fixture();
    let (cq_a, cq_b) = (create_cq(null_mut()), create_cq(null_mut()));
    let (a, b) = (create_qp(cq_a, IBV_QPT_UC), create_qp(cq_b, IBV_QPT_UC));
    // SAFETY: live QPs.
    let (qpn_a, qpn_b) = unsafe { ((*a).qp_num, (*b).qp_num) };
    for (q, remote_qpn) in [(a, qpn_b), (b, qpn_a)] {
        let mut attr = zeroed_attr();
        (attr.qp_state, attr.port_num, attr.qp_access_flags) =
            (IBV_QPS_INIT, 1, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        // SAFETY: a live QP and attributes.
        unsafe {
            let mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
            assert_eq!(qp::ibv_modify_qp(q, &mut attr, mask), 0);
            let mut attr = zeroed_attr();
            (attr.qp_state, attr.path_mtu, attr.dest_qp_num) = (IBV_QPS_RTR, 3, remote_qpn);
            (attr.ah_attr.is_global, attr.ah_attr.port_num, attr.ah_attr.grh.dgid) = (1, 1, gid_of(ADDR));
            let mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            assert_eq!(qp::ibv_modify_qp(q, &mut attr, mask), 0);
            let mut attr = zeroed_attr();
            attr.qp_state = IBV_QPS_RTS;
            assert_eq!(qp::ibv_modify_qp(q, &mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
        }
    }
    let (src, dst) = (buffer(8192), buffer(8192));
    // SAFETY: filling our own source buffer.
    unsafe { std::ptr::write_bytes(src.bytes.as_ptr() as *mut u8, 0x5c, 5000) };
    post_recv(b, &mut dst.sge(0, 4096), 70);
    post_recv(b, &mut dst.sge(0, 16), 71);
    let mut sge = src.sge(0, 3000);
    let mut wr = send_wr(1, IBV_WR_SEND_WITH_IMM, &mut sge);
    wr.imm_data = 7u32.to_be();
    assert_eq!(post_send(a, &mut wr), 0);
    let mut sge = src.sge(0, 5000);
    let mut wr = send_wr(2, IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge);
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr() + 3000, rkey: dst.rkey() };
    wr.imm_data = 8u32.to_be();
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!((poll_one(cq_a).wr_id, poll_one(cq_a).wr_id), (1, 2));
    let (sent, written) = (poll_one(cq_b), poll_one(cq_b));
    assert_eq!((sent.wr_id, sent.status, sent.byte_len, u32::from_be(sent.imm_data)), (70, 0, 3000, 7));
    assert_eq!((written.wr_id, written.opcode, written.byte_len, u32::from_be(written.imm_data)), (71, 129, 5000, 8));
    assert_eq!(dst.read(0, 8000), vec![0x5c; 8000]);
    // READ and ATOMIC need RC.
    let mut sge = src.sge(0, 8);
    let mut wr = send_wr(3, IBV_WR_RDMA_READ, &mut sge);
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr(), rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), libc::EOPNOTSUPP);
    // SAFETY: plain data, then a live context and PD.
    unsafe {
        let mut ex: ibv_qp_init_attr_ex = std::mem::zeroed();
        (ex.send_cq, ex.recv_cq, ex.qp_type, ex.pd) = (cq_a, cq_a, IBV_QPT_UC, pd);
        ex.cap = ibv_qp_cap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ;
        assert!(qp::create_qp_ex(ctx, &mut ex).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
        let q = qp::create_qp_ex(ctx, &mut ex);
        assert!(!q.is_null(), "errno {}", errno());
        assert_eq!(qp::ibv_destroy_qp(q), 0);
    }
}

/// Whether the QP recovers by selective repeat, as the engine has it.
fn selective_repeat(q: *mut ibv_qp) -> bool {
    // SAFETY: a live QP of the fixture's live context.
    let (ctx, qpn) = unsafe { (context::Context::from_ibv((*q).context), (*q).qp_num) };
    ctx.provider.engine_in_process().expect("an engine in the process").query_qp(qpn).expect("qp").1.selective_repeat
}

#[test]
fn ece_agrees_on_selective_repeat_and_not_with_another_vendor() {
    let (cq_a, cq_b) = (create_cq(null_mut()), create_cq(null_mut()));
    let (a, b) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_b, IBV_QPT_RC));
    // SAFETY: live QPs, ECE structures on the stack.
    unsafe {
        let (mut ece_a, mut ece_b) = (ibv_ece::default(), ibv_ece::default());
        assert_eq!((ece::ibv_query_ece(a, &mut ece_a), ece::ibv_query_ece(b, &mut ece_b)), (0, 0));
        assert_eq!(ece_a.options, ece::SELECTIVE_REPEAT, "a fresh RC QP offers selective repeat");
        assert_ne!(ece_a.vendor_id, 0);
        // Each end sets what the other offered, as rdma_cm does.
        assert_eq!((ece::ibv_set_ece(a, &mut ece_b), ece::ibv_set_ece(b, &mut ece_a)), (0, 0));
        let mut agreed = ibv_ece::default();
        assert_eq!(ece::ibv_query_ece(a, &mut agreed), 0);
        assert_eq!(agreed.options, ece::SELECTIVE_REPEAT);
        connect(a, ADDR, (*b).qp_num, 14, 7);
        connect(b, ADDR, (*a).qp_num, 14, 7);
        assert!(selective_repeat(a) && selective_repeat(b));
        // Too late once the QP receives.
        assert_eq!(ece::ibv_set_ece(a, &mut ece_b), libc::EINVAL);
    }
    // A multi-packet WRITE with immediate and a SEND over the agreed
    // connection, every byte checked.
    let (src, dst) = (buffer(16384), buffer(16384));
    for i in 0..16384 {
        // SAFETY: our own buffer, before posting.
        unsafe { *(src.bytes.as_ptr() as *mut u8).add(i) = (i * 7 % 251) as u8 };
    }
    post_recv(b, &mut dst.sge(0, 0), 1);
    let mut sge = src.sge(0, 16384);
    let mut wr = send_wr(2, IBV_WR_RDMA_WRITE_WITH_IMM, &mut sge);
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr(), rkey: dst.rkey() };
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!(poll_one(cq_a).status, 0);
    let got = poll_one(cq_b);
    assert_eq!((got.wr_id, got.status, got.byte_len), (1, 0, 16384));
    assert_eq!(dst.read(0, 16384), src.read(0, 16384));

    // Another vendor's options agree nothing: plain go-back-N.
    let (c, d) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_b, IBV_QPT_RC));
    // SAFETY: live QPs.
    unsafe {
        let mut mellanox = ibv_ece { vendor_id: 0x02c9, options: ece::SELECTIVE_REPEAT, comp_mask: 0 };
        assert_eq!(ece::ibv_set_ece(c, &mut mellanox), libc::EINVAL);
        let mut bad_mask = ibv_ece { vendor_id: mellanox.vendor_id, comp_mask: 1, ..ibv_ece::default() };
        assert_eq!(ece::ibv_set_ece(d, &mut bad_mask), libc::EINVAL);
        let mut nobody = ibv_ece::default();
        assert_eq!(ece::ibv_set_ece(d, &mut nobody), libc::EOPNOTSUPP);
        let mut agreed = ibv_ece::default();
        assert_eq!(ece::ibv_query_ece(c, &mut agreed), 0);
        assert_eq!(agreed.options, 0);
        connect(c, ADDR, (*d).qp_num, 14, 7);
        assert!(!selective_repeat(c));
    }
}

#[test]
fn rc_operations_through_the_wr_builder_of_ibv_qp_ex() {
    let (a, _b, cq_a, _) = rc_pair();
    let (src, dst) = (buffer(256), buffer(256));
    // SAFETY: filling our own source buffer.
    unsafe { std::ptr::write_bytes(src.bytes.as_ptr() as *mut u8, 0xab, 64) };
    // SAFETY: the builder's documented sequence on a live QP.
    unsafe {
        let qx = qp::ibv_qp_to_qp_ex(a);
        ((*qx).wr_start.unwrap())(qx);
        (*qx).wr_id = 10;
        (*qx).wr_flags = IBV_SEND_SIGNALED;
        ((*qx).wr_rdma_write.unwrap())(qx, dst.rkey(), dst.addr());
        ((*qx).wr_set_sge.unwrap())(qx, (*src.mr).lkey, src.addr(), 64);
        (*qx).wr_id = 11;
        ((*qx).wr_rdma_write.unwrap())(qx, dst.rkey(), dst.addr() + 128);
        let mut text = *b"inline!";
        ((*qx).wr_set_inline_data.unwrap())(qx, text.as_mut_ptr() as *mut c_void, text.len());
        text.fill(0); // copied at the call, so reuse is safe
        assert_eq!(((*qx).wr_complete.unwrap())(qx), 0);
        // A setter with no request begun is reported by wr_complete.
        ((*qx).wr_start.unwrap())(qx);
        ((*qx).wr_set_sge.unwrap())(qx, 0, 0, 0);
        assert_eq!(((*qx).wr_complete.unwrap())(qx), libc::EINVAL);
    }
    assert_eq!(poll_one(cq_a).wr_id, 10);
    assert_eq!(poll_one(cq_a).wr_id, 11);
    assert_eq!(dst.read(0, 64), vec![0xab; 64]);
    assert_eq!(dst.read(128, 7), b"inline!");
}

/// IBTA 1.5's ATOMIC WRITE through both ways of posting it: the builder's
/// `ibv_wr_atomic_write` (the 8 bytes by pointer, copied at the call) and
/// `IBV_WR_ATOMIC_WRITE` through `ibv_post_send` (the 8 bytes as the
/// request's data); the device says it has it.
#[test]
fn atomic_write_through_the_builder_and_ibv_post_send() {
    let (ctx, _) = fixture();
    let (a, _b, cq_a, _) = rc_pair();
    let (src, dst) = (buffer(64), buffer(64));
    // SAFETY: the verbs on live objects; plain data.
    unsafe {
        let mut attr: ibv_device_attr_ex = std::mem::zeroed();
        let query = (*verbs_ctx(ctx)).query_device_ex.unwrap();
        assert_eq!(query(ctx, null_mut(), &mut attr, size_of::<ibv_device_attr_ex>()), 0);
        let flags_ex = u64::from_ne_bytes(attr.extended[..8].try_into().unwrap());
        assert_ne!(flags_ex & IB_UVERBS_DEVICE_ATOMIC_WRITE, 0);
        assert_eq!(flags_ex as u32, attr.orig_attr.device_cap_flags, "the legacy flags below");

        let qx = qp::ibv_qp_to_qp_ex(a);
        ((*qx).wr_start.unwrap())(qx);
        (*qx).wr_id = 20;
        (*qx).wr_flags = IBV_SEND_SIGNALED;
        let mut word = *b"8 bytes!";
        ((*qx).wr_atomic_write.unwrap())(qx, dst.rkey(), dst.addr() + 8, word.as_ptr() as *const c_void);
        word.fill(0);
        assert_eq!(((*qx).wr_complete.unwrap())(qx), 0);
        let done = poll_one(cq_a);
        assert_eq!((done.wr_id, done.status, done.opcode), (20, IBV_WC_SUCCESS, 9), "IBV_WC_ATOMIC_WRITE");
        assert_eq!(dst.read(8, 8), b"8 bytes!");

        std::ptr::copy_nonoverlapping(b"by post!".as_ptr(), src.bytes.as_ptr() as *mut u8, 8);
        let mut sge = src.sge(0, 8);
        let mut wr = send_wr(21, IBV_WR_ATOMIC_WRITE, &mut sge);
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr() + 16, rkey: dst.rkey() };
        assert_eq!(post_send(a, &mut wr), 0);
        let done = poll_one(cq_a);
        assert_eq!((done.wr_id, done.status, done.opcode), (21, IBV_WC_SUCCESS, 9));
        assert_eq!(dst.read(16, 8), b"by post!");
        // Other than 8 bytes is refused at post.
        let mut sge = src.sge(0, 4);
        let mut wr = send_wr(22, IBV_WR_ATOMIC_WRITE, &mut sge);
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr(), rkey: dst.rkey() };
        assert_eq!(post_send(a, &mut wr), libc::EINVAL);
    }
}

#[test]
fn completion_channels_block_wake_and_honour_nonblocking_fds() {
    let (ctx, _) = fixture();
    // SAFETY: a live context.
    let channel = unsafe { cq::ibv_create_comp_channel(ctx) };
    let cq_b = create_cq(channel);
    let cq_a = create_cq(null_mut());
    let (a, b) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_b, IBV_QPT_RC));
    // SAFETY: live QPs.
    let (qpn_a, qpn_b) = unsafe { ((*a).qp_num, (*b).qp_num) };
    connect(a, ADDR, qpn_b, 14, 7);
    connect(b, ADDR, qpn_a, 14, 7);
    let (src, dst) = (buffer(64), buffer(64));
    // SAFETY: channel and CQ are live; the fd is the channel's.
    unsafe {
        let fd = (*channel).fd;
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        let (mut got_cq, mut got_ctx) = (null_mut(), null_mut());
        assert_eq!(cq::ibv_get_cq_event(channel, &mut got_cq, &mut got_ctx), -1);
        assert_eq!(errno(), libc::EAGAIN, "a non-blocking channel with no event");
        libc::fcntl(fd, libc::F_SETFL, flags);
        assert_eq!(((*(*cq_b).context).ops.req_notify_cq.unwrap())(cq_b, 0), 0);
    }
    post_recv(b, &mut dst.sge(0, 64), 1);
    let sender = {
        let (a, sge) = (a as usize, src.sge(0, 8));
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut sge = sge;
            let mut wr = send_wr(1, IBV_WR_SEND, &mut sge);
            assert_eq!(post_send(a as *mut ibv_qp, &mut wr), 0);
        })
    };
    // SAFETY: as above; this read blocks until the engine delivers.
    unsafe {
        let (mut got_cq, mut got_ctx) = (null_mut(), null_mut());
        assert_eq!(cq::ibv_get_cq_event(channel, &mut got_cq, &mut got_ctx), 0);
        assert_eq!(got_cq, cq_b);
        assert_eq!(got_ctx, 0x5eed as *mut c_void);
        assert_eq!(cq::ibv_destroy_comp_channel(channel), libc::EBUSY, "a CQ still uses it");
    }
    sender.join().unwrap();
    assert_eq!(poll_one(cq_b).status, 0);
    assert_eq!(poll_one(cq_a).status, 0);
    // ibv_destroy_cq waits until the event it handed out is acknowledged,
    // as rdma-core guarantees.
    // SAFETY: live QPs, CQ and channel; the CQ outlives the waiting thread.
    unsafe {
        assert_eq!(qp::ibv_destroy_qp(b), 0);
        let (done, cq) = (Arc::new(AtomicBool::new(false)), cq_b as usize);
        let destroyer = {
            let done = done.clone();
            std::thread::spawn(move || {
                let rc = cq::ibv_destroy_cq(cq as *mut ibv_cq);
                done.store(true, Ordering::SeqCst);
                rc
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "destroyed with an event unacknowledged");
        cq::ibv_ack_cq_events(cq_b, 1);
        assert_eq!(destroyer.join().unwrap(), 0);
        assert_eq!(cq::ibv_destroy_comp_channel(channel), 0, "no CQ uses it any more");
    }
}

#[test]
fn a_bad_rkey_fails_the_requester_and_raises_an_async_event_on_the_responder() {
    let (ctx, _) = fixture();
    let (a, b, cq_a, _) = rc_pair();
    let src = buffer(64);
    let mut sge = src.sge(0, 8);
    let mut wr = send_wr(9, IBV_WR_RDMA_WRITE, &mut sge);
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: 0x1000, rkey: 0xdead_0000 };
    assert_eq!(post_send(a, &mut wr), 0);
    let failed = poll_one(cq_a);
    assert_eq!((failed.wr_id, failed.status), (9, 10), "IBV_WC_REM_ACCESS_ERR");
    // SAFETY: a live context; the event names a live QP. Other tests may
    // raise events of their own on the shared context, so look for ours.
    unsafe {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut event: ibv_async_event = std::mem::zeroed();
            assert_eq!(context::ibv_get_async_event(ctx, &mut event), 0);
            context::ibv_ack_async_event(&mut event);
            if event.element == b as *mut c_void {
                assert_eq!(event.event_type, IBV_EVENT_QP_ACCESS_ERR);
                break;
            }
            assert!(Instant::now() < deadline);
        }
    }
}

#[test]
fn a_peer_that_never_answers_ends_in_retry_exceeded_then_flushes() {
    let cq = create_cq(null_mut());
    let q = create_qp(cq, IBV_QPT_RC);
    // timeout 8: 4.096 µs * 2^8 ~ 1 ms per try; two retries.
    connect(q, DEAD_ADDR, 0x99, 8, 2);
    let src = buffer(64);
    for wr_id in [1, 2] {
        let mut sge = src.sge(0, 8);
        assert_eq!(post_send(q, &mut send_wr(wr_id, IBV_WR_SEND, &mut sge)), 0);
    }
    let first = poll_one(cq);
    assert_eq!((first.wr_id, first.status), (1, 12), "IBV_WC_RETRY_EXC_ERR");
    let second = poll_one(cq);
    assert_eq!((second.wr_id, second.status), (2, 5), "IBV_WC_WR_FLUSH_ERR");
    let mut attr = zeroed_attr();
    // SAFETY: plain data out of a live QP.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { qp::ibv_query_qp(q, &mut attr, IBV_QP_STATE, &mut init) }, 0);
    assert_eq!(attr.qp_state, IBV_QPS_ERR);
    assert_eq!(init.send_cq, cq);
}

/// A responder moved to the error state right after it polled a message
/// (rdma_disconnect does that) first sends the ACK it owed: its peer's
/// send completes, instead of retrying into a QP that drops everything.
#[test]
fn a_qp_moved_to_error_sends_the_ack_it_owes_first() {
    let (cq_a, cq_b) = (create_cq(null_mut()), create_cq(null_mut()));
    let (a, b) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_b, IBV_QPT_RC));
    // SAFETY: live QPs.
    let (qpn_a, qpn_b) = unsafe { ((*a).qp_num, (*b).qp_num) };
    // timeout 8 (~1 ms per try), two retries: a lost ACK fails fast.
    connect(a, ADDR, qpn_b, 8, 2);
    connect(b, ADDR, qpn_a, 8, 2);
    let (src, dst) = (buffer(64), buffer(64));
    for round in 0..20 {
        let mut rsge = dst.sge(0, 64);
        post_recv(b, &mut rsge, round);
        let mut sge = src.sge(0, 8);
        assert_eq!(post_send(a, &mut send_wr(round, IBV_WR_SEND, &mut sge)), 0);
        assert_eq!(poll_one(cq_b).status, 0, "round {round}: received");
        if round == 19 {
            let mut attr = zeroed_attr();
            attr.qp_state = IBV_QPS_ERR;
            // SAFETY: a live QP.
            assert_eq!(unsafe { qp::ibv_modify_qp(b, &mut attr, IBV_QP_STATE) }, 0);
        }
        let sent = poll_one(cq_a);
        assert_eq!((sent.wr_id, sent.status), (round, 0), "round {round}: the send was acknowledged");
    }
}

#[test]
fn errors_follow_the_verbs_conventions() {
    let (_, pd) = fixture();
    let cq = create_cq(null_mut());
    // A raw packet QP is refused with EOPNOTSUPP and NULL.
    let mut init = ibv_qp_init_attr {
        qp_context: null_mut(),
        send_cq: cq,
        recv_cq: cq,
        srq: null_mut(),
        cap: ibv_qp_cap { max_send_wr: 1, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
        qp_type: IBV_QPT_RAW_PACKET,
        sq_sig_all: 0,
    };
    // SAFETY: live PD and CQ; attributes on the stack.
    unsafe {
        assert!(qp::ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        init.qp_type = IBV_QPT_RC;
        init.cap.max_send_wr = 1 << 20;
        assert!(qp::ibv_create_qp(pd, &mut init).is_null());
        assert_eq!(errno(), libc::EINVAL, "more WRs than max_qp_wr");
    }
    // RTR without a GRH is what RoCE refuses.
    let q = create_qp(cq, IBV_QPT_RC);
    let mut a = zeroed_attr();
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    // SAFETY: a live QP.
    unsafe {
        assert_eq!(
            qp::ibv_modify_qp(q, &mut a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
            0
        );
        let mut a = zeroed_attr();
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = 3;
        a.ah_attr.port_num = 1;
        let mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        assert_eq!(qp::ibv_modify_qp(q, &mut a, mask | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER), libc::EINVAL);
        // RTS straight from INIT skips a state.
        a.qp_state = IBV_QPS_RTS;
        assert_eq!(qp::ibv_modify_qp(q, &mut a, IBV_QP_STATE), libc::EINVAL);
        assert_eq!((*q).state, IBV_QPS_INIT, "a refused transition changes nothing");
        // Zero-based regions are not supported (zero-based windows are).
        let mut word = 0u64;
        let mr = memory::ibv_reg_mr(pd, &mut word as *mut u64 as *mut c_void, 8, IBV_ACCESS_ZERO_BASED as c_int);
        assert!(mr.is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP);
        // Unsupported verbs answer EOPNOTSUPP, never success.
        assert_eq!(unsupported::ibv_resolve_eth_l2_from_gid(), libc::EOPNOTSUPP);
        // Only UD QPs join multicast groups.
        let group = gid_of("239.255.77.9");
        assert_eq!(softrnic_ibverbs::multicast::ibv_attach_mcast(q, &group, 0), libc::EINVAL);
        assert!(unsupported::ibv_import_device().is_null());
        // An AH needs the GRH too.
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.port_num = 1;
        assert!(ah::ibv_create_ah(pd, &mut ah_attr).is_null());
        assert_eq!(errno(), libc::EINVAL);
        // NULL where an object belongs is EINVAL, never a crash.
        let mut wc: ibv_wc = std::mem::zeroed();
        let mut grh = [0u8; 40];
        let grh = grh.as_mut_ptr().cast::<ibv_grh>();
        assert_eq!(ah::ibv_init_ah_from_wc(null_mut(), 1, null_mut(), grh, &mut ah_attr), libc::EINVAL);
        assert_eq!(ah::ibv_init_ah_from_wc(null_mut(), 1, &mut wc, grh, null_mut()), libc::EINVAL);
        assert!(ah::ibv_create_ah_from_wc(null_mut(), &mut wc, grh, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ah::ibv_destroy_ah(null_mut()), libc::EINVAL);
        // Memory windows of a type verbs lacks, and a bind posted through
        // ibv_bind_mw for a type 2 window.
        let alloc_mw = (*(*q).context).ops.alloc_mw.unwrap();
        assert!(alloc_mw(pd, 3).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mw = alloc_mw(pd, IBV_MW_TYPE_2);
        let mut bind: ibv_mw_bind = std::mem::zeroed();
        assert_eq!(((*(*q).context).ops.bind_mw.unwrap())(q, mw, &mut bind), libc::EINVAL);
        assert_eq!(((*(*q).context).ops.dealloc_mw.unwrap())(mw), 0);
        // A CQ in use cannot go.
        assert_eq!(cq::ibv_destroy_cq(cq), libc::EBUSY);
        assert_eq!(qp::ibv_destroy_qp(q), 0);
    }
}

/// A region of `len` bytes that grants no remote access itself and takes
/// memory windows.
fn bindable_buffer(len: usize) -> Buffer {
    let (_, pd) = fixture();
    let mut bytes = vec![0u8; len];
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
    // SAFETY: the buffer lives as long as the region (both in `Buffer`).
    let mr = unsafe { memory::ibv_reg_mr(pd, bytes.as_mut_ptr() as *mut c_void, len, access as c_int) };
    assert!(!mr.is_null(), "MW_BIND is a region's access flag: errno {}", errno());
    Buffer { bytes, mr }
}

/// Memory windows through the verbs, as rdma-core's tests use them: a type
/// 1 window bound with `ibv_bind_mw` (its `rkey` moves on), a type 2 one
/// bound by `IBV_WR_BIND_MW` and invalidated by the peer's SEND with
/// invalidate, whose receive completion names the key; the region
/// cannot go while a window holds it.
#[test]
fn memory_windows_bound_used_and_invalidated_through_the_verbs() {
    let (a, b, cq_a, cq_b) = rc_pair();
    let (src, dst) = (buffer(4096), bindable_buffer(4096));
    // SAFETY: live objects of the fixture's context; plain data.
    unsafe {
        let ops = &(*(*b).context).ops;
        let (pd, region) = ((*b).pd, dst.mr);
        let info = |offset: u64, length: u64| ibv_mw_bind_info {
            mr: region,
            addr: dst.addr() + offset,
            length,
            mw_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        };
        let write_through = |wr_id: u64, rkey: u32, offset: u64, bytes: &[u8]| {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), src.bytes.as_ptr() as *mut u8, bytes.len());
            let mut sge = src.sge(0, bytes.len() as u32);
            let mut wr = send_wr(wr_id, IBV_WR_RDMA_WRITE, &mut sge);
            wr.wr.rdma = ibv_send_wr_rdma { remote_addr: dst.addr() + offset, rkey };
            assert_eq!(post_send(a, &mut wr), 0);
            poll_one(cq_a)
        };

        // Type 1: ibv_bind_mw posts the bind on b's send queue.
        let one = (ops.alloc_mw.unwrap())(pd, IBV_MW_TYPE_1);
        assert!(!one.is_null());
        let before = (*one).rkey;
        let mut bind = ibv_mw_bind { wr_id: 11, send_flags: IBV_SEND_SIGNALED, bind_info: info(0, 1024) };
        assert_eq!((ops.bind_mw.unwrap())(b, one, &mut bind), 0);
        let bound = poll_one(cq_b);
        assert_eq!((bound.wr_id, bound.status, bound.opcode), (11, IBV_WC_SUCCESS, 5), "IBV_WC_BIND_MW");
        assert_eq!((*one).rkey, (before & !0xff) | (before.wrapping_add(1) & 0xff), "ibv_inc_rkey");
        let done = write_through(1, (*one).rkey, 16, b"type 1");
        assert_eq!(done.status, IBV_WC_SUCCESS);
        assert_eq!(dst.read(16, 6), b"type 1");
        assert_eq!(memory::ibv_dereg_mr(dst.mr), libc::EBUSY, "a bound window holds its region");
        assert_eq!((ops.dealloc_mw.unwrap())(one), 0);

        // Type 2: bound by a work request under a key the program picks.
        let two = (ops.alloc_mw.unwrap())(pd, IBV_MW_TYPE_2);
        let rkey = ((*two).rkey & !0xff) | 0x77;
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = 12;
        wr.opcode = IBV_WR_BIND_MW;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.bind_mw = ibv_send_wr_bind_mw { mw: two, rkey, bind_info: info(2048, 512) };
        assert_eq!(post_send(b, &mut wr), 0);
        assert_eq!(poll_one(cq_b).status, IBV_WC_SUCCESS);
        assert_eq!(write_through(2, rkey, 2048 + 500, b"type 2!").status, IBV_WC_SUCCESS);
        assert_eq!(dst.read(2548, 7), b"type 2!");

        // SEND with invalidate from a: b's receive says which key went.
        post_recv(b, &mut dst.sge(0, 64), 13);
        let mut sge = src.sge(0, 4);
        let mut wr = send_wr(3, IBV_WR_SEND_WITH_INV, &mut sge);
        wr.imm_data = rkey;
        assert_eq!(post_send(a, &mut wr), 0);
        assert_eq!(poll_one(cq_a).status, IBV_WC_SUCCESS);
        let got = poll_one(cq_b);
        assert_eq!((got.wr_id, got.status, got.opcode, got.byte_len), (13, IBV_WC_SUCCESS, 128, 4));
        assert_ne!(got.wc_flags & IBV_WC_WITH_INV, 0);
        assert_eq!(got.imm_data, rkey, "invalidated_rkey, in host order");

        // Bound again through the extended QP's builder, then invalidated
        // locally.
        let ex = b as *mut ibv_qp_ex;
        let again = ((*two).rkey & !0xff) | 0x78;
        let bind_info = info(0, 64);
        ((*ex).wr_start.unwrap())(ex);
        (*ex).wr_id = 14;
        (*ex).wr_flags = IBV_SEND_SIGNALED;
        ((*ex).wr_bind_mw.unwrap())(ex, two, again, &bind_info);
        (*ex).wr_id = 15;
        ((*ex).wr_local_inv.unwrap())(ex, again);
        assert_eq!(((*ex).wr_complete.unwrap())(ex), 0);
        let (bound, invalidated) = (poll_one(cq_b), poll_one(cq_b));
        assert_eq!((bound.wr_id, bound.status, bound.opcode), (14, IBV_WC_SUCCESS, 5));
        assert_eq!((invalidated.wr_id, invalidated.status, invalidated.opcode), (15, IBV_WC_SUCCESS, 6));
        assert_eq!((ops.dealloc_mw.unwrap())(two), 0);

        // The old key, invalidated, reaches nothing: a's QP fails.
        assert_eq!(write_through(4, rkey, 2048, b"late").status, 10, "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(memory::ibv_dereg_mr(dst.mr), 0, "the windows let go");
        assert_eq!(memory::ibv_dereg_mr(src.mr), 0);
    }
}

#[test]
fn srq_receives_and_ud_sends_with_an_address_handle() {
    let (_, pd) = fixture();
    let cq = create_cq(null_mut());
    // SAFETY: the verbs' calls on live objects; attributes on the stack.
    unsafe {
        let mut srq_init =
            ibv_srq_init_attr { srq_context: null_mut(), attr: ibv_srq_attr { max_wr: 16, max_sge: 1, srq_limit: 0 } };
        let s = srq::ibv_create_srq(pd, &mut srq_init);
        assert!(!s.is_null());
        let mut got = ibv_srq_attr { max_wr: 0, max_sge: 0, srq_limit: 0 };
        assert_eq!(srq::ibv_query_srq(s, &mut got), 0);
        assert_eq!(got.max_wr, 16);
        assert_eq!(srq::ibv_destroy_srq(s), 0);
    }
    // UD: a send to our own UD QP through an AH, with the GRH in front.
    let (a, b) = (create_qp(cq, IBV_QPT_UD), create_qp(cq, IBV_QPT_UD));
    for q in [a, b] {
        let mut attr = zeroed_attr();
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        attr.qkey = 0x1111;
        // SAFETY: a live QP.
        unsafe {
            assert_eq!(
                qp::ibv_modify_qp(q, &mut attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
                0
            );
            attr.qp_state = IBV_QPS_RTR;
            assert_eq!(qp::ibv_modify_qp(q, &mut attr, IBV_QP_STATE), 0);
            attr.qp_state = IBV_QPS_RTS;
            assert_eq!(qp::ibv_modify_qp(q, &mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
        }
    }
    let (src, dst) = (buffer(128), buffer(128));
    post_recv(b, &mut dst.sge(0, 128), 77);
    // SAFETY: the verbs' calls on live objects.
    unsafe {
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.port_num = 1;
        ah_attr.grh.dgid = gid_of(ADDR);
        let ah = ah::ibv_create_ah(pd, &mut ah_attr);
        assert!(!ah.is_null());
        std::ptr::copy_nonoverlapping(b"datagram".as_ptr(), src.bytes.as_ptr() as *mut u8, 8);
        let mut sge = src.sge(0, 8);
        let mut wr = send_wr(5, IBV_WR_SEND, &mut sge);
        wr.wr.ud = ibv_send_wr_ud { ah, remote_qpn: (*b).qp_num, remote_qkey: 0x1111 };
        assert_eq!(post_send(a, &mut wr), 0);
        let mut seen = [poll_one(cq), poll_one(cq)];
        seen.sort_by_key(|w| w.wr_id);
        assert_eq!((seen[0].wr_id, seen[0].status), (5, 0));
        let recv = seen[1];
        assert_eq!((recv.wr_id, recv.status, recv.byte_len), (77, 0, 40 + 8));
        assert_ne!(recv.wc_flags & IBV_WC_GRH, 0);
        assert_eq!(recv.sl, 2, "an IPv4 header before the data, as mlx5 says it");
        assert_eq!(dst.read(40, 8), b"datagram");
        // The reply's AH comes from the completion and the GRH.
        let mut wc = recv;
        let reply = ah::ibv_create_ah_from_wc(pd, &mut wc, dst.bytes.as_ptr() as *mut ibv_grh, 1);
        assert!(!reply.is_null());
        assert_eq!(ah::Ah::from_ibv(reply).dest, ADDR.parse::<std::net::IpAddr>().unwrap());
        assert_eq!(ah::ibv_destroy_ah(reply), 0);
        assert_eq!(ah::ibv_destroy_ah(ah), 0);

        // To a multicast group b joined: QP number 0xFFFFFF, the group's
        // GID in the AH, the group in the GRH b receives.
        let group = gid_of("239.255.77.10");
        assert_eq!(multicast::ibv_attach_mcast(b, &group, 0), 0);
        post_recv(b, &mut dst.sge(0, 128), 78);
        ah_attr.grh.dgid = group;
        let to_group = ah::ibv_create_ah(pd, &mut ah_attr);
        assert!(!to_group.is_null());
        let mut wr = send_wr(6, IBV_WR_SEND, &mut sge);
        wr.wr.ud = ibv_send_wr_ud { ah: to_group, remote_qpn: 0xff_ffff, remote_qkey: 0x1111 };
        assert_eq!(post_send(a, &mut wr), 0);
        let mut seen = [poll_one(cq), poll_one(cq)];
        seen.sort_by_key(|w| w.wr_id);
        assert_eq!((seen[0].wr_id, seen[0].status), (6, 0));
        assert_eq!((seen[1].wr_id, seen[1].status, seen[1].byte_len), (78, 0, 40 + 8));
        assert_eq!(dst.read(36, 4), [239, 255, 77, 10], "the GRH's destination");
        assert_eq!(multicast::ibv_detach_mcast(b, &group, 0), 0);
        assert_eq!(multicast::ibv_detach_mcast(b, &group, 0), libc::EINVAL, "detached once");
        assert_eq!(ah::ibv_destroy_ah(to_group), 0);
    }
}

/// `ibv_create_cq_ex`, as verbs.h's inline wrapper calls it.
fn create_cq_ex(wc_flags: u64) -> *mut ibv_cq_ex {
    let (ctx, _) = fixture();
    let vctx = verbs_ctx(ctx);
    let mut attr = ibv_cq_init_attr_ex {
        cqe: 64,
        cq_context: null_mut(),
        channel: null_mut(),
        comp_vector: 0,
        wc_flags,
        comp_mask: 0,
        flags: 0,
        parent_domain: null_mut(),
    };
    // SAFETY: a live context and attributes.
    unsafe { ((*vctx).create_cq_ex.expect("create_cq_ex is provided"))(ctx, &mut attr) }
}

/// One poll session's completions: (wr_id, byte_len, qp_num, timestamp).
/// `dawdle` waits between reading a completion's wr_id and its other
/// fields, as a program with work to do would: time for another thread's
/// session to move the CQ on, were sessions not exclusive.
fn poll_session(cq: *mut ibv_cq_ex, dawdle: bool) -> Vec<(u64, u32, u32, u64)> {
    let mut seen = Vec::new();
    let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
    // SAFETY: a live extended CQ; its ops are called as verbs.h's
    // ibv_start_poll/ibv_next_poll/ibv_end_poll/ibv_wc_read_* call them.
    unsafe {
        if ((*cq).start_poll.unwrap())(cq, &mut attr) != 0 {
            return seen;
        }
        loop {
            assert_eq!((*cq).status, 0);
            let wr_id = (*cq).wr_id;
            if dawdle {
                std::thread::sleep(Duration::from_micros(200));
            }
            assert_eq!(((*cq).read_opcode.unwrap())(cq), 128, "IBV_WC_RECV");
            seen.push((
                wr_id,
                ((*cq).read_byte_len.unwrap())(cq),
                ((*cq).read_qp_num.unwrap())(cq),
                ((*cq).read_completion_ts.unwrap())(cq),
            ));
            match ((*cq).next_poll.unwrap())(cq) {
                0 => continue,
                rc => assert_eq!(rc, libc::ENOENT),
            }
            break;
        }
        ((*cq).end_poll.unwrap())(cq);
    }
    seen
}

#[test]
fn the_extended_cq_polls_in_sessions_with_completion_timestamps() {
    let (ctx, _) = fixture();
    // SAFETY: plain data; a live context and a large enough buffer.
    let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    let rc = unsafe { ((*verbs_ctx(ctx)).query_device_ex.unwrap())(ctx, null_mut(), &mut attr, size_of_val(&attr)) };
    assert_eq!(rc, 0);
    assert_eq!((attr.completion_timestamp_mask, attr.hca_core_clock), (u64::MAX, 1_000_000), "a 1 GHz clock");
    // What softrnic does not report is refused, not faked.
    assert!(create_cq_ex(IBV_WC_EX_WITH_CVLAN).is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);

    let cq_ex = create_cq_ex(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
    assert!(!cq_ex.is_null(), "errno {}", errno());
    let cq_a = create_cq(null_mut());
    let (a, b) = (create_qp(cq_a, IBV_QPT_RC), create_qp(cq_ex as *mut ibv_cq, IBV_QPT_RC));
    // SAFETY: live QPs.
    let (qpn_a, qpn_b) = unsafe { ((*a).qp_num, (*b).qp_num) };
    connect(a, ADDR, qpn_b, 14, 7);
    connect(b, ADDR, qpn_a, 14, 7);
    assert!(poll_session(cq_ex, false).is_empty(), "nothing yet: ENOENT, and no session to end");
    let clock = || {
        let mut values =
            ibv_values_ex { comp_mask: IBV_VALUES_MASK_RAW_CLOCK, raw_clock: libc::timespec { tv_sec: 0, tv_nsec: 0 } };
        // SAFETY: a live context and writable values.
        assert_eq!(unsafe { ((*verbs_ctx(ctx)).query_rt_values.unwrap())(ctx, &mut values) }, 0);
        assert_eq!(values.comp_mask, IBV_VALUES_MASK_RAW_CLOCK);
        values.raw_clock.tv_sec as u64 * 1_000_000_000 + values.raw_clock.tv_nsec as u64
    };

    // Rounds of 30 SENDs of sizes known by their wr_id, taken by two
    // threads polling the one CQ in sessions: a session is the CQ's alone,
    // so each sees every field of its own completions, and every
    // completion is seen once.
    let size_of_id = |id: u64| (id % 60 + 1) as u32;
    let (src, dst) = (buffer(64), buffer(64 * 30));
    for round in 0..5u64 {
        let before = clock();
        for i in 0..30u64 {
            post_recv(b, &mut dst.sge(64 * i as usize, 64), round * 30 + i);
        }
        for i in 0..30u64 {
            let id = round * 30 + i;
            let mut sge = src.sge(0, size_of_id(id));
            let mut wr = send_wr(id, IBV_WR_SEND, &mut sge);
            assert_eq!(post_send(a, &mut wr), 0);
        }
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let (cq, taken) = (cq_ex as usize, taken.clone());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let mut seen = Vec::new();
                    while taken.load(Ordering::SeqCst) < 30 && Instant::now() < deadline {
                        let session = poll_session(cq as *mut ibv_cq_ex, true);
                        taken.fetch_add(session.len(), Ordering::SeqCst);
                        seen.extend(session);
                        std::thread::yield_now();
                    }
                    seen
                })
            })
            .collect();
        let mut seen: Vec<(u64, u32, u32, u64)> = pollers.into_iter().flat_map(|p| p.join().unwrap()).collect();
        let after = clock();
        seen.sort();
        assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), (round * 30..round * 30 + 30).collect::<Vec<_>>());
        for &(id, len, qpn, ts) in &seen {
            assert_eq!((len, qpn), (size_of_id(id), qpn_b), "completion {id}");
            assert!(before <= ts && ts <= after, "completion {id} stamped {ts}, outside {before}..{after}");
        }
        for _ in 0..30 {
            assert_eq!(poll_one(cq_a).status, 0);
        }
    }
    // SAFETY: live QPs and CQs, destroyed in order.
    unsafe {
        assert_eq!(qp::ibv_destroy_qp(a), 0);
        assert_eq!(qp::ibv_destroy_qp(b), 0);
        assert_eq!(cq::ibv_destroy_cq(cq_ex as *mut ibv_cq), 0, "an extended CQ is destroyed as any CQ");
        assert_eq!(cq::ibv_destroy_cq(cq_a), 0);
    }
}

fn verbs_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: softrnic's contexts are the `context` field of a
    // `verbs_context` (verbs.h's `verbs_get_ctx`).
    unsafe { ctx.byte_sub(std::mem::offset_of!(verbs_context, context)) as *mut verbs_context }
}

#[test]
fn rereg_mr_moves_a_region_under_the_same_keys() {
    let (a, _b, cq_a, _cq_b) = rc_pair();
    let target = buffer(64);
    // SAFETY: a live MR.
    let (lkey, rkey) = unsafe { ((*target.mr).lkey, (*target.mr).rkey) };
    // The new home outlives the region (leaked for the test's length).
    let elsewhere: &'static mut [u8; 64] = Box::leak(Box::new([0u8; 64]));
    let new_addr = elsewhere.as_mut_ptr();
    // SAFETY: a live MR and a mapped range that stays mapped.
    let rc = unsafe {
        memory::ibv_rereg_mr(target.mr, IBV_REREG_MR_CHANGE_TRANSLATION, null_mut(), new_addr as *mut c_void, 64, 0)
    };
    assert_eq!(rc, 0);
    // SAFETY: a live MR.
    unsafe {
        assert_eq!(((*target.mr).lkey, (*target.mr).rkey), (lkey, rkey), "the keys stay, as hardware keeps them");
        assert_eq!((*target.mr).addr, new_addr as *mut c_void);
    }
    // A peer's WRITE under the old rkey lands in the new memory, not the old.
    let payload = *b"moved";
    let mut inline = ibv_sge { addr: payload.as_ptr() as u64, length: payload.len() as u32, lkey: 0 };
    let mut wr = send_wr(1, IBV_WR_RDMA_WRITE, &mut inline);
    wr.send_flags |= IBV_SEND_INLINE;
    wr.wr.rdma = ibv_send_wr_rdma { remote_addr: new_addr as u64, rkey };
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!(poll_one(cq_a).status, 0);
    // SAFETY: in bounds of the live new range; volatile, the NIC wrote it.
    let landed: Vec<u8> = (0..5).map(|i| unsafe { std::ptr::read_volatile(new_addr.add(i)) }).collect();
    assert_eq!(landed, payload);
    assert_eq!(target.read(0, 5), [0; 5], "the old memory is no longer the region's");
    // Bad input leaves the MR as it was.
    // SAFETY: a live MR.
    let rc = unsafe { memory::ibv_rereg_mr(target.mr, 0x40, null_mut(), null_mut(), 0, 0) };
    assert_eq!(rc, IBV_REREG_MR_ERR_INPUT);
    // SAFETY: a live MR.
    assert_eq!(unsafe { (*target.mr).rkey }, rkey);
}

#[test]
fn a_second_context_on_the_device_shares_its_engine_and_has_its_own_events() {
    let (ctx1, _) = fixture();
    // SAFETY: the verbs' own sequence on live objects; the second context
    // and everything made on it are destroyed before the end.
    unsafe {
        let mut n = 0;
        let list = device::ibv_get_device_list(&mut n);
        let ctx2 = context::ibv_open_device(*list);
        device::ibv_free_device_list(list);
        assert!(!ctx2.is_null(), "a second open of softrnic0 in one process: errno {}", errno());
        assert_ne!((*ctx2).async_fd, (*ctx1).async_fd, "each context its own event descriptor");
        let pd2 = memory::ibv_alloc_pd(ctx2);
        let cq2 = cq::ibv_create_cq(ctx2, 16, null_mut(), null_mut(), 0);
        let qp2 = create_qp_in(pd2, cq2, IBV_QPT_RC);
        let cq1 = create_cq(null_mut());
        let qp1 = create_qp(cq1, IBV_QPT_RC);
        connect(qp1, ADDR, (*qp2).qp_num, 14, 7);
        connect(qp2, ADDR, (*qp1).qp_num, 14, 7);
        // A SEND from the first context's QP into the second's, through the
        // one engine both share.
        let mut inbox = vec![0u8; 16];
        let mr2 = memory::ibv_reg_mr(pd2, inbox.as_mut_ptr() as *mut c_void, 16, IBV_ACCESS_LOCAL_WRITE as c_int);
        post_recv(qp2, &mut ibv_sge { addr: inbox.as_ptr() as u64, length: 16, lkey: (*mr2).lkey }, 5);
        let payload = *b"other context";
        let mut inline = ibv_sge { addr: payload.as_ptr() as u64, length: payload.len() as u32, lkey: 0 };
        let mut wr = send_wr(1, IBV_WR_SEND, &mut inline);
        wr.send_flags |= IBV_SEND_INLINE;
        assert_eq!(post_send(qp1, &mut wr), 0);
        assert_eq!(poll_one(cq1).status, 0);
        let got = poll_one(cq2);
        assert_eq!((got.wr_id, got.status, got.byte_len), (5, 0, payload.len() as u32));
        assert_eq!(std::ptr::read_volatile(inbox.as_ptr().cast::<[u8; 13]>()), payload);
        // A bad rkey at the second context's QP: its access error comes to
        // the second context, whose descriptor nobody else reads.
        let mut wr = send_wr(2, IBV_WR_RDMA_WRITE, &mut inline);
        wr.send_flags |= IBV_SEND_INLINE;
        wr.wr.rdma = ibv_send_wr_rdma { remote_addr: 0x1000, rkey: 0xdead_0000 };
        assert_eq!(post_send(qp1, &mut wr), 0);
        assert_eq!(poll_one(cq1).status, 10, "IBV_WC_REM_ACCESS_ERR");
        let mut pfd = libc::pollfd { fd: (*ctx2).async_fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, 10_000), 1, "no event on the second context");
        let mut event: ibv_async_event = std::mem::zeroed();
        assert_eq!(context::ibv_get_async_event(ctx2, &mut event), 0);
        assert_eq!((event.element, event.event_type), (qp2 as *mut c_void, IBV_EVENT_QP_ACCESS_ERR));
        context::ibv_ack_async_event(&mut event);
        // Closing the second context without destroying its objects takes
        // them out of the engine, which the first context keeps: no QP of
        // it answers, and no peer can write into its region any more.
        let (qpn2, lkey2) = ((*qp2).qp_num, (*mr2).lkey);
        let engine = context::Context::from_ibv(ctx1).provider.engine_in_process().expect("an engine in the process");
        assert!(engine.memory_region(lkey2).is_some() && engine.query_qp(qpn2).is_some());
        assert_eq!(context::ibv_close_device(ctx2), 0);
        assert!(engine.memory_region(lkey2).is_none(), "the closed context's region is gone");
        assert!(engine.query_qp(qpn2).is_none(), "the closed context's QP is gone");
        assert_eq!(qp::ibv_destroy_qp(qp1), 0);
    }
    let (a, b, cq_a, cq_b) = rc_pair();
    let dst = buffer(16);
    post_recv(b, &mut dst.sge(0, 16), 3);
    let mut inline = ibv_sge { addr: b"still".as_ptr() as u64, length: 5, lkey: 0 };
    let mut wr = send_wr(3, IBV_WR_SEND, &mut inline);
    wr.send_flags |= IBV_SEND_INLINE;
    assert_eq!(post_send(a, &mut wr), 0);
    assert_eq!((poll_one(cq_a).status, poll_one(cq_b).status), (0, 0), "the first context's engine runs on");
}
