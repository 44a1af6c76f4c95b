//! The sharded engine under concurrency: several engine threads (shards,
//! with and without separate receive and send threads) and several
//! application threads, each driving its own QPs with every operation,
//! CQs fed by QPs of several shards, and QPs created and destroyed while
//! traffic flows. On a clean loopback the engine must not disturb itself:
//! no datagram reaches the wrong shard, arrives out of sequence, is NAKed
//! or is sent twice; every byte is checked. Each run goes over both wires,
//! UDP and shared memory, with the devices driven both ways: inline by the
//! application's posts and polls, and by dedicated engine threads.

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Barrier, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use softrnic::{
    Access, Completion, CompletionQueue, ConnectOptions, Context, DatapathKind, EngineConfig, FaultConfig,
    MemoryRegion, NicCounters, Payload, ProgressMode, QpCaps, QueuePair, RecvWorkRequest, SendOp, SendWorkRequest,
    WcOpcode, WcStatus,
};

/// The machine, as the tests share it. A run that must count no
/// self-inflicted retransmission holds it alone: on two cores, the other
/// tests' threads beside its own kept a thread off the CPU past the 67 ms
/// timeout often enough to fail CI. Tests that only check delivery share it.
static MACHINE: RwLock<()> = RwLock::new(());

fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Each test takes its own pair of addresses so tests can run in parallel.
static NEXT: AtomicU8 = AtomicU8::new(10);

fn addresses() -> (IpAddr, IpAddr) {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    (IpAddr::from([127, 0, 3, n]), IpAddr::from([127, 0, 3, n + 1]))
}

/// Where each part of a pair's region lies.
const SEND_AT: usize = 0;
const WRITE_AT: usize = 1 << 14;
const READ_AT: usize = 2 << 14;
const COUNTER_AT: usize = 3 << 14;
const ATOMIC_AT: usize = COUNTER_AT + 8;
const REGION: usize = 4 << 14;
/// Message sizes the rounds cycle through: one byte to four packets.
const SIZES: [usize; 6] = [1, 100, 4096, 4097, 9000, 16384];

fn pattern(len: usize, salt: u32) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(31).wrapping_add(salt).to_le_bytes()[0] ^ (i >> 8) as u8).collect()
}

/// One connected pair of QPs, A on the first device, B on the second.
struct Pair {
    a: QueuePair,
    b: QueuePair,
    a_mr: MemoryRegion,
    b_mr: MemoryRegion,
}

/// The QPs of one application thread, with a CQ per side that all of them
/// (spread over the shards round robin) share.
struct Lane {
    pairs: Vec<Pair>,
    a_cq: CompletionQueue,
    b_cq: CompletionQueue,
}

