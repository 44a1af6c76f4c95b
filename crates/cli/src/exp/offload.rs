//! E4, E5 and E6: the offloaded stack. softrnicd is the engine on cores of
//! its own that sends and receives on programs' behalf (a DPU's part), and
//! its `--tx` and `--rx` designs decide where a payload is copied on the
//! way ([`softrnic_daemon::server::offload`]).
//!
//! - `softrnic exp e4` (`offload-tx`): two threads of `rdma_bench` SENDs,
//!   64 B to 8 KiB, through softrnicd with each transmit design.
//! - `softrnic exp e5` (`offload-rx`): eight threads, 512 B to 8 KiB (and
//!   16 and 32 connections at 8 KiB), with each receive design.
//! - `softrnic exp e6` (`stacks`): 2 KiB messages over 1 to 8 connections
//!   through the offloaded stack, the engine in the program (plain RDMA),
//!   the Snap-like baseline (`rdma_bench -snapListMiB`), and kernel TCP
//!   (iperf3).
//!
//! Each prints the seed's line per thread and the sum, and writes
//! `results/<exp>_results.csv`, the logs and `<exp>_figure.svg`. Beside the
//! throughput goes the engine's memory traffic as far as this machine lets
//! it be measured (a VM has no cache-miss counters): the bytes softrnicd's
//! designs copied per payload byte, and the staging memory they held.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use softrnic_daemon::server::offload::{OffloadStats, RxDesign, TxDesign};
use softrnic_rdma_bench::report::{End, ThreadLine};

use clap::Args;

use super::daemon::{self, Daemon};
use super::figure::Series;
use super::hosts::{Build, loopback_pair};
use super::listening::wait_for_listener;
use super::panels::{self, Panel};
use super::roles::which;
use super::{Common, Runs, median_by};

/// The message size of E6.
const E6_PAYLOAD: u32 = 2048;
/// The Snap-like baseline's linked list, per server thread: far beyond
/// any cache.
const SNAP_LIST_MIB: usize = 64;
/// Sends each `rdma_bench` QP keeps in flight.
const OUTSTANDING: &str = "48";
/// How long one run may take.
const LIMIT: Duration = Duration::from_secs(300);

/// The flags of e4, e5 and e6.
#[derive(Args, Debug, Clone)]
pub struct OffloadArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub runs: Runs,
}

/// How the two `rdma_bench` ends reach their devices.
#[derive(Clone, Copy)]
enum Stack<'a> {
    /// Through softrnicd: the offloaded stack.
    Offloaded(&'a Daemon),
    /// An engine in each program, with the server doing the Snap-like
    /// baseline's work per message or not.
    InProgram { snap: bool },
}

/// One run of `rdma_bench`: `threads` QPs, each sending `messages` of
/// `pack` bytes, nothing verified (the transport is what is measured).
struct Run {
    threads: u32,
    pack: u32,
    messages: u64,
}

impl Run {
    /// A run of about 2 GB (20 MB with `--quick`) over all threads, within
    /// bounds on the messages per thread that keep every size to seconds.
    fn sized(quick: bool, threads: u32, pack: u32) -> Run {
        let (bytes, fewest, most) = if quick { (2e7, 1_000, 5_000) } else { (2e9, 20_000, 300_000) };
        let messages = (bytes / f64::from(threads * pack)) as u64;
        Run { threads, pack, messages: messages.clamp(fewest, most) }
    }
}

