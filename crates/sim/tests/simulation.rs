//! The deterministic simulation test: thousands of seeds, each a random mix
//! of every RC operation from 0 B to several MiB over pairs of QPs sharing
//! one link that drops, reorders, duplicates and corrupts packets.
//!
//! - `SOFTRNIC_SIM_SEEDS=N` runs N seeds (default 1000);
//! - `SOFTRNIC_SIM_SEED=S` replays one seed;
//! - `SOFTRNIC_SIM_FIRST=F` starts at seed F (for long runs in slices).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use softrnic_sim::scenario::{self, Limits, Network, Outcome};

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}")))
}

/// The seeds the environment asks for, `default` of them if it does not.
fn seeds(default: u64) -> Vec<u64> {
    match env("SOFTRNIC_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env("SOFTRNIC_SIM_FIRST").unwrap_or(0);
            (first..first + env("SOFTRNIC_SIM_SEEDS").unwrap_or(default)).collect()
        }
    }
}

/// Runs every seed over `network`, on every core (each seed is its own
/// deterministic world, so the order they run in changes nothing): the
/// outcomes in seed order, or a panic naming the lowest seed that failed
/// and how to replay it.
fn run_all(seeds: &[u64], network: Network) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(seeds.len()));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(&seed) = seeds.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let result = scenario::judge(seed, network);
                    results.lock().unwrap().push((seed, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|&(seed, _)| seed);
    results
        .into_iter()
        .map(|(seed, result)| {
            result.unwrap_or_else(|failure| panic!("{failure}\nreplay with: {}", network.replay(seed)))
        })
        .collect()
}

#[test]
fn random_workloads_survive_a_hostile_network() {
    let seeds = seeds(1000);
    let mut totals = [0u64; 8];
    let mut recoveries = [0usize; 2];
    // Messages held for credits, probes, requesters that spent their RNR
    // retries, and requesters with few that credits had to spare.
    let mut credits = [0u64; 4];
    for outcome in run_all(&seeds, Network::Hostile) {
        totals[0] += outcome.network.dropped;
        totals[1] += outcome.retransmitted;
        totals[2] += outcome.rnr_naks;
        totals[3] += outcome.seq_naks;
        totals[4] += outcome.duplicates;
        totals[5] += outcome.icrc_drops;
        totals[6] += outcome.tail_loss_probes;
        totals[7] += outcome.placed_out_of_order;
        recoveries[usize::from(outcome.selective_repeat)] += 1;
        credits[0] += outcome.credit_waits;
        credits[1] += outcome.credit_probes;
        credits[2] += outcome.rnr_retries_spent as u64;
        credits[3] += outcome.credits_relied_on as u64;
    }
    println!(
        "{} seeds ({} go-back-N, {} selective repeat): {} packets dropped, {} retransmitted, {} RNR NAKs, {} sequence NAKs, {} duplicates, {} ICRC drops, {} tail-loss probes, {} packets placed out of order",
        seeds.len(),
        recoveries[0],
        recoveries[1],
        totals[0],
        totals[1],
        totals[2],
        totals[3],
        totals[4],
        totals[5],
        totals[6],
        totals[7]
    );
    println!(
        "credits: {} messages waited, {} probes; {} requesters spent their RNR retries, {} with fewer than 7 relied on credits",
        credits[0], credits[1], credits[2], credits[3]
    );
    // The faults must actually have exercised the recovery paths.
    if seeds.len() >= 100 {
        assert!(totals.iter().all(|&t| t > 0), "some recovery path never ran: {totals:?}");
        assert!(credits.iter().all(|&c| c > 0), "some credit path never ran: {credits:?}");
        assert!(recoveries.iter().all(|&n| n > 0), "both recoveries ran: {recoveries:?}");
    }
}

#[test]
fn a_perfect_network_needs_no_recovery() {
    let limits = Limits { max_fault: 0.0, host_faults: false, ..Limits::default() };
    for seed in 0..50 {
        let outcome = scenario::run(seed, limits).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(outcome.network.dropped, 0);
        assert_eq!(outcome.seq_naks, 0, "seed {seed}: nothing arrives out of order");
        if outcome.adaptive {
            // An adaptive timer whose floor is below the path's queueing
            // delay may send again early; the verdict (every completion
            // right, every byte right, every QP in RTS) still held.
            continue;
        }
        // A requester that spent its RNR retries failed its QP, and the
        // peer's requests to it then time out, as to a crashed host.
        if outcome.rnr_retries_spent > 0 {
            continue;
        }
        // Only RNR NAKs (a slow receiver) may cause a packet to be resent.
        assert_eq!((outcome.timeouts, outcome.duplicates), (0, 0), "seed {seed}");
        if outcome.rnr_naks == 0 {
            assert_eq!(outcome.retransmitted, 0, "seed {seed}");
        }
    }
}

