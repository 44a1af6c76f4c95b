//! Flow completion times on a fat tree, the evaluation of HPCC and its
//! successors, run on softrnic's own transport and switch pipeline in
//! virtual time.
//!
//! The tree is HPCC's (`fat.txt`): 320 servers, 16 per ToR, 20 ToRs and 20
//! aggregation switches in 5 pods of 4, 16 core switches; server links
//! 100 Gb/s, the rest 400 Gb/s, 1 µs per link. `scale` divides every rate
//! (and the buffers), so that a short window runs in minutes on 2 cores.
//! Flows arrive at each server as a Poisson process whose rate makes the
//! offered load `load` of its link, to a uniformly chosen other server,
//! with sizes drawn from the WebSearch or FB_Hadoop distribution (the
//! tables HPCC's traffic generator reads); each is an RC QP pair writing
//! its bytes. A flow's slowdown is its completion time over the time it
//! would take alone: the round trip of its path plus its bytes at the
//! server link's rate (the shape of HPCC's `fct_analysis.py`).

use std::time::Duration;

use softrnic_switch::{Graph, LinkFaults, PortConfig};
use softrnic_transport::{Choice, Completion, Instant, Mtu, TransportConfig, WcStatus};

use crate::fabric::{FabricSpec, HEADERS, Link};
use crate::flows::{self, Host};
use crate::world::World;

/// Flow sizes in bytes and the cumulative percentage of flows at or
/// below each (linear between points), as in HPCC's traffic generator.
const WEB_SEARCH: &[(u64, f64)] = &[
    (0, 0.0),
    (10_000, 15.0),
    (20_000, 20.0),
    (30_000, 30.0),
    (50_000, 40.0),
    (80_000, 53.0),
    (200_000, 60.0),
    (1_000_000, 70.0),
    (2_000_000, 80.0),
    (5_000_000, 90.0),
    (10_000_000, 97.0),
    (30_000_000, 100.0),
];
const FB_HADOOP: &[(u64, f64)] = &[
    (0, 0.0),
    (100, 1.0),
    (200, 2.0),
    (300, 5.0),
    (350, 15.0),
    (400, 20.0),
    (500, 30.0),
    (600, 40.0),
    (700, 50.0),
    (1_000, 60.0),
    (2_000, 67.0),
    (7_000, 70.0),
    (30_000, 72.0),
    (50_000, 82.0),
    (80_000, 87.0),
    (120_000, 90.0),
    (300_000, 95.0),
    (1_000_000, 97.5),
    (2_000_000, 99.0),
    (10_000_000, 100.0),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    WebSearch,
    FbHadoop,
}

impl Workload {
    pub fn parse(name: &str) -> Result<Workload, String> {
        match name {
            "websearch" | "web_search" | "WebSearch" => Ok(Workload::WebSearch),
            "hadoop" | "fb_hadoop" | "FB_Hadoop" => Ok(Workload::FbHadoop),
            other => Err(format!("`{other}` is not a workload: give websearch or hadoop")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::WebSearch => "websearch",
            Workload::FbHadoop => "hadoop",
        }
    }

    pub fn cdf(self) -> &'static [(u64, f64)] {
        match self {
            Workload::WebSearch => WEB_SEARCH,
            Workload::FbHadoop => FB_HADOOP,
        }
    }

    /// A flow size, by inverting the CDF at a uniform percentile.
    pub fn sample(self, rng: &mut fastrand::Rng) -> u64 {
        let p = rng.f64() * 100.0;
        let cdf = self.cdf();
        let i = cdf.iter().position(|&(_, q)| q >= p).unwrap_or(cdf.len() - 1).max(1);
        let ((s0, p0), (s1, p1)) = (cdf[i - 1], cdf[i]);
        let t = if p1 > p0 { (p - p0) / (p1 - p0) } else { 1.0 };
        ((s0 as f64 + t * (s1 - s0) as f64) as u64).max(1)
    }

