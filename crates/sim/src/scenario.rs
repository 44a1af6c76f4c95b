//! A whole simulated run from one seed: pairs of RC queue pairs between two
//! hosts, a random workload, a hostile network, then the oracle's verdict.

use std::sync::Arc;
use std::time::Duration;

use softrnic_transport::qp::QueuePair;
use softrnic_transport::time::ack_timeout;
use softrnic_transport::{
    Access, Choice, Completion, CqId, DmaBuffer, Instant, Mtu, Psn, QpCaps, QpInitAttr, QpState, QpType, RcConnection,
    Registration, Retransmission, SrqAttr, SrqId, TransportConfig, WcStatus,
};
use softrnic_wire::aeth;

use softrnic_switch::{Graph, LinkFaults, PfcConfig, PortConfig};

use crate::fabric::{FabricSpec, Link};
use crate::network::{Faults, NetworkStats};
use crate::workload::{EndpointPlan, GUARD, IOVA_BASE, PairPlan, RegionKeys, Shape, first_difference};
use crate::world::{Outage, OutageKind, World};

/// How hostile and how large a generated scenario may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_fault: f64,
    pub max_pairs: usize,
    pub ops_per_direction: usize,
    pub max_len: usize,
    /// Simulation steps before the run is declared stuck.
    pub max_steps: usize,
    /// Cross two switches (softrnic's switch pipeline) joined by a slower
    /// link, whose ports lose and reorder packets, instead of one faulty
    /// link.
    pub switched: bool,
    /// Draw faults beyond what the network does to packets: outages,
    /// clock jumps and crashes.
    pub host_faults: bool,
    /// The two hosts are devices of one machine ([`World::on_one_host`]):
    /// payloads by reference, packets spanning MTUs, no corruption.
    pub one_host: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_fault: 0.05,
            max_pairs: 3,
            ops_per_direction: 24,
            max_len: 4 << 20,
            max_steps: 20_000_000,
            switched: false,
            host_faults: true,
            one_host: false,
        }
    }
}

/// The networks a scenario's seeds run over, by the names the simulation
/// test's functions and `softrnic sim` give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// One link that drops, reorders, duplicates and corrupts packets.
    Hostile,
    /// Two of softrnic's switches joined by a slower link, whose ports
    /// lose and reorder packets.
    Switched,
    /// Two devices of one machine, whose packets carry references to
    /// each other's memory in place of payloads (spanning several MTUs),
    /// over a link that drops, reorders and duplicates them (but cannot
    /// corrupt them: that path has no ICRC).
    OneHost,
}

impl Network {
    pub const ALL: [Network; 3] = [Network::Hostile, Network::Switched, Network::OneHost];

    pub fn name(self) -> &'static str {
        match self {
            Network::Hostile => "hostile",
            Network::Switched => "switched",
            Network::OneHost => "one_host",
        }
    }

    /// The network `name` names.
    pub fn parse(name: &str) -> Result<Network, String> {
        Network::ALL
            .into_iter()
            .find(|n| n.name() == name)
            .ok_or_else(|| format!("`{name}` is not a simulated network; give hostile, switched or one_host"))
    }

    /// The default limits over this network.
    pub fn limits(self) -> Limits {
        Limits { switched: self == Network::Switched, one_host: self == Network::OneHost, ..Limits::default() }
    }

    /// The command that runs `seed` over this network again, its trace
    /// with `SOFTRNIC_SIM_TRACE=1` before it.
    pub fn replay(self, seed: u64) -> String {
        format!("SOFTRNIC_SIM_SEED={seed} cargo test --release -p softrnic-sim --test simulation {}", self.name())
    }
}

/// What a passing run did, for reports and for tests that check coverage.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub network: NetworkStats,
    pub virtual_time: Duration,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub tail_loss_probes: u64,
    /// Whether the QPs timed retransmissions adaptively.
    pub adaptive: bool,
    /// Whether the QPs recovered by selective repeat.
    pub selective_repeat: bool,
    /// Request packets placed before the ones ahead of them arrived.
    pub placed_out_of_order: u64,
    pub rnr_naks: u64,
    /// Messages that waited for end-to-end credits, and probes sent at
    /// zero credits.
    pub credit_waits: u64,
    pub credit_probes: u64,
    /// Requesters that spent their RNR retries (allowed only where the
    /// peer's application let its receives run out).
    pub rnr_retries_spent: usize,
    /// Requesters with fewer than 7 RNR retries (0 among them) whose
    /// peers kept their receives posted: credits had to spare them every
    /// RNR NAK but the probes'.
    pub credits_relied_on: usize,
    pub seq_naks: u64,
    pub duplicates: u64,
    pub icrc_drops: u64,
    /// Packets sent with their payload by reference, and of those the ones
    /// that stood for several MTUs (on one host).
    pub by_reference: u64,
    pub spanning: u64,
}

