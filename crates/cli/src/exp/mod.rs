//! `softrnic exp NAME`: the evaluations as commands (E8). Each experiment
//! sweeps its parameters, runs every role of every point as its own
//! process (`roles.rs`), retries a failed point once, and writes
//!
//! ```text
//! results/<exp>_results.csv    a row per measurement (kept as it goes)
//! results/<exp>_logs/          one log per role per point
//! results/<exp>_figure.svg     one line per configuration, references beside
//! ```
//!
//! Experiments are reachable by their number in EXPERIMENTS.md (`e9`) and
//! by name (`careful`); `experiments.rs` has them.

mod aggregation;
mod cc;
mod daemon;
mod experiments;
mod fct;
mod figure;
mod hosts;
mod incast;
mod listening;
mod offload;
mod panels;
mod roles;

use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

pub use experiments::EXPERIMENTS;
use figure::{Figure, Reference, Series};
use hosts::{Build, Inventory};
pub(crate) use roles::stop as stop_child;
use roles::{Placement, Role};

#[derive(Args, Debug, Clone)]
pub struct ExpArgs {
    /// The experiment: its number (e1 to e12) or name (latency,
    /// throughput, careful, containers, ...); none lists them.
    pub name: Option<String>,
    /// A small sweep (for CI and a first look).
    #[arg(long)]
    pub quick: bool,
    /// Where the CSV, the logs and the figure go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Only these configurations, in one figure (e.g. send-udp,tcp).
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Measure nothing: draw the figure again from the CSV in --out.
    #[arg(long)]
    pub plot: bool,
    /// Measure every point this many times and keep each value's median
    /// (shared machines are noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
    /// Run the roles on other hosts over SSH: a TOML inventory with a
    /// [server] and a [client] table, each with the host's address and
    /// optionally ssh, user, key, port, bin, lib and options (README,
    /// "Reproducing the evaluations").
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
    /// incast: how many hosts send to the one receiver (default 4, 2
    /// with --quick).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub senders: Option<u64>,
    /// incast: the congestion controls to compare, one run each: none,
    /// dcqcn, dctcp, timely, swift, or the path of a WebAssembly module.
    #[arg(long, value_delimiter = ',')]
    pub cc: Vec<String>,
    /// incast: run unmodified ib_write_bw over softrnic's libibverbs.so.1
    /// instead of softrnic bench.
    #[arg(long)]
    pub verbs: bool,
    /// incast: the links' rate (default 1Gbps).
    #[arg(long, value_parser = softrnic_lab::topology::parse_rate)]
    pub rate: Option<u64>,
    /// e10: the policies to compare, one run each: a2tp, atp, off
    /// (default all three).
    #[arg(long, value_delimiter = ',')]
    pub policy: Vec<String>,
    /// e10: the benchmark instead: one job's goodput through the switch
    /// against MPI_Allreduce over TCP (Open MPI), and the stage's cost
    /// per packet.
    #[arg(long)]
    pub bench: bool,
    /// e10: the switch's pool of aggregators (default 16, scaled down with
    /// the links so that the jobs contend for it).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=softrnic_lab::topology::MAX_AGGREGATORS as u64))]
    pub aggregators: Option<u64>,
    /// e10: how late the straggling job's last worker starts each step,
    /// ms (default 20).
    #[arg(long)]
    pub straggle: Option<f64>,
    /// fct: the flow-size distributions (websearch, hadoop).
    #[arg(long, value_delimiter = ',')]
    pub workload: Vec<String>,
    /// fct: the offered loads, as fractions of a link (default 0.3).
    #[arg(long, value_delimiter = ',')]
    pub load: Vec<f64>,
    /// fct: divide HPCC's link rates and buffers by this (10: 10 and
    /// 40 Gb/s), so that a window of simulated time runs in minutes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub scale: u64,
    /// e12: the numbers of pairs to run (default 2,4,8,16,32,64,128; 2,16
    /// with --quick).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=512))]
    pub pairs: Vec<u64>,
    /// e11, e12: the daemon's command processors (softrnicd --processors;
    /// default: softrnicd's).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub processors: Option<u16>,
    /// e11: the perftest programs to run (default ib_send_bw,ib_send_lat,
    /// ib_write_bw,ib_write_lat).
    #[arg(long, value_delimiter = ',')]
    pub tests: Vec<String>,
}

