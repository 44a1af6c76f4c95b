//! E13, applications: real jobs over softrnic against the same jobs over
//! kernel TCP, on two hosts (two network namespaces joined by a veth with
//! jumbo frames, a process of each job on an address of its own, eight a
//! host).
//!
//! - **Graph 500** (`examples/mpi/graph500.c`): the specification's BFS
//!   and SSSP with every result validated, as 16 MPI ranks; over softrnic
//!   with Open MPI's `pml ucx` on UCX's `rc_verbs` (no shared memory, no
//!   TCP: every message between ranks crosses softrnic), against Open
//!   MPI's own TCP transport (`pml ob1`, `btl tcp,self`). mpirun starts
//!   the other host's ranks through a launcher that enters its namespace,
//!   as ssh would log in to it. The figure of merit: the harmonic mean of
//!   TEPS.
//! - **A shuffle** (`examples/shuffle/shuffle.c`): GroupBy and SortBy over
//!   2 KB key-value pairs, 8 mappers and 8 reducers (four of each a host),
//!   the shuffle as RDMA WRITEs over rdma_cm connections through
//!   softrnic's `librdmacm.so.1`, against the same job over TCP. The
//!   figure of merit: job completion time, every reducer's output checked.
//!
//! The programs are C, built here with mpicc and cc, and run unmodified:
//! the same sources run over a real RDMA NIC.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;

use super::daemon::{self, ip};
use super::figure::Series;
use super::hosts::Build;
use super::namespace::{exec_in, kill_and_remove, remove_leftovers};
use super::panels::{self, Panel};
use super::roles::which;
use super::{Common, Runs, median_by};

#[derive(Args, Debug, Clone)]
pub struct ApplicationsArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub runs: Runs,
    /// Graph 500 scales: 2^SCALE vertices, 16 edges each (default 10,12,
    /// about ten minutes here; 8 with --quick). 0 skips Graph 500.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..=30))]
    pub scale: Vec<u32>,
    /// Search keys at each scale (the specification's 64; 4 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub roots: Option<u32>,
    /// Key-value pairs the shuffle moves (default 65536,131072,262144;
    /// 16384 with --quick). 0 skips the shuffle.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(0..=1 << 24))]
    pub pairs: Vec<u64>,
    /// Processes on each of the two hosts: Graph 500's ranks, and the
    /// shuffle's mappers and reducers, half each (the seed's 8: 16 ranks,
    /// 8 mappers, 8 reducers).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=32))]
    pub per_host: u32,
}

/// How long one job may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(1800);

/// The transports each job runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Softrnic,
    Tcp,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::Softrnic, Transport::Tcp];

    fn name(self) -> &'static str {
        match self {
            Transport::Softrnic => "softrnic",
            Transport::Tcp => "tcp",
        }
    }
}

/// GroupBy or SortBy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    GroupBy,
    SortBy,
}

impl Operation {
    const ALL: [Operation; 2] = [Operation::GroupBy, Operation::SortBy];

    fn name(self) -> &'static str {
        match self {
            Operation::GroupBy => "groupby",
            Operation::SortBy => "sortby",
        }
    }
}

/// Two hosts: network namespaces `srnic-e13-<pid>a` and `...b` joined by
/// a veth, each with `per_host` addresses (one per process, as a device
/// serves its own address); removed, with whatever runs in them, when
/// dropped.
struct TwoHosts {
    names: [String; 2],
    per_host: usize,
}

const PREFIX: &str = "srnic-e13-";
const SUBNET: &str = "10.89.0.0/24";

