//! A job's parameter server as a sans-IO state machine: it sums in
//! software what the switch could not (collided chunks, resends, partial
//! sums a resend flushed, everything when the job bypasses the switch),
//! merging by bitmap so no worker counts twice, and answers each finished
//! chunk once, for all workers (the switch replicates the answer), or once
//! per worker where no switch does.
//!
//! It remembers the last [`ServerConfig::remember`] finished chunks, to
//! answer a resend whose answer was lost.
//!
//! Anyone can send a datagram to the aggregation port, so a packet counts
//! only from one of the job's workers (its caller says which, by the
//! packet's source address), naming that worker, and claiming for the sum
//! only bits that worker may: its own, or, for a switch's sum (which
//! leaves the switch in the packet of the worker that completed or
//! flushed it), any that include its own. At most
//! [`ServerConfig::max_pending`] chunks are summed at once: a flood of
//! sequences cannot grow the server without end.

use std::collections::{HashMap, VecDeque};

use softrnic_wire::aggregation::{
    ALL_WORKERS, FLAG_ACK, FLAG_AGGREGATED, FLAG_COLLISION, FLAG_ECN, FLAG_OVERFLOW, FLAG_RESEND, MAX_WORKERS, NO_SLOT,
    Repr,
};

/// Who an answer goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// Every worker: sent to worker 0, replicated by the switch.
    All,
    Worker(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    pub job: u16,
    pub workers: u8,
    /// One answer per worker (no aggregating switch to replicate it).
    pub unicast: bool,
    pub remember: usize,
    /// Chunks summed at once, at most (a worker keeps its window's worth
    /// in flight; those beyond are dropped, and resent).
    pub max_pending: usize,
}

impl ServerConfig {
    pub fn new(job: u16, workers: u8) -> ServerConfig {
        ServerConfig { job, workers, unicast: false, remember: 65_536, max_pending: 65_536 }
    }

