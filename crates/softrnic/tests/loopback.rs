//! End to end over real UDP sockets on loopback: two devices on their own
//! 127.x addresses, every operation, with and without injected faults,
//! every byte checked.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use softrnic::{
    Access, CompletionQueue, ConnectOptions, Context, DatapathKind, EngineConfig, FaultConfig, MemoryRegion, Payload,
    ProgressMode, QpCaps, QueuePair, RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};

/// Each test takes its own pair of addresses so tests can run in parallel.
static NEXT: AtomicU8 = AtomicU8::new(10);

struct Side {
    ctx: Context,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn side(addr: IpAddr, faults: FaultConfig, len: usize) -> Side {
    side_with(EngineConfig { faults, ..EngineConfig::new(addr) }, len)
}

fn side_with(config: EngineConfig, len: usize) -> Side {
    let ctx = Context::with_config(config).expect("open");
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(len, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    Side { ctx, mr, cq, qp }
}

fn pair(faults: FaultConfig, len: usize) -> (Side, Side) {
    pair_recovering(faults, len, false)
}

/// A connected pair; `selective_repeat` asks both ends for it.
fn pair_recovering(faults: FaultConfig, len: usize, selective_repeat: bool) -> (Side, Side) {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let a = side(IpAddr::from([127, 0, 1, n]), faults, len);
    let b = side(IpAddr::from([127, 0, 1, n + 1]), faults, len);
    // Short timeouts keep faulty runs quick.
    let options = ConnectOptions { timeout: 10, min_rnr_timer: 1, selective_repeat, ..ConnectOptions::default() };
    a.qp.connect(&b.qp.endpoint(&b.mr), &options).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &options).unwrap();
    (a, b)
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(salt) ^ (i >> 8) as u8).collect()
}

fn wait(cq: &CompletionQueue) -> softrnic::Completion {
    cq.wait(Duration::from_secs(30)).expect("a completion")
}

/// Runs every operation once with `faults` and checks every byte.
fn every_operation(faults: FaultConfig) {
    let (a, b) = pair(faults, 4 * LEN);
    every_operation_on(&a, &b);
}

const LEN: usize = 1 << 20;