/// One point of a sweep: its configuration (a line in the figure), its
/// parameters, its roles, and how its output becomes rows.
pub struct Point {
    pub config: String,
    pub params: Vec<String>,
    pub roles: Vec<Role>,
    /// Why this point cannot run here (a peer program not installed): it
    /// is recorded as failed with the reason, not run.
    pub unavailable: Option<String>,
    /// The roles' logs, concatenated, to rows of the experiment's
    /// measured columns.
    pub read: Box<Reader>,
}

/// A CSV row's fields.
pub type Row = Vec<String>;
/// Reads a point's logs into rows.
pub type Reader = dyn Fn(&str) -> Result<Vec<Row>, String>;

/// What an experiment is made of.
pub struct Experiment {
    pub id: &'static str,
    pub name: &'static str,
    pub about: &'static str,
    /// The parameter columns, then the measured ones.
    pub params: &'static [&'static str],
    pub measured: &'static [&'static str],
    /// The figure: its axes (column names) and the seeds' references.
    pub x: &'static str,
    pub y: &'static str,
    pub x_log: bool,
    pub y_log: bool,
    pub x_label: &'static str,
    pub y_label: &'static str,
    pub references: fn() -> Vec<Reference>,
    pub points: fn(&Setup) -> Result<Vec<Point>, String>,
    /// How long one point may take.
    pub deadline: fn(bool) -> Duration,
}

/// Where the roles run, and the sweep's size.
pub struct Setup {
    pub quick: bool,
    pub runs: u32,
    pub placement: Placement,
}

impl Setup {
    /// The roles run here: `rdma_bench` and the drop-in library must be
    /// built beside `softrnic` (an inventory's hosts are checked before
    /// the sweep instead).
    pub fn check_rdma_bench(&self) -> Result<(), String> {
        let Build { bin, lib } = &self.placement.local;
        if self.placement.hosts.is_none() && !(bin.join("rdma_bench").exists() && lib.join("libibverbs.so.1").exists())
        {
            return Err(format!(
                "this experiment runs rdma_bench over softrnic's libibverbs.so.1, not found beside {}: run cargo build --release -p softrnic-rdma-bench && scripts/build-libibverbs.sh",
                bin.join("softrnic").display()
            ));
        }
        Ok(())
    }

    /// Whether `program` can run (checked here only; a host's PATH shows
    /// in the point's log).
    pub fn missing(&self, program: &str) -> bool {
        self.placement.hosts.is_none() && experiments::which(program).is_none()
    }

    /// The addresses of the server and the client and a TCP port for
    /// point `i`. With an inventory, its hosts' addresses; here, a fresh
    /// [`loopback_pair`].
    pub fn endpoints(&self, i: usize) -> (String, String, u16) {
        let pid = std::process::id() as usize;
        let port = 20_000 + ((pid * 7 + i * 2) % 20_000) as u16;
        if let Some(hosts) = &self.placement.hosts {
            let [server, client] = hosts::ROLES.map(|r| hosts.host(r).address.to_string());
            return (server, client, port);
        }
        let (server, client) = loopback_pair(i);
        (server, client, port)
    }
}

