//! softrnicd end to end: tenants that reach one daemon over its socket and
//! move data through shared queues.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{
    PROCESSORS, REGION, Tenant, address, connect_qp, daemon, daemon_with, every_operation, pair, pattern, rc_init,
};
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon_protocol::shared_memory::SharedMapping;
use softrnic_provider::client::{Channel, Cq, Qp, Srq};
use softrnic_transport::{
    Access, AlgorithmSpec, AsyncEvent, Completion, Payload, QpAttr, QpInitAttr, QpState, RecvWorkRequest, RemoteAddr,
    SendOp, SendWorkRequest, Sge, SrqAttr, WcStatus, smallvec,
};

#[test]
fn two_tenants_move_every_operation_through_shared_queues() {
    let daemon = daemon("ops");
    every_operation(daemon.socket());
}

#[test]
fn a_window_of_writes_arrives_whole_and_in_order() {
    let daemon = daemon("window");
    let (a, b) = pair(daemon.socket());
    for round in 0..20u8 {
        let data = pattern(REGION / 2, round);
        a.write(0, &data);
        // 128 writes of 256 bytes, signalled every 16th.
        for i in 0..128usize {
            let remote = RemoteAddr { addr: b.iova(i * 256), rkey: b.keys.rkey };
            let mut wr = SendWorkRequest::new(i as u64, SendOp::Write { remote, imm: None }, a.sge(i * 256, 256));
            wr.signaled = i % 16 == 15;
            loop {
                match a.session.post_send(&a.qp, &wr) {
                    Ok(()) => break,
                    Err(softrnic_transport::VerbsError::OutOfResources(_)) => {
                        let mut out = Vec::new();
                        a.cq.poll(16, &mut out);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while done.last().map(|c: &Completion| c.wr_id) != Some(127) {
            assert!(Instant::now() < deadline);
            a.cq.poll(16, &mut done);
        }
        assert!(done.iter().all(|c| c.status == WcStatus::Success));
        assert_eq!(b.read(0, 128 * 256), data[..128 * 256], "round {round}");
    }
}

/// Each receive written to the ring just before the SEND that needs it
/// leaves the peer is found, never RNR NAKed (see
/// [`common::receives_posted_just_in_time`]).
#[test]
fn a_receive_posted_just_before_its_message_is_found() {
    common::receives_posted_just_in_time(&daemon("fetch"));
}

#[test]
fn a_guessed_rkey_of_another_tenant_is_a_remote_access_error() {
    let daemon = daemon("rkey");
    let socket = daemon.socket();
    let (a, b) = pair(socket);
    // A third tenant on b's very device, with memory of its own.
    let victim = Tenant::open(socket, b.session.addr());
    victim.write(0, &[0x5a; 64]);
    let remote = RemoteAddr { addr: victim.iova(0), rkey: victim.keys.rkey };
    a.write(0, &[0xff; 64]);
    let mut wr = SendWorkRequest::new(9, SendOp::Write { remote, imm: None }, a.sge(0, 64));
    wr.signaled = true;
    a.session.post_send(&a.qp, &wr).unwrap();
    let done = a.wait(1);
    assert_eq!(done[0].status, WcStatus::RemAccessErr, "{done:?}");
    assert_eq!(victim.read(0, 64), [0x5a; 64], "untouched");
    // b's responder refused it: b's program is told on its async_fd, and
    // the victim, on the same device, hears nothing.
    assert_eq!(b.session.next_async_event().unwrap(), AsyncEvent::QpAccessError { qpn: b.qp.qpn });
    rustix::io::ioctl_fionbio(victim.session.async_fd(), true).unwrap();
    let nothing = victim.session.next_async_event().unwrap_err();
    assert_eq!(nothing.kind(), std::io::ErrorKind::WouldBlock, "{nothing}");
    // Nor may a tenant use another's keys or objects locally.
    let stolen = Payload::Gather(smallvec![Sge { addr: victim.iova(0), length: 8, lkey: victim.keys.lkey }]);
    let other = Tenant::open(socket, address());
    assert!(other.session.destroy_qp(victim.qp.qpn).is_err(), "another tenant's QP is unknown");
    assert!(other.session.deregister_memory(victim.keys.lkey).is_err(), "and its region");
    assert!(other.session.dealloc_pd(victim.pd).is_err(), "and its PD");
    let c = Tenant::open(socket, address());
    other.connect(&c);
    other.session.post_send(&other.qp, &SendWorkRequest::new(10, SendOp::Send { imm: None }, stolen)).unwrap();
    let done = other.wait(1);
    assert_eq!(done[0].status, WcStatus::LocProtErr, "a stolen lkey: {done:?}");
}

#[test]
fn limits_refuse_what_exceeds_them() {
    let config = DaemonConfig::parse("[tenant]\nmax_qps = 1\nmax_srqs = 1\nmax_memory_mib = 1\n").unwrap();
    let daemon = daemon_with("limits", config);
    let t = Tenant::open(daemon.socket(), address());
    let e = t.session.create_qp(rc_init(t.pd, t.cq.id)).err().unwrap();
    assert!(e.to_string().contains("at most 1 QPs"), "{e}");
    let big = SharedMapping::create("big", 2 << 20).unwrap();
    let e = t.session.register_memory(t.pd, &big, 0, 2 << 20, 0, Access::LOCAL_WRITE).unwrap_err();
    assert!(e.to_string().contains("MiB registered"), "{e}");
    let attr = SrqAttr { max_wr: 4, max_sge: 1, limit: 0 };
    let first = t.session.create_srq(t.pd, attr).unwrap();
    let e = t.session.create_srq(t.pd, attr).err().unwrap();
    assert!(e.to_string().contains("at most 1 SRQs"), "{e}");
    t.session.destroy_srq(&first).unwrap();
    t.session.create_srq(t.pd, attr).expect("room again once the first is destroyed");
}

#[test]
fn a_departed_tenant_frees_what_it_held_and_its_peer_flushes() {
    let daemon = daemon("departed");
    let (a, b) = pair(daemon.socket());
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 1, sges: smallvec![] }).unwrap();
    let b_addr = b.session.addr();
    drop(b);
    // Gone once the daemon has torn the tenant down (its connection's end
    // is only the start of that): until then the QP would still answer.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.counters(b_addr).is_some() {
        assert!(Instant::now() < deadline, "the departed tenant's device is still open");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The peer's requests now go unanswered: it retries, then fails.
    let remote = RemoteAddr { addr: 0, rkey: 0 };
    for wr_id in 0..4 {
        let mut wr = SendWorkRequest::new(wr_id, SendOp::Write { remote, imm: None }, a.sge(0, 8));
        wr.signaled = true;
        a.session.post_send(&a.qp, &wr).unwrap();
    }
    let done = a.wait(4);
    assert_eq!(done[0].status, WcStatus::RetryExcErr, "{done:?}");
    assert!(done[1..].iter().all(|c| c.status == WcStatus::WrFlushErr), "{done:?}");
    // The departed tenant's address serves a new tenant at once.
    let again = Tenant::open(daemon.socket(), b_addr);
    again.connect(&a);
    assert_eq!(again.qp.state(), QpState::Rts);
}

/// Eight pairs of tenants, each on a thread of its own, and four threads
/// sharing one QP: every byte lands, and the engines count no reordering
/// or NAK of their own making. The daemon's command processors each serve
/// half of the sixteen devices, each pair's two ends on two of them.
#[test]
fn tenants_and_threads_at_once_disturb_nothing() {
    let daemon = daemon("concurrent");
    let socket = daemon.socket();
    let pairs: Vec<(Tenant, Tenant)> = (0..8).map(|_| pair(socket)).collect();
    let processor = |t: &Tenant| daemon.processor_of(t.session.addr()).unwrap();
    let mut load = [0; PROCESSORS];
    for (a, b) in &pairs {
        assert_ne!(processor(a), processor(b), "a pair's ends on one processor");
        load[processor(a)] += 1;
        load[processor(b)] += 1;
    }
    assert_eq!(load, [16 / PROCESSORS; PROCESSORS]);
    std::thread::scope(|s| {
        for (n, (a, b)) in pairs.iter().enumerate() {
            s.spawn(move || {
                for round in 0..30u8 {
                    let data = pattern(8192, round ^ n as u8);
                    a.write(0, &data);
                    for i in 0..8usize {
                        let remote = RemoteAddr { addr: b.iova(i * 1024), rkey: b.keys.rkey };
                        let mut wr =
                            SendWorkRequest::new(i as u64, SendOp::Write { remote, imm: None }, a.sge(i * 1024, 1024));
                        wr.signaled = i == 7;
                        a.session.post_send(&a.qp, &wr).unwrap();
                    }
                    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
                    assert_eq!(b.read(0, 8192), data, "pair {n} round {round}");
                }
            });
        }
    });
    let (a, b) = &pairs[0];
    std::thread::scope(|s| {
        for t in 0..4usize {
            s.spawn(move || {
                for i in 0..50usize {
                    let at = t * 8192 + (i % 8) * 1024;
                    let remote = RemoteAddr { addr: b.iova(at), rkey: b.keys.rkey };
                    let wr = SendWorkRequest::new(
                        (t * 1000 + i) as u64,
                        SendOp::Write { remote, imm: None },
                        a.sge(at, 1024),
                    );
                    while let Err(e) = a.session.post_send(&a.qp, &wr) {
                        assert!(matches!(e, softrnic_transport::VerbsError::OutOfResources(_)), "{e}");
                        std::thread::yield_now();
                    }
                }
            });
        }
    });
    let mut done = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while done.len() < 200 {
        assert!(Instant::now() < deadline, "{} of 200", done.len());
        a.cq.poll(64, &mut done);
    }
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
    for (a, b) in &pairs {
        for addr in [a.session.addr(), b.session.addr()] {
            let c = daemon.counters(addr).unwrap();
            let t = &c.transport;
            assert_eq!(
                (t.rx_out_of_sequence, t.seq_naks_sent, t.rx_unknown_qp, c.rx_missteered),
                (0, 0, 0, 0),
                "{addr}: {c:?}"
            );
        }
    }
}

/// A QP of `receiver`'s that takes its receives from `srq` (completions
/// on the receiver's CQ), connected both ways with `sender`'s QP.
fn qp_on_srq(receiver: &Tenant, srq: &Srq, sender: &Tenant) -> Qp {
    let init = QpInitAttr { srq: Some(srq.id), ..rc_init(receiver.pd, receiver.cq.id) };
    let session = &receiver.session;
    let qp = session.create_qp(init).unwrap();
    connect_qp(session, &qp, receiver.psn, (sender.session.addr(), sender.qp.qpn, sender.psn), (14, 7));
    sender.connect_to(session.addr(), qp.qpn, receiver.psn);
    qp
}

/// Four senders, each from a thread of its own, SEND into one receiver's
/// SRQ through four QPs, while the receiver's poller hands each used
/// buffer to one of two threads that post it to the SRQ again: every
/// message arrives once, each sender's in order, and nothing was lost or
/// NAKed for its sequence on the way. The senders share credits for the
/// SRQ's buffers, as an application on an SRQ must (a message takes one,
/// the buffer's repost gives it back), so the program's SRQ never runs
/// dry. The engine's may, for a moment, before the processor's next pass
/// moves a repost from the ring into it: then the message fetches it from
/// the ring itself, as a NIC does, and nothing is RNR NAKed.
#[test]
fn an_srq_fed_and_drained_by_threads_takes_every_message_once_in_order() {
    const SENDERS: usize = 4;
    const MESSAGES: u32 = 300;
    const SLOTS: usize = 64;
    const LEN: usize = 64;
    const WINDOW: u32 = 16;
    let daemon = daemon("srq-threads");
    let socket = daemon.socket();
    let receiver = Tenant::open(socket, address());
    let session = &receiver.session;
    let srq = session.create_srq(receiver.pd, SrqAttr { max_wr: SLOTS as u32, max_sge: 1, limit: 0 }).unwrap();
    let senders: Vec<Tenant> = (0..SENDERS).map(|_| Tenant::open(socket, address())).collect();
    let qps: Vec<_> = senders.iter().map(|sender| qp_on_srq(&receiver, &srq, sender)).collect();
    let slot = |i: usize| RecvWorkRequest {
        wr_id: i as u64,
        sges: smallvec![Sge { addr: receiver.iova(i * LEN), length: LEN as u32, lkey: receiver.keys.lkey }],
    };
    for i in 0..SLOTS {
        session.post_srq_recv(&srq, &slot(i)).unwrap();
    }
    let credits = &AtomicUsize::new(SLOTS);
    let take = |credits: &AtomicUsize| credits.fetch_update(SeqCst, SeqCst, |c| c.checked_sub(1)).is_ok();
    std::thread::scope(|s| {
        for (n, sender) in senders.iter().enumerate() {
            s.spawn(move || {
                let (mut posted, mut done) = (0u32, 0u32);
                let mut completions = Vec::new();
                while done < MESSAGES {
                    if posted < MESSAGES && posted - done < WINDOW && take(credits) {
                        let at = (posted % WINDOW) as usize * LEN;
                        sender.write(at, &[&[n as u8][..], &posted.to_le_bytes()].concat());
                        let send = SendWorkRequest::new(
                            u64::from(posted),
                            SendOp::Send { imm: None },
                            sender.sge(at, LEN as u32),
                        );
                        sender.session.post_send(&sender.qp, &send).unwrap();
                        posted += 1;
                    } else if sender.cq.poll(16, &mut completions) == 0 {
                        std::thread::yield_now();
                    }
                    for c in completions.drain(..) {
                        assert_eq!((c.status, c.wr_id), (WcStatus::Success, u64::from(done)), "sender {n}");
                        done += 1;
                    }
                }
            });
        }
        let (to_posters, posters): (Vec<_>, Vec<_>) = (0..2).map(|_| std::sync::mpsc::channel::<usize>()).unzip();
        for used in posters {
            let (srq, slot) = (&srq, &slot);
            s.spawn(move || {
                for i in used {
                    session.post_srq_recv(srq, &slot(i)).unwrap();
                    credits.fetch_add(1, SeqCst);
                }
            });
        }
        let mut next = [0u32; SENDERS];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        for k in 0..SENDERS * MESSAGES as usize {
            while got.is_empty() {
                assert!(Instant::now() < deadline, "{k} of {} messages after 60 s", SENDERS * MESSAGES as usize);
                if receiver.cq.poll(16, &mut got) == 0 {
                    std::thread::yield_now();
                }
            }
            let c = got.remove(0);
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, LEN as u32), "{c:?}");
            let bytes = receiver.read(c.wr_id as usize * LEN, 5);
            let (n, seq) = (bytes[0] as usize, u32::from_le_bytes(bytes[1..5].try_into().unwrap()));
            assert_eq!(c.qp_num, qps[n].qpn, "sender {n}'s message on its own QP");
            assert_eq!(seq, next[n], "sender {n}'s messages in order");
            next[n] += 1;
            to_posters[k % 2].send(c.wr_id as usize).unwrap();
        }
        drop(to_posters);
        assert_eq!(next, [MESSAGES; SENDERS]);
    });
    for addr in std::iter::once(session.addr()).chain(senders.iter().map(|t| t.session.addr())) {
        let c = daemon.counters(addr).unwrap();
        let t = &c.transport;
        // Every message had its receive written before it was sent (the
        // credits): the engine fetches it from the ring if the processor
        // has not moved it yet, so nothing is RNR NAKed.
        let naks = (t.seq_naks_sent, t.rnr_naks_sent, t.rx_out_of_sequence, t.rx_unknown_qp, c.rx_missteered);
        assert_eq!(naks, (0, 0, 0, 0, 0), "{addr}: {c:?}");
    }
}