/// Runs `rdma_bench`'s server and client on point `i`'s loopback pair;
/// their per-thread lines.
fn rdma_bench(
    build: &Build,
    stack: Stack,
    run: &Run,
    i: usize,
    logs: &Path,
    tag: &str,
) -> Result<Vec<ThreadLine>, String> {
    let program = build.bin.join("rdma_bench");
    if !program.exists() {
        return Err(format!("{} is missing: run cargo build --release -p softrnic-rdma-bench", program.display()));
    }
    let (server, client) = loopback_pair(i);
    let port = (22_000 + (std::process::id() as usize * 11 + i) % 20_000).to_string();
    let daemon = match stack {
        Stack::Offloaded(daemon) => daemon.socket.display().to_string(),
        Stack::InProgram { .. } => "off".to_string(),
    };
    let start = |addr: &str, args: &[String], role: &str| -> Result<(Child, PathBuf), String> {
        let log = logs.join(format!("{tag}_{role}.log"));
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&program)
            .args(["-serverIp", &server, "-port", &port, "-auto_exit_sec", &LIMIT.as_secs().to_string()])
            .args(args)
            .env("LD_LIBRARY_PATH", &build.lib)
            .env("SOFTRNIC_ADDR", addr)
            .env("SOFTRNIC_DAEMON", &daemon)
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start rdma_bench: {e}"))?;
        Ok((child, log))
    };
    let mut server_args = vec!["-nodeId".to_string(), "0".into()];
    if let Stack::InProgram { snap: true } = stack {
        server_args.extend(["-snapListMiB".into(), SNAP_LIST_MIB.to_string()]);
    }
    let (mut server_child, server_log) = start(&server, &server_args, "server")?;
    // The server listens before the client connects (its list built).
    std::thread::sleep(Duration::from_millis(300));
    let client_args: Vec<String> = [
        "-nodeId",
        "1",
        "-threads",
        &run.threads.to_string(),
        "-packSize",
        &run.pack.to_string(),
        "-iterations",
        "1",
        "-numPack",
        &run.messages.to_string(),
        "-outstanding",
        OUTSTANDING,
        "-noVerify",
    ]
    .map(str::to_string)
    .into();
    let (mut client_child, client_log) = start(&client, &client_args, "client")?;
    let client_text = daemon::finish(&mut client_child, &client_log, LIMIT);
    let server_text = daemon::finish(&mut server_child, &server_log, Duration::from_secs(15));
    let text = client_text? + &server_text?;
    let lines: Vec<ThreadLine> = text.lines().filter_map(ThreadLine::parse).collect();
    for end in [End::Sent, End::Received] {
        let count = lines.iter().filter(|l| l.end == end).count();
        if count != run.threads as usize {
            return Err(format!("{count} {end:?} lines for {} threads; see {}", run.threads, logs.display()));
        }
    }
    Ok(lines)
}

/// What one point measured: its per-thread lines, and what softrnicd's
/// designs copied (`None` for the stacks without it).
struct Measured {
    lines: Vec<ThreadLine>,
    stats: Option<OffloadStats>,
}

impl Measured {
    /// The sum over the threads of `end`'s lines, Gb/s.
    fn total(&self, end: End) -> f64 {
        self.lines.iter().filter(|l| l.end == end).map(|l| l.gbps).sum()
    }

    /// The designs' copies per payload byte moved.
    fn copied_per_byte(&self, run: &Run) -> Option<f64> {
        let stats = self.stats?;
        let moved = (u64::from(run.threads) * run.messages * u64::from(run.pack)) as f64;
        Some((stats.tx_copied_bytes + stats.rx_copied_bytes) as f64 / moved)
    }

    fn staging_mib(&self) -> Option<f64> {
        Some(self.stats?.staging_peak as f64 / (1 << 20) as f64)
    }
}

/// Runs `run` through a softrnicd started with `flags`, `runs` times;
/// the run with the median sum of `end`'s lines.
fn offloaded(
    build: &Build,
    flags: &[&str],
    run: &Run,
    (i, runs, end): (usize, u32, End),
    logs: &Path,
    tag: &str,
) -> Result<Measured, String> {
    let mut measured = Vec::new();
    for r in 0..runs {
        let tag = format!("{tag}_run{r}");
        let log = logs.join(format!("{tag}_softrnicd.log"));
        let daemon = Daemon::start_with(build, &log, flags)?;
        let lines = rdma_bench(build, Stack::Offloaded(&daemon), run, i, logs, &tag);
        drop(daemon); // stopped: it prints what it copied
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let stats = text.lines().find_map(OffloadStats::parse);
        let stats = stats.ok_or_else(|| format!("softrnicd said nothing of its copies; see {}", log.display()))?;
        measured.push(Measured { lines: lines?, stats: Some(stats) });
    }
    Ok(median(measured, end))
}