impl TwoHosts {
    fn create(per_host: usize) -> Result<TwoHosts, String> {
        remove_leftovers(PREFIX, "e13");
        let pid = std::process::id();
        let hosts = TwoHosts { names: [format!("{PREFIX}{pid}a"), format!("{PREFIX}{pid}b")], per_host };
        let veth = [format!("e13-{}a", pid % 100_000), format!("e13-{}b", pid % 100_000)];
        for name in &hosts.names {
            ip(&["netns", "add", name])?;
        }
        // Jumbo frames, as a RoCE fabric is set up: a 4096 B path MTU's
        // packets whole, not in IP fragments.
        ip(&["link", "add", &veth[0], "mtu", "9000", "type", "veth", "peer", "name", &veth[1], "mtu", "9000"])?;
        for (side, (ns, veth)) in hosts.names.iter().zip(&veth).enumerate() {
            ip(&["link", "set", veth, "netns", ns])?;
            for i in 0..per_host {
                ip(&["-n", ns, "addr", "add", &format!("{}/24", hosts.addr(side, i)), "dev", veth])?;
            }
            ip(&["-n", ns, "link", "set", veth, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// The address of process `i` on host `side`.
    fn addr(&self, side: usize, i: usize) -> String {
        format!("10.89.0.{}", 1 + 100 * side + i)
    }

    fn addrs(&self, side: usize) -> Vec<String> {
        (0..self.per_host).map(|i| self.addr(side, i)).collect()
    }

    /// `argv` in host `side`'s namespace, dying with the runner, its
    /// output into `log`.
    fn spawn(&self, side: usize, argv: &[String], env: &[(&str, String)], log: &Path) -> Result<Child, String> {
        let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let (program, args) = argv.split_first().ok_or("nothing to run")?;
        let mut command = exec_in(&self.names[side], program);
        command.args(args).envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        command.stdin(Stdio::null()).stdout(file.try_clone().map_err(|e| e.to_string())?).stderr(file);
        command.spawn().map_err(|e| format!("cannot start {}: {e}", argv.join(" ")))
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for name in &self.names {
            kill_and_remove(name);
        }
    }
}

/// The two programs, built from the sources softrnic carries (so a moved
/// build still has them), and the scripts that place MPI's ranks.
struct Programs {
    graph500: PathBuf,
    shuffle: PathBuf,
    dir: PathBuf,
}

impl Programs {
    fn build(dir: &Path) -> Result<Programs, String> {
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok::<_, String>(path)
        };
        let graph500_c = write("graph500.c", include_str!("../../../../examples/mpi/graph500.c"))?;
        let shuffle_c = write("shuffle.c", include_str!("../../../../examples/shuffle/shuffle.c"))?;
        let programs =
            Programs { graph500: dir.join("graph500"), shuffle: dir.join("shuffle"), dir: dir.to_path_buf() };
        let compile = |compiler: &str, out: &Path, source: &Path, libs: &[&str]| {
            let result = Command::new(compiler).arg("-O2").arg("-o").arg(out).arg(source).args(libs).output();
            match result {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "{compiler} could not build {}:\n{}",
                    source.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => Err(format!("cannot run {compiler}: {e}")),
            }
        };
        compile("mpicc", &programs.graph500, &graph500_c, &["-lm"])?;
        compile("cc", &programs.shuffle, &shuffle_c, &["-lrdmacm", "-libverbs", "-lpthread"])?;
        Ok(programs)
    }

    /// Writes an executable script.
    fn script(&self, name: &str, text: &str) -> Result<PathBuf, String> {
        let path = self.dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }
}

/// What the packages this experiment needs lack, as one line.
fn missing_tools() -> Option<String> {
    let mut missing = Vec::new();
    for (program, package) in [("mpicc", "libopenmpi-dev"), ("mpirun", "openmpi-bin"), ("cc", "gcc")] {
        if which(program).is_none() {
            missing.push(package);
        }
    }
    if !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        missing.push("librdmacm-dev");
    }
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        missing.push("libibverbs-dev");
    }
    (!missing.is_empty()).then(|| format!("apt-get install {}", missing.join(" ")))
}

/// One Graph 500 run's figures.
#[derive(Debug, Clone, Copy)]
struct Teps {
    bfs: f64,
    sssp: f64,
    bfs_seconds: f64,
    sssp_seconds: f64,
}

/// The value after `key` on the line of `text` that starts with it.
fn field(text: &str, key: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].trim_start_matches([' ', '!']).trim().parse().ok()
}

