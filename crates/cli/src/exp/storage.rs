//! E7, a storage service: `softrnic storage`'s block RPC (4 KiB blocks
//! with a CRC-32 each, Alibaba Solar's shape) with 1 to 12 client
//! threads, in each design: the applications' CPUs doing the CRCs and
//! copies, softrnicd computing and checking the CRCs, softrnicd also
//! placing the blocks, and kernel TCP. Every point runs its own softrnicd
//! (so that its CPU time and block counters are the point's), a server
//! and a client, which first checks that a corrupt block is refused.
//!
//! Beside the seed's `Total Speed: N Mops` go the application's work per
//! block on the server (what an offload takes off it), and the CPU time
//! of the server, the client and softrnicd per block: where the work went.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::daemon::{self, Daemon};
use super::figure::Series;
use super::hosts::{Build, loopback_pair};
use super::listening::wait_for_listener;
use super::panels::{self, Panel};
use super::{Common, Runs, median_by};
use crate::storage::{Design, WORK_LINE, cpu_seconds};

#[derive(Args, Debug, Clone)]
pub struct StorageArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub runs: Runs,
    /// Client threads to run (default 1,2,4,8,12; 1,2 with --quick).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: Vec<u32>,
    /// Seconds each point measures (default 5; 1 with --quick).
    #[arg(long)]
    pub seconds: Option<f64>,
}

/// How long one client may take beyond its measured seconds.
const SLACK: Duration = Duration::from_secs(60);

/// What one point measured.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    mops: f64,
    gbps: f64,
    /// Microseconds per block: the server application's work (parsing,
    /// what CRCs and copies its design leaves it, answering), and the CPU
    /// time of the server, softrnicd and the client.
    server_work: f64,
    server_cpu: f64,
    daemon_cpu: f64,
    client_cpu: f64,
}

/// A number that follows `before` in `text`, up to `after`.
fn number_between(text: &str, before: &str, after: &str) -> Option<f64> {
    let rest = text.split_once(before)?.1;
    rest.split_once(after)?.0.trim().parse().ok()
}

/// The client's two lines: Mops, and the blocks, Gb/s and its CPU.
fn parse_client(text: &str) -> Option<(f64, u64, f64, f64)> {
    let mops = number_between(text, "Total Speed: ", " Mops")?;
    let line = text.lines().find(|l| l.starts_with("storage: "))?;
    let blocks = number_between(line, "thread(s), ", " blocks")? as u64;
    let gbps = number_between(line, "s: ", " Gb/s")?;
    let cpu = number_between(line, "client CPU ", " us per block")?;
    Some((mops, blocks, gbps, cpu))
}

/// The server's connections' lines: their requests, and the mean work
/// per request over all of them.
fn parse_work(text: &str) -> (usize, f64) {
    let lines: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(WORK_LINE))
        .filter_map(|l| Some((number_between(l, WORK_LINE, " requests")?, number_between(l, "requests, ", " us")?)))
        .collect();
    let requests: f64 = lines.iter().map(|(n, _)| n).sum();
    let work = lines.iter().map(|(n, us)| n * us).sum::<f64>() / requests.max(1.0);
    (lines.len(), work)
}

/// Starts `softrnic` with `args` through `daemon`, logging to `log`.
fn start(build: &Build, daemon: &Daemon, args: &[String], log: &Path) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    Command::new(build.bin.join("softrnic"))
        .args(args)
        .env("SOFTRNIC_DAEMON", &daemon.socket)
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("cannot start softrnic storage: {e}"))
}

