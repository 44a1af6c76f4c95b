//! In-network aggregation at cluster scale, in virtual time (E10 beyond
//! what one machine carries): jobs of workers and a parameter server each,
//! on one switch whose aggregation stage is the lab's (`softrnic-switch`),
//! running the lab's worker and server state machines
//! (`softrnic-aggregation`) unchanged.
//!
//! Every worker sums one tensor per step with the rest of its job; one job
//! may straggle (its last worker starts each step late), and jobs may run
//! different numbers of steps, so that one ends first. The run samples
//! each job's share of the pool (occupancy) and its goodput (tensor values
//! finished per second, as 32-bit values), and checks every step's sum
//! against the exact one.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use softrnic_aggregation::{Destination, ParameterServer, Policy, ServerConfig, Worker, WorkerConfig, contribution};
use softrnic_switch::{AggregationConfig, Graph, LinkFaults, PortConfig};
use softrnic_transport::{Instant, IntMark};
use softrnic_wire::aggregation::AGG_UDP_PORT;

use crate::fabric::{Fabric, FabricSpec, Link};
use crate::network::InFlight;

/// A scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub jobs: usize,
    pub workers: u8,
    pub rate_bps: u64,
    pub link_delay: Duration,
    pub slots: usize,
    /// Values per step's tensor, and per chunk.
    pub tensor: usize,
    pub values_per_packet: usize,
    pub policy: Policy,
    /// Workers ask the switch not to aggregate.
    pub bypass: bool,
    /// Job 0 runs this many steps; the others until the end.
    pub first_job_steps: Option<u64>,
    /// The straggling job and how late its last worker starts each step.
    pub straggler: Option<(usize, Duration)>,
    /// Loss on every switch port.
    pub loss: f64,
    /// The workers' shortest resend timer: longer than a straggler's
    /// delay, or every late step is resent through the server.
    pub min_rto: Duration,
    pub duration: Duration,
    pub sample_every: Duration,
    pub seed: u64,
}

impl Scenario {
    /// Cluster scale: 8 jobs of 16 workers on 100 Gb/s links sharing 512
    /// aggregators, job 1 straggling by 50 µs a step, job 0 ending after 8
    /// steps.
    pub fn cluster(policy: Policy) -> Scenario {
        Scenario {
            jobs: 8,
            workers: 16,
            rate_bps: 100_000_000_000,
            link_delay: Duration::from_micros(1),
            slots: 512,
            tensor: 64 * 1024,
            values_per_packet: 256,
            policy,
            bypass: false,
            first_job_steps: Some(8),
            straggler: Some((1, Duration::from_micros(50))),
            loss: 0.0,
            min_rto: Duration::from_micros(200),
            duration: Duration::from_millis(3),
            sample_every: Duration::from_micros(50),
            seed: 1,
        }
    }
}

impl Scenario {
    /// A small one for tests and a quick look: two jobs of four workers
    /// on 10 Gb/s links sharing 64 aggregators, job 1's last worker
    /// 200 µs late each step, job 0 ending after 30 steps; 12 ms.
    pub fn small(policy: Policy) -> Scenario {
        Scenario {
            jobs: 2,
            workers: 4,
            rate_bps: 10_000_000_000,
            slots: 64,
            tensor: 16 * 1024,
            first_job_steps: Some(30),
            straggler: Some((1, Duration::from_micros(200))),
            min_rto: Duration::from_micros(500),
            duration: Duration::from_millis(12),
            sample_every: Duration::from_micros(200),
            ..Scenario::cluster(policy)
        }
    }
}

impl Scenario {
    /// The seed's own shape (EXPERIMENTS.md, E10): two jobs of four
    /// workers and a parameter server on 100 Gb/s links, 62 values a
    /// chunk (308 B packets), job 1's last worker 100 µs late each step,
    /// job 0 ending after 20 steps of 256 Ki values; 12 ms. The pool (400
    /// aggregators) is sized as the seed's 20,000 are for its jobs: the
    /// healthy job alone fills about 40 % of it (it is the jobs' windows
    /// against the pool that set the shares, not the pool's size alone).
    /// The seed's UDP background traffic is not modelled: the links here
    /// carry the jobs alone.
    pub fn seed(policy: Policy) -> Scenario {
        Scenario {
            jobs: 2,
            workers: 4,
            slots: 400,
            tensor: 256 * 1024,
            values_per_packet: 62,
            first_job_steps: Some(20),
            straggler: Some((1, Duration::from_micros(100))),
            min_rto: Duration::from_micros(300),
            duration: Duration::from_millis(12),
            sample_every: Duration::from_micros(100),
            ..Scenario::cluster(policy)
        }
    }

