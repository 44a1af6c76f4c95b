//! In-network aggregation for real: workers and a parameter server in
//! network namespaces, the lab's switch summing their chunks over lossy
//! links. Needs root, iproute2 and ethtool: without them it skips on a
//! developer's machine and fails under CI (`CI=true`).

use std::process::Command;

mod common;

use common::lab_available;

const SOFTRNIC: &str = env!("CARGO_BIN_EXE_softrnic");

/// Every link loses 2 % of what the switch sends on it (chunks, sums,
/// answers): workers resend, the switch flushes partial sums to the
/// server, the server answers resends again, and every worker still finds
/// every value of every step equal to the exact sum (the worker checks
/// and fails otherwise).
#[test]
fn every_sum_is_exact_through_a_lossy_switch() {
    if !lab_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("softrnic-agg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topology = dir.join("lossy.toml");
    let mut toml =
        String::from("[defaults]\nrate = \"200Mbps\"\nloss = 0.02\n\n[[switch]]\nname = \"s0\"\naggregators = 32\n");
    for host in ["w0", "w1", "w2", "ps"] {
        toml += &format!("\n[[host]]\nname = \"{host}\"\nswitch = \"s0\"\n");
    }
    std::fs::write(&topology, toml).unwrap();
    let worker = |w: u32| {
        format!(
            "w{w}=exec {SOFTRNIC} agg worker --job 7 --worker {w} --workers 3 --addr $ADDR --server $ps --values 8192 --steps 25 --min-rto 2"
        )
    };
    let out = Command::new(SOFTRNIC)
        .arg("lab")
        .arg(&topology)
        .args(["--bg", &format!("ps=exec {SOFTRNIC} agg server --job 7 --workers $w0,$w1,$w2 --addr $ps")])
        .args(["--on", &worker(0), "--on", &worker(1), "--on", &worker(2)])
        .output()
        .expect("run softrnic lab");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let finished: Vec<&str> =
        text.lines().filter(|l| l.contains("25 steps of 8192 values") && l.contains("every sum exact")).collect();
    assert_eq!(finished.len(), 3, "{text}");
    let resent: u64 = finished
        .iter()
        .map(|l| {
            l.split("resent ").nth(1).and_then(|r| r.split(',').next()).and_then(|n| n.parse::<u64>().ok()).unwrap()
        })
        .sum();
    assert!(resent > 0, "2 % loss made workers resend: {text}");
    let server = text.lines().find(|l| l.starts_with("job 7 server:")).expect("the server's totals");
    assert!(server.contains(" 800 chunks"), "25 steps of 32 chunks, each answered once: {server}");
    // Loss alone, no muddle of the protocol's own: no sum the server had
    // to refuse because it overlapped what it held.
    assert!(server.contains(" 0 overlapping"), "{server}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `softrnic exp e10 --quick`: every policy's run in the lab (whose
/// workers check every sum), the simulator's, and the files the seed's
/// users look for.
#[test]
fn the_e10_experiment_writes_its_results() {
    if !lab_available() {
        return;
    }
    if Command::new("iperf3").arg("--version").output().is_err() {
        assert!(!std::env::var("CI").is_ok_and(|v| v == "true"), "CI must install iperf3 (.ci/run)");
        eprintln!("skipped: no iperf3 (apt install iperf3)");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("softrnic-e10-{}", std::process::id()));
    let out = Command::new(SOFTRNIC).args(["exp", "e10", "--quick", "--out"]).arg(&out_dir).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    for policy in ["a2tp", "atp", "off"] {
        assert!(
            text.lines().any(|l| l.starts_with("e10") && l.contains(&format!("{policy}: while both run"))),
            "{text}"
        );
    }
    let csv = std::fs::read_to_string(out_dir.join("result.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("policy,time_s,job,throughput_gbps,occupancy_pct"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let occupancy = |policy: &str, job: &str| -> f64 {
        rows.iter().filter(|r| r[0] == policy && r[2] == job).map(|r| r[4].parse::<f64>().unwrap()).fold(0.0, f64::max)
    };
    for job in ["0", "1"] {
        assert!(occupancy("a2tp", job) > 0.0, "job {job} held aggregators under A2TP");
        assert_eq!(occupancy("off", job), 0.0, "with aggregation off the pool stays empty");
    }
    let sim = std::fs::read_to_string(out_dir.join("aggregation_sim.csv")).unwrap();
    assert!(sim.lines().count() > 10, "{sim}");
    let figure = std::fs::read_to_string(out_dir.join("aggregation_figure.svg")).unwrap();
    assert!(figure.contains("<svg") && figure.contains("straggler"));
    let _ = std::fs::remove_dir_all(&out_dir);
}
