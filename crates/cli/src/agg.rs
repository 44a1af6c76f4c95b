//! `softrnic agg`: in-network aggregation's programs. `server` is a job's
//! parameter server; `worker` streams one tensor per step through the
//! switch (`softrnic lab`'s, with `aggregators` in its topology), checks
//! every step's sum against the exact one, and reports its goodput.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use softrnic_aggregation::{Allreduce, ParameterServer, Policy, ServerConfig, Socket, WorkerConfig, contribution};
use softrnic_wire::aggregation::{AGG_UDP_PORT, MAX_VALUES};

#[derive(Args, Debug)]
pub struct AggArgs {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// A job's parameter server: sums what the switch could not and
    /// answers every chunk. Runs until interrupted.
    Server(ServerArgs),
    /// A worker: sums a tensor per step with the job's other workers.
    Worker(WorkerArgs),
}

#[derive(Args, Debug)]
struct ServerArgs {
    #[arg(long)]
    job: u16,
    /// The job's workers' addresses, worker 0 first.
    #[arg(long, value_delimiter = ',', required = true)]
    workers: Vec<IpAddr>,
    /// This server's address (it listens on UDP 4793).
    #[arg(long)]
    addr: IpAddr,
    /// Answer each worker on its own: no aggregating switch replicates
    /// one answer to all.
    #[arg(long)]
    unicast: bool,
}

#[derive(Args, Debug)]
struct WorkerArgs {
    #[arg(long)]
    job: u16,
    /// This worker's index, from 0.
    #[arg(long)]
    worker: u8,
    /// Workers in the job.
    #[arg(long)]
    workers: u8,
    /// This worker's address (UDP 4793).
    #[arg(long)]
    addr: IpAddr,
    /// The job's parameter server.
    #[arg(long)]
    server: IpAddr,
    /// Values in each step's tensor.
    #[arg(long, default_value_t = 262_144)]
    values: usize,
    /// Values per chunk (ATP's packets carry 62).
    #[arg(long, default_value_t = MAX_VALUES)]
    chunk: usize,
    /// Steps to run (default: as many as --duration allows).
    #[arg(long)]
    steps: Option<u64>,
    /// Seconds to run (default 10, unless --steps).
    #[arg(long)]
    duration: Option<f64>,
    /// Milliseconds this worker waits before each step: a straggler.
    #[arg(long, default_value_t = 0.0)]
    straggle: f64,
    /// a2tp (link and aggregator windows) or atp (link window only).
    #[arg(long, default_value = "a2tp")]
    policy: Policy,
    /// Ask the switch not to aggregate: everything through the server.
    #[arg(long)]
    bypass: bool,
    /// The shortest resend timer, ms.
    #[arg(long, default_value_t = 5.0)]
    min_rto: f64,
}

pub fn run(args: &AggArgs) -> Result<(), String> {
    match &args.role {
        Role::Server(a) => server(a),
        Role::Worker(a) => worker(a),
    }
}