    /// The mean flow size: the integral of the piecewise-linear CDF.
    pub fn mean(self) -> f64 {
        self.cdf().windows(2).map(|w| (w[1].1 - w[0].1) / 100.0 * (w[0].0 + w[1].0) as f64 / 2.0).sum()
    }
}

/// A three-tier fat tree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FatTree {
    pub pods: usize,
    pub tors_per_pod: usize,
    pub aggs_per_pod: usize,
    pub cores: usize,
    pub hosts_per_tor: usize,
    pub host_rate_bps: u64,
    pub fabric_rate_bps: u64,
    pub link_delay: Duration,
    /// Packet buffer of every switch.
    pub buffer: u64,
}

impl FatTree {
    /// HPCC's 320-server tree with every rate and buffer divided by `scale`.
    pub fn hpcc(scale: u64) -> FatTree {
        FatTree {
            pods: 5,
            tors_per_pod: 4,
            aggs_per_pod: 4,
            cores: 16,
            hosts_per_tor: 16,
            host_rate_bps: 100_000_000_000 / scale,
            fabric_rate_bps: 400_000_000_000 / scale,
            link_delay: Duration::from_micros(1),
            buffer: 32_000_000 / scale,
        }
    }

    pub fn hosts(&self) -> usize {
        self.pods * self.tors_per_pod * self.hosts_per_tor
    }

    /// Switches are numbered ToRs, then aggregation switches, then cores.
    pub fn graph(&self) -> Graph {
        let tors = self.pods * self.tors_per_pod;
        let aggs = self.pods * self.aggs_per_pod;
        let host_switch = (0..self.hosts()).map(|h| h / self.hosts_per_tor).collect();
        let mut links = Vec::new();
        for pod in 0..self.pods {
            for t in 0..self.tors_per_pod {
                for a in 0..self.aggs_per_pod {
                    links.push((pod * self.tors_per_pod + t, tors + pod * self.aggs_per_pod + a));
                }
            }
        }
        // Aggregation switch `a` of every pod joins core group `a`.
        let per_agg = self.cores / self.aggs_per_pod;
        for pod in 0..self.pods {
            for a in 0..self.aggs_per_pod {
                for c in 0..per_agg {
                    links.push((tors + pod * self.aggs_per_pod + a, tors + aggs + a * per_agg + c));
                }
            }
        }
        Graph { switches: tors + aggs + self.cores, host_switch, links }
    }

    pub fn spec(&self, seed: u64) -> FabricSpec {
        let graph = self.graph();
        let (host, fabric) = (
            Link { rate_bps: self.host_rate_bps, delay: self.link_delay },
            Link { rate_bps: self.fabric_rate_bps, delay: self.link_delay },
        );
        fn port(link: &Link) -> PortConfig {
            // Any one queue may take a quarter of the buffer.
            PortConfig::new(link.rate_bps, link.rate_bps / 8 / 1000 * 80)
        }
        FabricSpec {
            host_links: vec![host; graph.host_switch.len()],
            switch_links: vec![fabric; graph.links.len()],
            graph,
            port,
            shared_buffer: self.buffer,
            seed,
            faults: LinkFaults::NONE,
            aggregation: None,
        }
    }

    /// Links between two servers: 2 under one ToR, 4 within a pod, 6
    /// across the core.
    pub fn hops(&self, a: usize, b: usize) -> usize {
        let (ta, tb) = (a / self.hosts_per_tor, b / self.hosts_per_tor);
        match () {
            _ if ta == tb => 2,
            _ if ta / self.tors_per_pod == tb / self.tors_per_pod => 4,
            _ => 6,
        }
    }
}