/// An SRQ's limit event through the daemon counts every receive the
/// program posted, those still in its ring included, and reaches the
/// SRQ's owner on its `async_fd` once the SRQ runs below the limit.
#[test]
fn an_srq_limit_fires_when_the_programs_receives_run_low() {
    let daemon = daemon("srq-limit");
    let socket = daemon.socket();
    let receiver = Tenant::open(socket, address());
    let session = &receiver.session;
    let srq = session.create_srq(receiver.pd, SrqAttr { max_wr: 16, max_sge: 1, limit: 0 }).unwrap();
    let sender = Tenant::open(socket, address());
    let _receiving = qp_on_srq(&receiver, &srq, &sender);
    for i in 0..8 {
        let sges = smallvec![Sge { addr: receiver.iova(i * 64), length: 64, lkey: receiver.keys.lkey }];
        session.post_srq_recv(&srq, &RecvWorkRequest { wr_id: i as u64, sges }).unwrap();
    }
    session.set_srq_limit(&srq, 4).unwrap();
    rustix::io::ioctl_fionbio(session.async_fd(), true).unwrap();
    let event = || session.next_async_event().map_err(|e| e.kind());
    for i in 0..5u64 {
        let mut wr = SendWorkRequest::new(i, SendOp::Send { imm: None }, sender.sge(0, 16));
        wr.signaled = true;
        sender.session.post_send(&sender.qp, &wr).unwrap();
        assert_eq!(sender.wait(1)[0].status, WcStatus::Success);
        assert_eq!(receiver.wait(1)[0].wr_id, i);
        if i < 4 {
            // 8 - (i + 1) receives left: not below 4 until the fifth.
            assert_eq!(event(), Err(std::io::ErrorKind::WouldBlock), "after {} messages", i + 1);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let fired = loop {
        match event() {
            Err(std::io::ErrorKind::WouldBlock) if Instant::now() < deadline => std::thread::yield_now(),
            other => break other,
        }
    };
    assert_eq!(fired, Ok(AsyncEvent::SrqLimitReached { srq: srq.id }));
    assert_eq!(session.query_srq(&srq).unwrap().limit, 0, "disarmed by firing");
}

/// A receiver whose receive CQ has a completion channel, connected to a
/// sender: `(sender, receiver, channel, receive CQ)`.
fn receiver_with_channel(socket: &std::path::Path) -> (Tenant, Tenant, Channel, Cq) {
    let b = Tenant::open(socket, address());
    let channel = b.session.create_channel().unwrap();
    let cq = b.session.create_cq(16, Some(&channel)).unwrap();
    let init = QpInitAttr { recv_cq: cq.id, ..rc_init(b.pd, b.cq.id) };
    let qp = b.session.create_qp(init).unwrap();
    let b = Tenant { qp, ..b };
    let a = Tenant::open(socket, address());
    a.connect(&b);
    b.connect(&a);
    (a, b, channel, cq)
}

/// A completion channel is a descriptor: it becomes readable once per
/// arming, naming the CQ, and stays quiet while the CQ is not armed.
#[test]
fn an_armed_cq_announces_its_next_completion_on_its_channel() {
    let daemon = daemon("channel");
    let (a, b, channel, cq) = receiver_with_channel(daemon.socket());
    let send = |wr_id| {
        b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id, sges: smallvec![] }).unwrap();
        a.session.post_send(&a.qp, &SendWorkRequest::new(wr_id, SendOp::Send { imm: None }, a.sge(0, 0))).unwrap();
        a.wait(1);
    };
    send(1);
    assert_eq!(channel.get_event(Duration::from_millis(50)).unwrap(), None, "not armed");
    let mut out = Vec::new();
    assert_eq!(cq.poll(4, &mut out), 1);
    cq.request_notify(false);
    send(2);
    assert_eq!(channel.get_event(Duration::from_secs(5)).unwrap(), Some(cq.id));
    send(3);
    assert_eq!(channel.get_event(Duration::from_millis(50)).unwrap(), None, "once per arming");
    assert_eq!(cq.poll(4, &mut out), 2);
    // Armed for solicited completions only: an error raises it too.
    cq.request_notify(true);
    send(4);
    assert_eq!(channel.get_event(Duration::from_millis(50)).unwrap(), None, "not solicited");
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 5, sges: smallvec![] }).unwrap();
    let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
    b.session.modify_qp(&b.qp, &error).unwrap();
    assert_eq!(channel.get_event(Duration::from_secs(5)).unwrap(), Some(cq.id), "a flushed receive");
    assert_eq!(cq.poll(4, &mut out), 2);
    assert_eq!(out.last().map(|c| (c.wr_id, c.status)), Some((5, WcStatus::WrFlushErr)));
    assert!(b.session.destroy_channel(&channel).is_err(), "a CQ still uses it");
}

