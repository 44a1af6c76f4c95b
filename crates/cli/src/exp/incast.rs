//! `softrnic exp incast`: N senders write to one receiver through the
//! lab's switch, whose port to the receiver is the bottleneck. Real
//! softrnic engines (or, with `--verbs`, unmodified `ib_write_bw` over the
//! drop-in `libibverbs.so.1`) run in network namespaces; the switch samples
//! its queues and counts each flow's delivered bytes.
//!
//! Writes `incast_results.csv` (per congestion control, over time: each
//! flow's delivered rate, the bottleneck queue's depth, marks and drops),
//! per-run logs, and `incast_figure.svg` (rates above, queue below).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use softrnic_lab::runner::{FLOWS_HEADER, STATS_HEADER};
use softrnic_lab::{LinkSpec, Namespaces, RunOptions, Runner, Topology};

use clap::Args;

use super::Common;
use super::figure::Series;
use super::hosts::Build;
use super::panels::{self, Panel};

/// One congestion control's incast: its name and its run, or why it
/// failed.
pub type LabRun = (String, Result<IncastRun, String>);

const COLUMNS: &str = "cc,time_s,kind,id,rate_gbps,depth_bytes,peak_bytes,marked,dropped";
/// The base RTT the senders' algorithms assume, µs (`congestion_env`).
const LAB_BASE_RTT_US: u32 = 100;

/// Every host, the switch and the flows' processes share the machine's
/// cores: on two, an engine thread can wait half a second for one
/// (`engine_stall_max_us`), and flows whose QPs gave up after 7 × 67 ms
/// of such waits died of it. So QPs wait 1 s (`-u 18`) before a retry
/// counts, and find real losses sooner with the adaptive timer.
const LAB_QP_TIMEOUT: u8 = 18;
const STALL_TOLERANT: &str = "SOFTRNIC_RETRANSMISSION=adaptive ";

/// The receiver's first TCP exchange port; sender i uses BASE + i.
const BASE_PORT: u16 = 19_515;

/// The flags of the incast.
#[derive(Args, Debug, Clone)]
pub struct IncastArgs {
    #[command(flatten)]
    pub common: Common,
    /// How many hosts send to the one receiver (default 4, 2 with
    /// --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub senders: Option<u64>,
    /// The congestion controls to compare, one run each: none, dcqcn,
    /// dctcp, timely, swift, or the path of a WebAssembly module.
    #[arg(long, value_delimiter = ',')]
    pub cc: Vec<String>,
    /// Run unmodified ib_write_bw over softrnic's libibverbs.so.1 instead
    /// of softrnic bench.
    #[arg(long)]
    pub verbs: bool,
    /// The links' rate (default 1Gbps).
    #[arg(long, value_parser = softrnic_lab::topology::parse_rate)]
    pub rate: Option<u64>,
}

pub fn run(args: &IncastArgs) -> Result<(), String> {
    let ccs = if args.cc.is_empty() { vec!["none".to_string()] } else { args.cc.clone() };
    let failed: Vec<String> = run_each(args, &ccs)?.into_iter().filter_map(|(_, run)| run.err()).collect();
    if failed.is_empty() { Ok(()) } else { Err(failed.join("; ")) }
}