/// One run's parameters.
#[derive(Debug, Clone)]
pub struct FctConfig {
    pub tree: FatTree,
    pub workload: Workload,
    /// Offered load on every server link, 0 to 1.
    pub load: f64,
    /// Flows start within this much simulated time.
    pub window: Duration,
    /// The run stops here even if flows are unfinished.
    pub limit: Duration,
    pub seed: u64,
    /// The congestion control every flow runs (every host speaks INT).
    pub algorithm: Option<Choice>,
}

/// One flow's outcome.
#[derive(Debug, Clone, Copy)]
pub struct FlowResult {
    pub src: usize,
    pub dst: usize,
    pub size: u64,
    pub start: Duration,
    /// None if it had not finished by the limit, or its QP gave up.
    pub fct: Option<Duration>,
    pub ideal: Duration,
}

impl FlowResult {
    pub fn slowdown(&self) -> Option<f64> {
        Some((self.fct?.as_secs_f64() / self.ideal.as_secs_f64()).max(1.0))
    }
}

#[derive(Debug)]
pub struct FctRun {
    pub flows: Vec<FlowResult>,
    pub simulated: Duration,
    /// Datagrams the fabric carried, and those its switches dropped.
    pub packets: u64,
    pub dropped: u64,
}

/// The transport's MTU in the fat tree, as HPCC's 1000-byte packets.
pub const MTU: Mtu = Mtu::Mtu1024;
/// Bytes one WRITE carries: a flow is a run of them on its QP.
const CHUNK: u64 = 256 * 1024;
/// WRITEs a flow keeps posted.
const DEPTH: usize = 8;
/// Every server's registered region: the source and target of all its
/// flows' WRITEs (their bytes are not what this measures).
const REGION: usize = CHUNK as usize;

/// A flow while the run goes on.
struct Live {
    result: FlowResult,
    qpn: u32,
    posted: u64,
    completed: u64,
    outstanding: usize,
    failed: bool,
}

impl FctConfig {
    /// The flows: Poisson arrivals per server over the window.
    pub fn flows(&self) -> Vec<FlowResult> {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let hosts = self.tree.hosts();
        let per_second = self.load * self.tree.host_rate_bps as f64 / 8.0 / self.workload.mean();
        let mut flows = Vec::new();
        for src in 0..hosts {
            let mut t = 0.0;
            loop {
                t += -(1.0 - rng.f64()).ln() / per_second;
                if t >= self.window.as_secs_f64() {
                    break;
                }
                let mut dst = rng.usize(..hosts - 1);
                if dst >= src {
                    dst += 1;
                }
                let size = self.workload.sample(&mut rng);
                let ideal = self.ideal(src, dst, size);
                flows.push(FlowResult { src, dst, size, start: Duration::from_secs_f64(t), fct: None, ideal });
            }
        }
        flows.sort_by_key(|f| f.start);
        flows
    }

    /// Alone on the network: a round trip of the path's propagation and
    /// one packet's store-and-forward per hop, plus the bytes (with their
    /// headers) at the server link's rate.
    pub fn ideal(&self, src: usize, dst: usize, size: u64) -> Duration {
        let mtu = u64::from(MTU.bytes());
        let packets = size.div_ceil(mtu).max(1);
        let wire = size + packets * (HEADERS as u64 + 12 + 4);
        let hops = self.tree.hops(src, dst) as u32;
        let bits = |bytes: u64, rate: u64| Duration::from_secs_f64(bytes as f64 * 8.0 / rate as f64);
        let store_and_forward = bits(mtu.min(size) + HEADERS as u64, self.tree.fabric_rate_bps) * (hops - 1);
        self.tree.link_delay * 2 * hops + store_and_forward + bits(wire, self.tree.host_rate_bps)
    }

    /// Runs every flow to completion (or the limit).
    pub fn run(&self) -> FctRun {
        self.run_flows(self.flows())
    }

