//! E11 and E12: unmodified perftest through softrnicd, against the engine
//! in each program (the host) and against the forwarding design, where
//! every data command crosses the daemon's socket (FreeFlow's).
//!
//! - `softrnic exp e11` (`containers`): `ib_send_bw`, `ib_send_lat`,
//!   `ib_write_bw`, `ib_write_lat`, 4 B to 1 MiB (`-a`, 1000 iterations),
//!   each way of running in turn.
//! - `softrnic exp e12` (`scalability`): 2 to 128 pairs running
//!   `ib_write_bw` with 128 KiB messages at once, through the daemon and
//!   forwarding; throughput per pair, the aggregate, and the daemon's
//!   memory per pair.
//!
//! The daemon's and forwarding's instances run in containers (namespaces
//! of their own, a veth between a pair's two, [`Instances`]) when the run
//! is root, else as processes on loopback addresses of their own; the
//! host's are processes with the engine inside. The daemon runs its
//! embedded switch (`--embedded-switch`): a pair's datagrams go from one
//! container's device to the other's through shared memory, as the host's
//! go between its two processes, not through the veth. Both write
//! `results/<exp>_results.csv`, the perftest logs and a figure.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::Common;
use super::figure::Series;
use super::hosts::Build;
use super::listening::wait_for_listener;
use super::panels::{self, Panel};

/// How a pair reaches its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// An engine inside each program.
    Host,
    /// One softrnicd, queues in shared memory.
    Daemon,
    /// One softrnicd, every post and poll over its socket.
    Forwarding,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Host => "host",
            Mode::Daemon => "softrnicd",
            Mode::Forwarding => "forwarding",
        }
    }

    fn env(self, socket: &Path) -> Vec<(&'static str, String)> {
        let socket = socket.display().to_string();
        match self {
            Mode::Host => vec![("SOFTRNIC_DAEMON", "off".into())],
            Mode::Daemon => vec![("SOFTRNIC_DAEMON", socket), ("SOFTRNIC_FORWARD", "0".into())],
            Mode::Forwarding => vec![("SOFTRNIC_DAEMON", socket), ("SOFTRNIC_FORWARD", "1".into())],
        }
    }
}

impl Build {
    /// The build beside this `softrnic`, with perftest installed.
    pub(super) fn with_perftest() -> Result<Build, String> {
        let build = Build::daemon_and_library()?;
        for program in ["ib_send_bw", "ib_write_bw"] {
            if super::roles::which(program).is_none() {
                return Err(format!("{program} is missing: apt-get install perftest"));
            }
        }
        Ok(build)
    }

    /// softrnicd and the library beside this `softrnic`.
    pub(super) fn daemon_and_library() -> Result<Build, String> {
        let build = Build::daemon()?;
        let library = build.lib.join("libibverbs.so.1");
        if !library.exists() {
            return Err(format!("{} is missing: run scripts/build-libibverbs.sh", library.display()));
        }
        Ok(build)
    }

    /// softrnicd beside this `softrnic`.
    pub(super) fn daemon() -> Result<Build, String> {
        let build = Build::here()?;
        let daemon = build.bin.join("softrnicd");
        if !daemon.exists() {
            return Err(format!("{} is missing: run cargo build --release -p softrnic-daemon", daemon.display()));
        }
        Ok(build)
    }
}

/// The flags of the daemon e11 and e12 start.
#[derive(Args, Debug, Clone)]
pub struct DaemonFlags {
    /// The daemon's command processors (softrnicd --processors; default:
    /// softrnicd's).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub processors: Option<u16>,
}

/// The flags of e11.
#[derive(Args, Debug, Clone)]
pub struct E11Args {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub daemon: DaemonFlags,
    /// The perftest programs to run (default ib_send_bw,ib_send_lat,
    /// ib_write_bw,ib_write_lat).
    #[arg(long, value_delimiter = ',')]
    pub tests: Vec<String>,
    /// Run them in QEMU guests instead: guest to host and guest to guest,
    /// against host to host (root; qemu-system-x86, a kernel in /boot,
    /// busybox-static, cpio).
    #[arg(long)]
    pub vm: bool,
    /// How the guests' CPUs run: tcg (QEMU's translator, function only)
    /// or kvm (the figures to compare).
    #[arg(long, value_enum, default_value_t = super::vm::Accel::Tcg, requires = "vm")]
    pub accel: super::vm::Accel,
}