/// Runs the incast once per congestion control in `ccs` (built-ins by
/// name, modules by path, or none), writes the CSV, logs and figure, and
/// returns each run, or why it failed (the others still run).
pub fn run_each(args: &IncastArgs, ccs: &[String]) -> Result<Vec<LabRun>, String> {
    for cc in ccs {
        // The senders' engines would refuse it: say so before building
        // anything.
        softrnic_engine::congestion::choose(cc, "").map_err(|e| format!("--cc {cc}: {e}"))?;
    }
    if let Some(reason) = softrnic_lab::namespaces::unavailable() {
        return Err(format!("the incast runs hosts in network namespaces: {reason}"));
    }
    let senders = args.senders.map_or(if args.common.quick { 2 } else { 4 }, |n| n as usize);
    let duration = Duration::from_secs(if args.common.quick { 2 } else { 8 });
    let rate = args.rate.unwrap_or(1_000_000_000);
    let bin = std::env::current_exe().map_err(|e| e.to_string())?;
    let lib = Build::here()?.lib;
    if args.verbs && !lib.join("libibverbs.so.1").exists() {
        return Err(format!(
            "--verbs runs ib_write_bw over softrnic's libibverbs.so.1, not found in {}: run scripts/build-libibverbs.sh",
            lib.display()
        ));
    }
    if args.verbs && super::roles::which("ib_write_bw").is_none() {
        return Err("--verbs needs perftest's ib_write_bw: apt install perftest".into());
    }
    let logs = args.common.out.join("incast_logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let csv_path = args.common.out.join("incast_results.csv");
    let mut rows = vec![COLUMNS.to_string()];
    let mut panels_rates = Vec::new();
    let mut panels_queue = Vec::new();
    let mut runs = Vec::new();
    for cc in ccs {
        let setup = Incast { senders, rate, duration, cc, verbs: args.verbs, bin: &bin, lib: &lib, logs: &logs };
        let run = match setup.run() {
            Ok(run) => run,
            Err(e) => {
                eprintln!("softrnic: {e}");
                runs.push((cc.clone(), Err(e)));
                continue;
            }
        };
        println!("{}", run.report(cc));
        rows.extend(run.rows(cc));
        for (flow, points) in &run.flow_rates {
            panels_rates.push(Series { name: format!("{cc} {flow}"), points: points.clone() });
        }
        panels_queue.push(Series { name: format!("{cc} queue"), points: run.queue_kib.clone() });
        runs.push((cc.clone(), Ok(run)));
    }
    std::fs::write(&csv_path, rows.join("\n") + "\n")
        .map_err(|e| format!("cannot write {}: {e}", csv_path.display()))?;
    let figure = args.common.out.join("incast_figure.svg");
    let title = format!(
        "{senders}-to-1 incast at {} Gb/s{}",
        rate as f64 / 1e9,
        if args.verbs { ", ib_write_bw" } else { ", softrnic bench" }
    );
    panels::write(
        &figure,
        &title,
        &[
            Panel {
                x_label: "time (s)".into(),
                y_label: "delivered (Gb/s)".into(),
                x_log: false,
                series: panels_rates,
            },
            Panel {
                x_label: "time (s)".into(),
                y_label: "bottleneck queue (KiB)".into(),
                x_log: false,
                series: panels_queue,
            },
        ],
    )?;
    println!("incast: {} rows in {}", rows.len() - 1, csv_path.display());
    println!("logs in {}, figure {}", logs.display(), figure.display());
    Ok(runs)
}

struct Incast<'a> {
    senders: usize,
    rate: u64,
    duration: Duration,
    cc: &'a str,
    verbs: bool,
    bin: &'a Path,
    lib: &'a Path,
    logs: &'a Path,
}

/// Per sender: (time, delivered Gb/s).
pub type FlowRates = BTreeMap<String, Vec<(f64, f64)>>;

/// What one run measured.
pub struct IncastRun {
    pub flow_rates: FlowRates,
    /// The bottleneck queue: (time, KiB at the sample, peak KiB since the
    /// one before).
    pub queue_kib: Vec<(f64, f64)>,
    pub samples: Vec<QueueRow>,
    pub buffer_limit: u64,
}

/// One sample of the bottleneck queue.
pub struct QueueRow {
    pub time: f64,
    pub depth: u64,
    pub peak: u64,
    pub marked: u64,
    pub dropped: u64,
}