/// A program that arms its CQ and then polls it, as rping's CQ thread
/// does, finds each completion there or is told of it on the channel,
/// however the arming and the daemon's writing of the completion
/// interleave ([`softrnic_ring::wakeup`]). Each round arms at a moment
/// spread over the message's flight, so that some arm just as the
/// completion is written: without the protocol's fences this test failed
/// in five runs of six (and one rping pair in fifty slept for good).
#[test]
fn a_cq_armed_while_its_completion_is_written_is_never_slept_through() {
    const ROUNDS: usize = 20_000;
    let daemon = daemon("arming");
    let (a, b, channel, cq) = receiver_with_channel(daemon.socket());
    let mut send = SendWorkRequest::new(0, SendOp::Send { imm: None }, a.sge(0, 0));
    send.signaled = false;
    let mut out = Vec::new();
    for round in 1..=ROUNDS {
        b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: round as u64, sges: smallvec![] }).unwrap();
        a.session.post_send(&a.qp, &send).unwrap();
        let arm_at = Instant::now() + Duration::from_nanos((round as u64 * 7919) % 40_000);
        while Instant::now() < arm_at {
            std::hint::spin_loop();
        }
        cq.request_notify(false);
        cq.poll(4, &mut out);
        if out.len() < round {
            // Not there when polled: the channel must say when it is.
            let event = channel.get_event(Duration::from_secs(5)).unwrap();
            assert_eq!(event, Some(cq.id), "round {round}: a completion written after the CQ was armed, no event");
            let deadline = Instant::now() + Duration::from_secs(5);
            while out.len() < round {
                assert!(Instant::now() < deadline, "round {round}: an event without its completion");
                cq.poll(4, &mut out);
            }
        }
        // An event for a completion polled already may come meanwhile.
        while channel.get_event(Duration::ZERO).unwrap().is_some() {}
    }
    assert!(out.iter().all(|c| c.status == WcStatus::Success));
    assert!(out.iter().enumerate().all(|(i, c)| c.wr_id == i as u64 + 1), "in order");
}