fn parse_graph500(text: &str) -> Option<Teps> {
    Some(Teps {
        bfs: field(text, "bfs  harmonic_mean_TEPS:")?,
        sssp: field(text, "sssp harmonic_mean_TEPS:")?,
        bfs_seconds: field(text, "bfs  mean_time:")?,
        sssp_seconds: field(text, "sssp mean_time:")?,
    })
}

/// One Graph 500 run of 2 x `per_host` ranks over `transport`.
fn graph500(
    hosts: &TwoHosts,
    programs: &Programs,
    build: &Build,
    (transport, scale, roots): (Transport, u32, u32),
    log: &Path,
) -> Result<Teps, String> {
    let softrnic = build.bin.join("softrnic");
    // mpirun's launcher (its plm_rsh_agent, in ssh's place): HOST
    // COMMAND..., run in HOST's namespace, with the host's addresses for
    // its ranks; over softrnic under `softrnic run`, which gives UCX the
    // device's kernel paths.
    let enter = match transport {
        Transport::Softrnic => format!("{} run --addr \"$host\" -- ", softrnic.display()),
        Transport::Tcp => String::new(),
    };
    let agent = programs.script(
        &format!("launch-{}", transport.name()),
        &format!(
            "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n  {}) ns={}; addrs=\"{}\";;\n  *) ns={}; addrs=\"{}\";;\nesac\n\
             exec ip netns exec \"$ns\" env E13_ADDRS=\"$addrs\" {enter}sh -c \"$*\"\n",
            hosts.addr(1, 0),
            hosts.names[1],
            hosts.addrs(1).join(" "),
            hosts.names[0],
            hosts.addrs(0).join(" "),
        ),
    )?;
    // Each rank takes its host's address at its local rank: a device
    // serves its own address.
    let rank = programs.script(
        "rank-address",
        "#!/bin/sh\nset -- $E13_ADDRS -- \"$@\"\nshift \"$OMPI_COMM_WORLD_LOCAL_RANK\"\nexport SOFTRNIC_ADDR=$1\n\
         while [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n",
    )?;
    let per_host = hosts.per_host;
    let mut argv: Vec<String> = Vec::new();
    if transport == Transport::Softrnic {
        argv.extend([softrnic.display().to_string(), "run".into(), "--addr".into(), hosts.addr(0, 0), "--".into()]);
    }
    argv.extend(
        [
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            &(2 * per_host).to_string(),
            "--host",
            &format!("{}:{per_host},{}:{per_host}", hosts.addr(0, 0), hosts.addr(1, 0)),
            "--mca",
            "plm_rsh_agent",
            &agent.display().to_string(),
            // Sixteen ranks share this machine's cores: one waiting for a
            // message yields its core.
            "--mca",
            "mpi_yield_when_idle",
            "1",
            // orted's copy of mpirun's hardware topology crashed it now
            // and then in namespaces (as in E10); one machine needs none.
            "--mca",
            "rtc",
            "^hwloc",
            "--mca",
            "oob_tcp_if_include",
            SUBNET,
        ]
        .map(String::from),
    );
    let transport_flags: &[&str] = match transport {
        Transport::Softrnic => &[
            "--mca",
            "pml",
            "ucx",
            "--mca",
            "osc",
            "ucx",
            "-x",
            "UCX_TLS=rc_v,self",
            "-x",
            "UCX_NET_DEVICES=softrnic0:1",
            "-x",
            "LD_LIBRARY_PATH",
        ],
        Transport::Tcp => &["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", SUBNET],
    };
    argv.extend(transport_flags.iter().map(|s| s.to_string()));
    argv.extend([rank.display().to_string(), programs.graph500.display().to_string()]);
    argv.extend(["-s", &scale.to_string(), "-n", &roots.to_string()].map(String::from));
    let env = [("E13_ADDRS", hosts.addrs(0).join(" "))];
    let mut child = hosts.spawn(0, &argv, &env, log)?;
    let text = daemon::finish(&mut child, log, LIMIT)?;
    if !text.contains("validation:                     passed") {
        return Err(format!("Graph 500 did not validate; see {}", log.display()));
    }
    parse_graph500(&text).ok_or_else(|| format!("no TEPS in {}", log.display()))
}