impl Incast<'_> {
    fn topology(&self) -> Result<Topology, String> {
        let link = LinkSpec::new(self.rate, 256_000);
        let mut topology = Topology::shape(&format!("star:{}", self.senders + 1), link)?;
        // One address for each sender's server: a softrnic device owns
        // its address's port 4791.
        topology.hosts[0].set_addresses(self.senders);
        Ok(topology)
    }

    /// The receiver's and a sender's command for flow `i` (from 1): the
    /// receiver serves flow i on its i-th address.
    fn commands(&self, i: usize) -> (String, String) {
        let port = BASE_PORT + i as u16;
        let secs = self.duration.as_secs();
        let server = if i == 1 { "$h0".to_string() } else { format!("$h0_{}", i - 1) };
        if self.verbs {
            let lib = self.lib.display();
            let run = format!(
                "{STALL_TOLERANT}LD_LIBRARY_PATH={lib} exec ib_write_bw -d softrnic0 -p {port} -D {secs} --report_gbits -u {LAB_QP_TIMEOUT}"
            );
            // The server's device takes its flow's address; the sender's
            // is its host's (SOFTRNIC_ADDR, set by the lab).
            (
                format!("{}SOFTRNIC_ADDR={server} {run}", self.receiver_env()),
                format!("{}{run} {server}", self.congestion_env()),
            )
        } else {
            let bin = self.bin.display();
            (
                format!(
                    "{}{STALL_TOLERANT}exec {bin} bench write_bw --server --addr {server} -p {port} -u {LAB_QP_TIMEOUT}",
                    self.receiver_env()
                ),
                format!(
                    "{}{STALL_TOLERANT}exec {bin} bench write_bw {server} -p {port} -D {secs} -u {LAB_QP_TIMEOUT}",
                    self.congestion_env()
                ),
            )
        }
    }

    /// What a sender's environment says of congestion control: the
    /// algorithm, the links' rate it starts from, and the path's base
    /// RTT. Through the lab's user-space switch a round trip takes far
    /// longer than the 10 µs of a data-centre hop that the algorithms
    /// assume; HPCC sizes its window by it (on a 2-core machine, 50 µs
    /// left the link under-used, 400 µs let the queue grow).
    fn congestion_env(&self) -> String {
        match self.cc {
            "none" => String::new(),
            cc => format!(
                "SOFTRNIC_CC={cc} SOFTRNIC_LINE_RATE={} SOFTRNIC_BASE_RTT={LAB_BASE_RTT_US} ",
                self.rate as f64 / 1e9
            ),
        }
    }

    /// The receiver's: it carries INT, to echo the records of a sender
    /// that collects them (HPCC).
    fn receiver_env(&self) -> &'static str {
        match self.cc {
            "none" => "",
            _ => "SOFTRNIC_INT=on ",
        }
    }

    fn log(&self, name: &str) -> Result<(File, PathBuf), String> {
        let path = self.logs.join(format!("{}_{name}.log", self.cc));
        let file = File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok((file, path))
    }

    fn run(&self) -> Result<IncastRun, String> {
        let topology = self.topology()?;
        let namespaces = Namespaces::create(&topology)?;
        let (stats, flows) =
            (self.logs.join(format!("{}_queues.csv", self.cc)), self.logs.join(format!("{}_flows.csv", self.cc)));
        let options = RunOptions {
            stats: Some(stats.clone()),
            flows: Some(flows.clone()),
            sample_every: Duration::from_millis(20),
            pcap: None,
            aggregation: None,
        };
        let runner = Runner::start(&topology, &namespaces, options)?;
        let spawn = |host: usize, command: &str, log: &str| -> Result<Child, String> {
            let (mut file, _) = self.log(log)?;
            // The log starts with the command, as the runner's role logs do.
            std::io::Write::write_all(&mut file, format!("$ {command}\n").as_bytes()).map_err(|e| e.to_string())?;
            let err = file.try_clone().map_err(|e| e.to_string())?;
            namespaces.spawn(&topology, host, command, Stdio::from(file), Stdio::from(err))
        };
        let mut servers = Vec::new();
        for i in 1..=self.senders {
            servers.push(spawn(0, &self.commands(i).0, &format!("h0_server{i}"))?);
        }
        std::thread::sleep(Duration::from_millis(700));
        let mut clients = Vec::new();
        for i in 1..=self.senders {
            clients.push((i, spawn(i, &self.commands(i).1, &format!("h{i}_sender"))?));
        }
        let deadline = Instant::now() + self.duration + Duration::from_secs(30);
        let mut failures = Vec::new();
        for (i, child) in &mut clients {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            failures.push(format!("sender h{i} ended with {status}"));
                        }
                        break;
                    }
                    _ if Instant::now() > deadline => {
                        failures.push(format!("sender h{i} did not finish"));
                        super::stop_child(child);
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        for server in &mut servers {
            super::stop_child(server);
        }
        let summary = runner.stop()?;
        drop(namespaces);
        let (mut file, _) = self.log("switch")?;
        std::io::Write::write_all(&mut file, format!("{summary}\n").as_bytes()).map_err(|e| e.to_string())?;
        if !failures.is_empty() {
            return Err(format!(
                "incast --cc {}: {}; see the logs in {}",
                self.cc,
                failures.join("; "),
                self.logs.display()
            ));
        }
        let buffer_limit = topology.hosts[0].link.queue;
        let flow_rates = read_flows(&flows)?;
        let samples = read_bottleneck(&stats)?;
        let queue_kib = samples.iter().map(|s| (s.time, s.peak as f64 / 1024.0)).collect();
        Ok(IncastRun { flow_rates, queue_kib, samples, buffer_limit })
    }
}

