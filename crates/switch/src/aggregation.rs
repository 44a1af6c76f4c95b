//! In-network aggregation (ATP, A2TP, SwitchML): a fixed pool of
//! aggregators in which a switch sums the gradient chunks of training
//! jobs on their way to the jobs' parameter servers
//! (`softrnic_wire::aggregation` has the packet).
//!
//! A chunk's aggregator is picked by its job and sequence
//! ([`Aggregator::slot_of`]):
//!
//! - free: the chunk claims it and is consumed;
//! - holding the same chunk: its values are added (saturating, flagged on
//!   overflow) unless the worker's bit is already set (a duplicate, dropped);
//!   the packet that completes the sum leaves, rewritten to carry it, for
//!   the server; the aggregator stays held until the server's ACK passes,
//!   so a worker that resends still finds the sum;
//! - holding another chunk: a collision; the packet is flagged and goes to
//!   the server unaggregated, which sums it in software, and so do the
//!   chunk's later packets (the aggregator remembers the last few chunks
//!   it turned away), so that no chunk is split between the two.
//!
//! A packet flagged to bypass the switch (the whole job's choice, or an
//! A2TP worker's chunk beyond its aggregator window) goes to the server
//! as it is, and its chunk is remembered as turned away, unless its chunk
//! already holds an aggregator, where it is summed: a chunk's first packet
//! decides where the chunk is summed, as workers' windows differ a little.
//!
//! A resent chunk is never added (its first copy may be in already): if
//! the aggregator holds its chunk with its bit, the packet leaves carrying
//! the aggregator's sum so far (partial or whole) and a partial one frees
//! the aggregator; otherwise it goes to the server as it is. So every
//! worker's first copy is counted in exactly one place (one aggregator
//! round, or the server), and the server, merging by bitmap, counts nobody
//! twice.
//!
//! The server answers with one ACK for all workers: the stage frees the
//! chunk's aggregator and replicates the ACK to every worker of the job,
//! whose addresses it learned from their chunks (as a learning switch
//! learns MACs), so the server's link carries each result once.
//!
//! What it learns it keeps while the job is alive: a worker's address and
//! the job's server (where its chunks go) are the first seen, and a chunk
//! that names a learned worker from another address is dropped, as is
//! every effect of an ACK that does not come from the job's server (it is
//! forwarded as any packet). Otherwise anyone could redirect a job's
//! answers, or make the switch copy a forged ACK to every worker. A job
//! idle for [`AggregationConfig::reclaim_after`], holding no aggregator,
//! is forgotten and learned anew.
//!
//! An aggregator untouched for [`AggregationConfig::reclaim_after`] may be
//! claimed by another chunk (its job died, or lost every packet): its
//! partial sum is dropped, and workers that are alive resend to the
//! server.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use softrnic_wire::aggregation::{
    ALL_WORKERS, FLAG_ACK, FLAG_AGGREGATED, FLAG_BYPASS, FLAG_COLLISION, FLAG_OVERFLOW, FLAG_RESEND, NO_SLOT, Packet,
};

use crate::Time;

/// Chunks an aggregator remembers having turned away (a few words of a
/// switch's memory, as SwitchML keeps shadow copies).
const TURNED_AWAY: usize = 4;

/// The pool's size and policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregationConfig {
    /// Aggregators in the pool (ATP has 20,000; SwitchML 8,192 slots).
    pub slots: usize,
    /// An aggregator untouched this long may be taken by another chunk.
    pub reclaim_after: Duration,
}

impl AggregationConfig {
    pub fn new(slots: usize) -> AggregationConfig {
        AggregationConfig { slots: slots.clamp(1, usize::from(NO_SLOT)), reclaim_after: Duration::from_secs(1) }
    }
}

/// What the stage did with a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The packet goes on (possibly rewritten): not aggregation traffic, a
    /// collision, a finished or flushed sum, a resend. `ce`: a summed
    /// packet arrived marked, so the sum leaves marked too.
    Forward { ce: bool },
    /// Summed into an aggregator: nothing leaves.
    Consume,
    /// A server's ACK: it goes on, and a copy to each of these workers.
    Replicate(Vec<IpAddr>),
}

