//! `softrnic exp e10` (`aggregation`): in-network aggregation shared by two
//! training jobs, one of them straggling, through the lab's switch, as the
//! seed's E10 runs it, scaled down to what this machine carries; then the
//! same switch stage and worker logic in the simulator at cluster scale.
//!
//! The lab: one switch with a pool of aggregators; two jobs of four
//! workers and a parameter server each; two background hosts sending UDP
//! (iperf3) to the servers' links. Job 1's last worker starts every step
//! late (`--straggle`); job 0 ends first, job 1 runs on alone. One run per
//! policy: A2TP's two windows, ATP's link window alone, and aggregation
//! off (everything through the servers). Every worker checks every sum
//! against the exact one.
//!
//! Writes `result.csv` (per policy, over time, per job: aggregation
//! throughput in Gb/s and aggregator occupancy in %), the simulator's
//! `aggregation_sim.csv`, per-run logs, and `aggregation_figure.svg`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use softrnic_aggregation::Policy;
use softrnic_lab::runner::AGGREGATION_HEADER;
use softrnic_lab::{LinkSpec, Namespaces, RunOptions, Runner, Topology};
use softrnic_sim::aggregation::{Outcome, Scenario};
use softrnic_switch::AggregationConfig;

use clap::Args;

use super::figure::Series;
use super::panels::{self, Panel};
use super::{Common, median_by};

const WORKERS: usize = 4;
const JOBS: usize = 2;
/// Hosts: each job's workers then its server, then the background pair.
const BACKGROUND: [usize; 2] = [JOBS * (WORKERS + 1), JOBS * (WORKERS + 1) + 1];
const COLUMNS: &str = "policy,time_s,job,throughput_gbps,occupancy_pct";

/// What one policy's run compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    A2tp,
    Atp,
    Off,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::A2tp => "a2tp",
            Config::Atp => "atp",
            Config::Off => "off",
        }
    }

    fn parse(text: &str) -> Result<Config, String> {
        match text {
            "a2tp" => Ok(Config::A2tp),
            "atp" => Ok(Config::Atp),
            "off" => Ok(Config::Off),
            _ => {
                Err(format!("--policy {text}: give a2tp, atp or off (aggregation off: everything through the servers)"))
            }
        }
    }

    fn worker_flags(self) -> &'static str {
        match self {
            Config::A2tp => "--policy a2tp",
            Config::Atp => "--policy atp",
            Config::Off => "--policy atp --bypass",
        }
    }
}

/// The lab's scale and timing.
struct Lab {
    rate: u64,
    slots: usize,
    straggle_ms: f64,
    /// The healthy job runs `both`; the straggler `both + alone`.
    both: Duration,
    alone: Duration,
    values: usize,
    bin: PathBuf,
    logs: PathBuf,
}

/// One job's samples: (time, Gb/s, occupancy %).
type Samples = Vec<(f64, f64, f64)>;

/// One policy's run: each job's samples, and when (on the samples' clock)
/// the workers started, the healthy job ended, and the straggler ended.
struct LabRun {
    jobs: Vec<Samples>,
    started: f64,
    healthy_ended: f64,
    ended: f64,
}

/// The flags of e10.
#[derive(Args, Debug, Clone)]
pub struct AggregationArgs {
    #[command(flatten)]
    pub common: Common,
    /// The policies to compare, one run each: a2tp, atp, off (default
    /// all three).
    #[arg(long, value_delimiter = ',', conflicts_with = "bench")]
    pub policy: Vec<String>,
    /// The benchmark instead: one job's goodput through the switch against
    /// MPI_Allreduce over TCP (Open MPI), and the stage's cost per packet.
    #[arg(long)]
    pub bench: bool,
    /// With --bench: measure this many times and keep the medians.
    #[arg(long, default_value_t = 1, requires = "bench", value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
    /// The links' rate (default 200Mbps, scaled down with the machine).
    #[arg(long, value_parser = softrnic_lab::topology::parse_rate)]
    pub rate: Option<u64>,
    /// The switch's pool of aggregators (default 16, scaled down with the
    /// links so that the jobs contend for it).
    #[arg(long, conflicts_with = "bench", value_parser = clap::value_parser!(u64).range(1..=softrnic_lab::topology::MAX_AGGREGATORS as u64))]
    pub aggregators: Option<u64>,
    /// How late the straggling job's last worker starts each step, ms
    /// (default 20).
    #[arg(long, conflicts_with = "bench")]
    pub straggle: Option<f64>,
}