fn lane(a: &Context, b: &Context, pairs: usize, options: &ConnectOptions) -> Lane {
    let (pd_a, pd_b) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (a_cq, b_cq) = (a.create_cq(4096).unwrap(), b.create_cq(4096).unwrap());
    let pairs = (0..pairs)
        .map(|_| {
            let a_mr = pd_a.register(REGION, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
            let b_mr = pd_b.register(REGION, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
            let qa = pd_a.create_rc_qp(&a_cq, &a_cq, QpCaps::default()).unwrap();
            let qb = pd_b.create_rc_qp(&b_cq, &b_cq, QpCaps::default()).unwrap();
            qa.connect(&qb.endpoint(&b_mr), options).unwrap();
            qb.connect(&qa.endpoint(&a_mr), options).unwrap();
            Pair { a: qa, b: qb, a_mr, b_mr }
        })
        .collect();
    Lane { pairs, a_cq, b_cq }
}

/// Polls `cq` until `n` completions arrive.
fn collect(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let mut out = Vec::with_capacity(n);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        cq.poll(n - out.len(), &mut out);
        assert!(std::time::Instant::now() < deadline, "{} of {n} completions after 60 s", out.len());
    }
    out
}

/// `rounds` rounds of SEND, WRITE, WRITE with immediate, READ and
/// FETCH_ADD on every pair of the lane at once, every result checked.
fn run_lane(lane: &Lane, lane_id: u32, rounds: u32) {
    for p in &lane.pairs {
        p.b_mr.write(READ_AT, &pattern(16384, 0xbeef + lane_id));
    }
    for round in 0..rounds {
        let len = SIZES[round as usize % SIZES.len()];
        for (i, p) in lane.pairs.iter().enumerate() {
            let salt = lane_id * 1000 + round * 10 + i as u32;
            p.a_mr.write(0, &pattern(len, salt));
            let id = u64::from(round) << 8 | i as u64;
            p.b.post_recv(RecvWorkRequest {
                wr_id: id,
                sges: softrnic_transport::smallvec![p.b_mr.sge(SEND_AT, len as u32)],
            })
            .unwrap();
            p.b.post_recv(RecvWorkRequest { wr_id: id, sges: softrnic_transport::smallvec![] }).unwrap();
            let data = p.a_mr.gather(0, len as u32);
            let wrs = [
                SendWorkRequest::new(id, SendOp::Send { imm: None }, data.clone()),
                SendWorkRequest::new(id, SendOp::Write { remote: p.b_mr.remote(WRITE_AT), imm: None }, data),
                SendWorkRequest::new(
                    id,
                    SendOp::Write { remote: p.b_mr.remote(WRITE_AT), imm: Some(round) },
                    Payload::Inline(softrnic_transport::smallvec![]),
                ),
                SendWorkRequest::new(
                    id,
                    SendOp::Read { remote: p.b_mr.remote(READ_AT) },
                    p.a_mr.gather(READ_AT, len as u32),
                ),
                SendWorkRequest::new(
                    id,
                    SendOp::FetchAdd { remote: p.b_mr.remote(COUNTER_AT), add: 1 },
                    p.a_mr.gather(ATOMIC_AT, 8),
                ),
            ];
            for wr in wrs {
                p.a.post_send(wr).unwrap();
            }
        }
        let sent = collect(&lane.a_cq, 5 * lane.pairs.len());
        let received = collect(&lane.b_cq, 2 * lane.pairs.len());
        for c in sent.iter().chain(&received) {
            assert_eq!(c.status, WcStatus::Success, "lane {lane_id} round {round}: {c:?}");
            assert_eq!(c.wr_id >> 8, u64::from(round), "a completion of another round: {c:?}");
        }
        // Completions of one QP come in the order its requests were posted.
        for p in &lane.pairs {
            let opcodes: Vec<WcOpcode> = sent.iter().filter(|c| c.qp_num == p.a.qpn()).map(|c| c.opcode).collect();
            let posted =
                [WcOpcode::Send, WcOpcode::RdmaWrite, WcOpcode::RdmaWrite, WcOpcode::RdmaRead, WcOpcode::FetchAdd];
            assert_eq!(opcodes, posted, "QP {:#x}", p.a.qpn());
        }
        for (i, p) in lane.pairs.iter().enumerate() {
            let expected = pattern(len, lane_id * 1000 + round * 10 + i as u32);
            let mut got = vec![0u8; len];
            p.b_mr.read(SEND_AT, &mut got);
            assert!(got == expected, "SEND data, lane {lane_id} round {round} pair {i}");
            p.b_mr.read(WRITE_AT, &mut got);
            assert!(got == expected, "WRITE data, lane {lane_id} round {round} pair {i}");
            p.a_mr.read(READ_AT, &mut got);
            assert!(got == pattern(16384, 0xbeef + lane_id)[..len], "READ data, lane {lane_id} round {round}");
            let mut word = [0u8; 8];
            p.a_mr.read(ATOMIC_AT, &mut word);
            assert_eq!(u64::from_ne_bytes(word), u64::from(round), "FETCH_ADD saw the previous rounds");
        }
    }
}

/// How a test's devices run: their wire and who drives them.
#[derive(Debug, Clone, Copy)]
struct Mode {
    datapath: DatapathKind,
    progress: ProgressMode,
}

/// Both wires, each driven inline and by dedicated engine threads.
const MODES: [Mode; 4] = [
    Mode { datapath: DatapathKind::Udp, progress: ProgressMode::Inline },
    Mode { datapath: DatapathKind::Shm, progress: ProgressMode::Inline },
    Mode { datapath: DatapathKind::Udp, progress: ProgressMode::Dedicated },
    Mode { datapath: DatapathKind::Shm, progress: ProgressMode::Dedicated },
];

fn open(addr: IpAddr, shards: usize, split: bool, faults: FaultConfig, mode: Mode) -> Context {
    let Mode { datapath, progress } = mode;
    let config = EngineConfig { faults, datapath, progress, ..EngineConfig::new(addr).with_threads(shards, split) };
    let ctx = Context::with_config(config).expect("open");
    assert_eq!(ctx.shared_memory(), datapath == DatapathKind::Shm);
    assert_eq!(ctx.progress_mode(), progress);
    ctx
}

/// Runs `threads` application threads of `pairs` QP pairs each between two
/// devices of `shards` shards run as `mode` says; returns both devices'
/// counters.
fn workload(
    mode: Mode,
    shards: usize,
    split: bool,
    threads: u32,
    pairs: usize,
    faults: FaultConfig,
) -> [NicCounters; 2] {
    workload_recovering(mode, (shards, split), threads, pairs, faults, false)
}

/// [`workload`], with every connection recovering by selective repeat when
/// `selective_repeat` says so.
fn workload_recovering(
    mode: Mode,
    (shards, split): (usize, bool),
    threads: u32,
    pairs: usize,
    faults: FaultConfig,
    selective_repeat: bool,
) -> [NicCounters; 2] {
    let (addr_a, addr_b) = addresses();
    let a = open(addr_a, shards, split, faults, mode);
    let b = open(addr_b, shards, split, faults, mode);
    // A loaded two-core machine can keep a thread off the CPU for
    // milliseconds: a clean run keeps the default retransmission timeout
    // (67 ms), a faulty one a short one.
    let options = if faults.is_none() {
        ConnectOptions { selective_repeat, ..ConnectOptions::default() }
    } else {
        ConnectOptions { timeout: 10, min_rnr_timer: 1, selective_repeat, ..ConnectOptions::default() }
    };
    let lanes: Vec<Lane> = (0..threads).map(|_| lane(&a, &b, pairs, &options)).collect();
    if shards > 1 {
        let mut used: Vec<usize> = lanes.iter().flat_map(|l| &l.pairs).map(|p| p.a.qpn() as usize % shards).collect();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), shards, "QPs are spread over every shard");
    }
    let start = Arc::new(Barrier::new(threads as usize));
    std::thread::scope(|scope| {
        for (id, lane) in lanes.iter().enumerate() {
            let start = start.clone();
            scope.spawn(move || {
                start.wait();
                run_lane(lane, id as u32, 36);
            });
        }
    });
    [a.counters(), b.counters()]
}