/// Every operation once from `a` to `b`, every byte checked.
fn every_operation_on(a: &Side, b: &Side) {
    let data = pattern(LEN, 3);
    a.mr.write(0, &data);
    b.mr.write(LEN, &data);

    // SEND with immediate, 1 MiB, into a posted receive.
    b.qp.post_recv(RecvWorkRequest { wr_id: 10, sges: softrnic_transport::smallvec![b.mr.sge(2 * LEN, LEN as u32)] })
        .unwrap();
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Send { imm: Some(7) }, a.mr.gather(0, LEN as u32))).unwrap();
    let c = wait(&a.cq);
    assert_eq!((c.wr_id, c.status, c.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let r = wait(&b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len, r.imm_data), (10, WcStatus::Success, LEN as u32, Some(7)));
    let mut got = vec![0u8; LEN];
    b.mr.read(2 * LEN, &mut got);
    assert!(got == data, "SEND data differs");

    // WRITE (the responder's application calls nothing), then READ back.
    a.qp.post_send(SendWorkRequest::new(
        2,
        SendOp::Write { remote: b.mr.remote(3 * LEN), imm: None },
        a.mr.gather(0, LEN as u32),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    b.mr.read(3 * LEN, &mut got);
    assert!(got == data, "WRITE data differs");
    a.qp.post_send(SendWorkRequest::new(3, SendOp::Read { remote: b.mr.remote(LEN) }, a.mr.gather(LEN, LEN as u32)))
        .unwrap();
    let c = wait(&a.cq);
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, LEN as u32));
    a.mr.read(LEN, &mut got);
    assert!(got == data, "READ data differs");

    // WRITE with immediate, and both atomics.
    b.qp.post_recv(RecvWorkRequest { wr_id: 11, sges: softrnic_transport::smallvec![] }).unwrap();
    a.qp.post_send(SendWorkRequest::new(
        4,
        SendOp::Write { remote: b.mr.remote(8), imm: Some(9) },
        Payload::Inline(softrnic_transport::smallvec![1; 8]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let r = wait(&b.cq);
    assert_eq!((r.opcode, r.imm_data, r.byte_len), (WcOpcode::RecvRdmaWithImm, Some(9), 8));
    b.mr.write(64, &40u64.to_ne_bytes());
    a.qp.post_send(SendWorkRequest::new(5, SendOp::FetchAdd { remote: b.mr.remote(64), add: 2 }, a.mr.gather(16, 8)))
        .unwrap();
    a.qp.post_send(SendWorkRequest::new(
        6,
        SendOp::CompareSwap { remote: b.mr.remote(64), compare: 42, swap: 99 },
        a.mr.gather(24, 8),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).opcode, WcOpcode::FetchAdd);
    assert_eq!(wait(&a.cq).opcode, WcOpcode::CompSwap);
    let mut word = [0u8; 8];
    a.mr.read(16, &mut word);
    assert_eq!(u64::from_ne_bytes(word), 40);
    a.mr.read(24, &mut word);
    assert_eq!(u64::from_ne_bytes(word), 42);
    b.mr.read(64, &mut word);
    assert_eq!(u64::from_ne_bytes(word), 99);
}

#[test]
fn every_operation_over_loopback() {
    every_operation(FaultConfig::default());
}

#[test]
fn every_operation_through_injected_faults() {
    let faults = FaultConfig { loss: 0.02, reorder: 0.02, duplicate: 0.02, corrupt: 0.02 };
    every_operation(faults);
}

#[test]
fn every_operation_by_selective_repeat_through_injected_faults() {
    let faults = FaultConfig { loss: 0.03, reorder: 0.02, duplicate: 0.02, corrupt: 0.01 };
    let (a, b) = pair_recovering(faults, 4 * LEN, true);
    assert!(a.qp.selective_repeat() && b.qp.selective_repeat());
    every_operation_on(&a, &b);
    let (ca, cb) = (a.ctx.counters().transport, b.ctx.counters().transport);
    assert!(cb.rx_placed_out_of_order > 0, "the responder placed what came after a loss: {cb:?}");
    assert!(ca.selective_naks_received > 0 && ca.retransmitted_packets > 0, "{ca:?}");
    assert_eq!((ca.seq_naks_received, cb.seq_naks_sent), (0, 0), "no go-back-N NAK on this connection");
}

#[test]
fn a_connection_uses_selective_repeat_only_if_both_ends_offer_it() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let a = side(IpAddr::from([127, 0, 1, n]), FaultConfig::default(), 4096);
    let b = side(IpAddr::from([127, 0, 1, n + 1]), FaultConfig::default(), 4096);
    let asks = ConnectOptions { selective_repeat: true, ..ConnectOptions::default() };
    let mut older_peer = b.qp.endpoint(&b.mr);
    assert!(older_peer.selective_repeat, "a softrnic RC endpoint offers it");
    // An endpoint line without `sr=1` (an older softrnic) offers nothing.
    older_peer.selective_repeat = false;
    a.qp.connect(&older_peer, &asks).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &ConnectOptions { selective_repeat: false, ..asks }).unwrap();
    assert!(!a.qp.selective_repeat() && !b.qp.selective_repeat());
    a.mr.write(0, b"plain RoCE");
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Write { remote: b.mr.remote(0), imm: None }, a.mr.gather(0, 10)))
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut got = [0u8; 10];
    b.mr.read(0, &mut got);
    assert_eq!(&got, b"plain RoCE");
}

/// Over UDP (the wire; the shared-memory wire computes none, as
/// loopback computes no checksum), every datagram carries an ICRC that
/// the receiver checks and accepts.
#[test]
fn packets_on_the_wire_carry_a_valid_icrc() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let over_udp =
        |last| EngineConfig { datapath: DatapathKind::Udp, ..EngineConfig::new(IpAddr::from([127, 0, 1, last])) };
    let (a, b) = (side_with(over_udp(n), 4096), side_with(over_udp(n + 1), 4096));
    a.qp.connect(&b.qp.endpoint(&b.mr), &ConnectOptions::default()).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &ConnectOptions::default()).unwrap();
    b.qp.post_recv(RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![b.mr.sge(0, 64)] }).unwrap();
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Send { imm: None }, Payload::Inline(b"checked"[..].into())))
        .unwrap();
    wait(&a.cq);
    wait(&b.cq);
    // Every datagram that arrived passed the receiver's ICRC check.
    let counters = b.ctx.counters().transport;
    assert!(counters.rx_packets > 0);
    assert_eq!(counters.rx_icrc_errors, 0);
}

