//! A worker as a sans-IO state machine: it streams one tensor per step,
//! in chunks of `values_per_packet`, to its job's parameter server, no
//! more chunks outstanding than its link window allows and no more of
//! them asking the switch for an aggregator than its aggregator window
//! allows (A2TP: the rest fall back to the server, flagged to bypass the
//! switch), resends a chunk whose
//! answer is late, and puts each answer (the chunk's sum over all
//! workers) into the step's result. Time is passed in (since the driver's
//! start); packets come in through [`Worker::handle_packet`] and leave
//! through [`Worker::poll_transmit`].
//!
//! Every worker of a job numbers chunks alike: step after step, each
//! chunk of the tensor takes the next sequence number.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use softrnic_wire::aggregation::{
    FLAG_ACK, FLAG_BYPASS, FLAG_COLLISION, FLAG_ECN, FLAG_OVERFLOW, FLAG_RESEND, MAX_VALUES, MAX_WORKERS, NO_SLOT,
    Packet, Repr,
};

use crate::rtt::{MAX_RTO, RttEstimator};
use crate::window::{AggregatorWindow, LinkWindow, Policy};

/// What a worker is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerConfig {
    pub job: u16,
    /// This worker's index, below `workers`.
    pub worker: u8,
    pub workers: u8,
    /// Values per chunk (ATP's packets hold 62).
    pub values_per_packet: usize,
    pub policy: Policy,
    /// Ask the switch not to aggregate: everything through the server.
    pub bypass: bool,
    pub initial_window: u32,
    pub max_window: u32,
    /// The shortest wait before a resend, and the wait before the first
    /// answer gives a round-trip time.
    pub min_rto: Duration,
    pub initial_rto: Duration,
}

impl WorkerConfig {
    pub fn new(job: u16, worker: u8, workers: u8) -> WorkerConfig {
        WorkerConfig {
            job,
            worker,
            workers,
            values_per_packet: MAX_VALUES,
            policy: Policy::A2tp,
            bypass: false,
            initial_window: 16,
            max_window: 1024,
            min_rto: Duration::from_millis(5),
            initial_rto: Duration::from_millis(200),
        }
    }

    /// Why this configuration cannot run, in words for a command line.
    pub fn check(&self) -> Result<(), String> {
        if self.workers == 0 || usize::from(self.workers) > MAX_WORKERS {
            return Err(format!("a job has 1 to {MAX_WORKERS} workers, not {}", self.workers));
        }
        if self.worker >= self.workers {
            return Err(format!("worker {} of {}: workers are numbered from 0", self.worker, self.workers));
        }
        if self.values_per_packet == 0 || self.values_per_packet > MAX_VALUES {
            return Err(format!("a chunk holds 1 to {MAX_VALUES} values, not {}", self.values_per_packet));
        }
        Ok(())
    }
}

/// What a worker has done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    pub sent: u64,
    pub resent: u64,
    pub acked: u64,
    /// ACKs that said a chunk collided (somewhere, for some worker).
    pub collided: u64,
    /// ACKs that came marked CE or said a packet of the chunk was.
    pub marked: u64,
    pub steps: u64,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    first_sent: Duration,
    /// Sends after the first.
    resends: u32,
    /// In the resend queue now.
    queued: bool,
    /// Bumped at each send, so a stale timer is known.
    generation: u32,
    /// Sent for the switch to aggregate; otherwise a fallback straight to
    /// the server (A2TP, beyond the aggregator window).
    switched: bool,
}

/// One step in progress: a tensor being summed.
#[derive(Debug)]
struct Step {
    tensor: Vec<i32>,
    result: Vec<i32>,
    first_sequence: u32,
    chunks: u32,
    /// Chunks not sent yet start here.
    next_chunk: u32,
    outstanding: BTreeMap<u32, Outstanding>,
    /// Of those, the ones sent for the switch to aggregate.
    switched: u32,
    /// Chunks to resend, in order.
    resend: VecDeque<u32>,
    answered: u32,
    overflow: bool,
}

/// A worker.
#[derive(Debug)]
pub struct Worker {
    config: WorkerConfig,
    link: LinkWindow,
    aggregators: AggregatorWindow,
    rtt: RttEstimator,
    /// Resend deadlines: (when, chunk, generation), the stale left to lapse.
    timers: BinaryHeap<Reverse<(Duration, u32, u32)>>,
    step: Option<Step>,
    next_sequence: u32,
    finished: Option<(Vec<i32>, bool)>,
    stats: WorkerStats,
}