    /// Runs these flows to completion (or the limit).
    pub fn run_flows(&self, flows: Vec<FlowResult>) -> FctRun {
        let tree = &self.tree;
        let rtt = self.ideal(0, tree.hosts() - 1, 1).as_secs_f64() * 2.0;
        // No congestion control: a fixed window of about one round trip's
        // bytes, as HPCC's simulator gives its windowed senders.
        let bdp = (rtt * tree.host_rate_bps as f64 / 8.0 / f64::from(MTU.bytes())).ceil() as u32;
        let window = bdp.max(4);
        // ACKs asked for often enough that the window never waits for one.
        let mut config = TransportConfig {
            max_inflight_packets: window,
            ack_request_interval: (window / 4).max(1),
            ..TransportConfig::default()
        };
        config.congestion.algorithm = self.algorithm.clone();
        config.congestion.int = true;
        config.congestion.line_rate_bps = tree.host_rate_bps;
        config.congestion.base_rtt = Duration::from_secs_f64(rtt);
        let mut world = World::with_fabric(&tree.spec(self.seed), config);
        let servers: Vec<Host> = (0..tree.hosts()).map(|h| Host::open(&mut world, h, REGION)).collect();
        let mut pending = flows.into_iter().peekable();
        let mut live: Vec<Live> = Vec::new();
        let mut by_qp: std::collections::HashMap<(usize, u32), usize> = Default::default();
        let mut done = Vec::new();
        let step = Duration::from_micros(1);
        let mut completions: Vec<Completion> = Vec::new();
        loop {
            let now = world.now - Instant::ZERO;
            while let Some(flow) = pending.next_if(|f| f.start <= now) {
                let qpn = flows::connect(&mut world, &servers, (flow.src, flow.dst), MTU, DEPTH);
                by_qp.insert((flow.src, qpn), live.len());
                live.push(Live { result: flow, qpn, posted: 0, completed: 0, outstanding: 0, failed: false });
            }
            for (i, flow) in live.iter_mut().enumerate() {
                if flow.result.fct.is_none() && !flow.failed {
                    post_chunks(&mut world, &servers, flow, i);
                }
            }
            let mut busy = std::collections::BTreeSet::new();
            for flow in live.iter().filter(|f| f.result.fct.is_none() && !f.failed) {
                busy.insert(flow.result.src);
            }
            for src in busy {
                completions.clear();
                world.device(src).poll_cq(servers[src].cq, usize::MAX, &mut completions);
                for c in &completions {
                    let Some(&i) = by_qp.get(&(src, c.qp_num)) else { continue };
                    let flow = &mut live[i];
                    if flow.failed {
                        continue;
                    }
                    if c.status != WcStatus::Success {
                        // Its QP gave up (retries exhausted): it never
                        // finishes, and the run does not wait for it.
                        flow.failed = true;
                        done.push(i);
                        continue;
                    }
                    flow.completed += 1;
                    flow.outstanding -= 1;
                    if flow.completed * CHUNK >= flow.result.size {
                        flow.result.fct = Some(now.saturating_sub(flow.result.start));
                        done.push(i);
                    }
                }
            }
            let all_started = pending.peek().is_none();
            if all_started && done.len() == live.len() || now >= self.limit {
                break;
            }
            let until = world.now + step;
            if !world.run_until_time(until) && all_started && done.len() == live.len() {
                break;
            }
        }
        let fabric = world.fabric.as_ref().expect("a fabric world");
        FctRun {
            flows: live.into_iter().map(|l| l.result).collect(),
            simulated: world.now - Instant::ZERO,
            packets: fabric.stats.sent,
            dropped: fabric.dropped(),
        }
    }
}

/// Keeps up to DEPTH WRITEs of the flow posted.
fn post_chunks(world: &mut World, servers: &[Host], flow: &mut Live, index: usize) {
    while flow.outstanding < DEPTH && flow.posted * CHUNK < flow.result.size {
        let len = (flow.result.size - flow.posted * CHUNK).min(CHUNK) as u32;
        let wr_id = (index as u64) << 20 | flow.posted;
        flows::post_write(world, servers, (flow.result.src, flow.result.dst), flow.qpn, wr_id, len);
        flow.posted += 1;
        flow.outstanding += 1;
    }
}