    /// The same with its healthy job alone: what "near its alone
    /// throughput" is measured against.
    pub fn alone(self) -> Scenario {
        Scenario { jobs: 1, straggler: None, first_job_steps: None, ..self }
    }
}

/// One sample of one job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub time: Duration,
    pub job: usize,
    /// Percent of the pool the job held, on average since the last sample.
    pub occupancy: f64,
    /// Tensor values finished per second, as Gb/s of 32-bit values.
    pub gbps: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub samples: Vec<Sample>,
    /// Steps each job finished.
    pub steps: Vec<u64>,
    /// When each job finished its last step (if it did).
    pub ended: Vec<Option<Duration>>,
    /// Packets the switch summed, and that collided.
    pub aggregated: u64,
    pub collisions: u64,
    pub resent: u64,
}

impl Outcome {
    /// A job's mean occupancy and goodput over samples in `[from, to)`.
    pub fn mean(&self, job: usize, from: Duration, to: Duration) -> (f64, f64) {
        let s: Vec<&Sample> = self.samples.iter().filter(|s| s.job == job && s.time >= from && s.time < to).collect();
        if s.is_empty() {
            return (0.0, 0.0);
        }
        let n = s.len() as f64;
        (s.iter().map(|s| s.occupancy).sum::<f64>() / n, s.iter().map(|s| s.gbps).sum::<f64>() / n)
    }
}

/// Host `host` of job `job` (its workers, then its server) is at
/// 10.(job+1).0.(host+1).
fn address(job: usize, host: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1 + job as u8, 0, 1 + host as u8)), AGG_UDP_PORT)
}

/// The job and host of an address.
fn locate(addr: SocketAddr) -> (usize, usize) {
    match addr.ip() {
        IpAddr::V4(ip) => (usize::from(ip.octets()[1]) - 1, usize::from(ip.octets()[3]) - 1),
        IpAddr::V6(_) => unreachable!("the scenario's hosts are IPv4"),
    }
}

struct WorkerHost {
    worker: Worker,
    addr: SocketAddr,
    start_at: Option<Duration>,
    step: u64,
}