/// One endpoint while the run goes on.
struct Live {
    host: usize,
    qpn: u32,
    cq: CqId,
    buffer: Arc<DmaBuffer>,
    keys: RegionKeys,
    caps: QpCaps,
    posted_ops: usize,
    posted_recvs: usize,
    /// Receives this endpoint keeps posted at most; small values make the
    /// peer meet RNR NAKs.
    recv_window: usize,
    /// Receives go to this shared receive queue (the QP's alone, so the
    /// oracle still knows which buffer each message lands in).
    srq: Option<SrqId>,
    /// A slow application posts at most one receive per period, so that
    /// SENDs meet RNR NAKs.
    recv_period: Option<Duration>,
    next_recv_post: Instant,
    /// An application that stops posting receives for a while: the peer's
    /// SENDs meet RNR NAKs until it starts again.
    recv_pause: Option<(Instant, Instant)>,
    sends_done: Vec<Completion>,
    recvs_done: Vec<Completion>,
    /// The responder's expected PSN when last looked at: it never goes back.
    epsn: Option<Psn>,
    /// Its host crashed and restarted: its QP and memory are gone.
    gone: bool,
    /// The RNR retries its requester has (7: for ever).
    rnr_retry: u8,
    /// Whether its requester may spend them: its peer's application lets
    /// the receives run out (it pauses, posts slowly, or shares an SRQ,
    /// which counts no credits). Where the peer keeps its receives posted,
    /// end-to-end credits must keep every SEND from an RNR NAK but the
    /// probes, and the probes find the receives posted since.
    may_spend_rnr_retries: bool,
    /// Its requester spent them: the pair ends as a crash would end it.
    rnr_retries_spent: bool,
}

/// Two hosts on two switches: 100 Gb/s host links, a 25 Gb/s link between
/// the switches (its queue fills and marks), a 1 MB buffer each (it may
/// overflow, unless the fabric is `lossless`), and every port losing and
/// reordering as `faults` says.
fn two_switches(faults: Faults, seed: u64, lossless: bool) -> FabricSpec {
    fn port(link: &Link) -> PortConfig {
        PortConfig::new(link.rate_bps, 512_000)
    }
    /// PFC pauses a sender that holds a quarter of the port's 512 KB
    /// queue, leaving room for what is on its 1 µs link when it stops.
    fn lossless_port(link: &Link) -> PortConfig {
        PortConfig { pfc: Some(PfcConfig { xoff: 128_000, xon: 96_000 }), ..port(link) }
    }
    let host = Link { rate_bps: 100_000_000_000, delay: Duration::from_micros(1) };
    let spine = Link { rate_bps: 25_000_000_000, delay: Duration::from_micros(2) };
    FabricSpec {
        graph: Graph { switches: 2, host_switch: vec![0, 1], links: vec![(0, 1)] },
        host_links: vec![host; 2],
        switch_links: vec![spine],
        port: if lossless { lossless_port } else { port },
        shared_buffer: 1_000_000,
        seed,
        faults: LinkFaults {
            loss: faults.loss,
            reorder: faults.reorder,
            reorder_by: faults.reorder_window,
            ..LinkFaults::NONE
        },
        aggregation: None,
    }
}

/// Runs `seed` over `network` and judges it: [`run`]'s verdict, or the
/// message of an invariant the transport asserted on the way (a panic,
/// caught so that one seed's failure is reported as any other).
pub fn judge(seed: u64, network: Network) -> Result<Outcome, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(seed, network.limits()))) {
        Ok(verdict) => verdict,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic without a message");
            Err(format!("panicked: {message}"))
        }
    }
}

