//! N-to-1 incast through one switch, in virtual time: the scenario that
//! shows whether a congestion-control algorithm controls the rate.
//!
//! N senders and one receiver hang off one switch; every link runs at the
//! same rate. Each sender keeps WRITEs posted to the receiver for the
//! whole run, joining `stagger` after the one before it (staggered join;
//! zero for a synchronised incast). The run samples every flow's delivered
//! rate (bytes its WRITEs completed) and the bottleneck queue, and reports
//! what the E3 table quotes: Jain's fairness index and link utilisation
//! over the steady part of the run (after the last join and a settling
//! time), and the peak and p99 queue.

use std::time::Duration;

use softrnic_switch::{Graph, LinkFaults, PfcConfig, PortConfig};
use softrnic_transport::{Choice, Completion, CongestionConfig, Instant, Mtu, TransportConfig, WcStatus};

use crate::fabric::{FabricSpec, Link};
use crate::flows::{self, Host};
use crate::world::World;

/// Bytes per WRITE: small enough that completions sample the rate finely.
const CHUNK: u32 = 16 * 1024;
/// WRITEs a flow keeps posted: enough that the window, not the posts,
/// limits what is in flight.
const DEPTH: usize = 64;
const MTU: Mtu = Mtu::Mtu4096;

/// One incast run.
#[derive(Debug, Clone)]
pub struct IncastConfig {
    pub senders: usize,
    pub rate_bps: u64,
    /// One-way delay of every link.
    pub link_delay: Duration,
    /// The switch's shared buffer; one queue may take all of it.
    pub buffer: u64,
    pub duration: Duration,
    /// Between one sender's start and the next's.
    pub stagger: Duration,
    /// Time after the last join before the steady part begins.
    pub settle: Duration,
    pub sample: Duration,
    pub algorithm: Option<Choice>,
    pub seed: u64,
}

impl IncastConfig {
    /// E3's simulated incast: `senders` to 1 at 100 Gb/s, 1 µs links, a
    /// 16 MB buffer (a Tomahawk's share, as HPCC's simulations give their
    /// switches), all starting together.
    pub fn e3(senders: usize, algorithm: Option<Choice>) -> IncastConfig {
        IncastConfig {
            senders,
            rate_bps: 100_000_000_000,
            link_delay: Duration::from_micros(1),
            buffer: 16 << 20,
            duration: Duration::from_millis(10),
            stagger: Duration::ZERO,
            settle: Duration::from_millis(2),
            sample: Duration::from_micros(50),
            algorithm,
            seed: 1,
        }
    }

    /// The round trip of the empty path: four link delays plus the
    /// serialisation of a packet on each of the two links there.
    pub fn base_rtt(&self) -> Duration {
        let packet = (MTU.bytes() as u64 + 100) * 8 * 1_000_000_000 / self.rate_bps;
        self.link_delay * 4 + Duration::from_nanos(2 * packet)
    }
}

/// What one incast run measured.
#[derive(Debug, Clone)]
pub struct IncastRun {
    /// Sample times, from the start.
    pub times: Vec<Duration>,
    /// Per flow, its delivered rate in each sample interval, Gb/s.
    pub flow_gbps: Vec<Vec<f64>>,
    /// The bottleneck queue at each sample, bytes.
    pub queue_bytes: Vec<u64>,
    /// Jain's fairness index of the flows' steady rates.
    pub fairness: f64,
    /// The bottleneck link's steady delivered rate over its capacity.
    pub utilisation: f64,
    pub peak_queue: u64,
    pub p99_queue: u64,
    /// Packets the switch dropped.
    pub drops: u64,
    /// CNPs the receiver sent, and packets it received marked CE.
    pub cnps: u64,
    pub ce_marked: u64,
}

/// Jain's fairness index: 1 when all are equal, 1/n when one has all.
pub fn jain(rates: &[f64]) -> f64 {
    let sum: f64 = rates.iter().sum();
    let squares: f64 = rates.iter().map(|r| r * r).sum();
    if squares == 0.0 { 0.0 } else { sum * sum / (rates.len() as f64 * squares) }
}