pub fn run(args: &AggregationArgs) -> Result<(), String> {
    if args.bench {
        return bench(args);
    }
    let configs = if args.policy.is_empty() {
        vec![Config::A2tp, Config::Atp, Config::Off]
    } else {
        args.policy.iter().map(|p| Config::parse(p)).collect::<Result<_, _>>()?
    };
    let lab = Lab::new(args)?;
    let mut panels_rate = Vec::new();
    let mut panels_pool = Vec::new();
    let mut rows = vec![COLUMNS.to_string()];
    let mut failures = Vec::new();
    if let Some(reason) = softrnic_lab::namespaces::unavailable() {
        failures.push(format!("the lab's part needs network namespaces: {reason}"));
    } else if super::roles::which("iperf3").is_none() {
        failures.push("the lab's background traffic is iperf3's: apt install iperf3".into());
    } else {
        println!(
            "e10 in the lab, scaled down to this machine ({} cores): {JOBS} jobs x ({WORKERS} workers + 1 parameter server) and 2 UDP background hosts on one switch, {} Mb/s links, {} aggregators, {} values a step in 256-value chunks; job 1's last worker {} ms late each step (the seed: 100 Gb/s links, 20,000 aggregators)",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            lab.rate / 1_000_000,
            lab.slots,
            lab.values,
            lab.straggle_ms
        );
        for config in &configs {
            match lab.run(*config) {
                Ok(run) => {
                    println!("{}", report(config.name(), &run));
                    for (job, samples) in run.jobs.iter().enumerate() {
                        rows.extend(
                            samples.iter().map(|(t, g, o)| format!("{},{t:.3},{job},{g:.4},{o:.2}", config.name())),
                        );
                        let name = format!("{} job {job}{}", config.name(), if job == 1 { " (straggler)" } else { "" });
                        panels_rate
                            .push(Series { name: name.clone(), points: samples.iter().map(|s| (s.0, s.1)).collect() });
                        panels_pool.push(Series { name, points: samples.iter().map(|s| (s.0, s.2)).collect() });
                    }
                }
                Err(e) => failures.push(format!("{}: {e}", config.name())),
            }
        }
    }
    let csv = args.common.out.join("result.csv");
    std::fs::write(&csv, rows.join("\n") + "\n").map_err(|e| format!("cannot write {}: {e}", csv.display()))?;
    let Simulated { rows: sim_rows, scale: sim_series, seed: seed_series } = simulate(args.common.quick)?;
    let sim_csv = args.common.out.join("aggregation_sim.csv");
    std::fs::write(&sim_csv, sim_rows.join("\n") + "\n")
        .map_err(|e| format!("cannot write {}: {e}", sim_csv.display()))?;
    let figure = args.common.out.join("aggregation_figure.svg");
    let axis = |y: &str, series| Panel { x_label: "time (s)".into(), y_label: y.into(), x_log: false, series };
    let simulated = |y: &str, series| Panel { x_label: "simulated time (ms)".into(), ..axis(y, series) };
    let mut panels = vec![
        axis("aggregation throughput (Gb/s)", panels_rate),
        axis("aggregator occupancy (%)", panels_pool),
        simulated("occupancy, simulator (%)", sim_series),
    ];
    if !seed_series.is_empty() {
        panels.push(simulated("occupancy, simulator at the seed's shape (%)", seed_series));
    }
    panels::write(&figure, "E10: two jobs share the switch's aggregators; job 1 straggles, job 0 ends first", &panels)?;
    println!(
        "e10: {} and {}; logs in {}; figure {}",
        csv.display(),
        sim_csv.display(),
        lab.logs.display(),
        figure.display()
    );
    if failures.is_empty() { Ok(()) } else { Err(failures.join("; ")) }
}