/// One run of a point: a softrnicd, a server, and a client of `design`
/// with `threads` threads.
fn point(
    build: &Build,
    design: Design,
    threads: u32,
    seconds: f64,
    (i, logs, tag): (usize, &Path, &str),
) -> Result<Measured, String> {
    let daemon_log = logs.join(format!("{tag}_softrnicd.log"));
    let daemon = Daemon::start_with(build, &daemon_log, &[])?;
    let (server_addr, client_addr) = loopback_pair(i);
    let port = 24_000 + ((std::process::id() as usize * 7 + i) % 20_000) as u16;
    let server_log = logs.join(format!("{tag}_server.log"));
    let server_args = ["storage", "--server", "--addr", &server_addr, "--port", &port.to_string()];
    let mut server = start(build, &daemon, &server_args.map(String::from), &server_log)?;
    let measured = (|| {
        wait_for_listener(&mut server, port, Duration::from_secs(20))?;
        let client_log = logs.join(format!("{tag}_client.log"));
        let client_args = [
            "storage",
            "--client",
            "--addr",
            &client_addr,
            "--server-addr",
            &server_addr,
            "--port",
            &port.to_string(),
            "--design",
            &design.to_string(),
            "--threads",
            &threads.to_string(),
            "--seconds",
            &seconds.to_string(),
            "--corrupt",
        ];
        let cpu = |child: &Child| cpu_seconds(Some(child.id()));
        let (server_before, daemon_before) = (cpu(&server), daemon.cpu_seconds());
        let mut client = start(build, &daemon, &client_args.map(String::from), &client_log)?;
        let text = daemon::finish(&mut client, &client_log, Duration::from_secs_f64(seconds) + SLACK)?;
        let (server_cpu, daemon_cpu) = (cpu(&server) - server_before, daemon.cpu_seconds() - daemon_before);
        let (mops, blocks, gbps, client_cpu) =
            parse_client(&text).ok_or_else(|| format!("no result in {}", client_log.display()))?;
        if !text.contains("corrupt block: refused with a CRC error") {
            return Err(format!("the corrupt block was not refused; see {}", client_log.display()));
        }
        // Each connection says what its work cost as it ends.
        let ended = Instant::now() + Duration::from_secs(10);
        let (connections, server_work) = loop {
            let (connections, work) = parse_work(&std::fs::read_to_string(&server_log).unwrap_or_default());
            if connections >= threads as usize || Instant::now() > ended {
                break (connections, work);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // One connection per client thread.
        if connections < threads as usize {
            return Err(format!("{connections} of the server's connections ended; see {}", server_log.display()));
        }
        let per_block = |seconds: f64| seconds * 1e6 / blocks.max(1) as f64;
        Ok(Measured {
            mops,
            gbps,
            server_work,
            server_cpu: per_block(server_cpu),
            daemon_cpu: per_block(daemon_cpu),
            client_cpu,
        })
    })();
    super::stop_child(&mut server);
    drop(daemon);
    let measured = measured?;
    // The offloaded designs' work was the daemon's: it says how much.
    if design != Design::Cpu && design != Design::Tcp {
        let log = std::fs::read_to_string(&daemon_log).unwrap_or_default();
        let computed = log.lines().find_map(|l| number_between(l, "blocks: ", " CRCs computed"));
        if !computed.is_some_and(|n| n > 0.0) {
            return Err(format!("softrnicd computed no block CRCs for {design}; see {}", daemon_log.display()));
        }
    }
    Ok(measured)
}

/// `softrnic exp e7`.
pub fn run(args: &StorageArgs) -> Result<(), String> {
    let (quick, runs, out) = (args.common.quick, args.runs.runs, &args.common.out);
    let build = Build::daemon()?;
    let (csv, logs) = daemon::output(out, "e7")?;
    let threads = match (args.threads.is_empty(), quick) {
        (false, _) => args.threads.clone(),
        (true, true) => vec![1, 2],
        (true, false) => vec![1, 2, 4, 8, 12],
    };
    let seconds = args.seconds.unwrap_or(if quick { 1.0 } else { 5.0 });
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(format!("--seconds {seconds} is not a positive number of seconds"));
    }
    let (mut rows, mut mops, mut work, mut totals) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &n in &threads {
        for design in Design::ALL {
            let tag = format!("{design}_{n}");
            let measured = (0..runs)
                .map(|r| {
                    point(
                        &build,
                        design,
                        n,
                        seconds,
                        (rows.len() * runs as usize + r as usize, &logs, &format!("{tag}_run{r}")),
                    )
                })
                .collect::<Result<Vec<_>, String>>()?;
            let m = median_by(measured, |m| m.mops).expect("at least one run");
            println!("e7: {design}, {n} thread(s)\n  Total Speed: {:.6} Mops", m.mops);
            println!(
                "  {:.3} Gb/s; per block: server work {:.2} us, CPU {:.2} us server, {:.2} us softrnicd, {:.2} us client",
                m.gbps, m.server_work, m.server_cpu, m.daemon_cpu, m.client_cpu
            );
            rows.push(format!(
                "{design},{n},{:.6},{:.4},{:.3},{:.3},{:.3},{:.3}",
                m.mops, m.gbps, m.server_work, m.server_cpu, m.daemon_cpu, m.client_cpu
            ));
            plot(&mut mops, design, f64::from(n), m.mops);
            plot(&mut work, design, f64::from(n), m.server_work);
            totals.push((design, n, m));
        }
    }
    let header = "design,threads,mops,gbps,server_work_us_per_block,server_cpu_us_per_block,\
                  daemon_cpu_us_per_block,client_cpu_us_per_block";
    daemon::write_csv(&csv, header, &rows)?;
    let figure = out.join("e7_figure.svg");
    let panels = [
        Panel { x_label: "client threads".into(), y_label: "Total Speed (Mops)".into(), x_log: false, series: mops },
        Panel {
            x_label: "client threads".into(),
            y_label: "server application work per block (us)".into(),
            x_log: false,
            series: work,
        },
    ];
    panels::write(
        &figure,
        "E7: 4 KiB block storage, CRC and copy in the application or offloaded to softrnicd",
        &panels,
    )?;
    let most = *threads.last().expect("threads");
    let at = |design| totals.iter().find(|(d, n, _)| *d == design && *n == most).map(|t| t.2);
    if let (Some(cpu), Some(tcp)) = (at(Design::Cpu), at(Design::Tcp)) {
        for design in [Design::Crc, Design::CrcCopy] {
            let Some(m) = at(design) else { continue };
            println!(
                "{design} at {most} thread(s): {:.2}x CPU-only's Mops, {:.2}x TCP's; server work per block {:.2} us \
                 against CPU-only's {:.2} us ({:.0} % saved)",
                m.mops / cpu.mops,
                m.mops / tcp.mops,
                m.server_work,
                cpu.server_work,
                100.0 * (1.0 - m.server_work / cpu.server_work)
            );
        }
    }
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// Adds `(x, y)` to `design`'s series.
fn plot(series: &mut Vec<Series>, design: Design, x: f64, y: f64) {
    let name = design.to_string();
    match series.iter_mut().find(|s| s.name == name) {
        Some(s) => s.points.push((x, y)),
        None => series.push(Series { name, points: vec![(x, y)] }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_and_server_lines_read_back() {
        let client = "corrupt block: refused with a CRC error (crc), nothing stored\nTotal Speed: 0.079519 Mops\n\
                      storage: design crc, 2 thread(s), 159037 blocks (79674 written, 79363 read, every CRC and byte \
                      checked) in 2.00 s: 2.606 Gb/s; client CPU 6.85 us per block (over 2.00 s)\n";
        assert_eq!(parse_client(client), Some((0.079519, 159037, 2.606, 6.85)));
        let server = format!(
            "storage server on 127.0.0.2:18715\n{WORK_LINE} 100 requests, 2.000 us of application work per request \
             (crc)\n{WORK_LINE} 300 requests, 1.000 us of application work per request (crc)\n"
        );
        assert_eq!(parse_work(&server), (2, 1.25));
    }
}