/// Runs the scenario of `seed` and checks every invariant; the error says
/// which one failed and how to replay it.
pub fn run(seed: u64, limits: Limits) -> Result<Outcome, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mtu = [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096][rng.usize(..5)];
    let faults = Faults::random(&mut rng, limits.max_fault);
    // Switch ports lose and reorder; they neither duplicate nor corrupt,
    // and the replay line says what the run had.
    let faults = if limits.switched { Faults { duplicate: 0.0, corrupt: 0.0, ..faults } } else { faults };
    // Nor can one host's path be corrupted unnoticed: it carries no ICRC.
    let faults = if limits.one_host { Faults { corrupt: 0.0, ..faults } } else { faults };
    // Half the seeds time retransmissions adaptively, some with a floor
    // below the path's RTT (spurious retransmissions must be harmless).
    let retransmission = match rng.u8(0..4) {
        0 | 1 => Retransmission::Fixed,
        2 => Retransmission::ADAPTIVE,
        _ => Retransmission::Adaptive { floor: Duration::from_micros(rng.u64(1..=50)) },
    };
    // Half the seeds recover by selective repeat (which always times
    // adaptively, with the floor drawn here if there is one), the other
    // half by go-back-N.
    let selective_repeat = rng.bool();
    let mut config = TransportConfig {
        max_inflight_packets: [4, 16, 64, 512][rng.usize(..4)],
        ack_request_interval: [1, 4, 32][rng.usize(..3)],
        retransmission,
        ..TransportConfig::default()
    };
    // Across switches, the QPs run a congestion-control algorithm (or
    // none): every invariant must hold whatever it does to the rate. Drawn
    // from a stream of its own, so each seed's workload and faults stay
    // what they were before congestion control joined the draw.
    if limits.switched {
        let names = ["none", "dcqcn", "dctcp", "timely", "hpcc", "swift"];
        let name = names[fastrand::Rng::with_seed(seed ^ 0xcc).usize(..names.len())];
        config.congestion.algorithm = (name != "none").then(|| Choice::builtin(name, "").expect("a built-in"));
        config.congestion.int = true;
    }
    let pairs = rng.usize(1..=limits.max_pairs);
    // Several MiB at large MTUs; at most 2048 packets a message at small ones.
    let max_len = limits.max_len.min(mtu.bytes() as usize * 2048);
    let shape = Shape { ops_per_direction: limits.ops_per_direction, max_len, mtu };
    let plans: Vec<PairPlan> = (0..pairs).map(|p| PairPlan::generate(&mut rng, p, &shape)).collect();
    // Go-back-N with no congestion control runs, as RoCE does, only over
    // a lossless fabric (PFC). Over tail-drop queues it collapses, on a
    // NIC as here: QPs blasting at 100 Gb/s into the 25 Gb/s link keep its
    // queue full, each timeout sends a whole window again into it, and a
    // full-size packet meets a full queue every time while the small ones
    // behind it fit (seed 7006859: one SEND's 4 KB packet dropped at all
    // 8 of its tries, among 34,845 tail drops). Selective repeat, or any
    // algorithm, must cope with the drops.
    let lossless = !selective_repeat && config.congestion.algorithm.is_none();
    let cc = match &config.congestion.algorithm {
        Some(algorithm) => algorithm.name().to_string(),
        None if limits.switched && lossless => "no congestion control, PFC".to_string(),
        None => "no congestion control".to_string(),
    };
    let mut world = match limits.switched {
        false => World::with_config(2, faults, seed, config),
        true => World::with_fabric(&two_switches(faults, seed, lossless), config),
    };
    let (jump, crash) = match limits.host_faults {
        true => (clock_jump(seed), crash(seed)),
        false => (None, None),
    };
    if limits.host_faults {
        world.outages = outages(seed);
    }
    if limits.one_host {
        world.on_one_host();
    }
    let recovery = if selective_repeat { "selective repeat" } else { "go-back-N" };
    let wire = if limits.one_host { ", one host: payloads by reference" } else { "" };
    let context = format!(
        "seed {seed} (mtu {}, {pairs} pair(s), faults {faults:?}, outages {:?}, clock jump {jump:?}, crash {crash:?}, {retransmission:?}, {recovery}, {cc}{wire})",
        mtu.bytes(),
        world.outages
    );

    // Set up both ends of every pair and connect them.
    let mut live: Vec<[Live; 2]> = Vec::new();
    let mut rnr_retries = rnr_retries(seed);
    let mut pauses = fastrand::Rng::with_seed(seed ^ 0x9a05);
    for plan in &plans {
        let mut ends = [0, 1].map(|host| open_endpoint(&mut world, host, &plan.ends[host], &mut rng));
        for end in &mut ends {
            end.recv_pause = recv_pause(&mut pauses);
        }
        let rd_atomic = [rng.u8(1..=16), rng.u8(1..=16)];
        for side in 0..2 {
            let peer = &ends[1 - side];
            let peer_runs_out = peer.srq.is_some() || peer.recv_period.is_some() || peer.recv_pause.is_some();
            let drawn = rnr_retries();
            // A requester may spend its RNR retries only on the hostile
            // network. Across the switches the pair it fails would leave
            // its survivor sending whole windows again at line rate into
            // the shared 25 Gb/s queue at each timeout (go-back-N, as a
            // NIC does), and with timers in step another pair's full-size
            // packet can meet a full queue at every try (seed 20010176:
            // pair 1's 4 KB SEND dropped at all 8 of its tries behind pair
            // 0's survivor, a tail-drop starvation that is the network's,
            // as 7006859's was). There, credits alone are judged: a peer
            // that keeps its receives posted.
            let rnr_retry = if limits.switched && peer_runs_out { 7 } else { drawn };
            ends[side].rnr_retry = rnr_retry;
            ends[side].may_spend_rnr_retries = rnr_retry < 7 && peer_runs_out;
            let (me, peer) = (&ends[side], &ends[1 - side]);
            let limits = (rd_atomic[side], rd_atomic[1 - side]);
            connect(&mut world, me, peer.qpn, mtu, limits, selective_repeat, &mut rng)
                .map_err(|e| format!("{context}: connect: {e}"))?;
            // Now and then congestion control would pace a QP.
            if rng.u8(0..10) == 0 {
                let rate = rng.u64(1..=50) * 1_000_000_000;
                let now = world.clock(me.host);
                world.device(me.host).set_qp_rate_limit(now, me.qpn, Some(rate)).map_err(|e| e.to_string())?;
            }
        }
        live.push(ends);
    }

    // The safety phase, faults on, until `heal_at`; then the liveness
    // phase: the network heals, and no QP with work may stall longer than
    // its timers allow. Invariants are checked at every step of both.
    let heal_at = Instant::ZERO + heal_after(seed);
    let mut healed: Option<Instant> = None;
    let mut jumped: Option<Instant> = None;
    let mut crashed: Option<Instant> = None;
    let mut broken: Option<String> = None;
    // Send completions each end expects, counted once: the loop below asks
    // at every step.
    let sends_expected: Vec<[usize; 2]> =
        plans.iter().map(|plan| plan.ends.each_ref().map(|end| end.expected_send_completions().len())).collect();
    let finished = world.run_until(
        |world| {
            if let Some(crash) = crash
                && crashed.is_none()
                && world.now >= crash.at
            {
                world.restart(crash.host);
                live.iter_mut().flatten().filter(|end| end.host == crash.host).for_each(|end| end.gone = true);
                crashed = Some(world.now);
            }
            let mut all_done = true;
            for (p, (plan, ends)) in plans.iter().zip(live.iter_mut()).enumerate() {
                let keys = [ends[0].keys, ends[1].keys];
                for side in 0..2 {
                    let end = &mut ends[side];
                    let plan = &plan.ends[side];
                    if let Err(invariant) = drive(world, end, plan, keys[1 - side]) {
                        broken = Some(format!("pair {p} side {side} at {:?}: {invariant}", world.now - Instant::ZERO));
                        return true;
                    }
                    let ended = crashed.is_some() || failed_on_rnr(ends);
                    let end = &ends[side];
                    all_done &= match ended {
                        // Every pair spans the two hosts: once one has
                        // crashed, or a requester has spent its RNR retries
                        // and its QP has failed, the ends left are done when
                        // every request is posted and none is left (done,
                        // failed or flushed). Their receives may wait for
                        // ever: a responder has no timer to notice its peer
                        // gone.
                        true => {
                            end.gone
                                || (end.posted_ops == plan.ops.len()
                                    && world.device(end.host).qp(end.qpn).is_some_and(|qp| qp.send_queue_len() == 0))
                        }
                        false => {
                            end.sends_done.len() == sends_expected[p][side] && end.recvs_done.len() == plan.recvs.len()
                        }
                    };
                }
            }
            if let Some(at) = crashed
                && let Some(hung) = hung_on_a_dead_peer(world, &live, at)
            {
                broken = Some(format!(
                    "host {} crashed at {:?}, then {hung}",
                    crash.map_or(0, |c| c.host),
                    at - Instant::ZERO
                ));
                return true;
            }
            if let Some(jump) = jump
                && jumped.is_none()
                && world.now >= jump.at
            {
                world.jump_clock(jump.host, jump.by);
                jumped = Some(world.now);
            }
            if healed.is_none() && world.now >= heal_at && !all_done {
                // Every fault ends: the network's, and the applications'
                // pauses in posting receives.
                world.heal();
                live.iter_mut().flatten().for_each(|end| end.recv_pause = None);
                healed = Some(world.now);
            }
            if let Some(at) = healed
                && crashed.is_none()
                && let Some(stall) = stalled(world, &live, at.max(jumped.unwrap_or(at)))
            {
                broken = Some(format!("the network healed at {:?}, then {stall}", at - Instant::ZERO));
                return true;
            }
            all_done
        },
        limits.max_steps,
    );
    if (!finished || broken.is_some()) && std::env::var_os("SOFTRNIC_SIM_TRACE").is_some() {
        for (p, ends) in live.iter().enumerate() {
            for (side, end) in ends.iter().enumerate() {
                let state = world.device(end.host).qp(end.qpn).map(|qp| format!("{qp:#?}"));
                println!("pair {p} side {side}: {}", state.unwrap_or_default());
            }
        }
    }
    if let Some(invariant) = broken {
        return Err(format!("{context}: {invariant}"));
    }
    // A run that stopped unfinished says where every QP with work stood.
    let stuck = match finished {
        true => String::new(),
        false => {
            format!(" (the run stopped at {:?}: {})", world.now - Instant::ZERO, unfinished(&world, &plans, &live))
        }
    };
    // A pair that a crash or spent RNR retries ended is judged as a
    // survivor; every other pair as planned, to the byte.
    let ended = |ends: &[Live; 2]| crashed.is_some() || failed_on_rnr(ends);
    survived(&world, &plans, &live, &ended, finished).map_err(|e| format!("{context}: {e}{stuck}"))?;
    let planned = || plans.iter().zip(&live).enumerate().filter(|(_, (_, ends))| !ended(ends));
    for (p, (plan, ends)) in planned() {
        for (side, (end, plan)) in ends.iter().zip(&plan.ends).enumerate() {
            let who = format!("{context}: pair {p} side {side}");
            let expected_recvs: Vec<_> = plan.recvs.iter().map(|r| r.expect).collect();
            check_completions(&who, "send", &end.sends_done, &plan.expected_send_completions())
                .map_err(|e| format!("{e}{stuck}"))?;
            check_completions(&who, "receive", &end.recvs_done, &expected_recvs).map_err(|e| format!("{e}{stuck}"))?;
            let state = world.device(end.host).qp(end.qpn).map(|qp| qp.state());
            if state != Some(QpState::Rts) {
                return Err(format!("{who}: QP ended in {state:?}"));
            }
        }
    }
    if !finished {
        return Err(format!("{context}: the run stopped before every request completed{stuck}"));
    }
    // Only now has every peer finished writing into every buffer.
    for (p, (plan, ends)) in planned() {
        for (side, (end, plan)) in ends.iter().zip(&plan.ends).enumerate() {
            if let Some(diff) = first_difference(&end.buffer.to_vec(), &plan.expected) {
                return Err(format!("{context}: pair {p} side {side}: memory differs from the oracle: {diff}"));
            }
        }
    }
    Ok(outcome(&world, &live, retransmission, selective_repeat))
}