impl Lab {
    fn new(args: &AggregationArgs) -> Result<Lab, String> {
        let logs = args.common.out.join("aggregation_logs");
        std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
        Ok(Lab {
            rate: args.rate.unwrap_or(200_000_000),
            slots: args.aggregators.map_or(16, |n| n as usize),
            straggle_ms: args.straggle.unwrap_or(20.0),
            both: Duration::from_secs(if args.common.quick { 4 } else { 12 }),
            alone: Duration::from_secs(if args.common.quick { 3 } else { 8 }),
            values: 65_536,
            bin: std::env::current_exe().map_err(|e| e.to_string())?,
            logs,
        })
    }

    /// The workers' shortest resend timer: past the straggler's delay, as
    /// the simulator's is, so that a step's wait for the straggler is not
    /// taken for loss (a resend would flush the straggler's partial sums
    /// and free its aggregators, whatever the policy).
    fn min_rto_ms(&self) -> f64 {
        (self.straggle_ms * 2.0).max(5.0)
    }

    fn topology(&self) -> Result<Topology, String> {
        let link = LinkSpec::new(self.rate, 256_000);
        let mut topology = Topology::shape(&format!("star:{}", BACKGROUND[1] + 1), link)?;
        topology.switches[0].aggregation = Some(AggregationConfig::new(self.slots));
        Ok(topology)
    }

    fn host(job: usize, index: usize) -> usize {
        job * (WORKERS + 1) + index
    }

    fn spawn(
        &self,
        namespaces: &Namespaces,
        topology: &Topology,
        host: usize,
        name: &str,
        command: &str,
    ) -> Result<Child, String> {
        let path = self.logs.join(format!("{name}.log"));
        let mut file = File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        std::io::Write::write_all(&mut file, format!("$ {command}\n").as_bytes()).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        namespaces.spawn(topology, host, command, Stdio::from(file), Stdio::from(err))
    }

    fn run(&self, config: Config) -> Result<LabRun, String> {
        let topology = self.topology()?;
        let namespaces = Namespaces::create(&topology)?;
        let pool_csv = self.logs.join(format!("{}_pool.csv", config.name()));
        let options = RunOptions {
            stats: None,
            flows: None,
            aggregation: Some(pool_csv.clone()),
            sample_every: Duration::from_millis(250),
            pcap: None,
        };
        let runner = Runner::start(&topology, &namespaces, options)?;
        // The runner's samples count from about here.
        let clock = Instant::now();
        let bin = self.bin.display();
        let name = config.name();
        let mut servers = Vec::new();
        for job in 0..JOBS {
            let workers: Vec<String> = (0..WORKERS).map(|w| format!("$h{}", Lab::host(job, w))).collect();
            let ps = Lab::host(job, WORKERS);
            let command = format!("exec {bin} agg server --job {job} --workers {} --addr $h{ps}", workers.join(","));
            servers.push(self.spawn(&namespaces, &topology, ps, &format!("{name}_job{job}_server"), &command)?);
            let iperf = format!("exec iperf3 -s -B $h{ps} -p 5201");
            servers.push(self.spawn(&namespaces, &topology, ps, &format!("{name}_job{job}_iperf3_server"), &iperf)?);
        }
        std::thread::sleep(Duration::from_millis(500));
        let total = (self.both + self.alone).as_secs();
        for (k, &bg) in BACKGROUND.iter().enumerate() {
            // A fifth of a link of UDP toward each server's port.
            let ps = Lab::host(k, WORKERS);
            let command = format!("exec iperf3 -u -c $h{ps} -p 5201 -b {} -t {total} -l 1200", self.rate / 5);
            servers.push(self.spawn(&namespaces, &topology, bg, &format!("{name}_background{k}"), &command)?);
        }
        let mut workers = Vec::new();
        let started = clock.elapsed().as_secs_f64();
        for job in 0..JOBS {
            let seconds = if job == 0 { self.both } else { self.both + self.alone }.as_secs_f64();
            for w in 0..WORKERS {
                let host = Lab::host(job, w);
                let straggle = if job == 1 && w == WORKERS - 1 {
                    format!(" --straggle {}", self.straggle_ms)
                } else {
                    String::new()
                };
                let command = format!(
                    "exec {bin} agg worker --job {job} --worker {w} --workers {WORKERS} --addr $h{host} --server $h{} --values {} --duration {seconds} --min-rto {} {}{straggle}",
                    Lab::host(job, WORKERS),
                    self.values,
                    self.min_rto_ms(),
                    config.worker_flags()
                );
                workers.push((
                    job,
                    w,
                    self.spawn(&namespaces, &topology, host, &format!("{name}_job{job}_worker{w}"), &command)?,
                ));
            }
        }
        let deadline = Instant::now() + self.both + self.alone + Duration::from_secs(30);
        let mut failures = Vec::new();
        // A job ends when its first worker does (one may start a last step
        // the others never join, and wait for it to time out).
        let mut ended = [f64::MAX; JOBS];
        let mut running: Vec<_> = workers.iter_mut().collect();
        while !running.is_empty() {
            let now = clock.elapsed().as_secs_f64();
            running.retain_mut(|(job, w, child)| match child.try_wait() {
                Ok(None) if Instant::now() <= deadline => true,
                Ok(None) | Err(_) => {
                    failures.push(format!("job {job} worker {w} did not finish"));
                    super::stop_child(child);
                    false
                }
                Ok(Some(status)) => {
                    ended[*job] = ended[*job].min(now);
                    if !status.success() {
                        failures.push(format!("job {job} worker {w} ended with {status}"));
                    }
                    false
                }
            });
            std::thread::sleep(Duration::from_millis(20));
        }
        for server in &mut servers {
            super::stop_child(server);
        }
        let summary = runner.stop()?;
        drop(namespaces);
        std::fs::write(self.logs.join(format!("{name}_switch.log")), format!("{summary}\n"))
            .map_err(|e| e.to_string())?;
        if !failures.is_empty() {
            return Err(format!("{}; see the logs in {}", failures.join("; "), self.logs.display()));
        }
        Ok(LabRun { jobs: read_pool(&pool_csv)?, started, healthy_ended: ended[0], ended: ended[1] })
    }
}