/// One job's share of the pool and what happened to its packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounters {
    /// Aggregators the job holds now.
    pub held: u64,
    /// `held` integrated over time, up to `held_since` (aggregator-ns):
    /// the mean occupancy between two samples, however short the holds.
    pub held_ns: u128,
    pub held_since: Time,
    pub claimed: u64,
    /// Chunks summed into an aggregator (the claiming one included).
    pub aggregated: u64,
    pub collisions: u64,
    /// Sums a switch finished.
    pub completed: u64,
    /// Partial sums a resend took to the server.
    pub flushed: u64,
    pub duplicates: u64,
    pub bypassed: u64,
    /// Results the server sent (resends of an ACK not counted), and their
    /// values: the job's progress.
    pub acked_chunks: u64,
    pub acked_values: u64,
    pub overflows: u64,
    /// The job's aggregators another chunk took after they sat idle.
    pub reclaimed: u64,
}

impl JobCounters {
    /// The job takes (`delta` 1) or gives back (-1) an aggregator at `now`.
    fn hold(&mut self, now: Time, delta: i64) {
        self.held_ns += u128::from(self.held) * now.saturating_sub(self.held_since).as_nanos();
        self.held_since = self.held_since.max(now);
        self.held = self.held.saturating_add_signed(delta);
    }

    /// Aggregator-seconds held until `now`.
    pub fn held_seconds(&self, now: Time) -> f64 {
        let ns = self.held_ns + u128::from(self.held) * now.saturating_sub(self.held_since).as_nanos();
        ns as f64 / 1e9
    }
}

#[derive(Debug)]
struct Slot {
    /// (job, sequence) of the chunk it holds; `None` when free.
    holder: Option<(u16, u32)>,
    /// The last chunks turned away from here, oldest replaced first: their
    /// other workers' packets follow them to the server even once the
    /// aggregator is free, so a chunk is not split between an aggregator
    /// and the server (where neither half could finish until a resend).
    turned_away: [Option<(u16, u32)>; TURNED_AWAY],
    next_turned_away: usize,
    fan_in: u8,
    bitmap: u32,
    done: bool,
    overflow: bool,
    ce: bool,
    claimed: Time,
    touched: Time,
    values: Vec<i32>,
}

impl Slot {
    /// Remembers that chunk `sequence` of `job` is summed by the server.
    fn turn_away(&mut self, job: u16, sequence: u32) {
        if !self.turned_away.contains(&Some((job, sequence))) {
            self.turned_away[self.next_turned_away] = Some((job, sequence));
            self.next_turned_away = (self.next_turned_away + 1) % TURNED_AWAY;
        }
    }
}

/// The aggregation stage of one switch.
#[derive(Debug)]
pub struct Aggregator {
    config: AggregationConfig,
    slots: Vec<Slot>,
    jobs: BTreeMap<u16, JobCounters>,
    /// Each job's server and workers, as learned.
    members: HashMap<u16, Membership>,
    /// Aggregation packets that were not well formed: forwarded untouched.
    pub malformed: u64,
    /// ACK copies that could not be made: a worker not yet seen.
    pub unknown_members: u64,
    /// Chunks from an address other than their worker's, and ACKs from
    /// another than the job's server: no effect on the pool.
    pub impostors: u64,
}

/// What the stage learned of a job.
#[derive(Debug, Default)]
struct Membership {
    /// Where its chunks go.
    server: Option<IpAddr>,
    /// Its workers' addresses, by worker index.
    workers: Vec<Option<IpAddr>>,
    /// When a packet of the job last counted.
    touched: Time,
}

impl Aggregator {
    pub fn new(config: AggregationConfig) -> Aggregator {
        let slots = (0..config.slots)
            .map(|_| Slot {
                holder: None,
                turned_away: [None; TURNED_AWAY],
                next_turned_away: 0,
                fan_in: 0,
                bitmap: 0,
                done: false,
                overflow: false,
                ce: false,
                claimed: Time::ZERO,
                touched: Time::ZERO,
                values: Vec::new(),
            })
            .collect();
        Aggregator {
            config,
            slots,
            jobs: BTreeMap::new(),
            members: HashMap::new(),
            malformed: 0,
            unknown_members: 0,
            impostors: 0,
        }
    }

    pub fn config(&self) -> AggregationConfig {
        self.config
    }