/// A fresh loopback pair for point `i` of this runner: the second octet
/// from its pid, the third from the point, and a pair no device holds yet
/// (another runner may be sweeping beside this one), so that no point
/// meets another's leftovers.
pub(crate) fn loopback_pair(i: usize) -> (String, String) {
    let pid = std::process::id() as usize;
    let free = |addr: &str| std::net::UdpSocket::bind((addr, softrnic_wire::ROCEV2_UDP_PORT)).is_ok();
    let (mut server, mut client) = (String::new(), String::new());
    for attempt in 0..100 {
        let second = 100 + (pid + attempt) % 100;
        let third = 1 + i % 250;
        (server, client) = (format!("127.{second}.{third}.1"), format!("127.{second}.{third}.2"));
        if free(&server) && free(&client) {
            break;
        }
    }
    (server, client)
}

pub fn run(args: &ExpArgs) -> Result<(), String> {
    let Some(name) = &args.name else {
        println!("Experiments (softrnic exp NAME [--quick] [--out DIR] [--compare A,B]):");
        for e in EXPERIMENTS {
            println!("  {:4} {:11} {}", e.id, e.name, e.about);
        }
        println!(
            "  {:4} {:11} congestion control, built in and user modules: size, cost, incasts (simulated and through the lab's switch)",
            "e3", "cc"
        );
        println!("  {:4} {:11} N senders to one receiver through the lab's switch (needs root)", "", "incast");
        println!("  {:4} {:11} flow completion times on HPCC's fat tree, in the simulator", "", "fct");
        println!(
            "  {:4} {:11} in-network aggregation shared by two jobs, one straggling (the lab's switch, needs root; and the simulator)",
            "e10", "aggregation"
        );
        println!(
            "  {:4} {:11} the offloaded stack's transmit designs: engine copy, bulk copy, header-only (softrnicd --tx)",
            "e4", "offload-tx"
        );
        println!(
            "  {:4} {:11} its receive designs: direct, per-connection buffers, an in-cache pool (softrnicd --rx)",
            "e5", "offload-rx"
        );
        println!(
            "  {:4} {:11} 2 KiB over 1..8 connections: the offloaded stack, plain RDMA, a Snap-like stack, TCP",
            "e6", "stacks"
        );
        println!(
            "  {:4} {:11} perftest through softrnicd, against the host and the forwarding design",
            "e11", "containers"
        );
        println!(
            "  {:4} {:11} 2 to 128 pairs of ib_write_bw through one softrnicd, and forwarded",
            "e12", "scalability"
        );
        return Ok(());
    };
    let swept = EXPERIMENTS.iter().any(|e| e.id.eq_ignore_ascii_case(name) || e.name.eq_ignore_ascii_case(name));
    if !swept && (args.plot || !args.compare.is_empty() || args.hosts.is_some()) {
        return Err(format!(
            "{name}: --plot, --compare and --hosts apply to e1, e2 and e9; the other experiments run their own roles \
             on this host and draw their figures as they measure (run it again without them)"
        ));
    }
    let e12 = name.eq_ignore_ascii_case("e12") || name.eq_ignore_ascii_case("scalability");
    if !e12 && !args.pairs.is_empty() {
        return Err(format!("{name}: --pairs applies to e12 only (run it again without it)"));
    }
    let e11 = name.eq_ignore_ascii_case("e11") || name.eq_ignore_ascii_case("containers");
    if !(e11 || e12) && args.processors.is_some() {
        return Err(format!("{name}: --processors applies to e11 and e12 only (run it again without it)"));
    }
    if !e11 && !args.tests.is_empty() {
        return Err(format!("{name}: --tests applies to e11 only (run it again without it)"));
    }
    if name.eq_ignore_ascii_case("incast") {
        return incast::run(args);
    }
    if name.eq_ignore_ascii_case("e3") || name.eq_ignore_ascii_case("cc") {
        return cc::run(args);
    }
    if name.eq_ignore_ascii_case("e10") || name.eq_ignore_ascii_case("aggregation") {
        return aggregation::run(args);
    }
    if name.eq_ignore_ascii_case("e4") || name.eq_ignore_ascii_case("offload-tx") {
        return offload::e4(args);
    }
    if name.eq_ignore_ascii_case("e5") || name.eq_ignore_ascii_case("offload-rx") {
        return offload::e5(args);
    }
    if name.eq_ignore_ascii_case("e6") || name.eq_ignore_ascii_case("stacks") {
        return offload::e6(args);
    }
    if e11 {
        return daemon::e11(args);
    }
    if e12 {
        return daemon::e12(args);
    }
    if name.eq_ignore_ascii_case("fct") || name.eq_ignore_ascii_case("fattree") {
        return fct::run(args);
    }
    let exp = EXPERIMENTS.iter().find(|e| e.id.eq_ignore_ascii_case(name) || e.name.eq_ignore_ascii_case(name));
    let Some(exp) = exp else {
        let known: Vec<String> = EXPERIMENTS.iter().map(|e| format!("{} ({})", e.id, e.name)).collect();
        return Err(format!("no experiment {name:?}: give one of {}", known.join(", ")));
    };
    let out = Output::create(&args.out, exp)?;
    let rows = match args.plot {
        true => read_rows(exp, &out)?
            .into_iter()
            .filter(|r| args.compare.is_empty() || args.compare.contains(&r[0]))
            .collect(),
        false => {
            let softrnic = std::env::current_exe().map_err(|e| e.to_string())?;
            let bin = softrnic.parent().ok_or("softrnic has no directory")?.to_path_buf();
            // The library's place in a build tree (scripts/build-libibverbs.sh).
            let lib = bin.join("../softrnic/lib");
            let local = Build { lib: lib.canonicalize().unwrap_or(lib), bin };
            let hosts = args.hosts.as_deref().map(Inventory::load).transpose()?;
            if let Some(hosts) = &hosts {
                hosts.check(&local)?;
            }
            let setup = Setup { quick: args.quick, runs: args.runs, placement: Placement { local, hosts } };
            let points = compared((exp.points)(&setup)?, &args.compare, exp)?;
            out.clear_logs()?;
            sweep(exp, &setup, &points, &out)?
        }
    };
    let figure = figure_of(exp, &rows, args.quick, args.runs);
    figure.write_svg(&out.figure)?;
    let failed = rows.iter().filter(|r| r.last().is_some_and(|e| !e.is_empty())).count();
    println!("{}: {} rows in {}", exp.id, rows.len(), out.csv.display());
    println!("logs in {}, figure {}", out.logs.display(), out.figure.display());
    match failed {
        n if n > 0 && !args.plot => Err(format!("{n} point(s) failed twice; their rows say why, their logs say more")),
        _ => Ok(()),
    }
}