/// Each job's throughput (from the answers the switch saw) and occupancy,
/// sample by sample.
fn read_pool(path: &Path) -> Result<Vec<Samples>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(AGGREGATION_HEADER) {
        return Err(format!("{}: not an aggregation file", path.display()));
    }
    let mut jobs: Vec<Samples> = vec![Vec::new(); JOBS];
    let mut last = [(0.0f64, 0.0f64, 0u64); JOBS];
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        // time_s,switch,job,held,held_seconds,slots,aggregated,collisions,completed,flushed,acked_chunks,acked_values
        let number = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        let (Some(time), Some(job), Some(held), Some(slots), Some(values)) =
            (number(0), number(2), number(4), number(5), f.get(11).and_then(|v| v.parse::<u64>().ok()))
        else {
            continue;
        };
        let job = job as usize;
        let Some(samples) = jobs.get_mut(job) else { continue };
        let (t0, held0, values0) = last[job];
        if time > t0 {
            let gbps = (values - values0) as f64 * 32.0 / (time - t0) / 1e9;
            // The mean share of the pool since the last sample.
            samples.push((time, gbps, (held - held0) / (time - t0) / slots * 100.0));
        }
        last[job] = (time, held, values);
    }
    Ok(jobs)
}

/// The mean of samples in `[from, to)`: (Gb/s, occupancy %).
fn mean(samples: &Samples, from: f64, to: f64) -> (f64, f64) {
    let s: Vec<_> = samples.iter().filter(|s| s.0 >= from && s.0 < to).collect();
    let n = s.len().max(1) as f64;
    (s.iter().map(|s| s.1).sum::<f64>() / n, s.iter().map(|s| s.2).sum::<f64>() / n)
}

/// The seed's comparison: each job while both run, the straggler alone
/// (a second after each start, half a second before each end).
fn report(policy: &str, run: &LabRun) -> String {
    let (jobs, both) = (&run.jobs, (run.started + 1.0, run.healthy_ended - 0.5));
    let (healthy, straggler) = (mean(&jobs[0], both.0, both.1), mean(&jobs[1], both.0, both.1));
    let alone = mean(&jobs[1], run.healthy_ended + 1.0, run.ended - 0.5);
    format!(
        "e10 {policy:>4}: while both run, healthy job {:.3} Gb/s at {:.1} % of the pool, straggler {:.3} Gb/s at {:.1} %; straggler alone {:.3} Gb/s at {:.1} %",
        healthy.0, healthy.1, straggler.0, straggler.1, alone.0, alone.1
    )
}