/// The forwarding design (every post and poll a request to the daemon),
/// the baseline of E11 and E12, moves the same operations, and a tenant
/// that forwards meets one that shares its queues.
#[test]
fn a_forwarding_tenant_posts_and_polls_over_the_socket() {
    let daemon = daemon("forward");
    let socket = daemon.socket();
    let a = Tenant::open_with(socket, address(), true);
    let b = Tenant::open(socket, address());
    assert!(a.session.forwarding() && !b.session.forwarding());
    a.connect(&b);
    b.connect(&a);
    assert_eq!(daemon.served().0, 1, "only the sharing tenant's QP is the processor's");
    let data = pattern(3000, 4);
    a.write(0, &data);
    b.session
        .post_recv(
            &b.qp,
            &RecvWorkRequest { wr_id: 5, sges: smallvec![Sge { addr: b.iova(100), length: 4096, lkey: b.keys.lkey }] },
        )
        .unwrap();
    a.session.post_send(&a.qp, &SendWorkRequest::new(6, SendOp::Send { imm: None }, a.sge(0, 3000))).unwrap();
    assert_eq!((a.wait(1)[0].wr_id, b.wait(1)[0].byte_len), (6, 3000));
    assert_eq!(b.read(100, 3000), data);
    a.session
        .post_recv(
            &a.qp,
            &RecvWorkRequest { wr_id: 7, sges: smallvec![Sge { addr: a.iova(8192), length: 64, lkey: a.keys.lkey }] },
        )
        .unwrap();
    let inline = Payload::Inline(softrnic_transport::InlineData::from_slice(b"back"));
    b.session.post_send(&b.qp, &SendWorkRequest::new(8, SendOp::Send { imm: None }, inline)).unwrap();
    assert_eq!(a.wait(1)[0].wr_id, 7);
    assert_eq!(a.read(8192, 4), b"back");
    assert!(a.session.create_channel().is_err(), "no completion channels when forwarding");
}