/// The flags of e12.
#[derive(Args, Debug, Clone)]
pub struct E12Args {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub daemon: DaemonFlags,
    /// The numbers of pairs to run (default 2,4,8,16,32,64,128; 2,16
    /// with --quick).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=512))]
    pub pairs: Vec<u64>,
}

/// A softrnicd for the experiment, stopped (SIGINT) when dropped.
pub(super) struct Daemon {
    child: Child,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// The containers' daemon: its embedded switch carries a pair's
    /// datagrams between the pair's namespaces, as an SR-IOV NIC carries
    /// them between two virtual functions; `--processors` if asked,
    /// softrnicd's own default otherwise.
    fn start(build: &Build, out: &Path, processors: Option<u16>) -> Result<Daemon, String> {
        let processors = processors.map(|n| n.to_string());
        let mut flags = vec!["--embedded-switch"];
        if let Some(n) = &processors {
            flags.extend(["--processors", n]);
        }
        Daemon::start_with(build, &out.join("softrnicd.log"), &flags)
    }

    /// A softrnicd with `args` (designs, cores), logging to `log`.
    pub(super) fn start_with(build: &Build, log_path: &Path, args: &[&str]) -> Result<Daemon, String> {
        let socket = std::env::temp_dir().join(format!("softrnicd-exp-{}.sock", std::process::id()));
        let log = std::fs::File::create(log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        let child = Command::new(build.bin.join("softrnicd"))
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start softrnicd: {e}"))?;
        let mut daemon = Daemon { child, socket, log: log_path.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !softrnic_provider::launch::listening(&daemon.socket) {
            if Instant::now() > deadline || daemon.child.try_wait().ok().flatten().is_some() {
                return Err(format!("softrnicd did not start; see {}", log_path.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    /// The end of the daemon's log, for an error a tenant met.
    fn log_tail(&self) -> String {
        format!("{} ends:\n{}", self.log.display(), log_tail(&self.log))
    }

    /// The CPU time the daemon has used, seconds.
    pub(super) fn cpu_seconds(&self) -> f64 {
        crate::storage::cpu_seconds(Some(self.child.id()))
    }

    /// The daemon's resident memory, bytes.
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next());
        kib.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        super::stop_child(&mut self.child);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One perftest process.
struct Perftest {
    child: Child,
    log: PathBuf,
}

/// Starts `args` as instance `place` of pair `i` (`0` the server, `1` the
/// client) on device `addr`.
fn perftest(
    build: &Build,
    env: &[(&str, String)],
    place: &Instances,
    (i, side): (usize, usize),
    args: &[String],
    log: PathBuf,
) -> Result<Perftest, String> {
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let argv: Vec<String> = place.entry(i, side).into_iter().chain(args.iter().cloned()).collect();
    let addr = place.addresses(i)[side].clone();
    let mut command = Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env("LD_LIBRARY_PATH", &build.lib)
        .env("SOFTRNIC_ADDR", addr)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file);
    let child = command.spawn().map_err(|e| format!("cannot start {}: {e}", args[0]))?;
    Ok(Perftest { child, log })
}

impl Perftest {
    /// Waits for it; its log's result rows.
    fn finish(mut self, limit: Duration) -> Result<Vec<Vec<f64>>, String> {
        finish(&mut self.child, &self.log, limit).map(|text| result_rows(&text))
    }
}

/// Waits up to `limit` for a program that logs to `log` (and stops it
/// then); its log, if it exited well.
pub(super) fn finish(child: &mut Child, log: &Path, limit: Duration) -> Result<String, String> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            if !status.success() {
                return Err(format!("{} exited with {status}; it ends:\n{}", log.display(), log_tail(log)));
            }
            return Ok(std::fs::read_to_string(log).unwrap_or_default());
        }
        if start.elapsed() > limit {
            super::stop_child(child);
            return Err(format!("{} ran past {}s; it ends:\n{}", log.display(), limit.as_secs(), log_tail(log)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last lines of a log, for an error that names it: a CI run keeps
/// the error but not the file.
fn log_tail(log: &Path) -> String {
    const LINES: usize = 15;
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read it: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LINES)..].join("\n")
}

/// perftest's result rows: lines of numbers that start with the size.
pub(super) fn result_rows(text: &str) -> Vec<Vec<f64>> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() >= 4 && f[0].parse::<u64>().is_ok())
        .filter_map(|f| f.iter().map(|x| x.parse::<f64>().ok()).collect())
        .collect()
}

/// Where the instances of the pairs run: containers (network, mount,
/// PID, IPC and UTS namespaces, a pair's two joined by a veth, made as
/// root, removed when the run ends or, if it was killed, by the next run),
/// or, without root, processes of this host on loopback addresses of their
/// own.
enum Instances {
    Containers(Containers),
    Processes,
}

impl Instances {
    fn new(pairs: usize) -> Result<Instances, String> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("not root: the instances run as processes of this host, not in containers");
            return Ok(Instances::Processes);
        }
        Containers::create(pairs).map(Instances::Containers)
    }

    fn name(&self) -> &'static str {
        match self {
            Instances::Containers(_) => "containers",
            Instances::Processes => "processes",
        }
    }

    /// The server's and the client's device addresses of pair `i`.
    fn addresses(&self, i: usize) -> [String; 2] {
        match self {
            Instances::Containers(_) => Containers::addresses(i),
            Instances::Processes => {
                let second = 150 + std::process::id() as usize % 50;
                [1, 2].map(|host| format!("127.{second}.{}.{}", 1 + i / 100, host + 2 * (i % 100)))
            }
        }
    }

    /// The command that enters side `side` of pair `i`.
    fn entry(&self, i: usize, side: usize) -> Vec<String> {
        match self {
            Instances::Containers(c) => {
                let ns = c.namespace(i, side);
                [
                    "ip",
                    "netns",
                    "exec",
                    &ns,
                    "unshare",
                    "--mount",
                    "--pid",
                    "--ipc",
                    "--uts",
                    "--fork",
                    "--kill-child",
                    "--",
                ]
                .map(str::to_string)
                .to_vec()
            }
            Instances::Processes => Vec::new(),
        }
    }
}

/// The namespaces of N pairs, removed when dropped.
struct Containers {
    prefix: String,
    pairs: usize,
}

impl Containers {
    /// Names start with `srnic-c<pid>-`, so a run removes what a killed one
    /// left (its pid is gone) and never another's.
    fn create(pairs: usize) -> Result<Containers, String> {
        remove_leftovers();
        let mut containers = Containers { prefix: format!("srnic-c{}-", std::process::id()), pairs: 0 };
        for i in 0..pairs {
            let [a, b] = [containers.namespace(i, 0), containers.namespace(i, 1)];
            let [va, vb] =
                [format!("sc{}a{i}", std::process::id() % 1000), format!("sc{}b{i}", std::process::id() % 1000)];
            let [addr_a, addr_b] = Containers::addresses(i).map(|addr| format!("{addr}/24"));
            containers.pairs = i + 1;
            for step in [
                vec!["netns", "add", &a],
                vec!["netns", "add", &b],
                vec!["link", "add", &va, "mtu", "9000", "type", "veth", "peer", "name", &vb, "mtu", "9000"],
                vec!["link", "set", &va, "netns", &a],
                vec!["link", "set", &vb, "netns", &b],
                vec!["-n", &a, "addr", "add", &addr_a, "dev", &va],
                vec!["-n", &b, "addr", "add", &addr_b, "dev", &vb],
                vec!["-n", &a, "link", "set", &va, "up"],
                vec!["-n", &b, "link", "set", &vb, "up"],
                vec!["-n", &a, "link", "set", "lo", "up"],
                vec!["-n", &b, "link", "set", "lo", "up"],
            ] {
                ip(&step)?;
            }
        }
        Ok(containers)
    }