/// What the simulator's runs give the figure and the CSV.
struct Simulated {
    rows: Vec<String>,
    /// Each job's occupancy, at scale and at the seed's shape.
    scale: Vec<Series>,
    seed: Vec<Series>,
}

/// The simulator: at cluster scale (a small scenario with --quick), and
/// without --quick at the seed's own shape too, beside the seed's
/// numbers; one run per policy each.
fn simulate(quick: bool) -> Result<Simulated, String> {
    let mut rows = vec!["policy,time_ms,job,throughput_gbps,occupancy_pct".to_string()];
    let (mut scale, mut seed) = (Vec::new(), Vec::new());
    for policy in [Policy::A2tp, Policy::Atp] {
        let scenario = if quick { Scenario::small(policy) } else { Scenario::cluster(policy) };
        let outcome = sim_run(&scenario, policy_name(policy), &mut rows, &mut scale)?;
        println!("{}", sim_report(policy_name(policy), &scenario, &outcome));
    }
    if !quick {
        for policy in [Policy::A2tp, Policy::Atp] {
            let scenario = Scenario::seed(policy);
            let outcome = sim_run(&scenario, &format!("seed-{}", policy_name(policy)), &mut rows, &mut seed)?;
            let alone = Scenario { duration: scenario.duration / 3, ..scenario.clone().alone() };
            let (_, alone_gbps) = softrnic_sim::aggregation::run(&alone)?.mean(0, alone.duration / 10, alone.duration);
            println!("{}", seed_report(policy_name(policy), &scenario, &outcome, alone_gbps));
        }
    }
    Ok(Simulated { rows, scale, seed })
}

fn policy_name(policy: Policy) -> &'static str {
    match policy {
        Policy::A2tp => "a2tp",
        Policy::Atp => "atp",
    }
}

/// Runs `scenario`, its samples into `rows` (as `name`) and its two jobs'
/// occupancy into `series`.
fn sim_run(
    scenario: &Scenario,
    name: &str,
    rows: &mut Vec<String>,
    series: &mut Vec<Series>,
) -> Result<Outcome, String> {
    let outcome = softrnic_sim::aggregation::run(scenario)?;
    for s in &outcome.samples {
        rows.push(format!("{name},{:.3},{},{:.3},{:.2}", s.time.as_secs_f64() * 1e3, s.job, s.gbps, s.occupancy));
    }
    for job in [0, 1] {
        let points = outcome
            .samples
            .iter()
            .filter(|s| s.job == job)
            .map(|s| (s.time.as_secs_f64() * 1e3, s.occupancy))
            .collect();
        let straggler = if job == 1 { " (straggler)" } else { "" };
        series.push(Series { name: format!("sim {name} job {job}{straggler}"), points });
    }
    Ok(outcome)
}

/// The seed's shape beside the seed's numbers.
fn seed_report(policy: &str, s: &Scenario, o: &Outcome, alone_gbps: f64) -> String {
    let ended = o.ended[0].unwrap_or(s.duration);
    let warm = s.sample_every * 5;
    let ((healthy, healthy_gbps), (straggler, straggler_gbps)) = (o.mean(0, warm, ended), o.mean(1, warm, ended));
    let (alone, after_gbps) = o.mean(1, ended + warm, s.duration);
    format!(
        "e10 simulated at the seed's shape, {policy:>4}: healthy job {healthy_gbps:.1} Gb/s at {healthy:.1} % \
         ({:.2}x its {alone_gbps:.1} Gb/s alone), straggler {straggler_gbps:.1} Gb/s at {straggler:.1} %; \
         straggler alone {after_gbps:.1} Gb/s at {alone:.1} % (the seed: about 50 Gb/s at 41-55 %, \
         15 Gb/s at 1-5 %, 85-97 % alone)",
        healthy_gbps / alone_gbps.max(f64::MIN_POSITIVE),
    )
}