#[test]
fn a_resized_cq_keeps_the_completions_not_polled_yet() {
    let daemon = daemon("resize");
    let (a, b) = pair(daemon.socket());
    let write = |id: u64| {
        let remote = RemoteAddr { addr: b.iova(0), rkey: b.keys.rkey };
        let mut wr = SendWorkRequest::new(id, SendOp::Write { remote, imm: None }, a.sge(0, 64));
        wr.signaled = true;
        a.session.post_send(&a.qp, &wr).unwrap();
    };
    for id in 0..5 {
        write(id);
    }
    // Wait until the daemon has moved all five into the ring, unpolled.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.cq.ready() < 5 {
        assert!(Instant::now() < deadline, "{} of 5 completions in the ring after 10 s", a.cq.ready());
        std::thread::sleep(Duration::from_millis(5));
    }
    let too_small = a.session.resize_cq(&a.cq, 2).unwrap_err();
    assert!(too_small.to_string().contains("while 5 completions wait"), "{too_small}");
    assert_eq!(a.session.resize_cq(&a.cq, 1000).unwrap(), 1024, "a power of two, at least what was asked");
    assert_eq!(a.cq.capacity(), 1024);
    let moved = a.wait(5);
    assert_eq!(moved.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1, 2, 3, 4], "all five, in order");
    // The new ring serves what comes next.
    write(5);
    assert_eq!(a.wait(1)[0].wr_id, 5);
    assert_eq!(a.session.resize_cq(&a.cq, 8).unwrap(), 8);
    write(6);
    assert_eq!(a.wait(1)[0].wr_id, 6);
}

