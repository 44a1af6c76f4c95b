//! `softrnic lab` and `softrnic exp incast` for real: hosts in network
//! namespaces, the software switch between them, softrnic engines on the
//! hosts. They need root, iproute2 and ethtool: without them they skip on a
//! developer's machine and fail under CI (`CI=true`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod common;

use common::lab_available;

const SOFTRNIC: &str = env!("CARGO_BIN_EXE_softrnic");

/// The lab's tests take turns. Each runs hosts, a switch and flows whose
/// rates and retry timers it asserts; run side by side on two cores, they
/// starved E3's HPCC and Swift senders into retry exhaustion once in a
/// few CI runs.
fn lab_turn() -> Option<MutexGuard<'static, ()>> {
    static TURN: Mutex<()> = Mutex::new(());
    lab_available().then(|| TURN.lock().unwrap_or_else(|e| e.into_inner()))
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softrnic-lab-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The lab's namespaces that exist now, of the run with process `pid`.
fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("srn-{pid}-");
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn counter(dir: &Path, addr: &str, name: &str) -> u64 {
    let path = dir.join("softrnic").join(format!("{addr}.counters"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {}", path.display()))
}

/// Two senders into one receiver whose link is slower than both together:
/// the switch's queue fills to its ECN thresholds and marks, the receiver's
/// engine sees the CE marks, the queue never holds more than its limit,
/// and every byte of every message arrives intact.
#[test]
fn two_senders_into_a_slower_port_are_marked_bounded_and_verified() {
    let Some(_turn) = lab_turn() else { return };
    let dir = temp_dir("incast");
    let topology = dir.join("two-to-one.toml");
    std::fs::write(
        &topology,
        r#"
[defaults]
rate = "1Gbps"
queue = "200KB"
ecn = { kmin = "20KB", kmax = "100KB", pmax = 0.2 }

[[switch]]
name = "s0"

[[host]]
name = "rx"
switch = "s0"
addresses = 2

[[host]]
name = "tx1"
switch = "s0"

[[host]]
name = "tx2"
switch = "s0"
"#,
    )
    .unwrap();
    let stats = dir.join("queues.csv");
    let server = |addr: &str, port: u16| format!("rx={SOFTRNIC} bench send_bw --server --addr ${addr} -p {port}");
    let client = |host: &str, addr: &str, port: u16| {
        format!("{host}=sleep 0.5; {SOFTRNIC} bench send_bw ${addr} -p {port} -n 150 --verify")
    };
    let out = Command::new(SOFTRNIC)
        .args(["lab", topology.to_str().unwrap(), "--stats", stats.to_str().unwrap()])
        .args(["--bg", &server("rx", 19611), "--bg", &server("rx_1", 19612)])
        .args(["--on", &client("tx1", "rx", 19611), "--on", &client("tx2", "rx_1", 19612)])
        .env("XDG_RUNTIME_DIR", &dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches("every byte checked, all correct").count(), 2, "{stdout}");

    let marked = counter(&dir, "10.77.0.1", "np_ecn_marked_roce_packets")
        + counter(&dir, "10.77.1.1", "np_ecn_marked_roce_packets");
    assert!(marked > 0, "the receiver saw no CE marks\n{stdout}");

    // The queue toward rx: above Kmin at its peak, never above its limit.
    let text = std::fs::read_to_string(&stats).unwrap();
    let (mut peak, mut switch_marked) = (0u64, 0u64);
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[3] == "rx" && f[4] == "1" {
            peak = peak.max(f[6].parse().unwrap());
            switch_marked = switch_marked.max(f[9].parse().unwrap());
        }
    }
    assert!(peak > 20_000 && peak <= 200_000, "queue peak {peak} B");
    assert!(switch_marked >= marked, "the switch marked {switch_marked}, the receiver saw {marked}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lab killed outright leaves its namespaces; the next run removes
/// them and says so. Ctrl-C takes a lab down cleanly.
#[test]
fn a_killed_lab_is_cleaned_up_by_the_next_and_ctrl_c_by_itself() {
    let Some(_turn) = lab_turn() else { return };
    let up = |secs: &str| {
        Command::new(SOFTRNIC)
            .args(["lab", "star:2", "--duration", secs])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let wait_for = |pid: u32, count: usize| {
        let start = Instant::now();
        while namespaces_of(pid).len() != count {
            assert!(start.elapsed() < Duration::from_secs(20), "{:?}", namespaces_of(pid));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut killed = up("60s");
    wait_for(killed.id(), 3);
    std::thread::sleep(Duration::from_millis(300));
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert_eq!(namespaces_of(killed.id()).len(), 3, "a killed run cannot clean up");

    let next = Command::new(SOFTRNIC).args(["lab", "star:2", "--each", "test -n \"$ADDR\""]).output().unwrap();
    let stderr = String::from_utf8_lossy(&next.stderr);
    assert!(next.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("left by run {}", killed.id())), "{stderr}");
    assert!(namespaces_of(killed.id()).is_empty());

    let mut interrupted = up("60s");
    wait_for(interrupted.id(), 3);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signals our own child, which has not been reaped.
    unsafe { libc::kill(interrupted.id() as i32, libc::SIGINT) };
    let status = interrupted.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(namespaces_of(interrupted.id()).is_empty());
}

/// `softrnic exp incast --quick`: its CSV, logs and figure, and the
/// congestion it shows with no congestion control: a full queue.
#[test]
fn the_incast_experiment_writes_its_results() {
    let Some(_turn) = lab_turn() else { return };
    let dir = temp_dir("exp");
    let out =
        Command::new(SOFTRNIC).args(["exp", "incast", "--quick", "--out", dir.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let csv = std::fs::read_to_string(dir.join("incast_results.csv")).unwrap();
    assert!(csv.starts_with("cc,time_s,kind,id,rate_gbps,depth_bytes,peak_bytes,marked,dropped\n"));
    assert!(csv.lines().any(|l| l.starts_with("none,") && l.contains(",flow,h1,")), "{csv}");
    assert!(csv.lines().any(|l| l.contains(",queue,s0:h0,")), "{csv}");
    let svg = std::fs::read_to_string(dir.join("incast_figure.svg")).unwrap();
    assert!(svg.contains("bottleneck queue") && svg.contains("none h2"));
    assert!(dir.join("incast_logs/none_h1_sender.log").exists());
    // With no congestion control the senders overrun the port.
    let report = stdout.lines().find(|l| l.starts_with("incast --cc none")).unwrap();
    let peak: u64 = report.split("queue peak ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(peak > 100, "{report}");

    // With --verbs, unmodified ib_write_bw over the drop-in library (built
    // by scripts/test.sh before the tests; CI installs perftest).
    let lib = Path::new(SOFTRNIC).parent().unwrap().join("../softrnic/lib/libibverbs.so.1");
    let perftest = Command::new("ib_write_bw").arg("--version").output().is_ok();
    if lib.exists() && perftest {
        let verbs = dir.join("verbs");
        let out = Command::new(SOFTRNIC)
            .args(["exp", "incast", "--quick", "--verbs", "--out", verbs.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let log = std::fs::read_to_string(verbs.join("incast_logs/none_h1_sender.log")).unwrap();
        assert!(log.contains("ib_write_bw") && log.contains("BW average[Gb/sec]"), "{log}");
    } else if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "CI must run the incast over ib_write_bw: build the library (scripts/build-libibverbs.sh) and install perftest"
        );
    } else {
        eprintln!("skipped --verbs: needs {} and perftest's ib_write_bw", lib.display());
    }

    let refused = Command::new(SOFTRNIC).args(["exp", "incast", "--cc", "cubic"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("--cc cubic: ") && stderr.contains("dcqcn"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// E3: every algorithm, built in and as a module, in the simulated incast
/// and through the lab's switch; the table and figures written.
#[test]
fn e3_measures_every_algorithm_in_the_simulator_and_the_lab() {
    let Some(_turn) = lab_turn() else { return };
    let dir = temp_dir("e3");
    let out = Command::new(SOFTRNIC).args(["exp", "e3", "--quick", "--out", dir.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let table = std::fs::read_to_string(dir.join("cc_results.csv")).unwrap();
    let rows: Vec<Vec<&str>> = table.lines().skip(1).map(|l| l.split(',').collect()).collect();
    let row = |name: &str| rows.iter().find(|r| r[0] == name).unwrap_or_else(|| panic!("no {name} in\n{table}"));
    let names: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(names, ["none", "dcqcn", "dctcp", "timely", "hpcc", "swift", "dcqcn.wasm", "aimd.wasm"]);
    let number = |r: &[&str], i: usize| r[i].parse::<f64>().unwrap_or_else(|_| panic!("column {i} of {r:?}"));
    // In the simulator (columns 6 to 9): the E3 targets.
    for name in ["dcqcn", "hpcc"] {
        let r = row(name);
        assert!(number(r, 6) >= 0.90 && number(r, 7) >= 0.95, "{r:?}");
    }
    assert!(number(row("hpcc"), 9) < 64.0, "HPCC's p99 queue near empty");
    assert!(number(row("none"), 9) > 4000.0, "without CC the queue fills the buffer");
    // The module is the built-in, event for event.
    assert_eq!(row("dcqcn")[6..10], row("dcqcn.wasm")[6..10]);
    // Size and cost: modules have bytes and a sandboxed cost.
    for name in ["dcqcn.wasm", "aimd.wasm"] {
        assert!(number(row(name), 3) > 1000.0 && number(row(name), 5) > 0.0, "{:?}", row(name));
    }
    // Through the real switch: DCQCN's and HPCC's runs (HPCC's INT on
    // UDP port 4792, stamped by the switch) finished and were measured.
    for name in ["dcqcn", "hpcc"] {
        assert!(number(row(name), 10) > 0.0, "{:?}", row(name));
    }
    let svg = std::fs::read_to_string(dir.join("cc_sim_figure.svg")).unwrap();
    assert!(svg.contains("bottleneck queue") && svg.contains("hpcc"));
    assert!(dir.join("incast_results.csv").exists() && dir.join("cc_sim_series.csv").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two leaves and two spines (four pipelines in one switch process, the
/// links between them in memory): a latency test crosses them, and each
/// host port's capture holds the frames.
#[test]
fn a_leaf_spine_lab_carries_softrnic_and_captures_it() {
    let Some(_turn) = lab_turn() else { return };
    let dir = temp_dir("leaf-spine");
    let pcap = dir.join("pcap");
    let out = Command::new(SOFTRNIC)
        .args(["lab", "leaf-spine:2x2x1", "--pcap", pcap.to_str().unwrap()])
        .args(["--bg", &format!("h0={SOFTRNIC} bench send_lat --server")])
        .args(["--on", &format!("h1=sleep 0.5; {SOFTRNIC} bench send_lat $h0 -n 300")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("t_avg"), "{stdout}");
    // Each leaf's port to a spine is in the table; an uncongested fabric
    // dropped nothing anywhere (the switch's own work loses no frame).
    let spine_ports = stdout.lines().filter(|l| l.starts_with("leaf") && l.contains(" spine")).count();
    assert_eq!(spine_ports, 4, "{stdout}");
    for row in stdout.lines().filter(|l| l.starts_with("leaf") || l.starts_with("spine")) {
        let dropped: u64 = row.split_whitespace().nth(7).unwrap().parse().unwrap();
        assert_eq!(dropped, 0, "{row}");
    }
    assert!(stdout.contains("ring drops 0, truncated frames 0"), "{stdout}");
    for host in ["h0", "h1"] {
        let bytes = std::fs::read(pcap.join(format!("{host}.pcap"))).unwrap();
        assert!(bytes.len() > 24 + 300 * 16, "{host}.pcap holds {} bytes", bytes.len());
        assert_eq!(&bytes[..4], &0xa1b2_c3d4u32.to_ne_bytes(), "a pcap file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