fn sim_report(policy: &str, s: &Scenario, o: &Outcome) -> String {
    let ended = o.ended[0].unwrap_or(s.duration);
    let warm = s.duration / 10;
    let (healthy, straggler) = (o.mean(0, warm, ended), o.mean(1, warm, ended));
    let others: Vec<(f64, f64)> = (2..s.jobs).map(|j| o.mean(j, warm, ended)).collect();
    let alone = o.mean(1, ended + warm, s.duration);
    let others = if others.is_empty() {
        String::new()
    } else {
        let n = others.len() as f64;
        format!(
            ", the other {} jobs {:.1} Gb/s at {:.1} % each",
            others.len(),
            others.iter().map(|x| x.1).sum::<f64>() / n,
            others.iter().map(|x| x.0).sum::<f64>() / n
        )
    };
    format!(
        "e10 simulated, {} jobs x {} workers at {} Gb/s, {} aggregators, {policy:>4}: job 0 {:.1} Gb/s at {:.1} %, straggler {:.1} Gb/s at {:.1} %{others}; straggler after job 0 ends {:.1} Gb/s at {:.1} %",
        s.jobs,
        s.workers,
        s.rate_bps / 1_000_000_000,
        s.slots,
        healthy.1,
        healthy.0,
        straggler.1,
        straggler.0,
        alone.1,
        alone.0
    )
}

/// `softrnic exp e10 --bench`: one job of four workers summing the same
/// tensors through the switch's aggregation and with Open MPI's
/// MPI_Allreduce over TCP, on the same lab hosts, each `--runs` times
/// (medians); and the aggregation stage's cost per packet against the
/// pipeline without it.
fn bench(args: &AggregationArgs) -> Result<(), String> {
    if let Some(reason) = softrnic_lab::namespaces::unavailable() {
        return Err(format!("the benchmark runs in the lab's namespaces: {reason}"));
    }
    for (program, package) in [("mpicc", "libopenmpi-dev"), ("mpirun", "openmpi-bin")] {
        if super::roles::which(program).is_none() {
            return Err(format!("the TCP baseline is Open MPI's: apt install {package}"));
        }
    }
    let lab = Lab::new(args)?;
    let seconds = if args.common.quick { 3 } else { 8 };
    let mpi = lab.logs.join("mpi_allreduce");
    // The program travels inside softrnic, so a moved build still has it.
    let source = lab.logs.join("mpi_allreduce.c");
    std::fs::write(&source, include_str!("../../../../examples/mpi/allreduce.c"))
        .map_err(|e| format!("cannot write {}: {e}", source.display()))?;
    let built = std::process::Command::new("mpicc").arg("-O2").arg("-o").arg(&mpi).arg(&source).status();
    if !built.is_ok_and(|s| s.success()) {
        return Err(format!("cannot build {} with mpicc", source.display()));
    }
    println!(
        "e10 bench: one job of {WORKERS} workers on a {}-port star, {} Mb/s links, {} values a step, {seconds} s a run, {} runs",
        WORKERS + 1,
        lab.rate / 1_000_000,
        lab.values,
        args.runs
    );
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        ours.push(lab.single_job(run, seconds)?);
        theirs.push(lab.mpi(run, seconds, &mpi)?);
    }
    let median = |runs: Vec<f64>| median_by(runs, |g| *g).expect("at least one run");
    let (ours, theirs) = (median(ours), median(theirs));
    let per_second = |gbps: f64| gbps * 1e9 / 32.0 / 1e6;
    println!(
        "e10 bench: aggregation through the switch {ours:.3} Gb/s ({:.2} M values/s), MPI_Allreduce over TCP {theirs:.3} Gb/s ({:.2} M values/s): {:.2}x",
        per_second(ours),
        per_second(theirs),
        ours / theirs
    );
    let (with, without) = stage_cost();
    println!(
        "e10 bench: the switch pipeline takes {with:.0} ns a chunk packet with the aggregation stage, {without:.0} ns without it (the same packets forwarded): {:.2}x",
        with / without
    );
    Ok(())
}