impl IncastRun {
    fn rows(&self, cc: &str) -> Vec<String> {
        let mut rows = Vec::new();
        for (flow, points) in &self.flow_rates {
            rows.extend(points.iter().map(|(t, r)| format!("{cc},{t:.3},flow,{flow},{r:.4},,,,")));
        }
        for s in &self.samples {
            rows.push(format!("{cc},{:.3},queue,s0:h0,,{},{},{},{}", s.time, s.depth, s.peak, s.marked, s.dropped));
        }
        rows
    }

    /// Mean rate per flow over the steady part, Jain's fairness, the
    /// queue's peak against its limit, marks and drops.
    /// Each flow's mean delivered rate over the steady part, Gb/s.
    pub fn steady_rates(&self) -> Vec<f64> {
        self.flow_rates.values().map(|p| steady_mean(p)).collect()
    }

    /// The bottleneck queue's peak, and its 99th percentile over the
    /// steady part, bytes.
    pub fn queue_peak_p99(&self) -> (u64, u64) {
        let peak = self.samples.iter().map(|s| s.peak).max().unwrap_or(0);
        let skip = self.samples.len() / 5;
        let mut steady: Vec<u64> =
            self.samples.iter().skip(skip).take(self.samples.len() - 2 * skip).map(|s| s.depth).collect();
        steady.sort_unstable();
        let p99 = steady.get((steady.len() * 99 / 100).min(steady.len().saturating_sub(1))).copied().unwrap_or(0);
        (peak, p99)
    }

    pub fn report(&self, cc: &str) -> String {
        let means = self.steady_rates();
        let total: f64 = means.iter().sum();
        let jain = softrnic_sim::incast::jain(&means);
        let (peak, _) = self.queue_peak_p99();
        let last = self.samples.last();
        format!(
            "incast --cc {cc}: {} flows, {:.3} Gb/s in all, per flow {}, Jain's fairness {jain:.2}; bottleneck queue peak {} KiB of {} KiB, {} marked, {} dropped",
            means.len(),
            total,
            means.iter().map(|m| format!("{m:.3}")).collect::<Vec<_>>().join("/"),
            peak / 1024,
            self.buffer_limit / 1024,
            last.map_or(0, |s| s.marked),
            last.map_or(0, |s| s.dropped),
        )
    }
}

/// The mean of a rate series, leaving out the first and last fifth (the
/// flows start and stop at slightly different times).
fn steady_mean(points: &[(f64, f64)]) -> f64 {
    let (skip, keep) = (points.len() / 5, points.len() - 2 * (points.len() / 5));
    let middle: Vec<f64> = points.iter().skip(skip).take(keep).map(|p| p.1).collect();
    if middle.is_empty() { 0.0 } else { middle.iter().sum::<f64>() / middle.len() as f64 }
}

/// Each flow's delivered rate to h0 between samples, from the switch's
/// cumulative byte counts.
pub fn read_flows(path: &Path) -> Result<FlowRates, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(FLOWS_HEADER) {
        return Err(format!("{}: not a flows file", path.display()));
    }
    let mut last: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    let mut rates: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let [time, src, dst, bytes] = f[..] else { continue };
        if dst != "h0" {
            continue;
        }
        let (time, bytes): (f64, u64) = (time.parse().unwrap_or(0.0), bytes.parse().unwrap_or(0));
        if let Some((t0, b0)) = last.get(src)
            && time > *t0
        {
            let gbps = (bytes - b0) as f64 * 8.0 / (time - t0) / 1e9;
            rates.entry(src.to_string()).or_default().push((time, gbps));
        }
        last.insert(src.to_string(), (time, bytes));
    }
    Ok(rates)
}

/// The data queue of the switch's port to h0, sample by sample.
pub fn read_bottleneck(path: &Path) -> Result<Vec<QueueRow>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut lines = text.lines();
    if lines.next() != Some(STATS_HEADER) {
        return Err(format!("{}: not a queue statistics file", path.display()));
    }
    let mut rows = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        // time_s,switch,port,peer,queue,depth,peak,enqueued,dropped,marked,...
        if f.len() < 10 || f[3] != "h0" || f[4] != "1" {
            continue;
        }
        let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
        rows.push(QueueRow { time: f[0].parse().unwrap_or(0.0), depth: n(5), peak: n(6), marked: n(9), dropped: n(8) });
    }
    Ok(rows)
}