/// What a run did, counted.
fn outcome(world: &World, live: &[[Live; 2]], retransmission: Retransmission, selective_repeat: bool) -> Outcome {
    let counters = [world.hosts[0].device.counters().clone(), world.hosts[1].device.counters().clone()];
    let sum = |f: fn(&softrnic_transport::Counters) -> u64| counters.iter().map(f).sum();
    Outcome {
        network: match &world.fabric {
            Some(fabric) => NetworkStats { dropped: fabric.dropped(), ..fabric.stats },
            None => world.network.stats,
        },
        virtual_time: world.now - Instant::ZERO,
        retransmitted: sum(|c| c.retransmitted_packets),
        timeouts: sum(|c| c.timeouts),
        tail_loss_probes: sum(|c| c.tail_loss_probes),
        // Selective repeat always times adaptively.
        adaptive: retransmission != Retransmission::Fixed || selective_repeat,
        selective_repeat,
        placed_out_of_order: sum(|c| c.rx_placed_out_of_order),
        rnr_naks: sum(|c| c.rnr_naks_sent),
        credit_waits: sum(|c| c.credit_waits),
        credit_probes: sum(|c| c.credit_probes),
        rnr_retries_spent: live.iter().flatten().filter(|end| end.rnr_retries_spent).count(),
        credits_relied_on: live.iter().flatten().filter(|end| end.rnr_retry < 7 && !end.may_spend_rnr_retries).count(),
        seq_naks: sum(|c| c.seq_naks_sent + c.selective_naks_sent),
        duplicates: sum(|c| c.rx_duplicate_requests + c.rx_duplicate_responses),
        icrc_drops: sum(|c| c.rx_icrc_errors),
        by_reference: sum(|c| c.tx_by_reference),
        spanning: sum(|c| c.tx_spanning),
    }
}