/// The same invariants with two switches in the path: softrnic's switch
/// pipeline queues, marks, drops on overflow, and its ports lose and
/// reorder packets.
#[test]
fn random_workloads_survive_a_switched_network() {
    let (mut dropped, mut retransmitted) = (0, 0);
    let seeds = seeds(100);
    for outcome in run_all(&seeds, Network::Switched) {
        dropped += outcome.network.dropped;
        retransmitted += outcome.retransmitted;
    }
    println!("switched: {dropped} packets dropped, {retransmitted} retransmitted");
    if seeds.len() >= 100 {
        assert!(dropped > 0 && retransmitted > 0, "the switches' losses exercised recovery");
    }
}

/// The same invariants between two devices of one machine: payloads by
/// reference, packets that carry several MTUs each and stand for as many
/// PSNs, over a link that drops, reorders and duplicates them (which the
/// rings never do, so recovery on this path is proved here).
#[test]
fn random_workloads_survive_one_host_by_reference() {
    let seeds = seeds(300);
    let (mut by_reference, mut spanning, mut retransmitted, mut duplicates) = (0, 0, 0, 0);
    for outcome in run_all(&seeds, Network::OneHost) {
        by_reference += outcome.by_reference;
        spanning += outcome.spanning;
        retransmitted += outcome.retransmitted;
        duplicates += outcome.duplicates;
    }
    println!(
        "one host: {by_reference} packets by reference, {spanning} of them spanning MTUs; {retransmitted} retransmitted, {duplicates} duplicates"
    );
    if seeds.len() >= 100 {
        assert!(spanning > 0 && retransmitted > 0 && duplicates > 0, "spans met loss and duplication");
    }
}

/// Replays one seed of the switched scenario that once failed.
fn replay_switched(seed: u64) {
    if let Err(failure) = scenario::run(seed, Network::Switched.limits()) {
        panic!("{failure}");
    }
}

/// Seed 100037: selective repeat under HPCC, 2.5 % reordering and nothing
/// else. The requester timed out behind its paced responder and asked for
/// the same 16 READ responses again every 17 µs; each repeat queued a
/// stream of its own, and the backlog (16 streams of 16 packets at 47 µs
/// each) outlasted the requester's seven retries: `RetryExcErr` on a READ
/// with nothing lost. A repeat the queued stream answers anyway now adds
/// nothing (`Responder::queue_replay`).
#[test]
fn seed_100037_a_paced_read_outlasts_no_retries() {
    replay_switched(100_037);
}

/// Seed 940176: selective repeat under Swift, with reordering (its replay
/// line also named duplication and corruption, which switch ports never
/// applied; it no longer does). The same backlog of repeated READ
/// streams, in both directions at 0.1 Gb/s, held the ACK of a SEND behind
/// it for longer than the SEND's retries lasted.
#[test]
fn seed_940176_an_ack_waits_behind_no_backlog_of_repeats() {
    replay_switched(940_176);
}

/// Seed 241505222531, the liveness phase's first find: selective repeat
/// under TIMELY, no faults at all. A QP's requester and its responder
/// share its pacer, and `poll_transmit` passed the first turn on every
/// call rather than every packet sent: a call that found the pacer closed
/// used up the requester's turn, and every open slot went to the READ
/// responses the QP owed its peer. A WRITE waited 8.5 ms with nothing in
/// flight, longer than the QP's timers allow once the network has healed.
#[test]
fn seed_241505222531_a_write_gets_turns_beside_its_qps_read_responses() {
    replay_switched(241_505_222_531);
}

/// Seed 241505223698: the same, a requester starved for 134 ms.
#[test]
fn seed_241505223698_a_requester_starves_no_longer_than_its_timers() {
    replay_switched(241_505_223_698);
}

/// Seed 241505217394: the same turns the other way, under go-back-N and
/// Swift with loss and duplication: once the QP began a WRITE, its READ
/// responses got no slot, and the peer's READ spent its retries asking.
#[test]
fn seed_241505217394_read_responses_get_turns_beside_their_qps_writes() {
    replay_switched(241_505_217_394);
}

/// Seed 7011119: selective repeat under Swift with 3.6 % loss. After the
/// network healed a 3.3 MB READ made no progress for 33.8 ms: the timer
/// had asked for its first chunk whole again, and the responder, paced
/// down to 68 Mb/s, resent the 442 responses that had arrived ahead of
/// those that had not, while the requester asked for its hole every
/// 20 µs (281,203 packets from its host). Going back now asks only for
/// the holes, and each repeat by the repair timer waits twice as long.
#[test]
fn seed_7011119_a_read_asked_again_asks_only_for_its_holes() {
    replay_switched(7_011_119);
}