impl Lab {
    /// A star of the job's workers and its server, no background.
    fn single_topology(&self) -> Result<Topology, String> {
        let link = LinkSpec::new(self.rate, 256_000);
        let mut topology = Topology::shape(&format!("star:{}", WORKERS + 1), link)?;
        topology.switches[0].aggregation = Some(AggregationConfig::new(softrnic_lab::topology::MAX_AGGREGATORS));
        Ok(topology)
    }

    /// Runs `commands` (host, log name, command), waits for every one in
    /// `foreground`, stops the rest; the foreground logs.
    fn run_hosts(
        &self,
        topology: &Topology,
        commands: &[(usize, String, String, bool)],
    ) -> Result<Vec<String>, String> {
        let namespaces = Namespaces::create(topology)?;
        let options = RunOptions {
            stats: None,
            flows: None,
            aggregation: None,
            sample_every: Duration::from_secs(1),
            pcap: None,
        };
        let runner = Runner::start(topology, &namespaces, options)?;
        let mut background = Vec::new();
        let mut foreground = Vec::new();
        for (host, name, command, waited) in commands {
            let child = self.spawn(&namespaces, topology, *host, name, command)?;
            if *waited {
                foreground.push((name.clone(), child))
            } else {
                background.push(child)
            }
            if !*waited {
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        let mut failures = Vec::new();
        for (name, child) in &mut foreground {
            match child.wait() {
                Ok(status) if status.success() => {}
                other => failures.push(format!("{name}: {other:?}")),
            }
        }
        for child in &mut background {
            super::stop_child(child);
        }
        runner.stop()?;
        drop(namespaces);
        if !failures.is_empty() {
            return Err(format!("{}; see the logs in {}", failures.join("; "), self.logs.display()));
        }
        foreground
            .iter()
            .map(|(name, _)| std::fs::read_to_string(self.logs.join(format!("{name}.log"))).map_err(|e| e.to_string()))
            .collect()
    }

    /// The job's goodput through the switch, as worker 0 reports it.
    fn single_job(&self, run: u32, seconds: u64) -> Result<f64, String> {
        let topology = self.single_topology()?;
        let bin = self.bin.display();
        let workers: Vec<String> = (0..WORKERS).map(|w| format!("$h{w}")).collect();
        let mut commands = vec![(
            WORKERS,
            format!("bench{run}_server"),
            format!("exec {bin} agg server --job 0 --workers {} --addr $h{WORKERS}", workers.join(",")),
            false,
        )];
        for w in 0..WORKERS {
            commands.push((
                w,
                format!("bench{run}_worker{w}"),
                format!(
                    "exec {bin} agg worker --job 0 --worker {w} --workers {WORKERS} --addr $h{w} --server $h{WORKERS} --values {} --duration {seconds}",
                    self.values
                ),
                true,
            ));
        }
        let logs = self.run_hosts(&topology, &commands)?;
        gbps_of(&logs[0], "aggregated")
    }

    /// MPI_Allreduce of the same tensors over TCP between the same hosts:
    /// mpirun on the server's host starts a rank on each worker's host
    /// through an agent that enters the host's namespace (as ssh would
    /// log in to it).
    fn mpi(&self, run: u32, seconds: u64, program: &Path) -> Result<f64, String> {
        let topology = self.single_topology()?;
        let agent = self.logs.join("netns-agent.sh");
        let script = format!(
            "#!/bin/sh\n\
             # mpirun's remote-shell agent: runs the command in the namespace of\n\
             # the lab host (of softrnic process {pid}) that has the address given.\n\
             host=$1; shift\n\
             for ns in $(ls /run/netns | grep '^srn-{pid}-h'); do\n\
             \x20   if ip netns exec \"$ns\" ip -4 -o addr show dev eth0 | grep -q \" $host/\"; then\n\
             \x20       exec ip netns exec \"$ns\" sh -c \"$*\"\n\
             \x20   fi\n\
             done\n\
             echo \"no lab host has the address $host\" >&2\n\
             exit 1\n",
            pid = std::process::id()
        );
        std::fs::write(&agent, script).map_err(|e| format!("cannot write {}: {e}", agent.display()))?;
        std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let hosts: Vec<String> = (0..WORKERS).map(|w| format!("$h{w}")).collect();
        // `rtc ^hwloc`: orted's copy of mpirun's hardware topology (shared
        // memory mapped at a fixed address) crashed it now and then here;
        // placement needs no topology on one machine's namespaces.
        let command = format!(
            "exec mpirun --allow-run-as-root -np {WORKERS} --host {} --mca plm_rsh_agent {} --mca mpi_yield_when_idle 1 --mca rtc ^hwloc --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 {} {} {seconds}",
            hosts.join(","),
            agent.display(),
            program.display(),
            self.values,
        );
        let logs = self.run_hosts(&topology, &[(WORKERS, format!("bench{run}_mpi"), command, true)])?;
        gbps_of(&logs[0], "Gb/s")
    }
}

/// The Gb/s figure on the line of `log` that says `marker`.
fn gbps_of(log: &str, marker: &str) -> Result<f64, String> {
    log.lines()
        .filter(|l| l.contains(marker))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| w.starts_with("Gb/s"))?;
            words.get(at.checked_sub(1)?)?.parse().ok()
        })
        .ok_or_else(|| format!("no goodput in: {log}"))
}