    /// The aggregator a chunk hashes to (ATP's choice: any chunk of any
    /// job may meet any other, so every job sees collisions in proportion
    /// to what the others hold).
    pub fn slot_of(&self, job: u16, sequence: u32) -> usize {
        // splitmix64's finalizer: consecutive chunks land far apart.
        let mut z = (u64::from(job) << 32 | u64::from(sequence)).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % self.slots.len() as u64) as usize
    }

    /// Every job seen, with its counters.
    pub fn jobs(&self) -> &BTreeMap<u16, JobCounters> {
        &self.jobs
    }

    /// Aggregators held by any job.
    pub fn held(&self) -> u64 {
        self.jobs.values().map(|j| j.held).sum()
    }

    /// An aggregation packet (UDP payload `payload`, from `src` to `dst`,
    /// arrived marked CE or not) crosses the switch. The payload may be
    /// rewritten in place; its length never changes.
    pub fn handle(&mut self, now: Time, src: IpAddr, dst: IpAddr, ce: bool, payload: &mut [u8]) -> Verdict {
        let mut packet = Packet::new_unchecked(&mut *payload);
        if packet.check().is_err() {
            self.malformed += 1;
            return Verdict::Forward { ce: false };
        }
        let (job, sequence) = (packet.job(), packet.sequence());
        if packet.has(FLAG_ACK) {
            if self.members.get(&job).and_then(|m| m.server) != Some(src) {
                self.impostors += 1;
                return Verdict::Forward { ce: false };
            }
            return self.acknowledged(now, job, sequence, dst, &packet);
        }
        let worker = packet.worker();
        if worker == ALL_WORKERS {
            self.malformed += 1;
            return Verdict::Forward { ce: false };
        }
        if !self.learn(now, job, packet.workers(), worker, src, dst) {
            self.impostors += 1;
            return Verdict::Consume;
        }
        let bit = 1u32 << worker;
        let index = self.slot_of(job, sequence);
        let reclaim_after = self.config.reclaim_after;
        let slot = &mut self.slots[index];
        let ours = slot.holder == Some((job, sequence));
        if packet.has(FLAG_BYPASS) {
            self.jobs.entry(job).or_default().bypassed += 1;
            // A chunk's first packet decides where the chunk is summed:
            // one already in an aggregator is summed there (this worker's
            // aggregator window was smaller than the first's); otherwise
            // its later packets follow this one to the server.
            if !ours {
                slot.turn_away(job, sequence);
                return Verdict::Forward { ce: false };
            }
        }
        if packet.has(FLAG_RESEND) {
            // (A resend of another length is not this chunk's to carry.)
            if !(ours && slot.bitmap & bit != 0 && slot.values.len() == packet.count()) {
                return Verdict::Forward { ce: false };
            }
            // The aggregator has this worker's first copy: the packet
            // takes the sum so far to the server.
            write_sum(&mut packet, slot, index, now);
            packet.set_flags(packet.flags() | FLAG_AGGREGATED);
            let ce = slot.ce;
            if !slot.done {
                slot.holder = None;
                let counters = self.jobs.entry(job).or_default();
                counters.flushed += 1;
                counters.hold(now, -1);
            }
            return Verdict::Forward { ce };
        }
        let count = packet.count();
        match slot.holder {
            Some(_) if ours && (slot.bitmap & bit != 0 || slot.done) => {
                self.jobs.entry(job).or_default().duplicates += 1;
                Verdict::Consume
            }
            Some(_) if ours && slot.values.len() != count => {
                // Same chunk, another length: not ours to sum.
                self.malformed += 1;
                Verdict::Forward { ce: false }
            }
            Some(_) if ours => {
                let mut overflow = false;
                for (sum, value) in slot.values.iter_mut().zip(packet.values()) {
                    let (added, over) = sum.overflowing_add(value);
                    *sum = if over { sum.saturating_add(value) } else { added };
                    overflow |= over;
                }
                slot.bitmap |= bit;
                slot.overflow |= overflow;
                slot.ce |= ce;
                slot.touched = now;
                let counters = self.jobs.entry(job).or_default();
                counters.aggregated += 1;
                counters.overflows += u64::from(overflow);
                self.finish_if_complete(now, index, &mut packet)
            }
            Some(_) if now.saturating_sub(slot.touched) < reclaim_after => {
                slot.turn_away(job, sequence);
                packet.set_flags(packet.flags() | FLAG_COLLISION);
                self.jobs.entry(job).or_default().collisions += 1;
                Verdict::Forward { ce: false }
            }
            None if slot.turned_away.contains(&Some((job, sequence))) => {
                packet.set_flags(packet.flags() | FLAG_COLLISION);
                self.jobs.entry(job).or_default().collisions += 1;
                Verdict::Forward { ce: false }
            }
            holder => {
                if let Some((stale, _)) = holder {
                    let counters = self.jobs.entry(stale).or_default();
                    counters.hold(now, -1);
                    counters.reclaimed += 1;
                }
                slot.holder = Some((job, sequence));
                slot.fan_in = packet.workers();
                slot.bitmap = bit;
                slot.done = false;
                slot.overflow = false;
                slot.ce = ce;
                slot.claimed = now;
                slot.touched = now;
                slot.values.clear();
                slot.values.extend(packet.values());
                let counters = self.jobs.entry(job).or_default();
                counters.hold(now, 1);
                counters.claimed += 1;
                counters.aggregated += 1;
                self.finish_if_complete(now, index, &mut packet)
            }
        }
    }

    /// When every worker is in, the packet in hand leaves with the sum;
    /// the aggregator waits for the server's ACK.
    fn finish_if_complete(&mut self, now: Time, index: usize, packet: &mut Packet<&mut [u8]>) -> Verdict {
        let slot = &mut self.slots[index];
        let all = if slot.fan_in >= 32 { u32::MAX } else { (1u32 << slot.fan_in) - 1 };
        if slot.bitmap != all {
            return Verdict::Consume;
        }
        slot.done = true;
        write_sum(packet, slot, index, now);
        packet.set_flags(packet.flags() | FLAG_AGGREGATED);
        let ce = slot.ce;
        if let Some((job, _)) = slot.holder {
            self.jobs.entry(job).or_default().completed += 1;
        }
        Verdict::Forward { ce }
    }

    /// The server's answer: frees the chunk's aggregator and fans out.
    fn acknowledged(&mut self, now: Time, job: u16, sequence: u32, dst: IpAddr, packet: &Packet<&mut [u8]>) -> Verdict {
        let slot = usize::from(packet.slot());
        let counters = self.jobs.entry(job).or_default();
        // Progress: one answer per chunk (the one for all workers, or the
        // one to worker 0 where the server answers each).
        if !packet.has(FLAG_RESEND) && matches!(packet.worker(), ALL_WORKERS | 0) {
            counters.acked_chunks += 1;
            counters.acked_values += packet.count() as u64;
        }
        if packet.slot() != NO_SLOT
            && let Some(s) = self.slots.get_mut(slot)
            && s.holder == Some((job, sequence))
        {
            s.holder = None;
            counters.hold(now, -1);
        }
        if packet.worker() != ALL_WORKERS {
            return Verdict::Forward { ce: false };
        }
        let members = self.members.get(&job).map(|m| m.workers.as_slice()).unwrap_or_default();
        let missing = usize::from(packet.workers()).saturating_sub(members.iter().flatten().count());
        self.unknown_members += missing as u64;
        Verdict::Replicate(members.iter().flatten().copied().filter(|&a| a != dst).collect())
    }

    /// Learns that `worker` of `job` (of `workers`) sends from `src` to the
    /// job's server at `dst`; false if the job learned otherwise already.
    fn learn(&mut self, now: Time, job: u16, workers: u8, worker: u8, src: IpAddr, dst: IpAddr) -> bool {
        let holding = self.jobs.get(&job).is_some_and(|j| j.held > 0);
        let members = self.members.entry(job).or_default();
        if !holding && now.saturating_sub(members.touched) >= self.config.reclaim_after {
            *members = Membership::default();
        }
        if *members.server.get_or_insert(dst) != dst {
            return false;
        }
        if members.workers.len() < usize::from(workers) {
            members.workers.resize(usize::from(workers), None);
        }
        if let Some(known) = members.workers.get_mut(usize::from(worker))
            && *known.get_or_insert(src) != src
        {
            return false;
        }
        members.touched = members.touched.max(now);
        true
    }
}