#[test]
fn a_peer_that_disappears_fails_its_work_requests() {
    let (a, b) = pair(FaultConfig::default(), 4096);
    let options = ConnectOptions { timeout: 8, retry_cnt: 2, ..ConnectOptions::default() };
    // Reconnect with a short timeout so the failure comes quickly.
    a.qp.modify(&softrnic::QpAttr { state: Some(softrnic::QpState::Reset), ..Default::default() }).unwrap();
    a.qp.connect(&b.qp.endpoint(&b.mr), &options).unwrap();
    drop(b);
    for id in 0..3 {
        a.qp.post_send(SendWorkRequest::new(
            id,
            SendOp::Write { remote: a.mr.remote(0), imm: None },
            Payload::Inline(softrnic_transport::smallvec![0; 8]),
        ))
        .unwrap();
    }
    let statuses: Vec<_> = (0..3).map(|_| wait(&a.cq).status).collect();
    assert_eq!(statuses, vec![WcStatus::RetryExcErr, WcStatus::WrFlushErr, WcStatus::WrFlushErr]);
    assert_eq!(a.qp.state(), softrnic::QpState::Error);
}

#[test]
fn completion_channel_wakes_a_sleeping_waiter() {
    let (a, b) = pair(FaultConfig::default(), 4096);
    b.cq.request_notify(false).unwrap();
    b.qp.post_recv(RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![b.mr.sge(0, 64)] }).unwrap();
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Send { imm: None }, Payload::Inline(b"wake"[..].into()))).unwrap();
    // The receiver does not poll: its engine thread must make the progress.
    assert!(b.cq.wait_event(Duration::from_secs(10)).unwrap(), "no completion event");
    assert_eq!(wait(&b.cq).byte_len, 4);
    drop(a);
}