/// The run whose sum of `end`'s lines is the median.
fn median(runs: Vec<Measured>, end: End) -> Measured {
    median_by(runs, |r| r.total(end)).expect("at least one run")
}

/// Prints a point's lines in the seed's spelling, and their sum.
fn print_point(title: &str, measured: &Measured, end: End) {
    println!("{title}");
    for line in measured.lines.iter().filter(|l| l.end == end) {
        println!("  {}", line.seed_line());
    }
    println!("  Total: {:.6} Gbps", measured.total(end));
}

fn ratio(value: Option<f64>, base: Option<f64>) -> String {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => format!("{:.2}x", v / b),
        _ => "n/a".to_string(),
    }
}

/// A figure's panel of the threads' summed throughput.
fn gbps_panel(x_label: &str, series: Vec<Series>) -> Panel {
    Panel { x_label: x_label.into(), y_label: "Gb/s (sum of the threads)".into(), x_log: true, series }
}

/// Adds `(x, y)` to the series named `name`.
fn plot(series: &mut Vec<Series>, name: &str, x: f64, y: f64) {
    match series.iter_mut().find(|s| s.name == name) {
        Some(s) => s.points.push((x, y)),
        None => series.push(Series { name: name.to_string(), points: vec![(x, y)] }),
    }
}