/// The verdict on the pairs that a host's crash, or a requester that
/// spent its RNR retries, `ended`: on every surviving end, the
/// completions are what the plan expects for as long as they succeed,
/// then at most one `RetryExcErr` or `RnrRetryExcErr` (the request the
/// peer never answered, or never had a receive for) and flushes; its QP
/// is in RTS only if nothing was left to fail. Bytes are not compared:
/// what the peer wrote before it ended depends on when it did.
fn survived(
    world: &World,
    plans: &[PairPlan],
    live: &[[Live; 2]],
    ended: &dyn Fn(&[Live; 2]) -> bool,
    finished: bool,
) -> Result<(), String> {
    if !finished && live.iter().any(ended) {
        return Err("the run stopped before every surviving request was done, failed or flushed".into());
    }
    for (p, (plan, ends)) in plans.iter().zip(live).enumerate().filter(|(_, (_, ends))| ended(ends)) {
        for (side, (end, plan)) in ends.iter().zip(&plan.ends).enumerate() {
            if end.gone {
                continue;
            }
            let who = format!("pair {p} side {side}");
            let expected_recvs: Vec<_> = plan.recvs.iter().map(|r| r.expect).collect();
            let failed = until_failure(&who, "send", &end.sends_done, &plan.expected_send_completions())?;
            until_failure(&who, "receive", &end.recvs_done, &expected_recvs)?;
            let state = world.hosts[end.host].device.qp(end.qpn).map(|qp| qp.state());
            let expected = if failed { QpState::Error } else { QpState::Rts };
            if state != Some(expected) {
                return Err(format!("{who}: QP ended in {state:?}, expected {expected:?}"));
            }
        }
    }
    Ok(())
}

/// Checks completions that succeed as planned up to a failure, then fail
/// once with `RetryExcErr` or `RnrRetryExcErr` (sends only) and flush;
/// returns whether one failed or flushed.
fn until_failure(
    who: &str,
    queue: &str,
    actual: &[Completion],
    expected: &[crate::workload::ExpectedCompletion],
) -> Result<bool, String> {
    let succeeded = actual.iter().take_while(|c| c.status == WcStatus::Success).count();
    check_completions(who, queue, &actual[..succeeded], &expected[..succeeded.min(expected.len())])?;
    let mut rest = actual[succeeded..].iter();
    if queue == "send"
        && let Some(first) = actual.get(succeeded)
        && matches!(first.status, WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr)
    {
        rest.next();
    }
    if let Some(c) = rest.find(|c| c.status != WcStatus::WrFlushErr) {
        let statuses: Vec<_> = actual.iter().map(|c| (c.wr_id, c.status)).collect();
        return Err(format!("{who}: after the pair failed, {queue} completion {c:?} (all: {statuses:?})"));
    }
    Ok(succeeded < actual.len())
}

/// Once a host has crashed, the first surviving QP whose requests are
/// not all done, failed or flushed within its retries: its ACK timeout for
/// each retry and once more, and one timeout of slack for where the
/// timer's expiries fall, since the crash or the QP's last progress after
/// it (what the dead host sent before it crashed still arrives, and a
/// retry is spent only when a whole timeout passes without progress).
fn hung_on_a_dead_peer(world: &World, live: &[[Live; 2]], crashed: Instant) -> Option<String> {
    for (p, ends) in live.iter().enumerate() {
        for (side, end) in ends.iter().enumerate() {
            let Some(qp) = world.hosts[end.host].device.qp(end.qpn) else { continue };
            if end.gone || qp.send_queue_len() == 0 {
                continue;
            }
            let bound = dead_peer_bound(qp);
            let since = qp.last_progress().max(crashed + world.hosts[end.host].clock_ahead);
            let waited = world.clock(end.host) - since;
            if waited > bound {
                return Some(format!(
                    "pair {p} side {side} (QP {:#x}) still had work after {waited:?} (its retries allow {bound:?}): {:?}, {}",
                    end.qpn,
                    qp.state(),
                    qp.progress()
                ));
            }
        }
    }
    None
}

/// The outages of a seed's network, drawn from a stream of their own (so
/// that each seed's workload and faults stay what they were): a quarter
/// of the seeds clog one direction, a quarter partition the hosts, each
/// for 50 µs to 2 ms within the first 5 ms. Two milliseconds is less
/// than any QP's retries last (its ACK timeout, at least 1 ms, eight
/// times), so every request must still complete.
fn outages(seed: u64) -> Vec<Outage> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x0c10);
    let mut outages = Vec::new();
    for kind in [OutageKind::Clog, OutageKind::Partition] {
        if rng.u8(0..4) == 0 {
            let from = Instant::ZERO + Duration::from_micros(rng.u64(0..5000));
            let until = from + Duration::from_micros(rng.u64(50..=2000));
            let between = if rng.bool() { (0, 1) } else { (1, 0) };
            outages.push(Outage { kind, between, from, until });
        }
    }
    outages
}