/// Runs the scenario; an error says which step's sum was wrong.
pub fn run(s: &Scenario) -> Result<Outcome, String> {
    let per_job = usize::from(s.workers) + 1;
    let hosts = s.jobs * per_job;
    let addrs: Vec<SocketAddr> = (0..hosts).map(|h| address(h / per_job, h % per_job)).collect();
    let link = Link { rate_bps: s.rate_bps, delay: s.link_delay };
    fn port(link: &Link) -> PortConfig {
        // A deep buffer: the pool, not the queues, is under study.
        PortConfig::new(link.rate_bps, 4 << 20)
    }
    let spec = FabricSpec {
        graph: Graph { switches: 1, host_switch: vec![0; hosts], links: vec![] },
        host_links: vec![link; hosts],
        switch_links: vec![],
        port,
        shared_buffer: 64 << 20,
        seed: s.seed,
        faults: LinkFaults { loss: s.loss, ..LinkFaults::NONE },
        aggregation: Some(AggregationConfig::new(s.slots)),
    };
    let mut fabric = Fabric::new(&spec, &addrs.iter().map(|a| a.ip()).collect::<Vec<_>>());
    let mut workers: Vec<Vec<WorkerHost>> = (0..s.jobs)
        .map(|j| {
            (0..s.workers)
                .map(|w| {
                    let config = WorkerConfig {
                        values_per_packet: s.values_per_packet,
                        policy: s.policy,
                        bypass: s.bypass,
                        min_rto: s.min_rto,
                        initial_rto: s.min_rto,
                        ..WorkerConfig::new(j as u16, w, s.workers)
                    };
                    WorkerHost {
                        worker: Worker::new(config),
                        addr: address(j, w.into()),
                        start_at: Some(Duration::ZERO),
                        step: 0,
                    }
                })
                .collect()
        })
        .collect();
    let mut servers: Vec<ParameterServer> =
        (0..s.jobs).map(|j| ParameterServer::new(ServerConfig::new(j as u16, s.workers))).collect();
    let server_addr = |j: usize| address(j, usize::from(s.workers));
    let mut outcome = Outcome { steps: vec![0; s.jobs], ended: vec![None; s.jobs], ..Outcome::default() };
    let mut last_acked = vec![(0u64, 0.0f64); s.jobs];
    let mut next_sample = s.sample_every;
    let mut now = Duration::ZERO;
    let mut buf = Vec::new();
    let instant = |t: Duration| Instant::ZERO + t;
    while now < s.duration {
        // Arrivals.
        while let Some(packet) = fabric.pop_due(instant(now)) {
            let (job, host) = locate(packet.to);
            if host == usize::from(s.workers) {
                let (from_job, from_host) = locate(packet.from);
                let sender = (from_job == job).then(|| u8::try_from(from_host).ok()).flatten();
                servers[job].handle_packet(sender, &packet.bytes, packet.meta.ce);
                while let Some((to, bytes)) = servers[job].poll_transmit() {
                    let w = match to {
                        Destination::All => 0,
                        Destination::Worker(w) => usize::from(w),
                    };
                    let from = fabric.host(server_addr(job).ip()).expect("the server is a host");
                    fabric.send(
                        instant(now),
                        from,
                        InFlight::new(server_addr(job), address(job, w), bytes, IntMark::None),
                    );
                }
            } else {
                workers[job][host].worker.handle_packet(now, &packet.bytes, packet.meta.ce);
            }
        }
        // Workers: steps, resends, sends.
        for (j, job) in workers.iter_mut().enumerate() {
            for (i, w) in job.iter_mut().enumerate() {
                if let Some((sum, _)) = w.worker.take_result() {
                    for (k, v) in sum.iter().enumerate() {
                        let exact: i32 = (0..usize::from(s.workers)).map(|x| contribution(j, w.step, x, k)).sum();
                        if *v != exact {
                            return Err(format!(
                                "seed {}: job {j} worker {i} step {} value {k}: {v}, not {exact}",
                                s.seed, w.step
                            ));
                        }
                    }
                    w.step += 1;
                    if i == 0 {
                        outcome.steps[j] = w.step;
                    }
                    let done = j == 0 && s.first_job_steps.is_some_and(|n| w.step >= n);
                    if done {
                        outcome.ended[j] = Some(now);
                    } else {
                        let late = s.straggler.filter(|&(sj, _)| sj == j && i + 1 == usize::from(s.workers));
                        let late = late.map(|(_, d)| d);
                        w.start_at = Some(now + late.unwrap_or_default());
                    }
                }
                if w.start_at.is_some_and(|t| t <= now) {
                    w.start_at = None;
                    let tensor: Vec<i32> = (0..s.tensor).map(|k| contribution(j, w.step, i, k)).collect();
                    w.worker.start(&tensor)?;
                }
                w.worker.handle_timeout(now);
                let from = fabric.host(w.addr.ip()).expect("a worker is a host");
                while w.worker.poll_transmit(now, &mut buf) {
                    fabric.send(
                        instant(now),
                        from,
                        InFlight::new(w.addr, server_addr(j), std::mem::take(&mut buf), IntMark::None),
                    );
                }
            }
        }
        if now >= next_sample {
            let stage = fabric.switch(0).aggregation().expect("the switch aggregates");
            for (j, last) in last_acked.iter_mut().enumerate() {
                let c = stage.jobs().get(&(j as u16)).copied().unwrap_or_default();
                let gbps = (c.acked_values - last.0) as f64 * 32.0 / s.sample_every.as_secs_f64() / 1e9;
                let held = c.held_seconds(now);
                let occupancy = (held - last.1) / s.sample_every.as_secs_f64() / s.slots as f64 * 100.0;
                *last = (c.acked_values, held);
                outcome.samples.push(Sample { time: now, job: j, occupancy, gbps });
            }
            next_sample += s.sample_every;
        }
        // The next thing to happen.
        let mut next = next_sample.min(s.duration);
        if let Some(at) = fabric.next_arrival() {
            next = next.min(at - Instant::ZERO);
        }
        for w in workers.iter().flatten() {
            for t in [w.start_at, w.worker.poll_timeout()].into_iter().flatten() {
                next = next.min(t);
            }
        }
        // Whatever was due at `now` has run: time moves on.
        now = next.max(now + Duration::from_nanos(1));
    }
    let stage = fabric.switch(0).aggregation().expect("the switch aggregates");
    for c in stage.jobs().values() {
        outcome.aggregated += c.aggregated;
        outcome.collisions += c.collisions;
    }
    outcome.resent = workers.iter().flatten().map(|w| w.worker.stats().resent).sum();
    Ok(outcome)
}