fn server(a: &ServerArgs) -> Result<(), String> {
    let workers = u8::try_from(a.workers.len()).map_err(|_| "--workers: at most 32 addresses")?;
    let config = ServerConfig { unicast: a.unicast, ..ServerConfig::new(a.job, workers) };
    config.check().map_err(|e| format!("--workers: {e}"))?;
    let mut socket = Socket::bind(SocketAddr::new(a.addr, AGG_UDP_PORT)).map_err(|e| format!("--addr: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    let addrs: Vec<SocketAddr> = a.workers.iter().map(|&ip| SocketAddr::new(ip, AGG_UDP_PORT)).collect();
    println!(
        "parameter server of job {} at {}: {} workers",
        a.job,
        socket.local_addr().map_err(|e| e.to_string())?,
        workers
    );
    let stats = softrnic_aggregation::serve(&mut socket, ParameterServer::new(config), &addrs, &stop, |_| {})?;
    println!(
        "job {} server: {} chunks ({} values) finished; summed here: {} collided, {} resent, {} partial sums, {} whole sums, {} bypassed; {} duplicates, {} overlapping, {} foreign, {} impostors, {} crowded out",
        a.job,
        stats.chunks,
        stats.values,
        stats.collided,
        stats.resent,
        stats.partial,
        stats.whole,
        stats.bypassed,
        stats.duplicates,
        stats.overlapping,
        stats.foreign,
        stats.impostors,
        stats.crowded
    );
    Ok(())
}

/// How long past its deadline a worker waits for peers to join its last
/// step.
const LAST_STEP_GRACE: Duration = Duration::from_secs(1);

fn worker(a: &WorkerArgs) -> Result<(), String> {
    if a.values == 0 {
        return Err("--values: a tensor needs at least one value".into());
    }
    let config = WorkerConfig {
        values_per_packet: a.chunk,
        policy: a.policy,
        bypass: a.bypass,
        min_rto: Duration::from_secs_f64(a.min_rto.max(0.01) / 1e3),
        ..WorkerConfig::new(a.job, a.worker, a.workers)
    };
    config.check().map_err(|e| format!("--worker/--workers/--chunk: {e}"))?;
    let mut allreduce =
        Allreduce::new(SocketAddr::new(a.addr, AGG_UDP_PORT), SocketAddr::new(a.server, AGG_UDP_PORT), config)?;
    let duration = match (a.duration, a.steps) {
        (Some(secs), _) if !(secs > 0.0 && secs < 1e9) => {
            return Err(format!("--duration {secs}: give seconds, more than 0"));
        }
        (Some(secs), _) => Duration::from_secs_f64(secs),
        (None, Some(_)) => Duration::MAX,
        (None, None) => Duration::from_secs(10),
    };
    let straggle = Duration::from_secs_f64(a.straggle.max(0.0) / 1e3);
    let (job, worker) = (usize::from(a.job), usize::from(a.worker));
    let start = Instant::now();
    let mut last_report = (start, 0u64);
    let mut step = 0u64;
    let mut tensor = vec![0i32; a.values];
    let give_up = allreduce.give_up_after;
    while a.steps.is_none_or(|n| step < n) && start.elapsed() < duration {
        std::thread::sleep(straggle);
        if a.steps.is_none() {
            // Peers done at the deadline never join a step begun just
            // before it: wait for them a second past it, not the whole
            // give-up time.
            allreduce.give_up_after = give_up.min(duration.saturating_sub(start.elapsed()) + LAST_STEP_GRACE);
        }
        for (i, v) in tensor.iter_mut().enumerate() {
            *v = contribution(job, step, worker, i);
        }
        if let Err(e) = allreduce.sum_i32(&mut tensor) {
            // Each worker checks the deadline between steps, so one may
            // start a last step its peers, done, never join.
            if start.elapsed() >= duration && a.steps.is_none() {
                println!(
                    "worker {worker} of job {job}: step {step} left unfinished: the job's other workers stopped at the deadline"
                );
                break;
            }
            return Err(format!("worker {worker} of job {job}, step {step}: {e}"));
        }
        for (i, v) in tensor.iter().enumerate() {
            let exact: i32 = (0..usize::from(a.workers)).map(|w| contribution(job, step, w, i)).sum();
            if *v != exact {
                return Err(format!("worker {worker} of job {job}, step {step}: value {i} summed to {v}, not {exact}"));
            }
        }
        step += 1;
        if last_report.0.elapsed() >= Duration::from_secs(1) {
            let gbps =
                (step - last_report.1) as f64 * a.values as f64 * 32.0 / last_report.0.elapsed().as_secs_f64() / 1e9;
            let s = allreduce.worker().stats();
            println!(
                "worker {worker} job {job}: step {step}, {gbps:.3} Gb/s, window {} ({} for the switch), health {:.2}, \
                 resent {}, collided {}",
                allreduce.worker().window(),
                allreduce.worker().aggregator_window(),
                allreduce.worker().health(),
                s.resent,
                s.collided
            );
            last_report = (Instant::now(), step);
        }
    }
    let secs = start.elapsed().min(duration).as_secs_f64();
    let s = allreduce.worker().stats();
    println!(
        "worker {worker} of job {job}: {step} steps of {} values in {secs:.2} s, {:.3} Gb/s aggregated, every sum exact; sent {} chunks, resent {}, collided {} ({:.1} %), ECN {}",
        a.values,
        step as f64 * a.values as f64 * 32.0 / secs / 1e9,
        s.sent,
        s.resent,
        s.collided,
        100.0 * s.collided as f64 / s.acked.max(1) as f64,
        s.marked
    );
    Ok(())
}
