//! The offloaded stack's designs (`softrnicd --tx`, `--rx`): each moves
//! every operation's data exactly as the engine alone does, copies what it
//! says it copies, and the in-cache design's buffers stay its pool's
//! however many receives the connections post.

mod common;

use std::time::{Duration, Instant};

use common::{Tenant, daemon_designed, every_operation, pattern};
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::offload::{
    Designs, IN_CACHE_BUFFERS, OffloadStats, PULLS_PER_QP, RxDesign, SLOT, TxDesign,
};
use softrnic_transport::{RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, WcStatus, smallvec};

fn designed(name: &str, tx: TxDesign, rx: RxDesign) -> softrnic_daemon::server::Running {
    daemon_designed(name, DaemonConfig::default(), Designs { tx, rx })
}

#[test]
fn every_design_moves_every_operation_and_counts_its_copies() {
    for (tx, rx) in [
        (TxDesign::BulkCopy, RxDesign::PerConnection),
        (TxDesign::EngineCopy, RxDesign::InCache),
        (TxDesign::HeaderOnly, RxDesign::Direct),
    ] {
        let daemon = designed(&format!("ops-{tx}-{rx}"), tx, rx);
        every_operation(daemon.socket());
        let stats = daemon.offload_stats();
        let copied_tx = if tx == TxDesign::HeaderOnly {
            OffloadStats::default()
        } else {
            // The WRITE (5000 B) and the SEND (3000 B) are copied; the
            // inline SEND, the READ and the two atomics pass.
            OffloadStats { tx_copied_bytes: 8000, tx_staged: 2, tx_passed: 4, ..OffloadStats::default() }
        };
        let copied_rx = if rx == RxDesign::Direct {
            OffloadStats::default()
        } else {
            // The SEND (3000 B) and the inline SEND (12 B) land in a
            // staging buffer first; the WRITE's immediate has no payload.
            OffloadStats { rx_copied_bytes: 3012, rx_staged: 2, ..OffloadStats::default() }
        };
        let counted = OffloadStats { staging_bytes: 0, staging_peak: 0, ..stats };
        let expected =
            OffloadStats { rx_copied_bytes: copied_rx.rx_copied_bytes, rx_staged: copied_rx.rx_staged, ..copied_tx };
        assert_eq!(counted, expected, "--tx {tx} --rx {rx}");
        assert_eq!(daemon.processor_restarts(), 0);
    }
}

/// Pairs of tenants each stream `messages` SENDs of `len` bytes, every
/// receive posted before the first send; returns the daemon's stats.
fn stream(daemon: &softrnic_daemon::server::Running, pairs: usize, messages: usize, len: usize) -> OffloadStats {
    let pairs: Vec<(Tenant, Tenant)> = (0..pairs).map(|_| common::pair(daemon.socket())).collect();
    // Each message in a slot of its own at both ends.
    let slot = common::REGION / messages;
    assert!(slot >= len);
    for (p, (a, b)) in pairs.iter().enumerate() {
        for m in 0..messages {
            a.write(m * slot, &pattern(len, (p * messages + m) as u8));
            let sges = smallvec![Sge { addr: b.iova(m * slot), length: slot as u32, lkey: b.keys.lkey }];
            b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: m as u64, sges }).unwrap();
        }
    }
    for (a, _) in &pairs {
        for m in 0..messages {
            let mut wr = SendWorkRequest::new(m as u64, SendOp::Send { imm: None }, a.sge(m * slot, len as u32));
            wr.signaled = m + 1 == messages;
            a.session.post_send(&a.qp, &wr).unwrap();
        }
    }
    for (p, (a, b)) in pairs.iter().enumerate() {
        let got = b.wait_up_to(messages, LONG);
        assert!(got.iter().all(|c| c.status == WcStatus::Success && c.byte_len == len as u32), "pair {p}: {got:?}");
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..messages as u64).collect::<Vec<_>>(), "pair {p}: the program's own wr_ids, in order");
        for m in 0..messages {
            assert_eq!(b.read(m * slot, len), pattern(len, (p * messages + m) as u8), "pair {p} message {m}");
        }
        assert_eq!(a.wait_up_to(1, LONG)[0].status, WcStatus::Success);
    }
    daemon.offload_stats()
}

