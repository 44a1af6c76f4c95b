//! The sweep runner of e1, e2 and e9: each [`Sweep`] is a set of points
//! whose roles are real processes (`roles.rs`), here or on an
//! inventory's hosts (`hosts.rs`). Every point runs `--runs` times (a
//! failed run once more), each value is the median of its runs, and the
//! rows go to the CSV as they come; `--plot` draws the figure again from
//! the CSV, `--compare` keeps some configurations.

use std::fs::File;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

use super::figure::{Figure, Reference, Series};
use super::hosts::{self, Build, Inventory, loopback_pair};
use super::roles::{self, Placement, Role};
use super::{Common, Runs};

/// The flags of a sweep.
#[derive(Args, Debug, Clone)]
pub struct SweepArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub runs: Runs,
    /// Only these configurations, in one figure (e.g. send-udp,tcp).
    #[arg(long, value_delimiter = ',')]
    pub compare: Vec<String>,
    /// Measure nothing: draw the figure again from the CSV in --out.
    #[arg(long)]
    pub plot: bool,
    /// Run the roles on other hosts over SSH: a TOML inventory with a
    /// [server] and a [client] table, each with the host's address and
    /// optionally ssh, user, key, port, bin, lib and options (README,
    /// "Reproducing the evaluations").
    #[arg(long, value_name = "FILE")]
    pub hosts: Option<PathBuf>,
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

/// What a sweep is made of.
pub struct Sweep {
    pub id: &'static str,
    pub name: &'static str,
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
        self.placement.hosts.is_none() && roles::which(program).is_none()
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

/// `softrnic exp e1 | e2 | e9`: sweeps `exp`'s points (or, with `--plot`,
/// reads them back) and draws its figure.
pub fn run(exp: &Sweep, args: &SweepArgs) -> Result<(), String> {
    let (quick, runs) = (args.common.quick, args.runs.runs);
    let out = Output::create(&args.common.out, exp)?;
    let rows = match args.plot {
        true => read_rows(exp, &out)?
            .into_iter()
            .filter(|r| args.compare.is_empty() || args.compare.contains(&r[0]))
            .collect(),
        false => {
            let local = Build::here()?;
            let hosts = args.hosts.as_deref().map(Inventory::load).transpose()?;
            if let Some(hosts) = &hosts {
                hosts.check(&local)?;
            }
            let setup = Setup { quick, runs, placement: Placement { local, hosts } };
            let points = compared((exp.points)(&setup)?, &args.compare, exp)?;
            out.clear_logs()?;
            sweep(exp, &setup, &points, &out)?
        }
    };
    let figure = figure_of(exp, &rows, quick, runs);
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
fn compared(mut points: Vec<Point>, compare: &[String], exp: &Sweep) -> Result<Vec<Point>, String> {
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
    fn create(dir: &Path, exp: &Sweep) -> Result<Output, String> {
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
fn sweep(exp: &Sweep, setup: &Setup, points: &[Point], out: &Output) -> Result<Vec<Vec<String>>, String> {
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
    exp: &Sweep,
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
    // A column that is not a number in every run (a name) is the same in
    // each: the first run's.
    let median = |values: Vec<&String>| -> String {
        let numbers: Vec<(f64, &String)> = values.iter().filter_map(|v| Some((v.parse().ok()?, *v))).collect();
        match numbers.len() == values.len() {
            true => super::median_by(numbers, |n| n.0).map_or_else(String::new, |n| n.1.clone()),
            false => values[0].clone(),
        }
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
fn header(exp: &Sweep) -> Vec<&'static str> {
    ["config"].iter().chain(exp.params).chain(exp.measured).chain(&["status", "error"]).copied().collect()
}

/// `--plot`: the rows of an earlier sweep, to draw its figure again.
fn read_rows(exp: &Sweep, out: &Output) -> Result<Vec<Row>, String> {
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
fn figure_of(exp: &Sweep, rows: &[Vec<String>], quick: bool, runs: u32) -> Figure {
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