/// The points of the configurations `--compare` names (all without it).
fn compared(mut points: Vec<Point>, compare: &[String], exp: &Experiment) -> Result<Vec<Point>, String> {
    if compare.is_empty() {
        return Ok(points);
    }
    let mut known: Vec<&str> = points.iter().map(|p| p.config.as_str()).collect();
    known.dedup();
    if let Some(bad) = compare.iter().find(|c| !known.contains(&c.as_str())) {
        return Err(format!("--compare {bad}: {} has the configurations {}", exp.id, known.join(", ")));
    }
    points.retain(|p| compare.contains(&p.config));
    Ok(points)
}

/// The result files of one experiment.
struct Output {
    csv: PathBuf,
    logs: PathBuf,
    figure: PathBuf,
}

impl Output {
    fn create(dir: &Path, exp: &Experiment) -> Result<Output, String> {
        let logs = dir.join(format!("{}_logs", exp.id));
        std::fs::create_dir_all(&logs).map_err(|e| {
            format!("cannot write results into {} ({e}): give --out a writable directory", dir.display())
        })?;
        Ok(Output {
            csv: dir.join(format!("{}_results.csv", exp.id)),
            logs,
            figure: dir.join(format!("{}_figure.svg", exp.id)),
        })
    }
}

impl Output {
    /// A new sweep's logs replace the last one's.
    fn clear_logs(&self) -> Result<(), String> {
        let entries = std::fs::read_dir(&self.logs).map_err(|e| format!("{}: {e}", self.logs.display()))?;
        for entry in entries.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "log")) {
            std::fs::remove_file(entry.path()).map_err(|e| format!("{}: {e}", entry.path().display()))?;
        }
        Ok(())
    }
}