/// A WebAssembly congestion-control module that sets its QP's rate to
/// `rate` at every event (and no window): the text format, compiled.
fn module_answering(rate: u64) -> Vec<u8> {
    use softrnic_cc::guest::Io;
    let control = 1024 + std::mem::offset_of!(Io, control);
    let window = control + 8;
    wat::parse_str(format!(
        r#"(module
            (memory (export "memory") 1)
            (func (export "softrnic_cc_abi") (result i32) i32.const 1)
            (func (export "softrnic_cc_io") (result i32) i32.const 1024)
            (func (export "softrnic_cc_init") (result i32) i32.const 0)
            (func (export "softrnic_cc_on_event")
                i32.const {control} i64.const {rate} i64.store
                i32.const {window} i64.const -1 i64.store))"#
    ))
    .unwrap()
}

/// A QP's own congestion control runs in the daemon: a built-in by name,
/// a module by its bytes, compiled in the daemon's sandbox, whose answer
/// paces the QP once traffic gives it events; the rate reads back. A
/// module that is not one, or another tenant's QP, is refused.
#[test]
fn a_qps_own_congestion_control_runs_in_the_daemon() {
    let daemon = daemon("qp-cc");
    let (a, b) = pair(daemon.socket());
    let qpn = a.qp.qpn;
    assert_eq!(a.session.qp_congestion_rate(qpn).unwrap(), None, "no algorithm yet");
    let dcqcn = AlgorithmSpec::Builtin { name: "dcqcn".into(), params: String::new() };
    a.session.set_qp_congestion_control(qpn, Some(dcqcn)).unwrap();
    assert!(a.session.qp_congestion_rate(qpn).unwrap().is_some_and(|rate| rate > 0), "DCQCN starts at line rate");
    let module =
        |bytes: Vec<u8>| AlgorithmSpec::Module { name: "pace.wasm".into(), bytes: bytes.into(), params: String::new() };
    a.session.set_qp_congestion_control(qpn, Some(module(module_answering(3_000_000_000)))).unwrap();
    let remote = RemoteAddr { addr: b.iova(0), rkey: b.keys.rkey };
    let mut write = SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, a.sge(0, 4096));
    write.signaled = true;
    a.session.post_send(&a.qp, &write).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(a.session.qp_congestion_rate(qpn).unwrap(), Some(3_000_000_000), "the module's answer");
    let e = a.session.set_qp_congestion_control(qpn, Some(module(b"\0asm garbage".to_vec()))).unwrap_err();
    assert!(e.to_string().contains("not a WebAssembly module"), "{e}");
    // Another tenant of the same device: its QP is not a's to pace.
    let c = Tenant::open(daemon.socket(), a.session.addr());
    assert_ne!(c.qp.qpn, qpn);
    assert!(a.session.set_qp_congestion_control(c.qp.qpn, None).is_err(), "another tenant's QP");
    assert!(a.session.qp_congestion_rate(c.qp.qpn).is_err(), "another tenant's QP");
    a.session.set_qp_congestion_control(qpn, None).unwrap();
    assert_eq!(a.session.qp_congestion_rate(qpn).unwrap(), None);
    assert_eq!(daemon.processor_restarts(), 0);
}