impl Worker {
    pub fn new(config: WorkerConfig) -> Worker {
        Worker {
            link: LinkWindow::new(config.initial_window, config.max_window),
            aggregators: AggregatorWindow::new(config.initial_window),
            rtt: RttEstimator::new(config.min_rto, config.initial_rto),
            config,
            timers: BinaryHeap::new(),
            step: None,
            next_sequence: 0,
            finished: None,
            stats: WorkerStats::default(),
        }
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    pub fn stats(&self) -> WorkerStats {
        self.stats
    }

    /// Chunks that may be outstanding now: the link window's.
    pub fn window(&self) -> u32 {
        self.link.chunks() as u32
    }

    /// Of those, the chunks that may be sent for the switch to aggregate:
    /// under A2TP the aggregator window's (never above the link window),
    /// the rest falling back to the job's server; under ATP all of them.
    pub fn aggregator_window(&self) -> u32 {
        match self.config.policy {
            Policy::Atp => self.window(),
            Policy::A2tp => self.aggregators.chunks().min(self.link.chunks()) as u32,
        }
    }

    /// γ: 1 while the switch's aggregators wait little for the job's last
    /// worker, less the longer they wait (`rtt`).
    pub fn health(&self) -> f64 {
        self.rtt.health()
    }

    /// Starts summing `tensor` with the job's other workers; every worker
    /// of the job must start steps of the same length in the same order.
    pub fn start(&mut self, tensor: &[i32]) -> Result<(), String> {
        if self.step.is_some() {
            return Err("a step is already running".into());
        }
        let chunks = tensor.len().div_ceil(self.config.values_per_packet) as u32;
        let first_sequence = self.next_sequence;
        self.next_sequence = self.next_sequence.wrapping_add(chunks);
        self.finished = None;
        self.step = Some(Step {
            tensor: tensor.to_vec(),
            result: vec![0; tensor.len()],
            first_sequence,
            chunks,
            next_chunk: 0,
            outstanding: BTreeMap::new(),
            switched: 0,
            resend: VecDeque::new(),
            answered: 0,
            overflow: false,
        });
        self.finish_if_done();
        Ok(())
    }

    /// Whether no step is running.
    pub fn is_idle(&self) -> bool {
        self.step.is_none()
    }

    /// The last step's sum over all workers, and whether a value
    /// saturated.
    pub fn take_result(&mut self) -> Option<(Vec<i32>, bool)> {
        self.finished.take()
    }

    /// Writes the next packet to send into `buf`; false when the windows
    /// or the step allow none now.
    pub fn poll_transmit(&mut self, now: Duration, buf: &mut Vec<u8>) -> bool {
        let window = self.window().max(1) as usize;
        let aggregator_window = self.aggregator_window().max(1);
        let Some(step) = &mut self.step else { return false };
        // The queue may hold chunks answered since they were queued.
        let mut queued = None;
        while let Some(chunk) = step.resend.pop_front() {
            if let Some(o) = step.outstanding.get_mut(&chunk).filter(|o| o.queued) {
                o.queued = false;
                queued = Some(chunk);
                break;
            }
        }
        let (chunk, resend) = if let Some(chunk) = queued {
            (chunk, true)
        } else if step.next_chunk < step.chunks && step.outstanding.len() < window {
            step.next_chunk += 1;
            (step.next_chunk - 1, false)
        } else {
            return false;
        };
        // A new chunk takes an aggregator while the aggregator window has
        // room; a resend goes as its first copy went.
        let entry = step.outstanding.entry(chunk).or_insert(Outstanding {
            first_sent: now,
            resends: 0,
            queued: false,
            generation: 0,
            switched: step.switched < aggregator_window,
        });
        let switched = entry.switched;
        let per = self.config.values_per_packet;
        let start = chunk as usize * per;
        let values = &step.tensor[start..(start + per).min(step.tensor.len())];
        let mut flags = if resend { FLAG_RESEND } else { 0 };
        if self.config.bypass || !switched {
            flags |= FLAG_BYPASS;
        }
        let header = Repr {
            flags,
            job: self.config.job,
            sequence: step.first_sequence.wrapping_add(chunk),
            bitmap: 1 << self.config.worker,
            workers: self.config.workers,
            worker: self.config.worker,
            slot: NO_SLOT,
            wait_us: 0,
            values: Vec::new(),
        };
        header.emit_with_values(values, buf).expect("a chunk fits a packet (config checked)");
        if !resend && switched {
            step.switched += 1;
        }
        entry.resends += u32::from(resend);
        entry.generation += 1;
        // Each resend of a chunk waits twice as long as the one before.
        let wait = self.rtt.rto() * (1 << entry.resends.min(6));
        self.timers.push(Reverse((now + wait.min(MAX_RTO), chunk, entry.generation)));
        self.stats.sent += 1;
        self.stats.resent += u64::from(resend);
        true
    }

    /// A datagram arrived (`ce`: its IP header said congestion).
    pub fn handle_packet(&mut self, now: Duration, bytes: &[u8], ce: bool) {
        let packet = Packet::new_unchecked(bytes);
        if packet.check().is_err() || !packet.has(FLAG_ACK) || packet.job() != self.config.job {
            return;
        }
        let Some(step) = &mut self.step else { return };
        let chunk = packet.sequence().wrapping_sub(step.first_sequence);
        let Some(sent) = step.outstanding.get(&chunk).copied() else { return };
        let per = self.config.values_per_packet;
        let start = chunk as usize * per;
        let len = per.min(step.tensor.len() - start);
        if packet.count() != len {
            return;
        }
        for (slot, value) in step.result[start..start + len].iter_mut().zip(packet.values()) {
            *slot = value;
        }
        step.overflow |= packet.has(FLAG_OVERFLOW);
        step.outstanding.remove(&chunk);
        step.switched -= u32::from(sent.switched);
        step.answered += 1;
        if packet.slot() != NO_SLOT {
            self.rtt.aggregator_sample(Duration::from_micros(packet.wait_us().into()));
        }
        if sent.resends == 0 {
            // Karn: an answer to a chunk sent twice times neither copy.
            self.rtt.sample(now.saturating_sub(sent.first_sent));
        }
        let (ecn, collided) = (ce || packet.has(FLAG_ECN), packet.has(FLAG_COLLISION));
        self.link.on_ack(ecn);
        // A fallback chunk never asked the pool: it says nothing of it.
        if sent.switched {
            self.aggregators.on_ack(collided, self.rtt.health(), self.link.chunks());
        }
        self.stats.acked += 1;
        self.stats.marked += u64::from(ecn);
        self.stats.collided += u64::from(collided);
        self.finish_if_done();
    }

    fn finish_if_done(&mut self) {
        if self.step.as_ref().is_some_and(|s| s.answered == s.chunks) {
            let step = self.step.take().expect("checked");
            self.finished = Some((step.result, step.overflow));
            self.timers.clear();
            self.stats.steps += 1;
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) should next run.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.timers.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Queues for resending every chunk whose answer is late; the link
    /// window backs off once for all of them.
    pub fn handle_timeout(&mut self, now: Duration) {
        let mut late = false;
        while let Some(&Reverse((at, chunk, generation))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(step) = &mut self.step else { continue };
            if let Some(o) = step.outstanding.get_mut(&chunk).filter(|o| o.generation == generation && !o.queued) {
                o.queued = true;
                step.resend.push_back(chunk);
                late = true;
            }
        }
        if late {
            self.link.on_timeout();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(worker: &mut Worker, now: Duration) -> Vec<Repr> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while worker.poll_transmit(now, &mut buf) {
            out.push(Repr::parse(&buf).unwrap());
        }
        out
    }

    fn ack(sent: &Repr, values: Vec<i32>, flags: u8) -> Vec<u8> {
        Repr { flags: FLAG_ACK | flags, bitmap: 0b11, values, ..sent.clone() }.to_bytes()
    }

    #[test]
    fn streams_a_tensor_in_chunks_within_the_window_and_collects_the_sums() {
        let config = WorkerConfig { values_per_packet: 4, initial_window: 2, ..WorkerConfig::new(3, 1, 2) };
        let mut w = Worker::new(config);
        w.start(&(0..10).collect::<Vec<i32>>()).unwrap();
        let first = drain(&mut w, Duration::ZERO);
        assert_eq!(first.len(), 2, "the window holds two chunks");
        assert_eq!((first[0].sequence, first[0].bitmap, first[0].values.clone()), (0, 0b10, vec![0, 1, 2, 3]));
        let t = Duration::from_micros(100);
        w.handle_packet(t, &ack(&first[0], vec![10; 4], 0), false);
        w.handle_packet(t, &ack(&first[1], vec![20; 4], 0), false);
        let last = drain(&mut w, t);
        assert_eq!(last.iter().map(|r| r.values.len()).collect::<Vec<_>>(), vec![2], "the short last chunk");
        w.handle_packet(t, &ack(&last[0], vec![30, 31], 0), false);
        let (sum, overflow) = w.take_result().unwrap();
        assert_eq!(sum, vec![10, 10, 10, 10, 20, 20, 20, 20, 30, 31]);
        assert!(!overflow && w.is_idle());
        // The next step's chunks follow on.
        w.start(&[1]).unwrap();
        assert_eq!(drain(&mut w, t)[0].sequence, 3);
    }

    #[test]
    fn a_late_answer_means_a_resend_flagged_as_such() {
        let mut w = Worker::new(WorkerConfig { values_per_packet: 2, ..WorkerConfig::new(1, 0, 2) });
        w.start(&[1, 2]).unwrap();
        let sent = drain(&mut w, Duration::ZERO);
        let deadline = w.poll_timeout().unwrap();
        w.handle_timeout(deadline - Duration::from_nanos(1));
        assert!(drain(&mut w, deadline).is_empty(), "not yet");
        w.handle_timeout(deadline);
        let again = drain(&mut w, deadline);
        assert_eq!(again.len(), 1);
        assert!(again[0].has(FLAG_RESEND));
        assert_eq!(again[0].values, sent[0].values);
        // The answer to either copy finishes the step; a second is ignored.
        w.handle_packet(deadline, &ack(&sent[0], vec![3, 4], 0), false);
        w.handle_packet(deadline, &ack(&sent[0], vec![9, 9], 0), false);
        assert_eq!(w.take_result().unwrap().0, vec![3, 4]);
        assert_eq!(w.stats().resent, 1);
    }

    /// Under A2TP collisions shrink the aggregator window, and the chunks
    /// beyond it fall back to the server (bypassing the switch) while the
    /// link window keeps the job sending; ATP keeps asking the switch.
    #[test]
    fn collisions_shrink_the_aggregator_window_under_a2tp_and_the_rest_falls_back() {
        let run = |policy| {
            let config =
                WorkerConfig { values_per_packet: 1, initial_window: 64, policy, ..WorkerConfig::new(1, 0, 2) };
            let mut w = Worker::new(config);
            w.start(&[0; 4096]).unwrap();
            let (mut now, mut fallbacks) = (Duration::ZERO, 0);
            for _ in 0..20 {
                now += Duration::from_micros(50);
                for sent in drain(&mut w, now) {
                    fallbacks += u32::from(sent.flags & FLAG_BYPASS != 0);
                    // Only a chunk that asked the switch can collide.
                    let flags = if sent.flags & FLAG_BYPASS == 0 { FLAG_COLLISION } else { 0 };
                    w.handle_packet(now, &ack(&sent, vec![0], flags), false);
                }
            }
            (w.aggregator_window(), w.window(), fallbacks)
        };
        let (aggregators, link, fallbacks) = run(Policy::A2tp);
        assert!(aggregators < 16, "every chunk collided: the aggregator window fell to {aggregators}");
        assert!(link >= 64 && fallbacks > 1000, "the link window ({link}) sent the rest as {fallbacks} fallbacks");
        let (aggregators, _, fallbacks) = run(Policy::Atp);
        assert!(aggregators >= 64 && fallbacks == 0, "ATP's link window saw no ECN and never falls back");
    }

    #[test]
    fn answers_of_another_job_or_malformed_are_ignored() {
        let mut w = Worker::new(WorkerConfig { values_per_packet: 2, ..WorkerConfig::new(1, 0, 2) });
        w.start(&[1, 2]).unwrap();
        let sent = drain(&mut w, Duration::ZERO);
        w.handle_packet(
            Duration::ZERO,
            &Repr { job: 2, ..Repr::parse(&ack(&sent[0], vec![5, 5], 0)).unwrap() }.to_bytes(),
            false,
        );
        w.handle_packet(Duration::ZERO, &ack(&sent[0], vec![5], 0), false);
        w.handle_packet(Duration::ZERO, &[0xff; 7], false);
        assert!(!w.is_idle());
    }
}