/// The pipeline's time per chunk packet (four workers' chunks, a sum to the
/// server, the server's answer fanned out), with the stage, and without it
/// (the same packets forwarded whole).
fn stage_cost() -> (f64, f64) {
    use softrnic_lab::eth_frame::EthFrame;
    use softrnic_switch::{PortConfig, Prefix, Routes, Switch, SwitchConfig, Time};
    use softrnic_wire::aggregation::{AGG_UDP_PORT, ALL_WORKERS, FLAG_ACK, NO_SLOT, Repr};
    let addr = |i: u8| [10, 77, 0, i + 1];
    let frame = |from: u8, to: u8, repr: &Repr| {
        let mut bytes = Vec::new();
        etherparse::PacketBuilder::ethernet2([0; 6], [0; 6])
            .ipv4(addr(from), addr(to), 64)
            .udp(AGG_UDP_PORT, AGG_UDP_PORT)
            .write(&mut bytes, &repr.to_bytes())
            .expect("a frame");
        EthFrame { bytes }
    };
    let measure = |aggregate: bool| {
        let mut routes = Routes::default();
        for i in 0..=WORKERS as u8 {
            routes.add(Prefix::host(std::net::IpAddr::from(addr(i))), vec![usize::from(i)]);
        }
        let port = PortConfig { red: None, ..PortConfig::new(u64::MAX / 2, u64::MAX / 4) };
        let config = SwitchConfig {
            aggregation: aggregate.then_some(AggregationConfig::new(20_000)),
            ..SwitchConfig::uniform(WORKERS + 1, port, u64::MAX / 2, 1)
        };
        let mut switch: Switch<EthFrame> = Switch::new(config, routes);
        let pool = softrnic_switch::Aggregator::new(AggregationConfig::new(20_000));
        let (mut packets, mut sequence, mut spent) = (0u64, 0u32, Duration::ZERO);
        let chunk = |w: u8, sequence| Repr {
            job: 1,
            sequence,
            workers: WORKERS as u8,
            worker: w,
            slot: NO_SLOT,
            values: vec![1; 256],
            ..Repr::default()
        };
        while spent < Duration::from_millis(300) {
            // Frames are made outside the clock: only the pipeline is timed.
            let mut batch = Vec::new();
            for _ in 0..64 {
                for w in 0..WORKERS as u8 {
                    batch.push((usize::from(w), frame(w, WORKERS as u8, &chunk(w, sequence))));
                }
                // The server answers for the aggregator that held the sum.
                let slot = if aggregate { pool.slot_of(1, sequence) as u16 } else { NO_SLOT };
                let ack = Repr { flags: FLAG_ACK, worker: ALL_WORKERS, slot, ..chunk(0, sequence) };
                batch.push((WORKERS, frame(WORKERS as u8, 0, &ack)));
                sequence += 1;
            }
            packets += batch.len() as u64;
            let start = Instant::now();
            for (port, frame) in batch {
                switch.handle_packet(Time::ZERO, port, frame);
            }
            while switch.poll_transmit(Time::ZERO).is_some() {}
            spent += start.elapsed();
        }
        spent.as_nanos() as f64 / packets as f64
    };
    (measure(true), measure(false))
}