/// Runs every point (a failed one twice), writing each row to the CSV as
/// it comes, so a sweep that fails midway keeps what it measured.
fn sweep(exp: &Experiment, setup: &Setup, points: &[Point], out: &Output) -> Result<Vec<Vec<String>>, String> {
    let file = File::create(&out.csv).map_err(|e| format!("cannot write {}: {e}", out.csv.display()))?;
    let mut csv = csv::Writer::from_writer(file);
    csv.write_record(header(exp)).map_err(|e| e.to_string())?;
    let progress = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(points.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} ETA {eta} {msg}")
                .expect("a valid template")
                .progress_chars("=> "),
        );
        bar.set_prefix(exp.id);
        bar
    });
    let mut rows = Vec::new();
    for (i, point) in points.iter().enumerate() {
        let label = format!("{} {}", point.config, point.params.join(" "));
        if let Some(bar) = &progress {
            bar.set_message(label.clone());
        }
        let start = Instant::now();
        let result = (0..setup.runs)
            .map(|run| {
                measure(exp, setup, point, &out.logs, i, run).or_else(|first| {
                    measure(exp, setup, point, &out.logs, i, run).map_err(|second| format!("{first}; again: {second}"))
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(medians);
        let new_rows = match result {
            Ok(measured) => measured.into_iter().map(|m| row(point, m, "ok", "")).collect::<Vec<_>>(),
            Err(e) => vec![row(point, vec![String::new(); exp.measured.len()], "failed", &e)],
        };
        for r in &new_rows {
            csv.write_record(r).map_err(|e| e.to_string())?;
        }
        csv.flush().map_err(|e| e.to_string())?;
        let verdict = if new_rows.iter().any(|r| r[r.len() - 2] == "failed") { "FAILED" } else { "ok" };
        match &progress {
            Some(bar) => bar.inc(1),
            None => {
                eprintln!("[{}/{}] {label}: {verdict} ({:.1}s)", i + 1, points.len(), start.elapsed().as_secs_f64())
            }
        }
        rows.extend(new_rows);
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(rows)
}

/// Runs one point's roles (its `run`th time) and reads their logs.
fn measure(
    exp: &Experiment,
    setup: &Setup,
    point: &Point,
    logs: &Path,
    i: usize,
    run: u32,
) -> Result<Vec<Vec<String>>, String> {
    if let Some(reason) = &point.unavailable {
        return Err(reason.clone());
    }
    let run = if setup.runs > 1 { format!("_run{run}") } else { String::new() };
    let tag = format!("{i:03}{run}_{}", sanitize(&format!("{}_{}", point.config, point.params.join("_"))));
    let paths = roles::run_point(&point.roles, &setup.placement, logs, &tag, (exp.deadline)(setup.quick))?;
    let text: String =
        paths.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let rows = (point.read)(&text)?;
    if rows.is_empty() {
        return Err("the roles printed no result".to_string());
    }
    Ok(rows)
}

/// Several runs' rows to one set: each value the median of its runs (the
/// lower middle for an even count), so a key column such as a size or a
/// percentile, the same in every run, stays as it is.
fn medians(runs: Vec<Vec<Row>>) -> Result<Vec<Row>, String> {
    let first = runs.first().ok_or("no runs")?;
    if let Some(odd) =
        runs.iter().find(|r| r.len() != first.len() || r.iter().zip(first).any(|(a, b)| a.len() != b.len()))
    {
        return Err(format!("runs gave different rows ({} and {})", first.len(), odd.len()));
    }
    let median = |values: Vec<&String>| -> String {
        let mut numbers: Vec<(f64, &String)> = values.iter().filter_map(|v| Some((v.parse().ok()?, *v))).collect();
        if numbers.len() < values.len() {
            return values[0].clone();
        }
        numbers.sort_by(|a, b| a.0.total_cmp(&b.0));
        numbers[(numbers.len() - 1) / 2].1.clone()
    };
    Ok((0..first.len())
        .map(|r| (0..first[r].len()).map(|c| median(runs.iter().map(|run| &run[r][c]).collect())).collect())
        .collect())
}

fn row(point: &Point, measured: Vec<String>, status: &str, error: &str) -> Vec<String> {
    let mut r = vec![point.config.clone()];
    r.extend(point.params.iter().cloned());
    r.extend(measured);
    r.push(status.to_string());
    r.push(error.to_string());
    r
}

/// The CSV's columns.
fn header(exp: &Experiment) -> Vec<&'static str> {
    ["config"].iter().chain(exp.params).chain(exp.measured).chain(&["status", "error"]).copied().collect()
}

/// `--plot`: the rows of an earlier sweep, to draw its figure again.
fn read_rows(exp: &Experiment, out: &Output) -> Result<Vec<Row>, String> {
    let mut reader = csv::Reader::from_path(&out.csv)
        .map_err(|e| format!("cannot read {} ({e}): run `softrnic exp {}` first", out.csv.display(), exp.id))?;
    let found: Vec<String> = reader.headers().map_err(|e| e.to_string())?.iter().map(str::to_string).collect();
    if found != header(exp) {
        return Err(format!("{} has the columns {}, not {}'s", out.csv.display(), found.join(","), exp.id));
    }
    reader
        .records()
        .map(|r| r.map(|r| r.iter().map(str::to_string).collect()).map_err(|e| format!("{}: {e}", out.csv.display())))
        .collect()
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

/// The figure from the rows that measured: a series per configuration.
fn figure_of(exp: &Experiment, rows: &[Vec<String>], quick: bool, runs: u32) -> Figure {
    let columns: Vec<&str> = ["config"].iter().chain(exp.params).chain(exp.measured).copied().collect();
    let at = |name: &str| columns.iter().position(|c| *c == name).expect("the figure's columns exist");
    let (x, y) = (at(exp.x), at(exp.y));
    let mut series: Vec<Series> = Vec::new();
    for r in rows.iter().filter(|r| r[r.len() - 2] == "ok") {
        let (Ok(px), Ok(py)) = (r[x].parse::<f64>(), r[y].parse::<f64>()) else { continue };
        match series.iter_mut().find(|s| s.name == r[0]) {
            Some(s) => s.points.push((px, py)),
            None => series.push(Series { name: r[0].clone(), points: vec![(px, py)] }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let quick = if quick { " (--quick)" } else { "" };
    let runs = if runs > 1 { format!(", medians of {runs} runs") } else { String::new() };
    Figure {
        title: format!("{} {}{quick}{runs}", exp.id.to_uppercase(), exp.name),
        x_label: exp.x_label,
        y_label: exp.y_label,
        x_log: exp.x_log,
        y_log: exp.y_log,
        series,
        references: (exp.references)(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_is_the_median_of_its_runs() {
        let run =
            |a: &str, b: &str| vec![vec!["64".to_string(), a.to_string()], vec!["128".to_string(), b.to_string()]];
        let rows = medians(vec![run("3.5", "9"), run("1.25", "7"), run("2.0", "8")]).unwrap();
        assert_eq!(rows, [["64", "2.0"], ["128", "8"]]);
        // Two runs: the lower middle, a value that was measured.
        assert_eq!(medians(vec![run("3", "1"), run("1", "3")]).unwrap(), [["64", "1"], ["128", "1"]]);
        assert!(medians(vec![run("1", "2"), vec![vec!["64".into(), "1".into()]]]).is_err());
    }
}