/// One host's clock jumping forward, as a monotonic clock does when its
/// host was frozen and resumes: every timer due in the skipped time fires
/// at once, and round trips timed across the jump look that much longer.
#[derive(Debug, Clone, Copy)]
pub struct ClockJump {
    pub host: usize,
    pub at: Instant,
    pub by: Duration,
}

/// Whether a seed's run has a clock jump, drawn from a stream of its own:
/// one seed in four, on either host, within the first 5 ms, by 10 µs to
/// 100 ms (log-uniform; the QPs' timeouts are 1 to 17 ms).
fn clock_jump(seed: u64) -> Option<ClockJump> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x71e7);
    (rng.u8(0..4) == 0).then(|| ClockJump {
        host: rng.usize(..2),
        at: Instant::ZERO + Duration::from_micros(rng.u64(0..5000)),
        by: Duration::from_secs_f64(1e-5 * 10f64.powf(rng.f64() * 4.0)),
    })
}

/// A host that crashes and comes back at once with a fresh device
/// ([`World::restart`]): its QPs are gone, and the peers' QPs must fail
/// their requests and flush the rest, never hang.
#[derive(Debug, Clone, Copy)]
pub struct Crash {
    pub host: usize,
    pub at: Instant,
}

/// Whether a seed's run has a crash, drawn from a stream of its own: one
/// seed in eight, either host, within the first 5 ms.
fn crash(seed: u64) -> Option<Crash> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xc7a5);
    (rng.u8(0..8) == 0)
        .then(|| Crash { host: rng.usize(..2), at: Instant::ZERO + Duration::from_micros(rng.u64(0..5000)) })
}

/// Whether an endpoint's application stops posting receives for a while,
/// and when: one in four, for 100 µs to 3 ms within the first 5 ms (its
/// QP retries RNR for ever, so the peer's SENDs wait it out).
fn recv_pause(rng: &mut fastrand::Rng) -> Option<(Instant, Instant)> {
    (rng.u8(0..4) == 0).then(|| {
        let from = Instant::ZERO + Duration::from_micros(rng.u64(0..5000));
        (from, from + Duration::from_micros(rng.u64(100..=3000)))
    })
}

/// Whether a pair failed because a requester spent its RNR retries: it
/// ends then as a crash ends a pair.
fn failed_on_rnr(ends: &[Live; 2]) -> bool {
    ends.iter().any(|end| end.rnr_retries_spent)
}

/// The RNR retries each requester gets, in the order the pairs' ends are
/// connected, drawn from a stream of their own: one in three fewer than
/// "for ever" (0 to 6), where end-to-end credits and the oracle's view of
/// the peer decide whether they may run out.
fn rnr_retries(seed: u64) -> impl FnMut() -> u8 {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x2e72);
    move || if rng.u8(0..3) == 0 { rng.u8(0..=6) } else { 7 }
}

/// When a seed's network heals: drawn from a stream of its own (so that
/// each seed's workload and faults stay what they were), log-uniform
/// from 1 ms to 100 ms of virtual time. Most runs finish sooner and keep
/// their faults to the end; the longer ones (the hardest: the largest
/// messages, the worst faults) are the ones whose end needs proving.
fn heal_after(seed: u64) -> Duration {
    let exponent = fastrand::Rng::with_seed(seed ^ 0x4ea1).f64() * 2.0;
    Duration::from_secs_f64(1e-3 * 10f64.powf(exponent))
}

/// How long a QP with work to do may go without progress once the
/// network has healed: its own horizon, its local ACK timeout for each of
/// its retries and once more, each after the pacer lets its packet go,
/// and its RNR timer for each RNR retry and once more. A requester that
/// waited longer on a healed network would either have failed its request
/// already or be waiting on something no timer watches.
fn stall_bound(qp: &QueuePair) -> Duration {
    let a = qp.attributes();
    let try_once = ack_timeout(a.timeout).unwrap_or_default() + qp.pacing_gap();
    let ack = try_once * (u32::from(a.retry_cnt) + 1);
    let rnr = Duration::from_nanos(aeth::rnr_timer_nanos(a.min_rnr_timer)) * (u32::from(a.rnr_retry) + 1);
    ack + rnr
}

/// How long a QP whose peer is gone (crashed, or failed) may take to fail
/// its requests: its [`stall_bound`], and one timeout of slack for where
/// its timer's expiries fall.
fn dead_peer_bound(qp: &QueuePair) -> Duration {
    stall_bound(qp) + ack_timeout(qp.attributes().timeout).unwrap_or_default()
}

/// The first QP that has had work to do and no progress for longer than
/// its [`stall_bound`] since `from` (when the network healed, or a clock
/// jumped after that), described. Each QP is timed by its host's clock.
/// A QP whose peer has failed (it spent its RNR retries) waits as on a
/// crashed peer, with one timeout of slack for where its timer's
/// expiries fall ([`hung_on_a_dead_peer`]).
fn stalled(world: &World, live: &[[Live; 2]], from: Instant) -> Option<String> {
    for (p, ends) in live.iter().enumerate() {
        let peer_failed = failed_on_rnr(ends);
        for (side, end) in ends.iter().enumerate() {
            let Some(qp) = world.hosts[end.host].device.qp(end.qpn) else { continue };
            let ahead = world.hosts[end.host].clock_ahead;
            let since = qp.last_progress().max(from + ahead);
            let bound = if peer_failed { dead_peer_bound(qp) } else { stall_bound(qp) };
            let waited = world.clock(end.host) - since;
            if qp.send_queue_len() > 0 && waited > bound {
                return Some(format!(
                    "pair {p} side {side} (QP {:#x}) made no progress for {:?} (its timers allow {bound:?}): {:?}, {}",
                    end.qpn,
                    waited,
                    qp.state(),
                    qp.progress()
                ));
            }
        }
    }
    None
}