/// Seed 7006859: go-back-N with no congestion control behind tail-drop
/// queues, which collapses on a NIC too: a SEND's 4 KB packet met the
/// full 25 Gb/s queue at all eight tries. Such QPs now run over PFC, as
/// RoCE deploys them, and must finish there.
#[test]
fn seed_7006859_go_back_n_without_congestion_control_runs_over_pfc() {
    replay_switched(7_006_859);
}

/// Seed 8000297: go-back-N under Swift, with loss and a clogged path: a
/// READ response was lost again in the stream that answered its repeat,
/// and the rest of that stream, paced at 15 Mb/s, kept the timer from
/// asking again for 67 ms. A response at or below one already seen beyond
/// the hole now shows the hole lost again (`beyond_the_hole`).
#[test]
fn seed_8000297_a_hole_lost_again_is_asked_for_again() {
    replay_switched(8_000_297);
}

/// Seed 8001058: go-back-N over PFC with reordering and nothing lost. The
/// simulated NIC queued whatever its QPs sent, however long PFC held the
/// link: each timeout stacked another window of copies in front of the
/// wire, queueing grew to 17 ms, and a WRITE spent its retries. A NIC
/// takes packets from its QPs as the wire does; the fabric's queue now
/// takes no more than 64 KiB (`NIC_QUEUE_BYTES`).
#[test]
fn seed_8001058_a_paused_nic_takes_no_more_from_its_qps() {
    replay_switched(8_001_058);
}

/// Seed 8003009: go-back-N over PFC, reordering only. A QP's requester
/// always had another packet of a long SEND going back, and its NIC took
/// one packet at a time: a bare ACK let a request go first on every
/// turn, so the QP's ACKs waited 8 ms and the peer's SEND spent its
/// retries. An ACK lets one request go ahead of it, not all of them.
#[test]
fn seed_8003009_an_ack_lets_one_request_ahead_not_all() {
    replay_switched(8_003_009);
}

/// Seed 12019469 of the switched network, a crash drawn: the surviving
/// QP took 75.9 ms to fail where its retries allow 75.6. Its adaptive
/// timer expired every 1.93 ms, and each retry was spent at the first
/// expiry a whole timeout (8.39 ms) after the last spend, 9.67 ms apart.
/// A retry is now spent a timeout after the last one fell due.
#[test]
fn seed_12019469_retries_are_spent_a_timeout_apart() {
    replay_switched(12_019_469);
}

/// Seeds 20007370 and 20009246, the first long run with `rnr_retry`
/// drawn: a SEND spent its RNR retries behind a READ awaiting a lost
/// response, its RNR NAK came twice, and the second failed the READ too,
/// so the queue reported two errors. A NAK for a request already finished
/// names nothing new, and after the error that names the cause a queue
/// reports flushes only (the mechanism alone:
/// `operations::a_repeated_rnr_nak_blames_no_other_request`).
#[test]
fn seeds_20007370_and_20009246_one_error_then_flushes() {
    replay_switched(20_007_370);
    replay_switched(20_009_246);
}

/// Seed 20010176: a pair failed when its peer let its receives run out,
/// and across the switches its survivor, going back to its whole window
/// at line rate at each timeout, kept the shared queue full; another
/// pair's 4 KB SEND, its timer in step, was dropped at all 8 tries. The
/// network's, as 7006859's was: the switched scenario draws fewer than 7
/// RNR retries only where the peer keeps its receives posted, and must
/// finish.
#[test]
fn seed_20010176_no_pair_may_fail_across_the_switches() {
    replay_switched(20_010_176);
}

/// Seeds 22012789 and 22007706: a QP paced at its congestion control's
/// floor (one 256 B packet per 139 µs) under a 100 µs timer, going back
/// under go-back-N: the timer, re-armed on each ACK while the next packet
/// still waited for the pacer, expired before it left and spent the slot
/// on a probe, and the timeouts kept the QP at its floor while a READ
/// answered behind it waited 17 ms. The timer now counts from when the
/// pacer lets the packet go, and a QP paced that slowly asks for every
/// ACK (`recovery::a_paced_write_is_timed_from_when_its_packets_may_leave`).
#[test]
fn seeds_22012789_and_22007706_a_paced_packet_is_timed_once_it_leaves() {
    replay_switched(22_012_789);
    replay_switched(22_007_706);
}

/// Seed 23047808 of the hostile network (go-back-N, no congestion
/// control, loss, reordering and duplication): its link queued whatever
/// the hosts gave it, each timeout stacked another window in front of the
/// wire, and a SEND sent at 34.5 ms arrived at 40.7, after its QP had
/// spent its retries. A NIC takes packets only while its queue has room,
/// on this network as on the switched one (seed 8001058).
#[test]
fn seed_23047808_a_nic_queues_no_more_than_its_room() {
    if let Err(failure) = scenario::run(23_047_808, Network::Hostile.limits()) {
        panic!("{failure}");
    }
}