/// Writes an aggregator's sum, bitmap, index and wait (since its first
/// packet, or its last one for a finished sum resent) into the packet in
/// hand.
fn write_sum(packet: &mut Packet<&mut [u8]>, slot: &Slot, index: usize, now: Time) {
    let until = if slot.done { slot.touched } else { now };
    packet.set_wait_us(until.saturating_sub(slot.claimed).as_micros().min(u128::from(u16::MAX)) as u16);
    packet.set_values(&slot.values);
    packet.set_bitmap(slot.bitmap);
    packet.set_slot(index as u16);
    if slot.overflow {
        packet.set_flags(packet.flags() | FLAG_OVERFLOW);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use softrnic_wire::aggregation::{FLAG_ECN, Repr};

    use super::*;

    const PS: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 100));

    fn worker_addr(w: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, w + 1))
    }

    fn chunk(job: u16, sequence: u32, workers: u8, worker: u8, values: &[i32]) -> Vec<u8> {
        Repr { job, sequence, workers, worker, slot: NO_SLOT, values: values.to_vec(), ..Repr::default() }.to_bytes()
    }

    fn send(agg: &mut Aggregator, at_ms: u64, bytes: &mut [u8]) -> Verdict {
        let worker = Packet::new_unchecked(&bytes[..]).worker();
        agg.handle(Time::from_millis(at_ms), worker_addr(worker), PS, false, bytes)
    }

    fn resend(mut bytes: Vec<u8>) -> Vec<u8> {
        bytes[1] |= FLAG_RESEND;
        bytes
    }

    /// Every worker's chunk is summed; the last leaves with the sum.
    #[test]
    fn claims_sums_and_completes() {
        let mut agg = Aggregator::new(AggregationConfig::new(16));
        for w in 0..2 {
            assert_eq!(send(&mut agg, 0, &mut chunk(1, 5, 3, w, &[w.into(), 10])), Verdict::Consume);
        }
        assert_eq!(agg.jobs()[&1].held, 1);
        let mut last = chunk(1, 5, 3, 2, &[2, 10]);
        assert_eq!(send(&mut agg, 3, &mut last), Verdict::Forward { ce: false });
        let result = Repr::parse(&last).unwrap();
        assert_eq!(result.values, vec![3, 30]);
        assert_eq!(result.wait_us, 3000, "the last worker came 3 ms after the first");
        assert_eq!(result.bitmap, 0b111);
        assert_eq!(result.flags, FLAG_AGGREGATED);
        assert_eq!(usize::from(result.slot), agg.slot_of(1, 5));
        let c = agg.jobs()[&1];
        assert_eq!((c.claimed, c.aggregated, c.completed, c.held), (1, 3, 1, 1), "held until the ACK");
    }

    /// A chunk whose aggregator holds another chunk goes on, flagged.
    #[test]
    fn a_collision_goes_to_the_server_unaggregated() {
        let mut agg = Aggregator::new(AggregationConfig::new(1));
        assert_eq!(send(&mut agg, 0, &mut chunk(1, 0, 2, 0, &[7])), Verdict::Consume);
        let mut other = chunk(2, 0, 2, 1, &[9]);
        assert_eq!(send(&mut agg, 0, &mut other), Verdict::Forward { ce: false });
        let repr = Repr::parse(&other).unwrap();
        assert_eq!((repr.flags, repr.values, repr.slot), (FLAG_COLLISION, vec![9], NO_SLOT));
        assert_eq!((agg.jobs()[&2].collisions, agg.jobs()[&2].held, agg.jobs()[&1].held), (1, 0, 1));
        // Job 1's chunk finishes and its ACK frees the aggregator; the
        // turned-away chunk's other packet still goes to the server, where
        // its first half is.
        send(&mut agg, 0, &mut chunk(1, 0, 2, 1, &[7]));
        let mut ack = Repr {
            flags: FLAG_ACK,
            job: 1,
            workers: 2,
            worker: ALL_WORKERS,
            slot: 0,
            values: vec![14],
            ..Repr::default()
        }
        .to_bytes();
        agg.handle(Time::ZERO, PS, worker_addr(0), false, &mut ack);
        assert_eq!(agg.held(), 0);
        let mut rest = chunk(2, 0, 2, 0, &[1]);
        assert_eq!(send(&mut agg, 0, &mut rest), Verdict::Forward { ce: false });
        assert!(Repr::parse(&rest).unwrap().has(FLAG_COLLISION));
        assert_eq!(send(&mut agg, 0, &mut chunk(2, 1, 2, 0, &[1])), Verdict::Consume, "another chunk claims it");
    }

    /// The server's ACK frees the aggregator and reaches every worker.
    #[test]
    fn the_servers_ack_frees_and_fans_out() {
        let mut agg = Aggregator::new(AggregationConfig::new(1));
        for w in 0..3 {
            send(&mut agg, 0, &mut chunk(4, 9, 3, w, &[1]));
        }
        let slot = agg.slot_of(4, 9) as u16;
        let mut ack = Repr {
            flags: FLAG_ACK,
            job: 4,
            sequence: 9,
            bitmap: 0b111,
            workers: 3,
            worker: ALL_WORKERS,
            slot,
            wait_us: 0,
            values: vec![3],
        }
        .to_bytes();
        let verdict = agg.handle(Time::ZERO, PS, worker_addr(0), false, &mut ack);
        assert_eq!(verdict, Verdict::Replicate(vec![worker_addr(1), worker_addr(2)]));
        let c = agg.jobs()[&4];
        assert_eq!((c.held, c.acked_chunks, c.acked_values), (0, 1, 1));
        // The pool is free for the next chunk.
        assert_eq!(send(&mut agg, 0, &mut chunk(5, 0, 2, 0, &[1])), Verdict::Consume);
        assert_eq!(agg.held(), 1);
    }

    /// A forger who knows the job: an ACK from anywhere but the job's
    /// server neither frees the aggregator nor is copied to the workers,
    /// and a chunk naming a learned worker from another address neither
    /// adds to the sum nor moves where answers go. Before, the switch
    /// copied any ACK to every worker, and learned any address.
    #[test]
    fn only_the_jobs_server_and_workers_count() {
        const STRANGER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 66));
        let mut agg = Aggregator::new(AggregationConfig::new(1));
        for w in 0..2 {
            send(&mut agg, 0, &mut chunk(4, 9, 3, w, &[1]));
        }
        let mut forged = chunk(4, 9, 3, 1, &[1000]);
        assert_eq!(agg.handle(Time::ZERO, STRANGER, PS, false, &mut forged), Verdict::Consume);
        let slot = agg.slot_of(4, 9) as u16;
        let ack = |values| {
            let workers = 3;
            Repr {
                flags: FLAG_ACK,
                job: 4,
                sequence: 9,
                bitmap: 0b111,
                workers,
                worker: ALL_WORKERS,
                slot,
                wait_us: 0,
                values,
            }
            .to_bytes()
        };
        let verdict = agg.handle(Time::ZERO, STRANGER, worker_addr(0), false, &mut ack(vec![1000]));
        assert_eq!(verdict, Verdict::Forward { ce: false }, "not copied to every worker");
        assert_eq!((agg.impostors, agg.held()), (2, 1), "the aggregator still holds the chunk");
        let mut last = chunk(4, 9, 3, 2, &[1]);
        assert_eq!(send(&mut agg, 0, &mut last), Verdict::Forward { ce: false });
        assert_eq!(Repr::parse(&last).unwrap().values, vec![3], "the workers' sum");
        let verdict = agg.handle(Time::ZERO, PS, worker_addr(0), false, &mut ack(vec![3]));
        assert_eq!(verdict, Verdict::Replicate(vec![worker_addr(1), worker_addr(2)]));
        // Idle past the reclaim time, the job is learned anew.
        let later = Time::ZERO + agg.config().reclaim_after;
        assert_eq!(agg.handle(later, STRANGER, PS, false, &mut chunk(4, 10, 3, 2, &[1])), Verdict::Consume);
        assert_eq!(agg.impostors, 2);
    }

    /// A resend is never summed twice: its first copy is in the
    /// aggregator, so the packet takes the partial sum to the server.
    #[test]
    fn a_resend_flushes_the_partial_sum_and_counts_nobody_twice() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        let first = chunk(1, 3, 3, 0, &[5]);
        send(&mut agg, 0, &mut first.clone());
        send(&mut agg, 0, &mut chunk(1, 3, 3, 1, &[6]));
        // A plain duplicate (the network's) is dropped.
        assert_eq!(send(&mut agg, 0, &mut first.clone()), Verdict::Consume);
        assert_eq!(agg.jobs()[&1].duplicates, 1);
        let mut again = resend(first);
        assert_eq!(send(&mut agg, 5, &mut again), Verdict::Forward { ce: false });
        let flushed = Repr::parse(&again).unwrap();
        assert_eq!((&flushed.values, flushed.bitmap), (&vec![11], 0b11));
        assert!(flushed.has(FLAG_AGGREGATED) && flushed.has(FLAG_RESEND));
        let c = agg.jobs()[&1];
        assert_eq!((c.flushed, c.held), (1, 0), "a partial flush frees the aggregator");
        // The third worker's first copy now starts a new round, alone.
        assert_eq!(send(&mut agg, 6, &mut chunk(1, 3, 3, 2, &[7])), Verdict::Consume);
        // A resend whose first copy is not in the aggregator goes on as it is.
        let mut lone = resend(chunk(1, 3, 3, 0, &[5]));
        assert_eq!(send(&mut agg, 7, &mut lone), Verdict::Forward { ce: false });
        assert_eq!(Repr::parse(&lone).unwrap().values, vec![5]);
    }

    /// After completion a resend (its ACK was lost) takes the whole sum
    /// again, and the aggregator stays held for the server's ACK.
    #[test]
    fn a_resend_after_completion_carries_the_whole_sum() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        send(&mut agg, 0, &mut chunk(1, 1, 2, 0, &[1, 2]));
        send(&mut agg, 0, &mut chunk(1, 1, 2, 1, &[10, 20]));
        let mut again = resend(chunk(1, 1, 2, 1, &[10, 20]));
        send(&mut agg, 1, &mut again);
        let repr = Repr::parse(&again).unwrap();
        assert_eq!((repr.values, repr.bitmap), (vec![11, 22], 0b11));
        assert_eq!(agg.jobs()[&1].held, 1);
    }

    #[test]
    fn overflow_saturates_and_is_flagged() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        send(&mut agg, 0, &mut chunk(1, 0, 2, 0, &[i32::MAX - 1, i32::MIN + 1, 1]));
        let mut last = chunk(1, 0, 2, 1, &[5, -5, 1]);
        send(&mut agg, 0, &mut last);
        let repr = Repr::parse(&last).unwrap();
        assert_eq!(repr.values, vec![i32::MAX, i32::MIN, 2]);
        assert!(repr.has(FLAG_OVERFLOW));
        assert_eq!(agg.jobs()[&1].overflows, 1);
    }

    /// A full pool turns every new chunk away until an ACK frees one; an
    /// aggregator idle past `reclaim_after` is taken back.
    #[test]
    fn a_full_pool_and_a_stale_aggregator() {
        let mut agg = Aggregator::new(AggregationConfig { slots: 2, reclaim_after: Duration::from_millis(100) });
        let mut held = 0;
        let mut seq = 0;
        while held < 2 {
            if send(&mut agg, 0, &mut chunk(1, seq, 2, 0, &[1])) == Verdict::Consume {
                held += 1;
            }
            seq += 1;
        }
        for s in 100..120 {
            assert_eq!(send(&mut agg, 50, &mut chunk(2, s, 2, 0, &[1])), Verdict::Forward { ce: false });
        }
        assert_eq!(agg.jobs()[&2].collisions, 20);
        assert_eq!(send(&mut agg, 200, &mut chunk(2, 100, 2, 0, &[1])), Verdict::Consume, "idle 200 ms");
        assert_eq!((agg.jobs()[&1].reclaimed, agg.jobs()[&1].held, agg.jobs()[&2].held), (1, 1, 1));
        // Job 1 held two aggregators for 200 ms, then one; job 2 one since.
        let at = Time::from_millis(300);
        assert!((agg.jobs()[&1].held_seconds(at) - (2.0 * 0.2 + 0.1)).abs() < 1e-9);
        assert!((agg.jobs()[&2].held_seconds(at) - 0.1).abs() < 1e-9);
    }

    /// A chunk's first packet decides where it is summed: a fallback
    /// (bypass) first sends the whole chunk to the server, and a fallback
    /// of a chunk already in an aggregator is summed there.
    #[test]
    fn a_chunks_first_packet_decides_where_it_is_summed() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        let bypassing = |mut packet: Vec<u8>| {
            packet[1] |= FLAG_BYPASS;
            packet
        };
        assert_eq!(send(&mut agg, 0, &mut bypassing(chunk(1, 7, 2, 0, &[1]))), Verdict::Forward { ce: false });
        let mut second = chunk(1, 7, 2, 1, &[2]);
        assert_eq!(send(&mut agg, 0, &mut second), Verdict::Forward { ce: false }, "follows the first");
        assert!(Packet::new_unchecked(&second[..]).has(FLAG_COLLISION) && agg.held() == 0);
        // Chunk 8 asks first: the fallback joins it in its aggregator.
        assert_eq!(send(&mut agg, 0, &mut chunk(1, 8, 2, 0, &[1])), Verdict::Consume);
        let mut last = bypassing(chunk(1, 8, 2, 1, &[2]));
        assert!(matches!(send(&mut agg, 0, &mut last), Verdict::Forward { .. }));
        assert_eq!(Packet::new_unchecked(&last[..]).values().collect::<Vec<_>>(), vec![3], "the whole sum");
        assert_eq!(agg.jobs()[&1].bypassed, 2);
    }

    #[test]
    fn bypass_and_malformed_packets_pass_untouched() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        let mut bypass = chunk(1, 0, 2, 0, &[1]);
        bypass[1] |= FLAG_BYPASS;
        let before = bypass.clone();
        assert_eq!(send(&mut agg, 0, &mut bypass), Verdict::Forward { ce: false });
        assert_eq!((bypass, agg.held()), (before, 0));
        let mut bad = chunk(1, 0, 2, 0, &[1]);
        bad[0] = 9;
        let mut short = chunk(1, 0, 2, 0, &[1, 2]);
        short.truncate(22);
        for packet in [&mut bad, &mut short, &mut vec![1u8; 3]] {
            assert_eq!(send_raw(&mut agg, packet), Verdict::Forward { ce: false });
        }
        assert_eq!(agg.malformed, 3);
    }

    fn send_raw(agg: &mut Aggregator, bytes: &mut [u8]) -> Verdict {
        agg.handle(Time::ZERO, worker_addr(0), PS, false, bytes)
    }

    /// A marked contribution marks the sum.
    #[test]
    fn congestion_on_any_contribution_marks_the_sum() {
        let mut agg = Aggregator::new(AggregationConfig::new(4));
        agg.handle(Time::ZERO, worker_addr(0), PS, true, &mut chunk(1, 0, 2, 0, &[1]));
        let mut last = chunk(1, 0, 2, 1, &[1]);
        assert_eq!(agg.handle(Time::ZERO, worker_addr(1), PS, false, &mut last), Verdict::Forward { ce: true });
        assert!(!Repr::parse(&last).unwrap().has(FLAG_ECN), "the server sets ECN in its ACK, not the switch");
    }

    proptest::proptest! {
        /// Hostile packets (valid chunks with bytes flipped, and noise)
        /// never panic the stage, and the pool's accounting stays true:
        /// each job's `held` is the aggregators that hold its chunks.
        #[test]
        fn hostile_packets_keep_the_pool_consistent(
            packets in proptest::collection::vec(
                (0u16..3, 0u32..40, 0u8..4, proptest::collection::vec(proptest::num::i32::ANY, 1..6),
                 proptest::option::of((0usize..40, proptest::num::u8::ANY)), 0u8..3, 0u64..2000),
                1..200),
        ) {
            let mut agg = Aggregator::new(AggregationConfig { slots: 8, reclaim_after: Duration::from_millis(500) });
            for (job, sequence, worker, values, flip, kind, at_ms) in packets {
                let mut bytes = match kind {
                    // A worker's chunk, its resend, or the server's answer.
                    0 => chunk(job, sequence, 4, worker, &values),
                    1 => resend(chunk(job, sequence, 4, worker, &values)),
                    _ => Repr { flags: FLAG_ACK, job, sequence, workers: 4, worker: ALL_WORKERS, slot: agg.slot_of(job, sequence) as u16, values, ..Repr::default() }.to_bytes(),
                };
                let (src, dst) = if kind == 2 { (PS, worker_addr(0)) } else { (worker_addr(worker), PS) };
                if let Some((at, byte)) = flip {
                    let len = bytes.len();
                    bytes[at % len] ^= byte;
                }
                let _ = agg.handle(Time::from_millis(at_ms), src, dst, false, &mut bytes);
                for (job, counters) in agg.jobs() {
                    let holding = agg.slots.iter().filter(|s| s.holder.is_some_and(|(j, _)| j == *job)).count();
                    proptest::prop_assert_eq!(counters.held, holding as u64, "job {}", job);
                }
            }
        }
    }
}
