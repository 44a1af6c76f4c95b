//! `softrnic exp`: the quick sweeps write the CSV, logs and figure the
//! issue promises, with the columns and rows each experiment has.

use std::path::{Path, PathBuf};
use std::process::Command;

fn softrnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrnic"))
}

/// An experiment's output directory, removed when the test ends (kept
/// when it fails, to be looked at).
struct OutDir(PathBuf);

impl std::ops::Deref for OutDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("the experiment's output is kept in {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn out_dir(name: &str) -> OutDir {
    let dir = std::env::temp_dir().join(format!("softrnic-exp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    OutDir(dir)
}

/// The CSV's header and rows.
fn csv(path: &Path) -> (String, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().map(str::to_string);
    (lines.next().expect("a header"), lines.collect())
}

/// The CSV's rows as fields, read by the csv crate (a config may hold a
/// comma, and is then quoted).
fn records(path: &Path) -> Vec<Vec<String>> {
    let mut reader = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader.records().map(|r| r.expect("a well-formed row").iter().map(str::to_string).collect()).collect()
}

fn assert_figure_parses(path: &Path, series: &[&str]) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("a well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    for name in series {
        assert!(texts.iter().any(|t| t.contains(name)), "{name} is not in {}", path.display());
    }
}

fn run(args: &[&str]) -> std::process::Output {
    softrnic().args(args).output().expect("run softrnic")
}

#[test]
fn e9_quick_compares_send_write_and_tcp() {
    let out = out_dir("e9");
    let o = run(&["exp", "careful", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e9_results.csv"));
    assert_eq!(header, "config,size,mbps,status,error");
    // softrnic's two operations over its two wires, and TCP: five sizes
    // each, every one measured.
    assert_eq!(rows.len(), 25, "{rows:?}");
    for config in ["send-udp", "write-udp", "send-shm", "write-shm", "tcp"] {
        let sizes: Vec<&str> = rows
            .iter()
            .filter(|r| r.starts_with(&format!("{config},")))
            .map(|r| r.split(',').nth(1).unwrap())
            .collect();
        assert_eq!(sizes, ["1", "64", "1024", "16384", "65536"], "{config}");
    }
    assert!(rows.iter().all(|r| r.ends_with(",ok,") && r.split(',').nth(2).unwrap().parse::<f64>().unwrap() > 0.0));
    // A log per role per point.
    let logs = std::fs::read_dir(out.join("e9_logs")).unwrap().count();
    assert_eq!(logs, 10);
    assert_figure_parses(&out.join("e9_figure.svg"), &["send-udp", "write-shm", "tcp", "sockets on 1 GbE"]);
    // --plot draws the figure again from the CSV, measuring nothing.
    std::fs::remove_file(out.join("e9_figure.svg")).unwrap();
    let o = run(&["exp", "e9", "--plot", "--out", out.to_str().unwrap(), "--compare", "tcp,send-shm"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_figure_parses(&out.join("e9_figure.svg"), &["tcp", "send-shm"]);
    assert_eq!(std::fs::read_dir(out.join("e9_logs")).unwrap().count(), 10, "no role ran");
    // --compare keeps the configurations named; --runs 2 measures each
    // point twice (a log per role per run) and keeps one row per size.
    let o = run(&["exp", "e9", "--quick", "--out", out.to_str().unwrap(), "--compare", "tcp", "--runs", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (_, rows) = csv(&out.join("e9_results.csv"));
    assert!(rows.len() == 5 && rows.iter().all(|r| r.starts_with("tcp,")), "{rows:?}");
    assert_eq!(std::fs::read_dir(out.join("e9_logs")).unwrap().count(), 4, "the last sweep's logs only");
    assert_figure_parses(&out.join("e9_figure.svg"), &["medians of 2 runs"]);
}

/// E1 and E2 run rdma_bench over the drop-in library: a skip without it
/// on a developer's machine, a failure under CI (scripts/test.sh builds it).
fn library_built(test: &str) -> bool {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_softrnic"));
    let dir = exe.parent().unwrap();
    let missing =
        [dir.join("rdma_bench"), dir.join("../softrnic/lib/libibverbs.so.1")].into_iter().find(|p| !p.exists());
    match missing {
        None => true,
        Some(p) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test} must run under CI: {} is missing", p.display())
        }
        Some(p) => {
            eprintln!(
                "SKIPPED {test}: {} is missing (scripts/build-libibverbs.sh, cargo build -p softrnic-rdma-bench)",
                p.display()
            );
            false
        }
    }
}

#[test]
fn e2_quick_measures_each_size_and_qp_count_with_verified_data() {
    if !library_built("e2_quick_measures_each_size_and_qp_count_with_verified_data") {
        return;
    }
    let out = out_dir("e2");
    let o = run(&["exp", "e2", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e2_results.csv"));
    assert_eq!(header, "config,pack_size,qps,engine_threads,gbps,status,error");
    let records = records(&out.join("e2_results.csv"));
    let shape: Vec<(&str, &str, &str)> =
        records.iter().map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str())).collect();
    let expected = [
        ("qps=1,engines=1", "64", "1"),
        ("qps=1,engines=1", "1024", "1"),
        ("qps=2,engines=1", "64", "2"),
        ("qps=2,engines=1", "1024", "2"),
    ];
    assert_eq!(shape, expected, "{rows:?}");
    assert!(records.iter().all(|r| r[5] == "ok" && r[4].parse::<f64>().unwrap() > 0.0), "{rows:?}");
    assert_figure_parses(&out.join("e2_figure.svg"), &["qps=1,engines=1", "qps=2,engines=1", "Soft-RoCE"]);
}

#[test]
fn e1_quick_puts_softrnic_beside_raw_udp() {
    if !library_built("e1_quick_puts_softrnic_beside_raw_udp") {
        return;
    }
    let out = out_dir("e1");
    let o = run(&["exp", "e1", "--quick", "--out", out.to_str().unwrap()]);
    let (header, rows) = csv(&out.join("e1_results.csv"));
    assert_eq!(header, "config,size,percentile,latency_ns,mean_ns,status,error");
    let percentiles: Vec<&str> = rows.iter().take(10).map(|r| r.split(',').nth(2).unwrap()).collect();
    assert_eq!(percentiles, ["5", "25", "50", "75", "95", "5", "25", "50", "75", "95"]);
    // The floor: raw UDP (sockperf's three percentiles), or its absence
    // named in its row; CI installs sockperf and must measure it.
    let raw: Vec<&String> = rows.iter().filter(|r| r.starts_with("raw-udp,")).collect();
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if raw.len() == 1 && !ci {
        assert!(raw[0].contains("failed,raw UDP needs sockperf"), "{raw:?}");
        assert!(!o.status.success());
    } else {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(raw.len(), 3, "{rows:?}");
    }
    // Percentiles rise.
    let udp: Vec<u64> = rows[..5].iter().map(|r| r.split(',').nth(3).unwrap().parse().unwrap()).collect();
    assert!(udp.windows(2).all(|w| w[0] <= w[1]), "{udp:?}");
    assert_figure_parses(&out.join("e1_figure.svg"), &["softrnic-udp", "softrnic-shm", "Soft-RoCE, mean"]);
}

#[test]
fn bad_experiment_input_gets_one_clear_line() {
    let o = run(&["exp", "e42"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("unrecognized subcommand 'e42'"), "{err}");
    let o = run(&["exp", "e9", "--compare", "udp", "--out", out_dir("bad").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--compare udp: e9 has the configurations send-udp, write-udp, send-shm, write-shm, tcp"),
        "{err}"
    );
    let o = run(&["exp", "e9", "--quick", "--out", "/proc/softrnic-results"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("cannot write results into /proc/softrnic-results") && err.contains("--out"), "{err}");
    let empty = out_dir("empty");
    let o = run(&["exp", "e2", "--plot", "--out", empty.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("e2_results.csv") && err.contains("run `softrnic exp e2` first"), "{err}");
    // A flag the experiment does not honour is refused, never ignored.
    for (args, flag) in [
        (&["exp", "e4", "--plot"][..], "--plot"),
        (&["exp", "e5", "--processors", "2"], "--processors"),
        (&["exp", "e5", "--tests", "ib_send_bw"], "--tests"),
        (&["exp", "e11", "--runs", "3"], "--runs"),
        (&["exp", "e12", "--runs", "3"], "--runs"),
        (&["exp", "incast", "--runs", "3"], "--runs"),
        (&["exp", "e3", "--runs", "3"], "--runs"),
        (&["exp", "fct", "--pairs", "2"], "--pairs"),
        (&["exp", "e7", "--pairs", "2"], "--pairs"),
        (&["exp", "e13", "--threads", "2"], "--threads"),
    ] {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        let usage = format!("Usage: softrnic exp {}", args[1]);
        assert!(!o.status.success() && err.contains(&format!("unexpected argument '{flag}'")), "{args:?}: {err}");
        assert!(err.contains(&usage), "{args:?}: {err}");
    }
    // e10 takes medians of its benchmark only, and its lab's flags not there.
    let o = run(&["exp", "e10", "--runs", "3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--bench"), "{err}");
    let o = run(&["exp", "e10", "--bench", "--policy", "atp"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot be used with"), "{err}");
    let o = run(&["exp", "e12", "--processors", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--processors") && err.contains("1..=64"), "{err}");
    let o = run(&["exp", "e13", "--per-host", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--per-host") && err.contains("2..=32"), "{err}");
    let o = run(&["exp", "e11", "--tests", "ib_read_bw"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--tests ib_read_bw: e11 runs ib_send_bw, ib_send_lat"), "{err}");
    // The listing and the help both name every experiment of the table.
    let listing = run(&["exp"]);
    let help = run(&["exp", "--help"]);
    for text in [String::from_utf8_lossy(&listing.stdout), String::from_utf8_lossy(&help.stdout)] {
        for id in ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e9", "e10", "e11", "e12", "e13", "incast", "fct"] {
            assert!(text.lines().any(|l| l.split_whitespace().next() == Some(id)), "{id} in {text}");
        }
    }
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let tasks =
        std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    tasks
        .iter()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn roles_die_with_a_killed_runner() {
    let out = out_dir("killed");
    let mut runner = softrnic().args(["exp", "e9", "--out", out.to_str().unwrap()]).spawn().expect("run softrnic");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let roles = loop {
        let roles = children(runner.id());
        if roles.len() == 2 || std::time::Instant::now() > deadline {
            break roles;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(roles.len(), 2, "the first point's server and client");
    runner.kill().unwrap();
    runner.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while roles.iter().any(|&p| alive(p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(roles.iter().all(|&p| !alive(p)), "roles outlived the runner: {roles:?}");
}

/// `exp fct --quick`: the fat tree in the simulator, a row per finished
/// flow, slowdowns per size bucket that never beat the ideal, the figure,
/// and how fast the simulator went.
#[test]
fn fct_quick_writes_flows_buckets_and_the_figure() {
    let dir = out_dir("fct");
    let out =
        run(&["exp", "fct", "--quick", "--workload", "hadoop", "--cc", "none,hpcc", "--out", dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("fat tree: 320 servers at 10 Gb/s, 56 switches"), "{stdout}");
    for cc in ["none", "hpcc"] {
        let finished =
            stdout.lines().find(|l| l.starts_with(&format!("{cc}: hadoop load 0.3:"))).expect("a report line");
        assert!(finished.contains("datagrams per wall second"), "{finished}");
    }
    let (header, flows) = csv(&dir.join("fct_results.csv"));
    assert_eq!(header, "cc,workload,load,src,dst,size_bytes,start_us,fct_us,ideal_us,slowdown");
    assert!(flows.len() > 100, "{} flows", flows.len());
    for row in records(&dir.join("fct_results.csv")) {
        let slowdown: f64 = row[9].parse().unwrap();
        assert!(slowdown >= 1.0, "{row:?}");
    }
    let buckets = records(&dir.join("fct_summary.csv"));
    assert!(buckets.len() >= 5);
    for b in &buckets {
        let [p50, p95, p99] = [5, 6, 7].map(|i| b[i].parse::<f64>().unwrap());
        assert!(1.0 <= p50 && p50 <= p95 && p95 <= p99, "{b:?}");
    }
    assert_figure_parses(&dir.join("fct_figure.svg"), &["none hadoop load 0.3", "hpcc hadoop load 0.3"]);
    let refused = run(&["exp", "fct", "--load", "2"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--load 2: give the offered load as a fraction"));
}

/// perftest (Debian's package) plays E11's and E12's instances: present
/// here, or the test says why it does not run; under CI it must run.
fn perftest_here(test: &str) -> bool {
    nothing_missing(test, &[(!on_path("ib_write_bw")).then_some("perftest")])
}

/// Containers (namespaces) take root; without it the instances are
/// processes of this host, and the CSV says which.
fn instances() -> &'static str {
    if rustix::process::geteuid().is_root() { "containers" } else { "processes" }
}

#[test]
fn e11_quick_runs_perftest_through_the_daemon_on_the_host_and_forwarded() {
    if !perftest_here("e11") {
        return;
    }
    let out = out_dir("e11");
    let o = run(&["exp", "e11", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e11_results.csv"));
    assert_eq!(header, "mode,instances,test,size,value,unit");
    for (mode, place) in [("host", "processes"), ("softrnicd", instances()), ("forwarding", instances())] {
        for test in ["ib_send_bw", "ib_send_lat", "ib_write_bw", "ib_write_lat"] {
            let sizes: Vec<&str> = rows
                .iter()
                .filter(|r| r.starts_with(&format!("{mode},{place},{test},")))
                .map(|r| r.split(',').nth(3).unwrap())
                .collect();
            assert_eq!(sizes, ["64", "65536"], "{mode} {test}: {rows:?}");
        }
    }
    assert!(rows.iter().all(|r| r.split(',').nth(4).unwrap().parse::<f64>().unwrap() > 0.0), "{rows:?}");
    assert_figure_parses(&out.join("e11_figure.svg"), &["host", "softrnicd", "forwarding"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("x forwarding"), "the ratios: {text}");
    assert_no_namespaces_left();
}

/// A program on PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).exists()))
}

/// Whether `test` has all it needs (each of `missing` that is `Some`
/// names a package, or root): if not, it says why it does not run; under
/// CI it must.
fn nothing_missing(test: &str, missing: &[Option<&str>]) -> bool {
    let missing: Vec<&str> = missing.iter().flatten().copied().collect();
    if !missing.is_empty() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{test}: CI must run it (.ci/run installs {missing:?})");
        eprintln!("{test}: skipped: it needs {}", missing.join(", "));
    }
    missing.is_empty()
}

/// The network namespaces whose names start with `prefix`.
fn namespaces_named(prefix: &str) -> Vec<String> {
    let names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.into_iter().filter(|n| n.starts_with(prefix)).collect()
}

/// QEMU, a kernel in /boot, busybox and cpio, and root for the guests'
/// taps: present, or the test says why it does not run; under CI it must.
fn guests_here(test: &str) -> bool {
    let kernel = std::fs::read_dir("/boot")
        .is_ok_and(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")));
    nothing_missing(
        test,
        &[
            (!rustix::process::geteuid().is_root()).then_some("root"),
            (!on_path("qemu-system-x86_64")).then_some("qemu-system-x86"),
            (!kernel).then_some("linux-image-cloud-amd64"),
            (!on_path("busybox")).then_some("busybox-static"),
            (!on_path("cpio")).then_some("cpio"),
        ],
    )
}

/// E11 in QEMU guests under TCG: every perftest program guest to host and
/// guest to guest beside host to host, and rdma_bench's server verifying
/// every byte at each placement (the runner fails otherwise); nothing
/// left behind (the namespace, its taps, the guests).
#[test]
fn e11_vm_quick_runs_perftest_in_guests() {
    if !perftest_here("e11 --vm") || !guests_here("e11 --vm") {
        return;
    }
    let out = out_dir("e11-vm");
    let o = run(&["exp", "e11", "--vm", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e11_vm_results.csv"));
    assert_eq!(header, "placement,accel,test,size,value,unit");
    for placement in ["host-host", "guest-host", "guest-guest"] {
        let tests: Vec<&str> = rows
            .iter()
            .filter(|r| r.starts_with(&format!("{placement},tcg,")))
            .map(|r| r.split(',').nth(2).unwrap())
            .collect();
        assert_eq!(tests, ["ib_send_bw", "ib_send_lat", "ib_write_bw", "ib_write_lat", "rdma_bench"], "{rows:?}");
        assert!(rows.contains(&format!("{placement},tcg,rdma_bench,4096,400,verified")), "{rows:?}");
    }
    assert!(rows.iter().all(|r| r.split(',').nth(4).unwrap().parse::<f64>().unwrap() > 0.0), "{rows:?}");
    assert_figure_parses(&out.join("e11_vm_figure.svg"), &["host-host", "guest-host", "guest-guest"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("not ratios"), "no ratio from TCG: {text}");
    assert_eq!(namespaces_named("srnic-vm"), Vec::<String>::new(), "the guests' namespace is removed");
}

/// Root (the two hosts are namespaces), Open MPI, a C compiler and
/// rdma-core's headers: present, or the test says why it does not run;
/// under CI it must.
fn applications_here(test: &str) -> bool {
    let here = nothing_missing(
        test,
        &[
            (!rustix::process::geteuid().is_root()).then_some("root"),
            (!on_path("mpicc")).then_some("libopenmpi-dev"),
            (!on_path("mpirun")).then_some("openmpi-bin"),
            (!Path::new("/usr/include/rdma/rdma_cma.h").exists()).then_some("librdmacm-dev"),
        ],
    );
    here && library_built(test)
}

/// E13's quick run: Graph 500 over 16 MPI ranks on two hosts, over
/// softrnic and over TCP, every search validated (the runner fails
/// otherwise); GroupBy and SortBy with 8 mappers and 8 reducers, every
/// reducer's output checked; the two namespaces removed.
#[test]
fn e13_quick_runs_graph500_and_the_shuffle_beside_tcp() {
    if !applications_here("e13") {
        return;
    }
    let out = out_dir("e13");
    let o = run(&["exp", "applications", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e13_results.csv"));
    assert_eq!(header, "app,transport,size,processes,teps,seconds,shuffle_seconds");
    let keys: Vec<String> = rows.iter().map(|r| r.split(',').take(4).collect::<Vec<_>>().join(",")).collect();
    let mut expected = Vec::new();
    for transport in ["softrnic", "tcp"] {
        expected.extend(["bfs", "sssp"].map(|k| format!("graph500-{k},{transport},8,16")));
    }
    for op in ["groupby", "sortby"] {
        expected.extend(["softrnic", "tcp"].map(|t| format!("{op},{t},16384,16")));
    }
    assert_eq!(keys, expected);
    for row in &rows {
        let figures: Vec<f64> = row.split(',').skip(4).filter(|f| !f.is_empty()).map(|f| f.parse().unwrap()).collect();
        assert!(figures.len() == 2 && figures.iter().all(|&f| f > 0.0), "{row}");
    }
    assert_figure_parses(&out.join("e13_figure.svg"), &["BFS softrnic", "SSSP tcp", "groupby softrnic", "sortby tcp"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("x TCP's BFS TEPS") && text.contains("x TCP's time"), "the ratios: {text}");
    assert_eq!(namespaces_named("srnic-e13-"), Vec::<String>::new(), "the hosts are removed");
}

#[test]
fn e12_quick_runs_sixteen_pairs_at_once() {
    if !perftest_here("e12") {
        return;
    }
    let out = out_dir("e12");
    let o = run(&["exp", "scalability", "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (header, rows) = csv(&out.join("e12_results.csv"));
    assert_eq!(header, "mode,instances,pairs,gbps_per_pair,gbps_aggregate,daemon_bytes_per_pair,failed_pairs");
    let keys: Vec<String> = rows.iter().map(|r| r.split(',').take(3).collect::<Vec<_>>().join(",")).collect();
    let place = instances();
    assert_eq!(
        keys,
        [
            format!("softrnicd,{place},2"),
            format!("softrnicd,{place},16"),
            format!("forwarding,{place},2"),
            format!("forwarding,{place},16")
        ]
    );
    for row in &rows {
        let f: Vec<f64> = row.split(',').skip(3).map(|x| x.parse().unwrap()).collect();
        assert!(f[0] > 0.0 && f[1] >= f[0] && f[3] == 0.0, "every pair moved data: {row}");
    }
    assert_figure_parses(&out.join("e12_figure.svg"), &["softrnicd", "forwarding"]);
    assert_no_namespaces_left();
}

/// The runner removed the containers it made: no namespace of a runner
/// that has exited is left.
fn assert_no_namespaces_left() {
    let out = std::process::Command::new("ip").args(["netns", "list"]).output();
    let list = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string()).unwrap_or_default();
    let orphan = |line: &str| {
        let pid = line.trim_start_matches("srnic-c").split('-').next().unwrap_or("");
        !Path::new(&format!("/proc/{pid}")).exists()
    };
    assert!(!list.lines().any(|l| l.starts_with("srnic-c") && orphan(l)), "namespaces left behind: {list}");
}

/// Runs an offloaded-stack experiment's quick sweep; its CSV's rows as
/// fields, and what it printed.
fn offload_quick(exp: &str, header: &str) -> Option<(Vec<Vec<String>>, String)> {
    if !library_built(exp) {
        return None;
    }
    let out = out_dir(exp);
    let o = run(&["exp", exp, "--quick", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv_path = out.join(format!("{exp}_results.csv"));
    assert_eq!(csv(&csv_path).0, header);
    let rows = records(&csv_path);
    let figure = out.join(format!("{exp}_figure.svg"));
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_figure_parses(&figure, &names);
    assert!(rows.iter().all(|r| r[3].parse::<f64>().unwrap() > 0.0), "every point moved data: {rows:?}");
    Some((rows, String::from_utf8_lossy(&o.stdout).into_owned()))
}

#[test]
fn e4_quick_runs_each_transmit_design_and_counts_its_copies() {
    let header = "design,payload,threads,gbps,copied_bytes_per_byte,staging_peak_bytes";
    let Some((rows, printed)) = offload_quick("e4", header) else { return };
    let keys: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    let designs = ["engine-copy", "bulk-copy", "header-only"];
    let expected: Vec<(&str, &str)> = designs.iter().flat_map(|d| [(*d, "64"), (*d, "8192")]).collect();
    assert_eq!(keys, expected);
    for r in &rows {
        // The copying designs copy every payload byte once, from staging
        // slots of their own; header-only copies nothing.
        let copies = r[0] != "header-only";
        assert_eq!(r[4], if copies { "1.000" } else { "0.000" }, "{r:?}");
        assert_eq!(r[5] != "0", copies, "{r:?}");
    }
    assert!(printed.contains("  thread [1], duration ["), "the seed's lines: {printed}");
    assert!(printed.contains("] Gbps\n  Total: "), "{printed}");
}

#[test]
fn e5_quick_runs_each_receive_design_with_eight_threads() {
    let header = "design,payload,connections,gbps,copied_bytes_per_byte,staging_peak_mib";
    let Some((rows, printed)) = offload_quick("e5", header) else { return };
    let keys: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str())).collect();
    let designs = ["per-connection", "in-cache", "direct"];
    let expected: Vec<_> = designs.iter().flat_map(|d| [(*d, "512", "8"), (*d, "8192", "8")]).collect();
    assert_eq!(keys, expected);
    for r in &rows {
        let copies = r[0] != "direct";
        assert_eq!(r[4], if copies { "1.000" } else { "0.000" }, "{r:?}");
    }
    // The in-cache pool is 1024 buffers of 8448 B, whatever the traffic.
    assert!(rows.iter().filter(|r| r[0] == "in-cache").all(|r| r[5] == "8.3" || r[5] == "8.2"), "{rows:?}");
    assert!(printed.contains("]s, recv speed ["), "the seed's lines: {printed}");
}

/// E7: each design at 1 and 2 client threads, every point's corrupt
/// block refused (the runner fails otherwise), and the offloaded designs'
/// CRCs computed by softrnicd (the runner reads its count).
#[test]
fn e7_quick_runs_each_storage_design_beside_tcp() {
    let header = "design,threads,mops,gbps,server_work_us_per_block,server_cpu_us_per_block,daemon_cpu_us_per_block,\
                  client_cpu_us_per_block";
    let Some((rows, printed)) = offload_quick("e7", header) else { return };
    let keys: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    let designs = ["cpu", "crc", "crc-copy", "tcp"];
    let expected: Vec<(&str, &str)> = ["1", "2"].iter().flat_map(|n| designs.map(|d| (d, *n))).collect();
    assert_eq!(keys, expected);
    assert!(rows.iter().all(|r| r[4].parse::<f64>().unwrap() > 0.0), "the server's work measured: {rows:?}");
    assert_eq!(printed.matches("  Total Speed: ").count(), 8, "the seed's lines: {printed}");
    assert!(printed.contains("crc-copy at 2 thread(s): "), "{printed}");
}

#[test]
fn e6_quick_puts_the_offloaded_stack_beside_rdma_snap_and_tcp() {
    let Some((rows, printed)) = offload_quick("e6", "stack,connections,payload,gbps,copied_bytes_per_byte") else {
        return;
    };
    let keys: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect();
    let stacks = ["offloaded", "rdma", "snap", "tcp"];
    let expected: Vec<(&str, &str)> = stacks.iter().flat_map(|s| [(*s, "1"), (*s, "2")]).collect();
    assert_eq!(keys, expected);
    assert!(rows.iter().all(|r| (r[0] == "offloaded") != r[4].is_empty()), "copies counted by softrnicd: {rows:?}");
    assert_eq!(printed.matches("Total bandwidth: ").count(), 8, "{printed}");
}