/// Time for RNR retries while receives wait for pool buffers.
const LONG: Duration = Duration::from_secs(60);

/// The staging designs pair a receive with a staging buffer when a
/// message fetches it, as the processor does: no RNR NAK either.
#[test]
fn staged_receives_posted_just_before_their_messages_are_found() {
    for rx in [RxDesign::PerConnection, RxDesign::InCache] {
        common::receives_posted_just_in_time(&designed(&format!("fetch-{rx:?}"), TxDesign::HeaderOnly, rx));
    }
}

/// In-cache, a receive takes a pool buffer only when its message
/// arrives: idle connections whose receives outnumber the pool's buffers
/// take none of them, and a busy connection beside them meets no RNR NAK
/// (when receives took their buffers as they were posted, the idle ones
/// held the whole pool and the busy one's messages were refused).
#[test]
fn in_cache_receives_take_a_buffer_only_for_their_message() {
    let daemon = designed("in-cache-idle", TxDesign::HeaderOnly, RxDesign::InCache);
    let idle: Vec<(Tenant, Tenant)> = (0..5).map(|_| common::pair(daemon.socket())).collect();
    for (_, b) in &idle {
        for m in 0..256 {
            let sges = smallvec![Sge { addr: b.iova(0), length: 64, lkey: b.keys.lkey }];
            b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: m, sges }).unwrap();
        }
    }
    const { assert!(5 * 256 > IN_CACHE_BUFFERS) };
    // The processor takes them from the rings on its next pass.
    std::thread::sleep(Duration::from_millis(100));
    common::receives_posted_just_in_time(&daemon);
}

#[test]
fn the_in_cache_pool_bounds_the_buffers_however_many_receives_wait() {
    // Five pairs post 256 receives each, 1280, more than the pool's 1024
    // buffers, and stream into them: every message arrives, each copied
    // once from the pool.
    let daemon = designed("in-cache", TxDesign::HeaderOnly, RxDesign::InCache);
    let stats = stream(&daemon, 5, 256, 200);
    assert_eq!((stats.rx_staged, stats.rx_copied_bytes), (5 * 256, 5 * 256 * 200));
    assert_eq!(stats.staging_peak, (IN_CACHE_BUFFERS * SLOT) as u64, "the pool, and nothing per connection");

    // Per connection, every QP (10 of them, default depth 256) holds a ring.
    let daemon = designed("per-connection", TxDesign::HeaderOnly, RxDesign::PerConnection);
    let stats = stream(&daemon, 5, 256, 200);
    assert_eq!(stats.rx_staged, 5 * 256);
    assert_eq!(stats.staging_peak, (10 * 256 * SLOT) as u64);
    drop(daemon);
}

#[test]
fn copying_transmit_designs_keep_a_window_of_sends_intact() {
    // 256 sends in flight on one QP reuse every staging slot: none may be
    // overwritten before the engine is done with it (retransmissions too).
    for tx in [TxDesign::BulkCopy, TxDesign::EngineCopy] {
        let daemon = designed(&format!("window-{tx}"), tx, RxDesign::Direct);
        let stats = stream(&daemon, 2, 256, 250);
        assert_eq!((stats.tx_staged, stats.tx_copied_bytes, stats.tx_passed), (512, 512 * 250, 0));
        // A slot for each send the engine holds, each pull under way, and one.
        let pulls = if tx == TxDesign::EngineCopy { PULLS_PER_QP } else { 0 };
        assert_eq!(stats.staging_peak, (4 * (256 + pulls + 1) * SLOT) as u64);
    }
}