/// A list of SENDs posted as one (`ibv_post_send` with a list): a list
/// the send queue holds is posted whole and arrives in order; one longer
/// than the queue's room is posted up to the first request that does not
/// fit, which is named, and those before it still run.
#[test]
fn a_list_of_sends_is_posted_whole_or_up_to_the_refused_one() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let b = side(IpAddr::from([127, 0, 1, n + 1]), FaultConfig::default(), 4096);
    let ctx = Context::with_config(EngineConfig::new(IpAddr::from([127, 0, 1, n]))).unwrap();
    let (qp, mr, cq) = list_sender(&ctx, &b);
    let send = |i: u64| SendWorkRequest::new(i, SendOp::Send { imm: None }, mr.gather(64 * i as usize, 64));

    let refused = qp.post_send_list((0..6).map(send)).unwrap_err();
    assert_eq!(refused.posted, 4, "the queue holds 4: {refused}");
    let sent: Vec<_> = (0..4).map(|_| wait(&cq)).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(sent, (0..4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    qp.post_send_list((4..8).map(send)).unwrap();
    let sent: Vec<_> = (4..8).map(|_| wait(&cq)).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(sent, (4..8).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    all_arrived_in_order(&b, 8);
}

/// Through softrnicd, where each request of a list is its own entry in the
/// daemon's ring: two lists of 4, every message in order.
#[test]
fn a_list_of_sends_through_softrnicd_arrives_in_order() {
    let daemon = daemon("lists");
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let b = pair_through(&daemon, 4096).1;
    let ctx = Context::through_daemon(daemon.socket(), IpAddr::from([127, 0, 1, n])).unwrap();
    let (qp, mr, cq) = list_sender(&ctx, &b);
    let send = |i: u64| SendWorkRequest::new(i, SendOp::Send { imm: None }, mr.gather(64 * i as usize, 64));
    for list in [0..4, 4..8] {
        qp.post_send_list(list.clone().map(send)).unwrap();
        let sent: Vec<_> = list.clone().map(|_| wait(&cq)).map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(sent, list.map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    }
    all_arrived_in_order(&b, 8);
}

/// A QP of `ctx` whose send queue holds 4, connected to `b` (reset for
/// it), with 8 messages of 64 bytes in its region and 8 receives posted
/// at `b` for them.
fn list_sender(ctx: &Context, b: &Side) -> (QueuePair, MemoryRegion, CompletionQueue) {
    let pd = ctx.alloc_pd().unwrap();
    let (mr, cq) = (pd.register(4096, Access::LOCAL_WRITE).unwrap(), ctx.create_cq(64).unwrap());
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps { max_send_wr: 4, ..QpCaps::default() }).unwrap();
    b.qp.modify(&softrnic::QpAttr { state: Some(softrnic::QpState::Reset), ..Default::default() }).unwrap();
    qp.connect(&b.qp.endpoint(&b.mr), &ConnectOptions::default()).unwrap();
    b.qp.connect(&qp.endpoint(&mr), &ConnectOptions::default()).unwrap();
    for i in 0..8u64 {
        let at = 64 * i as usize;
        b.qp.post_recv(RecvWorkRequest { wr_id: i, sges: softrnic_transport::smallvec![b.mr.sge(at, 64)] }).unwrap();
        mr.write(at, &pattern(64, i as u8));
    }
    (qp, mr, cq)
}

/// `b`'s first `n` receives completed in order, each with its message.
fn all_arrived_in_order(b: &Side, n: u64) {
    let received: Vec<_> = (0..n).map(|_| wait(&b.cq)).map(|c| (c.wr_id, c.status, c.byte_len)).collect();
    assert_eq!(received, (0..n).map(|i| (i, WcStatus::Success, 64)).collect::<Vec<_>>(), "in order");
    for i in 0..n {
        let mut got = vec![0u8; 64];
        b.mr.read(64 * i as usize, &mut got);
        assert_eq!(got, pattern(64, i as u8), "message {i}");
    }
}

/// A target that spun on its CQ, which lets its engine thread stand by
/// longer between looks (up to 8 ms), then stopped polling without
/// blocking on a channel: its engine thread still takes over, and a READ
/// of its memory is answered.
#[test]
fn a_target_that_spun_then_stopped_polling_still_answers() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let inline = |addr| side_with(EngineConfig { progress: ProgressMode::Inline, ..EngineConfig::new(addr) }, 4096);
    let (a, b) = (inline(IpAddr::from([127, 0, 1, n])), inline(IpAddr::from([127, 0, 1, n + 1])));
    a.qp.connect(&b.qp.endpoint(&b.mr), &ConnectOptions::default()).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &ConnectOptions::default()).unwrap();
    let data = pattern(64, 9);
    b.mr.write(0, &data);
    // Long enough for the interval to grow to its longest (about 64 ms
    // of looks from 1 ms up by an eighth each).
    let spinning = std::time::Instant::now();
    let mut none = Vec::new();
    while spinning.elapsed() < Duration::from_millis(200) {
        b.cq.poll(8, &mut none);
    }
    assert!(none.is_empty());
    // b neither polls nor posts from here on.
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Read { remote: b.mr.remote(0) }, a.mr.gather(0, 64))).unwrap();
    let c = wait(&a.cq);
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 64));
    let mut got = vec![0u8; 64];
    a.mr.read(0, &mut got);
    assert_eq!(got, data);
}

#[test]
fn opening_an_address_twice_or_one_that_is_not_local_says_why() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let addr = IpAddr::from([127, 0, 1, n]);
    let _first = Context::open(addr).unwrap();
    let err = Context::open(addr).err().unwrap().to_string();
    assert!(err.contains("already in use"), "{err}");
    let err = Context::open("192.0.2.77".parse().unwrap()).err().unwrap().to_string();
    assert!(err.contains("not an address of this machine"), "{err}");
}

/// A daemon of this test's own, on a socket of its own.
fn daemon(name: &str) -> softrnic_daemon::server::Running {
    use softrnic_daemon::server::{Daemon, DaemonOptions};
    let socket = std::env::temp_dir().join(format!("softrnicd-api-{}-{name}.sock", std::process::id()));
    Daemon::bind(DaemonOptions::at(socket)).unwrap().start().unwrap()
}