/// Which QPs still had work, and where each stood.
fn unfinished(world: &World, plans: &[PairPlan], live: &[[Live; 2]]) -> String {
    let mut lines = Vec::new();
    for (p, (plan, ends)) in plans.iter().zip(live).enumerate() {
        for (side, (end, plan)) in ends.iter().zip(&plan.ends).enumerate() {
            let (sent, received) = (end.sends_done.len(), end.recvs_done.len());
            let (sends, recvs) = (plan.expected_send_completions().len(), plan.recvs.len());
            if sent == sends && received == recvs {
                continue;
            }
            let qp = world.hosts[end.host].device.qp(end.qpn);
            let state = qp.map_or("gone".to_string(), |qp| format!("{:?}, {}", qp.state(), qp.progress()));
            lines.push(format!(
                "pair {p} side {side} (QP {:#x}): {sent} of {sends} send and {received} of {recvs} receive completions, {state}",
                end.qpn
            ));
        }
    }
    lines.join("; ")
}

fn open_endpoint(world: &mut World, host: usize, plan: &EndpointPlan, rng: &mut fastrand::Rng) -> Live {
    let device = world.device(host);
    let pd = device.alloc_pd();
    let cq = device.create_cq(1 << 16);
    let buffer = world.buffer(&plan.initial);
    let device = world.device(host);
    let mr = device
        .register_memory(Registration {
            pd,
            buffer: buffer.clone(),
            offset: GUARD,
            len: plan.region_len(),
            iova: IOVA_BASE,
            access: Access::LOCAL_WRITE | Access::REMOTE,
        })
        .expect("register");
    let caps = QpCaps { max_send_wr: rng.u32(1..=64), max_recv_wr: 64, ..QpCaps::default() };
    let srq = (rng.u8(0..4) == 0)
        .then(|| device.create_srq(pd, SrqAttr { max_wr: 64, max_sge: 16, limit: 0 }).expect("create_srq"));
    let init = QpInitAttr { qp_type: QpType::Rc, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: false, srq };
    let qpn = device.create_qp(init).expect("create qp");
    Live {
        host,
        qpn,
        cq,
        buffer,
        keys: RegionKeys { iova: IOVA_BASE, lkey: mr.lkey, rkey: mr.rkey },
        caps,
        posted_ops: 0,
        posted_recvs: 0,
        recv_window: rng.usize(1..=8),
        recv_period: rng.bool().then(|| Duration::from_micros(rng.u64(1..=50))),
        srq,
        next_recv_post: Instant::ZERO,
        recv_pause: None,
        sends_done: Vec::new(),
        recvs_done: Vec::new(),
        epsn: None,
        gone: false,
        rnr_retry: 7,
        may_spend_rnr_retries: false,
        rnr_retries_spent: false,
    }
}

/// Connects `me` to the peer's QP; `rd_atomic` is what this end issues and
/// what the peer does.
fn connect(
    world: &mut World,
    me: &Live,
    peer_qpn: u32,
    mtu: Mtu,
    (max_rd_atomic, peer_max_rd_atomic): (u8, u8),
    selective_repeat: bool,
    rng: &mut fastrand::Rng,
) -> softrnic_transport::Result<()> {
    // Both ends agree on PSNs; start near the wrap now and then.
    let psn = |qpn: u32| Psn::new(qpn.wrapping_mul(0x9e37_79b9) ^ 0xff_ff00);
    let connection = RcConnection {
        access: Access::REMOTE,
        remote_addr: world.ip(1 - me.host),
        dest_qpn: peer_qpn,
        rq_psn: psn(peer_qpn),
        sq_psn: psn(me.qpn),
        mtu,
        // Our responder must allow as many READ/ATOMIC as the peer issues.
        max_dest_rd_atomic: peer_max_rd_atomic,
        max_rd_atomic,
        min_rnr_timer: rng.u8(1..=4),
        timeout: rng.u8(8..=12),
        retry_cnt: 7,
        rnr_retry: me.rnr_retry,
        selective_repeat,
        authenticate: false,
    };
    let now = world.clock(me.host);
    for attr in connection.steps() {
        world.device(me.host).modify_qp(now, me.qpn, &attr)?;
    }
    Ok(())
}