#[test]
fn the_copy_engines_keys_are_no_use_to_a_peer() {
    // Under engine-copy each region has a twin in the copy engine's own
    // domain, registered right after it: the key after b's own is most
    // likely its twin's. A peer that guesses it gets a remote access error.
    let daemon = designed("twins", TxDesign::EngineCopy, RxDesign::Direct);
    let (a, b) = common::pair(daemon.socket());
    b.write(0, &pattern(64, 3));
    let guess = RemoteAddr { addr: b.iova(0), rkey: b.keys.rkey + 0x100 };
    let mut wr = SendWorkRequest::new(1, SendOp::Read { remote: guess }, a.sge(0, 64));
    wr.signaled = true;
    a.session.post_send(&a.qp, &wr).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::RemAccessErr);
    assert_ne!(a.read(0, 64), pattern(64, 3));
}

#[test]
fn engine_copy_under_load_from_several_threads_never_stalls() {
    // Pulls, posts and the copy engine's polls interleave with the shards'
    // own work (inline progress drives the shards from inside those
    // calls): four pairs stream at once, each from its own thread, with a
    // window of sends and receives reposted as they complete.
    let daemon = designed("pull-stress", TxDesign::EngineCopy, RxDesign::InCache);
    let pairs: Vec<(Tenant, Tenant)> = (0..4).map(|_| common::pair(daemon.socket())).collect();
    let (messages, window, len) = (4000u64, 64u64, 64usize);
    std::thread::scope(|s| {
        for (p, (a, b)) in pairs.iter().enumerate() {
            s.spawn(move || {
                let slot = |m: u64| (m % window) as usize * 256;
                for m in 0..window {
                    let sges = smallvec![Sge { addr: b.iova(slot(m)), length: 256, lkey: b.keys.lkey }];
                    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: m, sges }).unwrap();
                }
                let (mut sent, mut acked, mut received) = (0u64, 0u64, 0u64);
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut got = Vec::new();
                while received < messages {
                    assert!(Instant::now() < deadline, "pair {p}: {received} of {messages} after 120 s");
                    while sent < messages && sent - acked < window {
                        a.write(slot(sent), &pattern(len, (sent + p as u64) as u8));
                        let mut wr =
                            SendWorkRequest::new(sent, SendOp::Send { imm: None }, a.sge(slot(sent), len as u32));
                        wr.signaled = true;
                        a.session.post_send(&a.qp, &wr).unwrap();
                        sent += 1;
                    }
                    got.clear();
                    a.cq.poll(16, &mut got);
                    assert!(got.iter().all(|c| c.status == WcStatus::Success), "pair {p}: {got:?}");
                    acked += got.len() as u64;
                    got.clear();
                    b.cq.poll(16, &mut got);
                    for c in &got {
                        assert_eq!((c.status, c.wr_id % window), (WcStatus::Success, received % window), "pair {p}");
                        assert_eq!(b.read(slot(c.wr_id), len), pattern(len, (received + p as u64) as u8), "pair {p}");
                        received += 1;
                        let next = c.wr_id + window;
                        let sges = smallvec![Sge { addr: b.iova(slot(next)), length: 256, lkey: b.keys.lkey }];
                        b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: next, sges }).unwrap();
                    }
                    if got.is_empty() {
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
    let stats = daemon.offload_stats();
    assert_eq!(stats.tx_staged + stats.tx_passed, 4 * messages);
    assert_eq!(stats.rx_staged, 4 * messages);
    assert_eq!(daemon.processor_restarts(), 0);
}

/// A QP moved to the error state completes every receive the program
/// posted, flushed, wherever it waits: posted to the engine with a
/// staging buffer, (in-cache) waiting for its message, or still in the
/// program's ring. The program gets each of its own `wr_id`s back, once,
/// in order. (In-cache receives never completed before: nothing took them
/// to the engine.)
#[test]
fn staged_receives_flush_when_the_qp_moves_to_error() {
    use softrnic_transport::{QpAttr, QpState};
    for rx in [RxDesign::Direct, RxDesign::PerConnection, RxDesign::InCache] {
        let daemon = designed(&format!("flush-{rx:?}"), TxDesign::HeaderOnly, rx);
        let (_a, b) = common::pair(daemon.socket());
        let receives = 200u64;
        let post = |m: u64| {
            let sges = smallvec![Sge { addr: b.iova(0), length: 64, lkey: b.keys.lkey }];
            b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: m, sges }).unwrap();
        };
        // The first half the processor takes from the ring on its next
        // pass; the second is still in the ring when the QP fails.
        (0..receives / 2).for_each(post);
        std::thread::sleep(Duration::from_millis(50));
        (receives / 2..receives).for_each(post);
        let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
        b.session.modify_qp(&b.qp, &error).unwrap();
        let got = b.wait_up_to(receives as usize, Duration::from_secs(10));
        assert!(got.iter().all(|c| c.status == WcStatus::WrFlushErr), "{rx:?}: {got:?}");
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..receives).collect::<Vec<_>>(), "{rx:?}: each receive flushed once, in order");
        // Receives posted after the error flush too.
        post(receives);
        let late = b.wait_up_to(1, Duration::from_secs(10));
        assert_eq!((late[0].wr_id, late[0].status), (receives, WcStatus::WrFlushErr), "{rx:?}");
    }
}