    pub fn check(&self) -> Result<(), String> {
        if self.workers == 0 || usize::from(self.workers) > MAX_WORKERS {
            return Err(format!("a job has 1 to {MAX_WORKERS} workers, not {}", self.workers));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Packets summed here, by kind.
    pub collided: u64,
    pub resent: u64,
    pub partial: u64,
    pub whole: u64,
    pub bypassed: u64,
    /// Chunks finished, and their values.
    pub chunks: u64,
    pub values: u64,
    /// Packets that added nothing new: duplicates, and sums that overlap
    /// what is here already (their workers resend).
    pub duplicates: u64,
    pub overlapping: u64,
    /// Not this job's, or not well formed.
    pub foreign: u64,
    /// From no worker of the job, or claiming what its sender may not.
    pub impostors: u64,
    /// New chunks dropped while [`ServerConfig::max_pending`] were summed.
    pub crowded: u64,
}

#[derive(Debug)]
struct Pending {
    bitmap: u32,
    /// The longest an aggregator waited for this chunk's workers.
    wait_us: u16,
    values: Vec<i32>,
    flags: u8,
    slot: u16,
}

/// A parameter server.
#[derive(Debug)]
pub struct ParameterServer {
    config: ServerConfig,
    pending: HashMap<u32, Pending>,
    finished: HashMap<u32, Repr>,
    finished_order: VecDeque<u32>,
    out: VecDeque<(Destination, Vec<u8>)>,
    stats: ServerStats,
}

impl ParameterServer {
    pub fn new(config: ServerConfig) -> ParameterServer {
        ParameterServer {
            config,
            pending: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            out: VecDeque::new(),
            stats: ServerStats::default(),
        }
    }

    pub fn stats(&self) -> ServerStats {
        self.stats
    }

    fn all(&self) -> u32 {
        if self.config.workers >= 32 { u32::MAX } else { (1u32 << self.config.workers) - 1 }
    }

    /// A datagram arrived from worker `sender` (`None`: from an address
    /// that is no worker's of the job); `ce`: its IP header said
    /// congestion.
    pub fn handle_packet(&mut self, sender: Option<u8>, bytes: &[u8], ce: bool) {
        let Ok(repr) = Repr::parse(bytes) else {
            self.stats.foreign += 1;
            return;
        };
        if repr.job != self.config.job || repr.has(FLAG_ACK) || repr.workers != self.config.workers {
            self.stats.foreign += 1;
            return;
        }
        let all = self.all();
        if !may_claim(sender, &repr, all) {
            self.stats.impostors += 1;
            return;
        }
        let stats = &mut self.stats;
        match (repr.has(FLAG_AGGREGATED), repr.bitmap == all) {
            (true, true) => stats.whole += 1,
            (true, false) => stats.partial += 1,
            _ if repr.has(FLAG_COLLISION) => stats.collided += 1,
            _ if repr.has(FLAG_RESEND) => stats.resent += 1,
            _ => stats.bypassed += 1,
        }
        if let Some(answer) = self.finished.get(&repr.sequence) {
            // Done already: a resend means its worker missed the answer,
            // which goes to it alone, flagged so the switch does not count
            // it as progress.
            if repr.has(FLAG_RESEND) {
                let again = Repr { flags: answer.flags | FLAG_RESEND, worker: repr.worker, ..answer.clone() };
                self.out.push_back((Destination::Worker(repr.worker), again.to_bytes()));
            }
            self.stats.duplicates += 1;
            return;
        }
        if !self.pending.contains_key(&repr.sequence) && self.pending.len() >= self.config.max_pending {
            self.stats.crowded += 1;
            return;
        }
        let pending = self.pending.entry(repr.sequence).or_insert_with(|| Pending {
            bitmap: 0,
            wait_us: 0,
            values: vec![0; repr.values.len()],
            flags: 0,
            slot: NO_SLOT,
        });
        if repr.bitmap & pending.bitmap != 0 || pending.values.len() != repr.values.len() {
            if repr.bitmap & !pending.bitmap == 0 {
                self.stats.duplicates += 1;
            } else {
                self.stats.overlapping += 1;
            }
            return;
        }
        for (sum, v) in pending.values.iter_mut().zip(&repr.values) {
            let (added, overflow) = sum.overflowing_add(*v);
            *sum = if overflow { sum.saturating_add(*v) } else { added };
            if overflow {
                pending.flags |= FLAG_OVERFLOW;
            }
        }
        pending.bitmap |= repr.bitmap;
        pending.flags |= repr.flags & (FLAG_COLLISION | FLAG_OVERFLOW | FLAG_ECN);
        if ce {
            pending.flags |= FLAG_ECN;
        }
        if repr.has(FLAG_AGGREGATED) && repr.slot != NO_SLOT {
            pending.slot = repr.slot;
            pending.wait_us = pending.wait_us.max(repr.wait_us);
        }
        if pending.bitmap == all {
            let done = self.pending.remove(&repr.sequence).expect("present");
            self.finish(repr.sequence, done);
        }
    }

    fn finish(&mut self, sequence: u32, done: Pending) {
        let answer = Repr {
            flags: FLAG_ACK | done.flags,
            job: self.config.job,
            sequence,
            bitmap: done.bitmap,
            workers: self.config.workers,
            worker: ALL_WORKERS,
            slot: done.slot,
            wait_us: done.wait_us,
            values: done.values,
        };
        self.stats.chunks += 1;
        self.stats.values += answer.values.len() as u64;
        if self.config.unicast {
            for w in 0..self.config.workers {
                self.out.push_back((Destination::Worker(w), Repr { worker: w, ..answer.clone() }.to_bytes()));
            }
        } else {
            self.out.push_back((Destination::All, answer.to_bytes()));
        }
        self.finished.insert(sequence, answer);
        self.finished_order.push_back(sequence);
        while self.finished_order.len() > self.config.remember {
            let old = self.finished_order.pop_front().expect("non-empty");
            self.finished.remove(&old);
        }
    }

    /// The next answer to send.
    pub fn poll_transmit(&mut self) -> Option<(Destination, Vec<u8>)> {
        self.out.pop_front()
    }

    /// Chunks being summed now.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// Whether the worker `sender` may send `repr`: it names itself, and
/// claims its own bit alone, or for a switch's sum its own among others
/// of the job's (`all`).
fn may_claim(sender: Option<u8>, repr: &Repr, all: u32) -> bool {
    let Some(worker) = sender.filter(|&w| w == repr.worker && w < 32) else { return false };
    let own = 1u32 << worker;
    let claimed = repr.bitmap;
    claimed & !all == 0 && if repr.has(FLAG_AGGREGATED) { claimed & own != 0 } else { claimed == own }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(worker: u8, sequence: u32, values: Vec<i32>, flags: u8) -> Vec<u8> {
        Repr { flags, job: 1, sequence, bitmap: 1 << worker, workers: 3, worker, slot: NO_SLOT, wait_us: 0, values }
            .to_bytes()
    }

    /// Whatever mix of switch sums and single chunks arrives, each worker
    /// counts once and one answer leaves, for all.
    #[test]
    fn merges_partial_sums_and_single_chunks_by_bitmap() {
        let mut ps = ParameterServer::new(ServerConfig::new(1, 3));
        let partial = Repr {
            flags: FLAG_AGGREGATED | FLAG_RESEND,
            bitmap: 0b011,
            slot: 7,
            wait_us: 40,
            ..Repr::parse(&from(0, 5, vec![3, 3], 0)).unwrap()
        };
        ps.handle_packet(Some(0), &partial.to_bytes(), false);
        ps.handle_packet(Some(1), &from(1, 5, vec![2, 2], FLAG_RESEND), false);
        assert!(ps.poll_transmit().is_none(), "worker 1 is in the partial sum already");
        ps.handle_packet(Some(2), &from(2, 5, vec![10, 20], FLAG_COLLISION), true);
        let (to, bytes) = ps.poll_transmit().unwrap();
        let answer = Repr::parse(&bytes).unwrap();
        assert_eq!(to, Destination::All);
        assert_eq!(answer.values, vec![13, 23]);
        assert_eq!((answer.worker, answer.slot, answer.bitmap, answer.wait_us), (ALL_WORKERS, 7, 0b111, 40));
        assert_eq!(answer.flags, FLAG_ACK | FLAG_COLLISION | FLAG_ECN);
        let s = ps.stats();
        assert_eq!((s.partial, s.resent, s.collided, s.duplicates, s.chunks), (1, 1, 1, 1, 1));
    }

    #[test]
    fn a_resend_after_the_answer_is_answered_again() {
        let mut ps = ParameterServer::new(ServerConfig { unicast: true, ..ServerConfig::new(1, 3) });
        for w in 0..3 {
            ps.handle_packet(Some(w), &from(w, 0, vec![1], FLAG_COLLISION), false);
        }
        let answers: Vec<_> = std::iter::from_fn(|| ps.poll_transmit()).collect();
        assert_eq!(
            answers.iter().map(|a| a.0).collect::<Vec<_>>(),
            (0..3).map(Destination::Worker).collect::<Vec<_>>()
        );
        ps.handle_packet(Some(2), &from(2, 0, vec![1], FLAG_RESEND), false);
        let (to, bytes) = ps.poll_transmit().unwrap();
        let again = Repr::parse(&bytes).unwrap();
        assert_eq!((to, &again.values, again.worker), (Destination::Worker(2), &vec![3], 2));
        assert!(again.has(FLAG_RESEND), "not counted twice as progress by the switch");
    }

    #[test]
    fn an_overlapping_sum_is_refused_and_foreign_packets_ignored() {
        let mut ps = ParameterServer::new(ServerConfig::new(1, 3));
        ps.handle_packet(Some(0), &from(0, 0, vec![1], FLAG_RESEND), false);
        let overlap = Repr { flags: FLAG_AGGREGATED, bitmap: 0b011, ..Repr::parse(&from(0, 0, vec![9], 0)).unwrap() };
        ps.handle_packet(Some(0), &overlap.to_bytes(), false);
        ps.handle_packet(Some(1), &Repr { job: 9, ..Repr::parse(&from(1, 0, vec![1], 0)).unwrap() }.to_bytes(), false);
        ps.handle_packet(Some(1), &[1, 2, 3], false);
        let s = ps.stats();
        assert_eq!((s.overlapping, s.foreign), (1, 2));
        assert!(ps.poll_transmit().is_none());
    }

    /// A stranger's packet, a worker naming another, a worker's own chunk
    /// claiming others' bits, and bits past the job's workers: none counts,
    /// and the chunk still finishes with the workers' true sum. Before, a
    /// forged bitmap took the chunk: the real workers' chunks were then
    /// refused as overlapping, and the sum was the forger's.
    #[test]
    fn only_a_worker_counts_and_only_for_itself() {
        let mut ps = ParameterServer::new(ServerConfig::new(1, 3));
        let forged = |worker: u8, bitmap: u32, flags: u8| {
            Repr { bitmap, flags, ..Repr::parse(&from(worker, 0, vec![1000], 0)).unwrap() }.to_bytes()
        };
        ps.handle_packet(None, &forged(0, 0b111, FLAG_AGGREGATED), false);
        ps.handle_packet(Some(1), &forged(0, 0b001, 0), false);
        ps.handle_packet(Some(1), &forged(1, 0b111, 0), false);
        ps.handle_packet(Some(1), &forged(1, 0b101, FLAG_AGGREGATED), false);
        ps.handle_packet(Some(2), &forged(2, 0b1100, FLAG_AGGREGATED), false);
        assert_eq!((ps.stats().impostors, ps.pending()), (5, 0));
        for w in 0..3 {
            ps.handle_packet(Some(w), &from(w, 0, vec![i32::from(w) + 1], 0), false);
        }
        let (_, bytes) = ps.poll_transmit().expect("the chunk finishes");
        assert_eq!(Repr::parse(&bytes).unwrap().values, vec![6], "the workers' sum, nothing forged in it");
    }

    /// A worker's flood of chunks far ahead: at most `max_pending` are
    /// summed at once, the rest dropped for their senders to resend.
    #[test]
    fn a_flood_of_chunks_is_held_to_the_most_pending() {
        let mut ps = ParameterServer::new(ServerConfig { max_pending: 100, ..ServerConfig::new(1, 3) });
        for sequence in 0..10_000 {
            ps.handle_packet(Some(0), &from(0, sequence, vec![1], 0), false);
        }
        assert_eq!((ps.pending(), ps.stats().crowded), (100, 9_900));
        for w in 1..3 {
            ps.handle_packet(Some(w), &from(w, 7, vec![1], 0), false);
        }
        assert!(ps.poll_transmit().is_some(), "a pending chunk still finishes");
        ps.handle_packet(Some(0), &from(0, 20_000, vec![1], 0), false);
        assert_eq!(ps.pending(), 100, "and makes room for one more");
    }
}