/// Asserts that none of the counters `pick` names counted on either
/// device; on failure, says what ran and shows both devices whole (the
/// other side often says why).
fn assert_none(
    what: impl std::fmt::Debug,
    counters: &[NicCounters; 2],
    pick: impl Fn(&NicCounters) -> Vec<(&str, u64)>,
) {
    let counted: Vec<String> = ["A", "B"]
        .iter()
        .zip(counters)
        .flat_map(|(side, c)| {
            pick(c).into_iter().filter(|(_, n)| *n > 0).map(move |(name, n)| format!("{side}: {n} {name}"))
        })
        .collect();
    assert!(counted.is_empty(), "{what:?} counted {}\nA: {:?}\nB: {:?}", counted.join(", "), counters[0], counters[1]);
}

/// An engine thread kept from its shard this long, half the retransmission
/// timeout (67 ms), was stalled by the machine, not by its progress policy
/// (it sleeps at most 20 ms and wakes for every datagram; on two cores
/// with every test's threads, stalls reach about 13 ms): a peer's timer
/// may then fire though nothing was lost.
const MACHINE_STALL_US: u64 = 33_000;

/// Whether the machine stalled an engine thread of either device for
/// [`MACHINE_STALL_US`], said on stderr: the retransmission timeouts of a
/// clean run (and the retransmissions and duplicates they cause) are then
/// the machine's doing, not the engine's.
fn machine_stalled(what: impl std::fmt::Debug, counters: &[NicCounters; 2]) -> bool {
    let stall = counters.iter().map(|c| c.engine_stall_max_us).max().unwrap_or(0);
    if stall >= MACHINE_STALL_US {
        eprintln!("{what:?}: the machine stalled an engine thread for {stall} µs; retransmission timeouts are excused");
    }
    stall >= MACHINE_STALL_US
}