/// RESET discards every receive the program posted, wherever it was: in
/// the engine, kept by the stage, or still in the program's ring. Once the
/// QP is connected again only receives posted after the RESET complete,
/// in order, and the staging buffers of the discarded ones are free.
#[test]
fn reset_discards_the_receives_the_stage_and_the_ring_hold() {
    use softrnic_transport::{QpAttr, QpState};
    for rx in [RxDesign::Direct, RxDesign::PerConnection, RxDesign::InCache] {
        let daemon = designed(&format!("reset-{rx:?}"), TxDesign::HeaderOnly, rx);
        let (a, b) = common::pair(daemon.socket());
        let post = |m: u64| {
            let sges = smallvec![Sge { addr: b.iova(0), length: 64, lkey: b.keys.lkey }];
            b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: m, sges }).unwrap();
        };
        // Most the processor takes on its next pass; the last are still
        // in the ring when the program resets the QP.
        (0..200).for_each(post);
        std::thread::sleep(Duration::from_millis(50));
        (200..250).for_each(post);
        let reset = QpAttr { state: Some(QpState::Reset), ..QpAttr::default() };
        b.session.modify_qp(&b.qp, &reset).unwrap();
        b.connect(&a);
        let fresh = 1000..1256u64;
        fresh.clone().for_each(post);
        for m in fresh.clone() {
            a.session.post_send(&a.qp, &SendWorkRequest::new(m, SendOp::Send { imm: None }, a.sge(0, 64))).unwrap();
        }
        let got = b.wait_up_to(256, LONG);
        assert!(got.iter().all(|c| c.status == WcStatus::Success), "{rx:?}: {got:?}");
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, fresh.collect::<Vec<_>>(), "{rx:?}: only the receives posted after the RESET");
        let mut more = Vec::new();
        assert_eq!(b.cq.poll(16, &mut more), 0, "{rx:?}: nothing of before the RESET: {more:?}");
    }
}

/// A QP that takes its receives from an SRQ gets no receive stage (they
/// land directly): no staging buffers, and nothing registered for them
/// that would outlive the QP. Before the stages were built per direction,
/// one was made and dropped unreleased, its registration left behind.
#[test]
fn a_qp_on_an_srq_gets_no_receive_stage() {
    use softrnic_transport::{QpInitAttr, SrqAttr};
    for rx in [RxDesign::PerConnection, RxDesign::InCache] {
        let daemon = designed(&format!("srq-{rx:?}"), TxDesign::HeaderOnly, rx);
        let t = common::Tenant::open(daemon.socket(), common::address());
        let before = daemon.offload_stats();
        let srq = t.session.create_srq(t.pd, SrqAttr { max_wr: 64, max_sge: 1, limit: 0 }).unwrap();
        let init = QpInitAttr { srq: Some(srq.id), ..common::rc_init(t.pd, t.cq.id) };
        let qp = t.session.create_qp(init).unwrap();
        assert_eq!(daemon.offload_stats(), before, "{rx:?}: no staging for a QP on an SRQ");
        t.session.destroy_qp(qp.qpn).unwrap();
        assert_eq!(daemon.offload_stats(), before, "{rx:?}");
    }
}