impl IncastConfig {
    pub fn run(&self) -> IncastRun {
        let n = self.senders;
        let receiver = n;
        let link = Link { rate_bps: self.rate_bps, delay: self.link_delay };
        let spec = FabricSpec {
            graph: Graph { switches: 1, host_switch: vec![0; n + 1], links: Vec::new() },
            host_links: vec![link; n + 1],
            switch_links: Vec::new(),
            port: incast_port,
            shared_buffer: self.buffer,
            seed: self.seed,
            faults: LinkFaults::NONE,
            aggregation: None,
        };
        let config = TransportConfig {
            // Without congestion control the window alone holds a sender
            // back: a generous one, as a NIC's, so the queue shows it.
            max_inflight_packets: 512,
            ack_request_interval: 8,
            congestion: CongestionConfig {
                algorithm: self.algorithm.clone(),
                // Every host speaks INT, so HPCC's switches can stamp.
                int: true,
                line_rate_bps: self.rate_bps,
                base_rtt: self.base_rtt(),
                ..CongestionConfig::default()
            },
            ..TransportConfig::default()
        };
        let mut world = World::with_fabric(&spec, config);
        let hosts: Vec<Host> = (0..=n).map(|h| Host::open(&mut world, h, CHUNK as usize)).collect();
        let mut qpns = vec![None; n];
        let mut outstanding = vec![0usize; n];
        let mut delivered = vec![0u64; n];
        let mut last = vec![0u64; n];
        let mut run = IncastRun {
            times: Vec::new(),
            flow_gbps: vec![Vec::new(); n],
            queue_bytes: Vec::new(),
            fairness: 0.0,
            utilisation: 0.0,
            peak_queue: 0,
            p99_queue: 0,
            drops: 0,
            cnps: 0,
            ce_marked: 0,
        };
        let mut completions: Vec<Completion> = Vec::new();
        let step = Duration::from_micros(1);
        let mut next_sample = self.sample;
        let steady_from = self.stagger * (n as u32 - 1) + self.settle;
        let (mut steady_bytes, mut steady_start) = (vec![0u64; n], None);
        loop {
            let now = world.now - Instant::ZERO;
            if now >= self.duration {
                break;
            }
            for s in 0..n {
                if qpns[s].is_none() && now >= self.stagger * s as u32 {
                    qpns[s] = Some(flows::connect(&mut world, &hosts, (s, receiver), MTU, DEPTH));
                }
                let Some(qpn) = qpns[s] else { continue };
                while outstanding[s] < DEPTH {
                    flows::post_write(&mut world, &hosts, (s, receiver), qpn, s as u64, CHUNK);
                    outstanding[s] += 1;
                }
                completions.clear();
                world.device(s).poll_cq(hosts[s].cq, usize::MAX, &mut completions);
                for c in &completions {
                    assert_eq!(c.status, WcStatus::Success, "flow {s} failed under incast");
                    outstanding[s] -= 1;
                    delivered[s] += u64::from(CHUNK);
                }
            }
            if now >= next_sample {
                let fabric = world.fabric.as_mut().expect("a fabric world");
                let samples = fabric.switch_mut(0).take_samples(now);
                let bottleneck = samples.iter().filter(|q| q.port == receiver);
                let (queue, peak) = bottleneck.fold((0, 0), |(q, p), s| (q + s.bytes, p.max(s.peak_bytes)));
                run.peak_queue = run.peak_queue.max(peak);
                run.times.push(now);
                run.queue_bytes.push(queue);
                let seconds = self.sample.as_secs_f64();
                for s in 0..n {
                    run.flow_gbps[s].push((delivered[s] - last[s]) as f64 * 8.0 / seconds / 1e9);
                    last[s] = delivered[s];
                }
                if now >= steady_from && steady_start.is_none() {
                    steady_start = Some((now, delivered.clone()));
                }
                next_sample += self.sample;
            }
            world.run_until_time(world.now + step);
        }
        let end = world.now - Instant::ZERO;
        if let Some((start, at_start)) = steady_start {
            for s in 0..n {
                steady_bytes[s] = delivered[s] - at_start[s];
            }
            let seconds = (end - start).as_secs_f64();
            let rates: Vec<f64> = steady_bytes.iter().map(|&b| b as f64 * 8.0 / seconds).collect();
            run.fairness = jain(&rates);
            run.utilisation = rates.iter().sum::<f64>() / self.rate_bps as f64;
            let mut steady_queue: Vec<u64> =
                run.times.iter().zip(&run.queue_bytes).filter(|(t, _)| **t >= start).map(|(_, &q)| q).collect();
            steady_queue.sort_unstable();
            if let Some(&p99) =
                steady_queue.get((steady_queue.len() * 99 / 100).min(steady_queue.len().saturating_sub(1)))
            {
                run.p99_queue = p99;
            }
        }
        let fabric = world.fabric.as_ref().expect("a fabric world");
        run.drops = fabric.dropped();
        run.ce_marked = fabric.ce_delivered;
        run.cnps = world.device(receiver).counters().cnps_sent;
        run
    }
}

/// Every port: HPCC's ECN thresholds for its rate, one queue may take
/// the whole shared buffer, and PFC, as RoCE fabrics run DCQCN: a sender
/// is paused once it holds 1.75 MB of the buffer (eight of them fit the
/// 16 MB buffer with headroom for what is on the wire).
fn incast_port(link: &Link) -> PortConfig {
    let pfc = PfcConfig { xoff: 1792 * 1024, xon: 1536 * 1024 };
    PortConfig { pfc: Some(pfc), ..PortConfig::new(link.rate_bps, u64::MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jains_index() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), 1.0);
        assert_eq!(jain(&[1.0, 0.0, 0.0, 0.0]), 0.25);
    }
}