/// Slowdown percentiles of the flows in one size bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Flows up to this size (bytes), above the previous bucket's.
    pub max_size: u64,
    pub flows: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

/// Finished flows grouped by size at the distribution's own points.
pub fn buckets(workload: Workload, flows: &[FlowResult]) -> Vec<Bucket> {
    let bounds: Vec<u64> = workload.cdf().iter().map(|&(s, _)| s).filter(|&s| s > 0).collect();
    let mut out = Vec::new();
    let mut lower = 0;
    for &upper in &bounds {
        let mut slowdowns: Vec<f64> =
            flows.iter().filter(|f| f.size > lower && f.size <= upper).filter_map(|f| f.slowdown()).collect();
        lower = upper;
        if slowdowns.is_empty() {
            continue;
        }
        slowdowns.sort_by(f64::total_cmp);
        let at = |p: f64| slowdowns[((slowdowns.len() - 1) as f64 * p).round() as usize];
        out.push(Bucket { max_size: upper, flows: slowdowns.len(), p50: at(0.5), p95: at(0.95), p99: at(0.99) });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_sizes_follow_the_distribution() {
        let mut rng = fastrand::Rng::with_seed(3);
        for workload in [Workload::WebSearch, Workload::FbHadoop] {
            let n = 200_000;
            let samples: Vec<u64> = (0..n).map(|_| workload.sample(&mut rng)).collect();
            for &(size, percent) in workload.cdf() {
                let below = samples.iter().filter(|&&s| s <= size).count() as f64 / n as f64 * 100.0;
                assert!((below - percent).abs() < 1.0, "{workload:?}: {below:.1}% at or below {size}, CDF {percent}%");
            }
            let mean = samples.iter().sum::<u64>() as f64 / n as f64;
            assert!((mean / workload.mean() - 1.0).abs() < 0.05, "{workload:?}: mean {mean:.0}, {}", workload.mean());
        }
    }

    #[test]
    fn hpccs_tree_has_its_shape() {
        let tree = FatTree::hpcc(1);
        let graph = tree.graph();
        assert_eq!((tree.hosts(), graph.switches), (320, 56));
        // A ToR: 16 servers and 4 aggregation switches; a core: 5 pods.
        assert_eq!(graph.ports(0).len(), 20);
        assert_eq!(graph.ports(55).len(), 5);
        assert_eq!((tree.hops(0, 15), tree.hops(0, 16), tree.hops(0, 319)), (2, 4, 6));
        assert!(graph.unreachable().is_none());
    }

    /// A short, light run: every flow finishes, and none beats its ideal.
    #[test]
    fn a_light_load_finishes_every_flow_near_its_ideal() {
        let config = FctConfig {
            tree: FatTree {
                pods: 2,
                tors_per_pod: 2,
                aggs_per_pod: 2,
                cores: 2,
                hosts_per_tor: 4,
                ..FatTree::hpcc(10)
            },
            workload: Workload::FbHadoop,
            algorithm: None,
            load: 0.2,
            window: Duration::from_millis(3),
            limit: Duration::from_millis(50),
            seed: 1,
        };
        let run = config.run();
        assert!(run.flows.len() > 20, "{} flows", run.flows.len());
        for flow in &run.flows {
            let fct = flow.fct.expect("finished");
            assert!(fct + Duration::from_micros(1) >= flow.ideal, "{flow:?} beat its ideal");
        }
        assert_eq!(run.dropped, 0);
        let mut slowdowns: Vec<f64> = run.flows.iter().filter_map(|f| f.slowdown()).collect();
        slowdowns.sort_by(f64::total_cmp);
        let median = slowdowns[slowdowns.len() / 2];
        assert!(median < 2.0, "a light load slows flows little: median {median}");
    }
}