/// A connected pair whose devices softrnicd serves.
fn pair_through(daemon: &softrnic_daemon::server::Running, len: usize) -> (Side, Side) {
    let side = |addr| {
        let ctx = Context::through_daemon(daemon.socket(), addr).expect("open through softrnicd");
        assert!(ctx.through_daemon_now());
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.register(len, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
        let cq = ctx.create_cq(1024).unwrap();
        let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        Side { ctx, mr, cq, qp }
    };
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let (a, b) = (side(IpAddr::from([127, 0, 1, n])), side(IpAddr::from([127, 0, 1, n + 1])));
    let options = ConnectOptions { timeout: 10, min_rnr_timer: 1, ..ConnectOptions::default() };
    a.qp.connect(&b.qp.endpoint(&b.mr), &options).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &options).unwrap();
    (a, b)
}

#[test]
fn every_operation_through_softrnicd() {
    let daemon = daemon("every");
    let (a, b) = pair_through(&daemon, 4 * LEN);
    every_operation_on(&a, &b);
    assert!(a.ctx.counters().transport.tx_packets > 0, "the daemon's counters");
}

#[test]
fn a_completion_channel_through_softrnicd_wakes_a_sleeping_waiter() {
    let daemon = daemon("channel");
    let (a, b) = pair_through(&daemon, 4096);
    b.cq.request_notify(false).unwrap();
    b.qp.post_recv(RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![b.mr.sge(0, 64)] }).unwrap();
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Send { imm: None }, Payload::Inline(b"wake"[..].into()))).unwrap();
    assert!(b.cq.wait_event(Duration::from_secs(10)).unwrap(), "no completion event");
    assert_eq!(wait(&b.cq).byte_len, 4);
}

/// A memory window over real UDP: b opens 64 bytes of a region that grants
/// no remote access itself, a writes through the window's rkey, and a
/// SEND with invalidate from a shuts it.
#[test]
fn a_window_opens_part_of_a_region_until_the_peer_invalidates_it() {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let a = side(IpAddr::from([127, 0, 1, n]), FaultConfig::default(), 4096);
    let b = Context::open(IpAddr::from([127, 0, 1, n + 1])).unwrap();
    let pd = b.alloc_pd().unwrap();
    let region = pd.register(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    let cq = b.create_cq(64).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    let options = ConnectOptions { timeout: 10, min_rnr_timer: 1, ..ConnectOptions::default() };
    a.qp.connect(&qp.endpoint(&region), &options).unwrap();
    qp.connect(&a.qp.endpoint(&a.mr), &options).unwrap();

    let window = pd.alloc_window(softrnic::WindowType::Two).unwrap();
    let (bind, rkey) = window.bind(&region, 1024, 64, Access::REMOTE_WRITE, 9);
    qp.post_send(SendWorkRequest::new(1, SendOp::BindWindow(bind), Payload::Gather(Default::default()))).unwrap();
    let bound = wait(&cq);
    assert_eq!((bound.opcode, bound.status), (WcOpcode::BindMw, WcStatus::Success));

    a.mr.write(0, b"through a window");
    let remote = softrnic::RemoteAddr { addr: region.iova() + 1024 + 8, rkey };
    a.qp.post_send(SendWorkRequest::new(2, SendOp::Write { remote, imm: None }, a.mr.gather(0, 16))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut landed = [0u8; 16];
    region.read(1032, &mut landed);
    assert_eq!(&landed, b"through a window");

    qp.post_recv(RecvWorkRequest { wr_id: 3, sges: vec![region.sge(0, 64)].into() }).unwrap();
    a.qp.post_send(SendWorkRequest::new(4, SendOp::SendWithInvalidate { rkey }, a.mr.gather(0, 4))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let received = wait(&cq);
    assert_eq!((received.wr_id, received.invalidated_rkey), (3, Some(rkey)));
    a.qp.post_send(SendWorkRequest::new(5, SendOp::Write { remote, imm: None }, a.mr.gather(0, 16))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr, "the key reaches nothing now");
}