/// What a clean run must not count.
fn assert_undisturbed(what: impl std::fmt::Debug, counters: &[NicCounters; 2]) {
    let stalled = machine_stalled(&what, counters);
    assert_none(&what, counters, |c| {
        let t = &c.transport;
        let timer = |n: u64| if stalled { 0 } else { n };
        vec![
            ("rx_dropped_by_kernel", c.rx_dropped_by_kernel),
            ("rx_missteered", c.rx_missteered),
            ("rx_out_of_sequence", t.rx_out_of_sequence),
            ("seq_naks_sent", t.seq_naks_sent),
            ("seq_naks_received", t.seq_naks_received),
            ("retransmitted_packets", timer(t.retransmitted_packets)),
            ("timeouts", timer(t.timeouts)),
            ("rx_duplicate_requests", timer(t.rx_duplicate_requests)),
            ("rx_unknown_qp", t.rx_unknown_qp),
            ("tx_dropped_by_kernel", c.tx_dropped_by_kernel),
            ("rx_ring_malformed", c.rx_ring_malformed),
        ]
    });
    for c in counters {
        assert!(c.transport.rx_packets > 0 && c.transport.tx_packets > 0);
    }
}

/// Every clean configuration, on both wires, driven both ways.
fn undisturbed(shards: usize, split: bool, threads: u32, pairs: usize) {
    let _machine = alone();
    for mode in MODES {
        assert_undisturbed(
            (mode, shards, split, threads, pairs),
            &workload(mode, shards, split, threads, pairs, FaultConfig::default()),
        );
    }
}

#[test]
fn one_shard_three_application_threads() {
    undisturbed(1, false, 3, 3);
}

#[test]
fn two_shards_three_application_threads() {
    undisturbed(2, false, 3, 3);
}

#[test]
fn four_shards_two_application_threads() {
    undisturbed(4, false, 2, 4);
}

#[test]
fn split_receive_and_send_threads() {
    undisturbed(2, true, 2, 3);
}

#[test]
fn shards_through_a_hostile_network() {
    let _machine = shared();
    let faults = FaultConfig { loss: 0.02, reorder: 0.02, duplicate: 0.01, corrupt: 0.01 };
    for mode in MODES {
        hostile(mode, faults);
    }
}

/// Selective repeat across shards and application threads: on a clean
/// link nothing arrives out of order and no NAK is sent; through faults
/// every result is still right and the repairs really happened.
#[test]
fn selective_repeat_across_shards_and_threads() {
    let _machine = alone();
    for mode in MODES {
        let counters = workload_recovering(mode, (2, false), 2, 3, FaultConfig::default(), true);
        // Its timer is the adaptive one, whose probes a descheduled thread
        // may trigger; what must not happen is disorder.
        assert_none(("selective repeat", mode), &counters, |c| {
            let t = &c.transport;
            vec![
                ("rx_out_of_sequence", t.rx_out_of_sequence),
                ("rx_placed_out_of_order", t.rx_placed_out_of_order),
                ("selective_naks_sent", t.selective_naks_sent),
                ("seq_naks_sent", t.seq_naks_sent),
                ("rx_missteered", c.rx_missteered),
                ("rx_dropped_by_kernel", c.rx_dropped_by_kernel),
            ]
        });
        let faults = FaultConfig { loss: 0.02, reorder: 0.02, duplicate: 0.01, corrupt: 0.01 };
        let [a, b] = workload_recovering(mode, (2, false), 2, 3, faults, true);
        assert!(a.transport.rx_placed_out_of_order + b.transport.rx_placed_out_of_order > 0);
        assert_eq!(a.transport.seq_naks_received + b.transport.seq_naks_received, 0, "no go-back-N NAK");
    }
}