/// Does what an application would: posts receives within its window and
/// requests while the send queue has room, and polls its completions.
/// Checks the invariants that hold at every step (TigerBeetle's online
/// checks, so that a break names the moment it happened, not the end of
/// the run): the error says which one broke.
fn drive(world: &mut World, end: &mut Live, plan: &EndpointPlan, peer: RegionKeys) -> Result<(), String> {
    if end.gone {
        return Ok(());
    }
    // The application keeps the world's time; the device, its host's.
    let (now, clock) = (world.now, world.clock(end.host));
    let device = world.device(end.host);
    if let Some(qp) = device.qp(end.qpn) {
        let epsn = qp.expected_psn();
        if end.epsn.is_some_and(|before| epsn.is_before(before)) {
            return Err(format!("the responder's expected PSN went back from {:?} to {epsn:?}", end.epsn));
        }
        end.epsn = Some(epsn);
        // Credits never go below the one probe the IBTA allows.
        if let Some(credits) = qp.credits_available()
            && credits < -1
        {
            return Err(format!("the requester overdrew its end-to-end credits: {credits}"));
        }
    }
    let mut polled = Vec::new();
    device.poll_cq(end.cq, usize::MAX, &mut polled);
    for c in &polled {
        // Receive completions (flushed ones too) carry receive opcodes.
        if c.opcode as u32 >= 128 {
            in_order(c, &end.recvs_done, plan.recvs[..end.posted_recvs].iter().map(|r| r.wr_id), "receive")?;
            end.recvs_done.push(*c);
        } else {
            in_order(c, &end.sends_done, plan.ops[..end.posted_ops].iter().map(|op| op.wr_id), "send")?;
            if c.status == WcStatus::RnrRetryExcErr {
                if !end.may_spend_rnr_retries {
                    return Err(format!(
                        "{c:?} with rnr_retry {}, though the peer kept its receives posted and counted them",
                        end.rnr_retry
                    ));
                }
                end.rnr_retries_spent = true;
            }
            end.sends_done.push(*c);
        }
    }
    if !polled.is_empty() {
        // Only the region's own bytes may change; the guards around it never.
        let initial = &plan.initial;
        for at in [0, initial.len() - GUARD] {
            let mut guard = [0u8; GUARD];
            end.buffer.read(at, &mut guard);
            if guard[..] != initial[at..at + GUARD] {
                return Err(format!("a byte outside the registered region changed, at offset {at}"));
            }
        }
    }
    let paused = end.recv_pause.is_some_and(|(from, until)| from <= now && now < until);
    while end.posted_recvs < plan.recvs.len()
        && end.posted_recvs - end.recvs_done.len() < end.recv_window
        && now >= end.next_recv_post
        && !paused
    {
        let wr = plan.recvs[end.posted_recvs].work_request(end.keys);
        match end.srq {
            Some(srq) => device.post_srq_recv(srq, wr).expect("post_srq_recv"),
            None => device.post_recv(clock, end.qpn, wr).expect("post_recv"),
        }
        end.posted_recvs += 1;
        if let Some(period) = end.recv_period {
            end.next_recv_post = now + period;
        }
    }
    while end.posted_ops < plan.ops.len() {
        let in_queue = device.qp(end.qpn).map_or(0, |qp| qp.send_queue_len());
        if in_queue >= end.caps.max_send_wr as usize {
            break;
        }
        let wr = plan.ops[end.posted_ops].work_request(end.keys, peer);
        device.post_send(clock, end.qpn, wr).expect("post_send");
        end.posted_ops += 1;
    }
    Ok(())
}

/// Completion `c` is for a request that was posted (`posted`, in the order
/// they were) and comes after those `done` before it.
fn in_order(
    c: &Completion,
    done: &[Completion],
    mut posted: impl Iterator<Item = u64>,
    queue: &str,
) -> Result<(), String> {
    let Some(index) = posted.position(|wr_id| wr_id == c.wr_id) else {
        return Err(format!("a {queue} completion for a request never posted: {c:?}"));
    };
    // Work request ids grow in the order a plan posts them (`workload.rs`).
    let previous = done.last().map(|p| p.wr_id);
    if previous.is_some_and(|p| p >= c.wr_id) {
        return Err(format!("{queue} completions out of order: {c:?} (request {index}) after {previous:?}"));
    }
    Ok(())
}

fn check_completions(
    who: &str,
    queue: &str,
    actual: &[Completion],
    expected: &[crate::workload::ExpectedCompletion],
) -> Result<(), String> {
    for (i, e) in expected.iter().enumerate() {
        let Some(a) = actual.get(i) else {
            return Err(format!(
                "{who}: {queue} completion {i} of {} never came (expected wr_id {:#x})",
                expected.len(),
                e.wr_id
            ));
        };
        let matches = a.wr_id == e.wr_id
            && a.status == WcStatus::Success
            && a.opcode == e.opcode
            && a.byte_len == e.byte_len
            && (e.imm.is_none() || a.imm_data == e.imm);
        if !matches {
            return Err(format!("{who}: {queue} completion {i} is {a:?}, expected {e:?}"));
        }
    }
    if actual.len() > expected.len() {
        return Err(format!(
            "{who}: {} extra {queue} completions, first {:?}",
            actual.len() - expected.len(),
            actual[expected.len()]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use softrnic_transport::WcOpcode;

    use super::*;

    fn completion(wr_id: u64) -> Completion {
        Completion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: 1,
            src_qp: 0,
            source: None,
            grh: false,
            solicited: false,
            timestamp: Instant::ZERO,
            block: None,
        }
    }

    #[test]
    fn a_completion_is_for_a_posted_request_after_those_before_it() {
        let posted = [1, 2, 3];
        let done = [completion(1)];
        assert!(in_order(&completion(3), &done, posted.into_iter(), "send").is_ok(), "one skipped (unsignalled)");
        let never = in_order(&completion(9), &done, posted.into_iter(), "send").unwrap_err();
        assert!(never.contains("never posted"), "{never}");
        let again = in_order(&completion(1), &done, posted.into_iter(), "send").unwrap_err();
        assert!(again.contains("out of order"), "{again}");
    }

    #[test]
    fn the_network_heals_between_one_and_a_hundred_milliseconds() {
        let heals: Vec<Duration> = (0..1000).map(heal_after).collect();
        assert!(heals.iter().all(|&h| Duration::from_millis(1) <= h && h <= Duration::from_millis(100)));
        let early = heals.iter().filter(|&&h| h < Duration::from_millis(10)).count();
        assert!((400..600).contains(&early), "log-uniform: half below 10 ms, not {early} of 1000");
    }
}