/// A daemon stopped under its tenants tears them down first, as a device
/// removed under its programs: their posted receives flush, their next
/// control verb fails, and their devices close with their shared-memory
/// inboxes (a daemon that exited under its tenants left those in its
/// user's inbox directory for the next one to sweep).
#[test]
fn a_stopping_daemon_flushes_its_tenants_and_leaves_nothing_in_dev_shm() {
    let daemon = daemon("stopping");
    let (a, b) = pair(daemon.socket());
    b.session.post_recv(&b.qp, &RecvWorkRequest { wr_id: 7, sges: smallvec![] }).unwrap();
    let inboxes = |addr: std::net::IpAddr| -> Vec<String> {
        let dir = softrnic_engine::shm::inbox_dir().unwrap();
        let names = std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok());
        let names = names.map(|e| e.file_name().to_string_lossy().into_owned());
        names.filter(|n| n.ends_with(&format!("-{addr}"))).collect()
    };
    let addrs = [a.session.addr(), b.session.addr()];
    assert!(addrs.iter().all(|&addr| inboxes(addr).len() == 1), "each device has its inbox while it runs");
    drop(daemon);
    let flushed = b.wait(1);
    assert_eq!((flushed[0].wr_id, flushed[0].status), (7, WcStatus::WrFlushErr));
    assert!(b.session.alloc_pd().is_err(), "the daemon is gone");
    for addr in addrs {
        assert_eq!(inboxes(addr), Vec::<String>::new(), "{addr}'s inbox is removed");
    }
}