/// One shuffle's figures, seconds.
#[derive(Debug, Clone, Copy)]
struct Shuffled {
    job: f64,
    shuffle: f64,
}

/// The microseconds after `key` on a line of `text`.
fn stamp(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// The job's times from its processes' stamps: from the first mapper's
/// start to the last reducer's end, and from the first byte shipped to
/// the last reducer's input in place.
fn job_times(mappers: &[String], reducers: &[String]) -> Option<Shuffled> {
    let first = |texts: &[String], key| texts.iter().map(|t| stamp(t, key)).collect::<Option<Vec<_>>>();
    let start = *first(mappers, "start_us ")?.iter().min()?;
    let shuffle_start = *first(mappers, "shuffle_start_us ")?.iter().min()?;
    let end = *first(reducers, "end_us ")?.iter().max()?;
    let data_in = *first(reducers, "data_in_us ")?.iter().max()?;
    let seconds = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1e6;
    Some(Shuffled { job: seconds(start, end), shuffle: seconds(shuffle_start, data_in) })
}

/// One run of the shuffle: the reducers first, listening, then the
/// mappers; every reducer must pass its check.
fn shuffle(
    hosts: &TwoHosts,
    programs: &Programs,
    build: &Build,
    (transport, op, pairs): (Transport, Operation, u64),
    logs: &Path,
    tag: &str,
) -> Result<Shuffled, String> {
    let half = hosts.per_host / 2;
    let (mappers, reducers) = (2 * half, 2 * half);
    // Process k of each kind runs on host k / half; reducers take a
    // host's first addresses, mappers the rest.
    let place = |k: usize, reducer: bool| (k / half, hosts.addr(k / half, k % half + if reducer { 0 } else { half }));
    let port = 7000 + (std::process::id() % 1000) as u16;
    let listen: Vec<String> = (0..reducers).map(|r| format!("{}:{port}", place(r, true).1)).collect();
    let env_for = |addr: &str| match transport {
        Transport::Softrnic => {
            vec![("LD_LIBRARY_PATH", build.lib.display().to_string()), ("SOFTRNIC_ADDR", addr.to_string())]
        }
        Transport::Tcp => Vec::new(),
    };
    let common = |role: &str, id: usize| {
        let mut argv = vec![programs.shuffle.display().to_string(), role.to_string()];
        argv.extend(["-i", &id.to_string(), "-m", &mappers.to_string(), "-p", &pairs.to_string()].map(String::from));
        argv.extend(
            ["-o", op.name(), "-t", if transport == Transport::Softrnic { "rdma" } else { "tcp" }].map(String::from),
        );
        argv
    };
    let mut running: Vec<(Child, PathBuf)> = Vec::new();
    let result = (|| {
        for (r, addr) in listen.iter().enumerate() {
            let (side, host_addr) = place(r, true);
            let mut argv = common("reducer", r);
            argv.extend(["-n".to_string(), reducers.to_string(), "-l".to_string(), addr.clone()]);
            let log = logs.join(format!("{tag}_reducer{r}.log"));
            running.push((hosts.spawn(side, &argv, &env_for(&host_addr), &log)?, log));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for (child, log) in &mut running {
            while !std::fs::read_to_string(&*log).unwrap_or_default().contains("listening on") {
                if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                    return Err(format!("a reducer did not listen; see {}", log.display()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let mut mapper_children = Vec::new();
        for m in 0..mappers {
            let (side, addr) = place(m, false);
            let mut argv = common("mapper", m);
            argv.extend(["-r".to_string(), listen.join(",")]);
            let log = logs.join(format!("{tag}_mapper{m}.log"));
            mapper_children.push((hosts.spawn(side, &argv, &env_for(&addr), &log)?, log));
        }
        let mut mapper_texts = Vec::new();
        for (child, log) in &mut mapper_children {
            mapper_texts.push(daemon::finish(child, log, LIMIT)?);
        }
        let mut reducer_texts = Vec::new();
        for (child, log) in &mut running {
            let text = daemon::finish(child, log, LIMIT)?;
            if !text.contains("checked: every pair once and intact") {
                return Err(format!("a reducer's output failed its check; see {}", log.display()));
            }
            reducer_texts.push(text);
        }
        job_times(&mapper_texts, &reducer_texts).ok_or_else(|| format!("no times in the logs of {tag}"))
    })();
    for (child, _) in &mut running {
        super::stop_child(child);
    }
    result
}

/// `softrnic exp e13`.
pub fn run(args: &ApplicationsArgs) -> Result<(), String> {
    if let Some(reason) = softrnic_lab::namespaces::unavailable() {
        return Err(format!("E13 runs its two hosts in network namespaces: {reason}"));
    }
    if let Some(install) = missing_tools() {
        return Err(format!("E13 builds its programs with Open MPI, a C compiler and rdma-core's headers: {install}"));
    }
    let (quick, runs, out) = (args.common.quick, args.runs.runs, &args.common.out);
    let build = Build::here()?;
    if !build.lib.join("librdmacm.so.1").exists() {
        return Err(format!(
            "softrnic's drop-in libraries are not in {}: scripts/build-libibverbs.sh builds them",
            build.lib.display()
        ));
    }
    let scales = match (args.scale.is_empty(), quick) {
        (false, _) => args.scale.iter().copied().filter(|&s| s > 0).collect(),
        (true, true) => vec![8],
        (true, false) => vec![10, 12],
    };
    let roots = args.roots.unwrap_or(if quick { 4 } else { 64 });
    let sizes: Vec<u64> = match (args.pairs.is_empty(), quick) {
        (false, _) => args.pairs.iter().copied().filter(|&p| p > 0).collect(),
        (true, true) => vec![16_384],
        (true, false) => vec![65_536, 131_072, 262_144],
    };
    let (csv, logs) = daemon::output(out, "e13")?;
    let programs = Programs::build(&logs)?;
    let per_host = args.per_host as usize;
    let hosts = TwoHosts::create(per_host)?;
    println!(
        "e13: two hosts (namespaces joined by a veth), {per_host} processes each; Graph 500 at scale(s) {scales:?} \
         with {roots} search keys, a shuffle of {sizes:?} pairs of 2 KB; {runs} run(s) a point"
    );
    let mut rows = Vec::new();
    let (mut teps_series, mut jct_series) = (Vec::new(), Vec::new());
    for &scale in &scales {
        let mut at = Vec::new();
        for transport in Transport::ALL {
            let measured = (0..runs)
                .map(|r| {
                    let log = logs.join(format!("graph500_s{scale}_{}_run{r}.log", transport.name()));
                    graph500(&hosts, &programs, &build, (transport, scale, roots), &log)
                })
                .collect::<Result<Vec<_>, String>>()?;
            let t = median_by(measured, |t| t.bfs).expect("at least one run");
            println!(
                "e13: Graph 500, scale {scale}, {} ranks over {}: bfs harmonic_mean_TEPS {:.4e}, sssp harmonic_mean_TEPS \
                 {:.4e} (every tree and distance array validated)",
                2 * per_host,
                transport.name(),
                t.bfs,
                t.sssp
            );
            for (kernel, teps, seconds) in [("bfs", t.bfs, t.bfs_seconds), ("sssp", t.sssp, t.sssp_seconds)] {
                rows.push(format!(
                    "graph500-{kernel},{},{scale},{},{teps:.6e},{seconds:.6},",
                    transport.name(),
                    2 * per_host
                ));
                plot(
                    &mut teps_series,
                    &format!("{} {}", kernel.to_uppercase(), transport.name()),
                    f64::from(scale),
                    teps / 1e6,
                );
            }
            at.push(t);
        }
        println!(
            "e13: Graph 500, scale {scale}: softrnic at {:.2}x TCP's BFS TEPS, {:.2}x its SSSP TEPS",
            at[0].bfs / at[1].bfs,
            at[0].sssp / at[1].sssp
        );
    }
    for &pairs in &sizes {
        for op in Operation::ALL {
            let mut at = Vec::new();
            for transport in Transport::ALL {
                let measured = (0..runs)
                    .map(|r| {
                        let tag = format!("shuffle_{}_{pairs}_{}_run{r}", op.name(), transport.name());
                        shuffle(&hosts, &programs, &build, (transport, op, pairs), &logs, &tag)
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let s = median_by(measured, |s| s.job).expect("at least one run");
                println!(
                    "e13: {} of {pairs} pairs, {} mappers and {} reducers over {}: job {:.3} s, shuffle {:.3} s \
                     (every reducer's output checked)",
                    op.name(),
                    per_host,
                    per_host,
                    transport.name(),
                    s.job,
                    s.shuffle
                );
                rows.push(format!(
                    "{},{},{pairs},{},,{:.6},{:.6}",
                    op.name(),
                    transport.name(),
                    2 * per_host,
                    s.job,
                    s.shuffle
                ));
                plot(&mut jct_series, &format!("{} {}", op.name(), transport.name()), pairs as f64, s.job);
                at.push(s);
            }
            println!(
                "e13: {} of {pairs} pairs: softrnic's job in {:.2}x TCP's time (shuffle {:.2}x)",
                op.name(),
                at[0].job / at[1].job,
                at[0].shuffle / at[1].shuffle
            );
        }
    }
    drop(hosts);
    daemon::write_csv(&csv, "app,transport,size,processes,teps,seconds,shuffle_seconds", &rows)?;
    let figure = out.join("e13_figure.svg");
    let mut panels = Vec::new();
    if !teps_series.is_empty() {
        panels.push(Panel {
            x_label: "Graph 500 SCALE (2^SCALE vertices)".into(),
            y_label: "harmonic mean of TEPS (millions)".into(),
            x_log: false,
            series: teps_series,
        });
    }
    if !jct_series.is_empty() {
        panels.push(Panel {
            x_label: "key-value pairs of 2 KB".into(),
            y_label: "job completion time (s)".into(),
            x_log: true,
            series: jct_series,
        });
    }
    panels::write(&figure, "E13: Graph 500 and a shuffle job, over softrnic and over TCP, on two hosts", &panels)?;
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// Adds `(x, y)` to the series named `name`.
fn plot(series: &mut Vec<Series>, name: &str, x: f64, y: f64) {
    match series.iter_mut().find(|s| s.name == name) {
        Some(s) => s.points.push((x, y)),
        None => series.push(Series { name: name.to_string(), points: vec![(x, y)] }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph500_output_reads_back() {
        let text = "SCALE:                          10\nbfs  mean_time:                 0.00096\n\
                    bfs  harmonic_mean_TEPS:     !  1.69996e+07\nsssp mean_time:                 0.0031\n\
                    sssp harmonic_mean_TEPS:     !  5.16996e+06\n";
        let t = parse_graph500(text).unwrap();
        assert_eq!((t.bfs, t.sssp, t.bfs_seconds, t.sssp_seconds), (1.69996e7, 5.16996e6, 0.00096, 0.0031));
        assert!(parse_graph500("SCALE: 10\n").is_none());
    }

    #[test]
    fn the_job_runs_from_the_first_start_to_the_last_end() {
        let mappers = ["start_us 100\nshuffle_start_us 300\nend_us 900\n", "start_us 50\nshuffle_start_us 400\n"]
            .map(String::from);
        let reducers = ["data_in_us 1000\nend_us 1500\n", "data_in_us 1200\nend_us 1400\n"].map(String::from);
        let s = job_times(&mappers, &reducers).unwrap();
        assert_eq!((s.job, s.shuffle), (1450e-6, 900e-6));
        // A reducer that never said when its input was in: no figure.
        assert!(job_times(&mappers, &["end_us 1500\n".to_string()]).is_none());
    }
}