fn hostile(mode: Mode, faults: FaultConfig) {
    let [a, b] = workload(mode, 3, false, 2, 3, faults);
    // Every result was checked; the faults really happened.
    assert!(a.injected_tx.dropped + b.injected_tx.dropped > 0);
    assert!(a.transport.retransmitted_packets + b.transport.retransmitted_packets > 0);
    // Only a corrupted destination QP reaches the wrong shard (which hands
    // it on; its owner then drops it for its ICRC).
    assert!(a.rx_missteered + b.rx_missteered <= a.injected_tx.corrupted + b.injected_tx.corrupted);
}

/// A device with an inbox and one without: they talk over UDP both ways,
/// and the first has to notice datagrams on its socket although it also
/// watches its rings.
#[test]
fn a_shared_memory_device_talks_udp_to_one_without() {
    let _machine = shared();
    let (addr_a, addr_b) = addresses();
    let shm = Mode { datapath: DatapathKind::Shm, progress: ProgressMode::Inline };
    let udp = Mode { datapath: DatapathKind::Udp, progress: ProgressMode::Dedicated };
    let a = open(addr_a, 2, false, FaultConfig::default(), shm);
    let b = open(addr_b, 2, false, FaultConfig::default(), udp);
    let options = ConnectOptions::default();
    // B sends first (SENDs to A are in every round), then both ways.
    run_lane(&lane(&b, &a, 2, &options), 0, 12);
    run_lane(&lane(&a, &b, 2, &options), 1, 12);
    assert_undisturbed("shared memory and UDP devices", &[a.counters(), b.counters()]);
}

/// QPs created and destroyed on every shard while other QPs carry traffic:
/// the traffic is undisturbed and nothing leaks or hangs.
#[test]
fn create_and_destroy_race_traffic() {
    let _machine = shared();
    let (addr_a, addr_b) = addresses();
    let open =
        |addr, progress| open(addr, 3, false, FaultConfig::default(), Mode { datapath: DatapathKind::Shm, progress });
    let (a, b) = (open(addr_a, ProgressMode::Inline), open(addr_b, ProgressMode::Dedicated));
    let options = ConnectOptions::default();
    let busy = lane(&a, &b, 3, &options);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            run_lane(&busy, 0, 48);
            done.store(true, Ordering::Release);
        });
        scope.spawn(|| {
            let mut cycles = 0;
            while !done.load(Ordering::Acquire) || cycles < 20 {
                let churn = lane(&a, &b, 2, &options);
                for p in &churn.pairs {
                    p.a_mr.write(0, b"churn");
                    let wr = SendWorkRequest::new(
                        1,
                        SendOp::Write { remote: p.b_mr.remote(0), imm: None },
                        p.a_mr.gather(0, 5),
                    );
                    p.a.post_send(wr).unwrap();
                }
                for c in collect(&churn.a_cq, churn.pairs.len()) {
                    assert_eq!(c.status, WcStatus::Success);
                }
                drop(churn);
                cycles += 1;
            }
        });
    });
    let counters = [a.counters(), b.counters()];
    let stalled = machine_stalled("create and destroy", &counters);
    assert_none("create and destroy", &counters, |c| {
        let t = &c.transport;
        vec![
            ("rx_out_of_sequence", t.rx_out_of_sequence),
            ("seq_naks_sent", t.seq_naks_sent),
            ("retransmitted_packets", if stalled { 0 } else { t.retransmitted_packets }),
            ("rx_missteered", c.rx_missteered),
        ]
    });
}