/// `softrnic exp e4`.
pub fn e4(args: &OffloadArgs) -> Result<(), String> {
    let (quick, runs, out) = (args.common.quick, args.runs.runs, &args.common.out);
    let build = Build::daemon_and_library()?;
    let (csv, logs) = daemon::output(out, "e4")?;
    let payloads: &[u32] = if quick { &[64, 8192] } else { &[64, 128, 256, 512, 1024, 2048, 4096, 8192] };
    let (mut rows, mut gbps, mut copied, mut totals) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for design in [TxDesign::EngineCopy, TxDesign::BulkCopy, TxDesign::HeaderOnly] {
        for &pack in payloads {
            let run = Run::sized(quick, 2, pack);
            let tag = format!("{design}_{pack}");
            let flags = ["--tx", &design.to_string()];
            let measured = offloaded(&build, &flags, &run, (rows.len(), runs, End::Sent), &logs, &tag)?;
            print_point(&format!("e4: --tx {design}, {pack} B, 2 threads"), &measured, End::Sent);
            let (total, per_byte) = (measured.total(End::Sent), measured.copied_per_byte(&run).unwrap_or(0.0));
            rows.push(format!(
                "{design},{pack},2,{total:.4},{per_byte:.3},{}",
                measured.stats.map_or(0, |s| s.staging_peak)
            ));
            plot(&mut gbps, &design.to_string(), f64::from(pack), total);
            // The engine's memory traffic beside it: what it copied, per second.
            plot(&mut copied, &design.to_string(), f64::from(pack), total * per_byte);
            totals.push((design, pack, total));
        }
    }
    daemon::write_csv(&csv, "design,payload,threads,gbps,copied_bytes_per_byte,staging_peak_bytes", &rows)?;
    let figure = out.join("e4_figure.svg");
    let copied = Panel {
        x_label: "payload (B)".into(),
        y_label: "payload the daemon copied (Gb/s)".into(),
        x_log: true,
        series: copied,
    };
    let panels = [gbps_panel("payload (B)", gbps), copied];
    panels::write(&figure, "E4: the offloaded stack's transmit designs (2 threads)", &panels)?;
    let at = |design, pack| totals.iter().find(|(d, p, _)| *d == design && *p == pack).map(|t| t.2);
    for pack in [4096, 8192].into_iter().filter(|p| payloads.contains(p)) {
        println!(
            "header-only at {pack} B: {} bulk-copy, {} engine-copy (target: ahead of both)",
            ratio(at(TxDesign::HeaderOnly, pack), at(TxDesign::BulkCopy, pack)),
            ratio(at(TxDesign::HeaderOnly, pack), at(TxDesign::EngineCopy, pack)),
        );
    }
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// `softrnic exp e5`.
pub fn e5(args: &OffloadArgs) -> Result<(), String> {
    let (quick, runs, out) = (args.common.quick, args.runs.runs, &args.common.out);
    let build = Build::daemon_and_library()?;
    let (csv, logs) = daemon::output(out, "e5")?;
    // Eight connections over the sizes, then more connections at 8 KiB,
    // where the per-connection design's buffers outgrow the cache.
    let mut points: Vec<(u32, u32)> = match quick {
        true => vec![(8, 512), (8, 8192)],
        false => [512, 1024, 2048, 4096, 8192].map(|pack| (8, pack)).into(),
    };
    if !quick {
        points.extend([(16, 8192), (32, 8192)]);
    }
    let (mut rows, mut gbps, mut staging, mut totals) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for design in [RxDesign::PerConnection, RxDesign::InCache, RxDesign::Direct] {
        for &(connections, pack) in &points {
            let run = Run::sized(quick, connections, pack);
            let tag = format!("{design}_{connections}_{pack}");
            let flags = ["--rx", &design.to_string()];
            let measured = offloaded(&build, &flags, &run, (rows.len(), runs, End::Received), &logs, &tag)?;
            print_point(&format!("e5: --rx {design}, {pack} B, {connections} threads"), &measured, End::Received);
            let total = measured.total(End::Received);
            let per_byte = measured.copied_per_byte(&run).unwrap_or(0.0);
            let mib = measured.staging_mib().unwrap_or(0.0);
            rows.push(format!("{design},{pack},{connections},{total:.4},{per_byte:.3},{mib:.1}"));
            if connections == 8 {
                plot(&mut gbps, &design.to_string(), f64::from(pack), total);
            }
            if pack == 8192 {
                plot(&mut staging, &design.to_string(), f64::from(connections), mib);
            }
            totals.push((design, connections, pack, total));
        }
    }
    daemon::write_csv(&csv, "design,payload,connections,gbps,copied_bytes_per_byte,staging_peak_mib", &rows)?;
    let figure = out.join("e5_figure.svg");
    let staging = Panel {
        x_label: "connections, 8 KiB".into(),
        y_label: "staging buffers held (MiB)".into(),
        x_log: true,
        series: staging,
    };
    let panels = [gbps_panel("payload (B), 8 threads", gbps), staging];
    panels::write(&figure, "E5: the offloaded stack's receive designs", &panels)?;
    let at = |design, connections, pack| {
        totals.iter().find(|t| t.0 == design && t.1 == connections && t.2 == pack).map(|t| t.3)
    };
    for &(connections, pack) in points.iter().filter(|(_, p)| *p >= 4096) {
        println!(
            "in-cache at {pack} B, {connections} connections: {} per-connection (target: ahead), {} direct",
            ratio(at(RxDesign::InCache, connections, pack), at(RxDesign::PerConnection, connections, pack)),
            ratio(at(RxDesign::InCache, connections, pack), at(RxDesign::Direct, connections, pack)),
        );
    }
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// The stacks E6 compares.
const E6_STACKS: [&str; 4] = ["offloaded", "rdma", "snap", "tcp"];

/// `softrnic exp e6`.
pub fn e6(args: &OffloadArgs) -> Result<(), String> {
    let (quick, runs, out) = (args.common.quick, args.runs.runs, &args.common.out);
    let build = Build::daemon_and_library()?;
    let (csv, logs) = daemon::output(out, "e6")?;
    let connections: &[u32] = if quick { &[1, 2] } else { &[1, 2, 4, 8] };
    let (mut rows, mut series, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    for stack in E6_STACKS {
        for &n in connections {
            let run = Run::sized(quick, n, E6_PAYLOAD);
            let (i, tag) = (rows.len(), format!("{stack}_{n}"));
            let (total, per_byte) = match stack {
                "offloaded" => {
                    let flags = ["--tx", "header-only", "--rx", "in-cache"];
                    let measured = offloaded(&build, &flags, &run, (i, runs, End::Received), &logs, &tag)?;
                    (measured.total(End::Received), measured.copied_per_byte(&run))
                }
                "tcp" => (tcp(n, quick, runs, i, &logs, &tag)?, None),
                _ => {
                    let place = Stack::InProgram { snap: stack == "snap" };
                    let measured = (0..runs)
                        .map(|r| {
                            let lines = rdma_bench(&build, place, &run, i, &logs, &format!("{tag}_run{r}"))?;
                            Ok(Measured { lines, stats: None })
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                    (median(measured, End::Received).total(End::Received), None)
                }
            };
            println!("e6: {stack}, {n} connection(s), {E6_PAYLOAD} B\n  Total bandwidth: {total:.6} Gbps");
            let per_byte = per_byte.map_or(String::new(), |b| format!("{b:.3}"));
            rows.push(format!("{stack},{n},{E6_PAYLOAD},{total:.4},{per_byte}"));
            plot(&mut series, stack, f64::from(n), total);
            totals.push((stack, n, total));
        }
    }
    daemon::write_csv(&csv, "stack,connections,payload,gbps,copied_bytes_per_byte", &rows)?;
    let figure = out.join("e6_figure.svg");
    let panel = Panel {
        x_label: format!("connections ({E6_PAYLOAD} B messages)"),
        y_label: "Total bandwidth (Gb/s)".into(),
        x_log: true,
        series,
    };
    panels::write(&figure, "E6: the offloaded stack against other network stacks", &[panel])?;
    let most = *connections.last().expect("connections");
    let at = |stack| totals.iter().find(|t| t.0 == stack && t.1 == most).map(|t| t.2);
    println!(
        "offloaded at {most} connection(s): {} plain RDMA, {} the Snap-like baseline, {} kernel TCP",
        ratio(at("offloaded"), at("rdma")),
        ratio(at("offloaded"), at("snap")),
        ratio(at("offloaded"), at("tcp")),
    );
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// Kernel TCP with `n` connections of 2 KiB writes (iperf3 `-P n -l 2048`),
/// the median of `runs`; Gb/s received.
fn tcp(n: u32, quick: bool, runs: u32, i: usize, logs: &Path, tag: &str) -> Result<f64, String> {
    if which("iperf3").is_none() {
        return Err("the TCP baseline needs iperf3: apt-get install iperf3".into());
    }
    let (server, client) = loopback_pair(i);
    let port_number = (26_000 + (std::process::id() as usize * 11 + i) % 20_000) as u16;
    let port = port_number.to_string();
    let seconds = if quick { "1" } else { "3" };
    let mut results = Vec::new();
    for r in 0..runs {
        let start = |args: &[&str], role: &str| -> Result<(Child, PathBuf), String> {
            let log = logs.join(format!("{tag}_run{r}_{role}.log"));
            let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let child = Command::new("iperf3")
                .args(args)
                .stdin(Stdio::null())
                .stdout(file.try_clone().map_err(|e| e.to_string())?)
                .stderr(file)
                .spawn()
                .map_err(|e| format!("cannot start iperf3: {e}"))?;
            Ok((child, log))
        };
        let (mut listener, listener_log) = start(&["-s", "-1", "-B", &server, "-p", &port], "server")?;
        if let Err(e) = wait_for_listener(&mut listener, port_number, Duration::from_secs(30)) {
            super::stop_child(&mut listener);
            return Err(format!("iperf3: {e}; see {}", listener_log.display()));
        }
        let streams = n.to_string();
        let client_args =
            ["-c", &server, "-B", &client, "-p", &port, "-P", &streams, "-l", "2048", "-t", seconds, "-J"];
        let (mut sender, sender_log) = start(&client_args, "client")?;
        let report = daemon::finish(&mut sender, &sender_log, LIMIT);
        let _ = daemon::finish(&mut listener, &listener_log, Duration::from_secs(5));
        let report: serde_json::Value = serde_json::from_str(&report?)
            .map_err(|e| format!("iperf3 wrote no JSON report ({e}); see {}", sender_log.display()))?;
        let bits = report["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .ok_or_else(|| format!("iperf3's report has no received rate; see {}", sender_log.display()))?;
        results.push(bits / 1e9);
    }
    Ok(median_by(results, |r| *r).expect("at least one run"))
}