    /// Pair `i`'s two addresses, on the veth between its containers.
    fn addresses(i: usize) -> [String; 2] {
        [1, 2].map(|host| format!("10.{}.{}.{host}", 80 + i / 250, i % 250))
    }

    fn namespace(&self, i: usize, side: usize) -> String {
        format!("{}{i}{}", self.prefix, ["a", "b"][side])
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for i in 0..self.pairs {
            for side in 0..2 {
                let _ = ip(&["netns", "del", &self.namespace(i, side)]);
            }
        }
    }
}

pub(super) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// Removes the namespaces of runs whose process is gone.
fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name.strip_prefix("srnic-c").and_then(|rest| rest.split('-').next()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// Runs one perftest pair and returns the client's rows.
#[allow(clippy::too_many_arguments)] // a pair's whole description
fn pair(
    build: &Build,
    env: &[(&str, String)],
    place: &Instances,
    i: usize,
    program: &str,
    args: &[&str],
    logs: &Path,
    tag: &str,
) -> Result<Vec<Vec<f64>>, String> {
    let port = (21_000 + (std::process::id() as usize * 13 + i) % 20_000) as u16;
    let mut argv: Vec<String> = std::iter::once(program).chain(args.iter().copied()).map(str::to_string).collect();
    argv.extend(["-p".to_string(), port.to_string()]);
    let mut server = perftest(build, env, place, (i, 0), &argv, logs.join(format!("{tag}_server.log")))?;
    if let Err(e) = wait_for_listener(&mut server.child, port, Duration::from_secs(60)) {
        super::stop_child(&mut server.child);
        return Err(format!("{e}; {} ends:\n{}", server.log.display(), log_tail(&server.log)));
    }
    argv.push(place.addresses(i)[0].clone());
    let client = perftest(build, env, place, (i, 1), &argv, logs.join(format!("{tag}_client.log")))?;
    let server_log = server.log.clone();
    let limit = Duration::from_secs(300);
    let rows = client.finish(limit);
    let served = server.finish(Duration::from_secs(15));
    match (rows, served) {
        (Ok(rows), Ok(_)) => Ok(rows),
        // Each side's story: a client's failure is often the server's.
        (Err(client), Ok(_)) => Err(format!("{client}\n{} ends:\n{}", server_log.display(), log_tail(&server_log))),
        (Ok(_), Err(server)) => Err(server),
        (Err(client), Err(server)) => Err(format!("{client}\n{server}")),
    }
}

/// `exp`'s CSV in `out`, and its logs' directory, emptied.
pub(super) fn output(out: &Path, exp: &str) -> Result<(PathBuf, PathBuf), String> {
    let logs = out.join(format!("{exp}_logs"));
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    Ok((out.join(format!("{exp}_results.csv")), logs))
}

pub(super) fn write_csv(path: &Path, header: &str, rows: &[String]) -> Result<(), String> {
    let mut file = std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    writeln!(file, "{header}").map_err(|e| e.to_string())?;
    for row in rows {
        writeln!(file, "{row}").map_err(|e| e.to_string())?;
    }
    Ok(())
}

const MODES: [Mode; 3] = [Mode::Host, Mode::Daemon, Mode::Forwarding];
const E11_TESTS: [&str; 4] = ["ib_send_bw", "ib_send_lat", "ib_write_bw", "ib_write_lat"];

/// The perftest programs `--tests` names, in E11's order; all without it.
pub(super) fn e11_tests(asked: &[String]) -> Result<Vec<&'static str>, String> {
    if let Some(bad) = asked.iter().find(|t| !E11_TESTS.contains(&t.as_str())) {
        return Err(format!("--tests {bad}: e11 runs {}", E11_TESTS.join(", ")));
    }
    Ok(E11_TESTS.into_iter().filter(|t| asked.is_empty() || asked.iter().any(|a| a == t)).collect())
}

/// `softrnic exp e11`.
pub fn e11(args: &E11Args) -> Result<(), String> {
    let (quick, out) = (args.common.quick, &args.common.out);
    let tests = e11_tests(&args.tests)?;
    let build = Build::with_perftest()?;
    let (csv, logs) = output(out, "e11")?;
    // The host's programs each run their own engine; the daemon's tenants
    // run in containers (one pair per test).
    let host = Instances::Processes;
    let containers = Instances::new(tests.len())?;
    let daemon = Daemon::start(&build, &logs, args.daemon.processors)?;
    // Every size perftest's -a runs, kept from 4 B to 1 MiB; quick: two
    // sizes, few iterations.
    let runs: &[&[&str]] = if quick { &[&["-s", "64"], &["-s", "65536"]] } else { &[&["-a"]] };
    let iterations = if quick { "200" } else { "1000" };
    let mut rows = Vec::new();
    let mut series: Vec<(usize, Series)> = Vec::new();
    for (t, test) in tests.iter().enumerate() {
        let lat = test.ends_with("_lat");
        for mode in MODES {
            let place = if mode == Mode::Host { &host } else { &containers };
            let mut points = Vec::new();
            for (r, sizes) in runs.iter().enumerate() {
                let mut perftest_args: Vec<&str> = sizes.to_vec();
                perftest_args.extend(["-n", iterations]);
                if !lat {
                    perftest_args.push("--report_gbits");
                }
                let tag = format!("{test}_{}_{r}", mode.name());
                eprintln!("e11: {test} {} {} ...", mode.name(), sizes.join(" "));
                let got = pair(&build, &mode.env(&daemon.socket), place, t, test, &perftest_args, &logs, &tag)
                    .map_err(|e| match mode {
                        Mode::Host => e,
                        _ => format!("{e}\n{}", daemon.log_tail()),
                    })?;
                for row in got.iter().filter(|r| (4.0..=1048576.0).contains(&r[0])) {
                    // bw: bytes iters peak avg msg_rate; lat: bytes iters min max typical ...
                    let (value, unit) = if lat { (row[4], "us") } else { (row[3], "gbps") };
                    rows.push(format!("{},{},{test},{},{value},{unit}", mode.name(), place.name(), row[0]));
                    points.push((row[0], value));
                }
            }
            series.push((t, Series { name: mode.name().to_string(), points }));
        }
    }
    drop(daemon);
    drop(containers);
    write_csv(&csv, "mode,instances,test,size,value,unit", &rows)?;
    let panels = e11_panels(&tests, &series);
    let figure = out.join("e11_figure.svg");
    panels::write(&figure, "E11: perftest through softrnicd, on the host, and forwarded", &panels)?;
    print_e11_summary(&tests, &rows);
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// The value of an E11 row (`how,where,test,size,value,unit`) whose
/// first field is `how`.
pub(super) fn e11_value(rows: &[String], how: &str, test: &str, size: f64) -> Option<f64> {
    rows.iter().map(|r| r.split(',').collect::<Vec<_>>()).find_map(|f| {
        (f[0] == how && f[2] == test && f[3].parse::<f64>().ok() == Some(size))
            .then(|| f[4].parse::<f64>().ok())
            .flatten()
    })
}

/// A panel per perftest program: message size against its figure, a
/// series per way of running it (`series`, by the program's index).
pub(super) fn e11_panels(tests: &[&str], series: &[(usize, Series)]) -> Vec<Panel> {
    tests
        .iter()
        .enumerate()
        .map(|(t, test)| Panel {
            x_label: format!("{test}: message size (B)"),
            y_label: if test.ends_with("_lat") { "typical latency (µs)".into() } else { "Gb/s".into() },
            x_log: true,
            series: series.iter().filter(|(i, _)| *i == t).map(|(_, s)| s.clone()).collect(),
        })
        .collect()
}

/// The ratios at 64 B and at 64 KiB and above.
fn print_e11_summary(tests: &[&str], rows: &[String]) {
    let value = |mode: &str, test: &str, size: f64| e11_value(rows, mode, test, size);
    println!("\nE11 ratios (softrnicd against forwarding, and against the host):");
    for test in tests {
        for size in [64.0, 65536.0] {
            if let (Some(d), Some(f), Some(h)) =
                (value("softrnicd", test, size), value("forwarding", test, size), value("host", test, size))
            {
                println!(
                    "  {test:13} {size:>6} B: softrnicd {d:.3}, forwarding {f:.3}, host {h:.3}: {:.2}x forwarding, {:.2}x host",
                    d / f,
                    d / h
                );
            }
        }
    }
}

const E12_HEADER: &str = "mode,instances,pairs,gbps_per_pair,gbps_aggregate,daemon_bytes_per_pair,failed_pairs";

/// `softrnic exp e12`.
pub fn e12(args: &E12Args) -> Result<(), String> {
    let (quick, out) = (args.common.quick, &args.common.out);
    let build = Build::with_perftest()?;
    let (csv, logs) = output(out, "e12")?;
    let counts: Vec<usize> = match (&args.pairs[..], quick) {
        ([], true) => vec![2, 16],
        ([], false) => vec![2, 4, 8, 16, 32, 64, 128],
        (pairs, _) => pairs.iter().map(|&n| n as usize).collect(),
    };
    // perftest measures between its margins: 5 s after its start to 5 s
    // before its end, when every pair has started (128 take about 3 s)
    // and none has finished.
    let (seconds, margin) = if quick { ("2", "0") } else { ("15", "5") };
    let place = Instances::new(counts.iter().copied().max().unwrap_or(2))?;
    let mut rows = Vec::new();
    let mut per_pair: Vec<Series> = Vec::new();
    let mut aggregate: Vec<Series> = Vec::new();
    for mode in [Mode::Daemon, Mode::Forwarding] {
        let daemon = Daemon::start(&build, &logs, args.daemon.processors)?;
        let idle = daemon.rss();
        let (mut pair_points, mut total_points) = (Vec::new(), Vec::new());
        for &n in &counts {
            eprintln!("e12: {n} pairs in {}, {} ...", place.name(), mode.name());
            let env = mode.env(&daemon.socket);
            // A retransmission timeout of 1 s (-u 18): hundreds of
            // processes on two cores keep a responder off a core for longer
            // than perftest's 67 ms times seven retries.
            let argv = |port: usize| -> Vec<String> {
                let port = port.to_string();
                ["ib_write_bw", "-s", "131072", "-D", seconds, "-f", margin, "--report_gbits", "-u", "18", "-p", &port]
                    .map(str::to_string)
                    .to_vec()
            };
            let tag = |i: usize, side: &str| logs.join(format!("{}_{n}_{i}_{side}.log", mode.name()));
            let mut servers = Vec::new();
            for i in 0..n {
                servers.push(perftest(&build, &env, &place, (i, 0), &argv(30_000 + i), tag(i, "server"))?);
            }
            // A server that never listens fails its pair below (its
            // client finds no one), which is counted. One deadline for
            // all: servers that hang must not make the wait theirs times n.
            let deadline = Instant::now() + Duration::from_secs(60 + n as u64);
            for (i, server) in servers.iter_mut().enumerate() {
                let left = deadline.saturating_duration_since(Instant::now());
                if let Err(e) = wait_for_listener(&mut server.child, (30_000 + i) as u16, left) {
                    eprintln!("e12: pair {i}: {e}");
                }
            }
            let mut clients = Vec::new();
            for i in 0..n {
                let mut client = argv(30_000 + i);
                client.push(place.addresses(i)[0].clone());
                clients.push(perftest(&build, &env, &place, (i, 1), &client, tag(i, "client"))?);
            }
            // Every instance connected: the daemon's memory with them.
            std::thread::sleep(Duration::from_millis(500));
            let busy = daemon.rss();
            let limit = Duration::from_secs(120 + n as u64);
            // A pair that fails counts as moving nothing, and is counted.
            let mut rates = Vec::new();
            let mut failed = 0;
            for client in clients {
                match client.finish(limit) {
                    Ok(rows) => rates.push(rows.first().map_or(0.0, |r| r[3])),
                    Err(e) => {
                        eprintln!("e12: {e}");
                        failed += 1;
                        rates.push(0.0);
                    }
                }
            }
            for server in servers {
                let _ = server.finish(Duration::from_secs(30));
            }
            let total: f64 = rates.iter().sum();
            let mean = total / n as f64;
            let memory_per_pair = busy.saturating_sub(idle) / n as u64;
            rows.push(format!("{},{},{n},{mean:.4},{total:.4},{memory_per_pair},{failed}", mode.name(), place.name()));
            pair_points.push((n as f64, mean));
            total_points.push((n as f64, total));
        }
        per_pair.push(Series { name: mode.name().to_string(), points: pair_points });
        aggregate.push(Series { name: mode.name().to_string(), points: total_points });
    }
    drop(place);
    write_csv(&csv, E12_HEADER, &rows)?;
    let figure = out.join("e12_figure.svg");
    let panels = [
        Panel { x_label: "pairs".into(), y_label: "Gb/s per pair (mean)".into(), x_log: true, series: per_pair },
        Panel { x_label: "pairs".into(), y_label: "Gb/s, all pairs".into(), x_log: true, series: aggregate },
    ];
    panels::write(&figure, "E12: ib_write_bw 128 KiB, N pairs through one softrnicd", &panels)?;
    println!("{E12_HEADER}");
    for row in &rows {
        println!("{row}");
    }
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perftest_rows_are_the_lines_of_numbers() {
        let text = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      2000             20.41              20.40  \t\t   0.038919\n---\n";
        assert_eq!(result_rows(text), vec![vec![65536.0, 2000.0, 20.41, 20.40, 0.038919]]);
    }

    #[test]
    fn tests_runs_the_named_programs_in_e11s_order_and_refuses_others() {
        let named = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(e11_tests(&[]).unwrap(), E11_TESTS.to_vec());
        assert_eq!(e11_tests(&named(&["ib_write_bw", "ib_send_bw"])).unwrap(), ["ib_send_bw", "ib_write_bw"]);
        let err = e11_tests(&named(&["ib_read_bw"])).unwrap_err();
        assert!(err.contains("--tests ib_read_bw") && err.contains("ib_write_lat"), "{err}");
    }
}
