//! `softrnic run`: unmodified tools that read the kernel's RDMA paths
//! themselves see softrnic0 (infiniband-diags' `ibstat` and `ibstatus`,
//! UCX), and nothing changes outside the program.
//!
//! Needs a mount namespace (root, or user namespaces), infiniband-diags,
//! UCX's tools, and the drop-in library built (scripts/build-libibverbs.sh):
//! without them a developer's machine skips with the reason, CI fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn softrnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrnic"))
}

fn unavailable() -> Option<String> {
    for (tool, package) in
        [("ibstat", "infiniband-diags"), ("ibstatus", "infiniband-diags"), ("ucx_perftest", "ucx-utils")]
    {
        if Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().map_or(true, |o| !o.status.success())
        {
            return Some(format!("needs {tool} (apt-get install {package})"));
        }
    }
    let lib = Path::new(env!("CARGO_BIN_EXE_softrnic")).parent()?.join("../softrnic/lib/libibverbs.so.1");
    if !lib.exists() {
        return Some(format!("needs the drop-in library at {} (scripts/build-libibverbs.sh)", lib.display()));
    }
    let probe = softrnic().args(["run", "--addr", "127.0.0.9", "--", "true"]).output().ok()?;
    (!probe.status.success()).then(|| String::from_utf8_lossy(&probe.stderr).trim().to_string())
}

fn available(test: &str) -> bool {
    match unavailable() {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{test} must run under CI: {reason}"),
        Some(reason) => {
            eprintln!("skipping {test}: {reason}");
            false
        }
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn ibstat_and_ibstatus_see_softrnic0_and_nothing_leaks_out() {
    if !available("ibstat_and_ibstatus_see_softrnic0_and_nothing_leaks_out") {
        return;
    }
    // The runs' process ids: each stages its tree in /tmp/softrnic-run-PID.
    let mut pids = Vec::new();
    let mut run = |args: &[&str]| {
        let child = softrnic().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        pids.push(child.id());
        child.wait_with_output().unwrap()
    };
    let o = run(&["run", "--addr", "127.0.0.9", "--", "ibstat"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for line in [
        "CA 'softrnic0'",
        "Number of ports: 1",
        "Node GUID: 0x027372007f000009",
        "State: Active",
        "Physical state: LinkUp",
        "Link layer: Ethernet",
    ] {
        assert!(out.contains(line), "ibstat lacks {line:?}:\n{out}");
    }
    let o = run(&["run", "--addr", "127.0.0.9", "--", "ibstatus"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for line in ["device 'softrnic0' port 1", "0000:0000:0000:0000:0000:ffff:7f00:0009", "4: ACTIVE", "Ethernet"] {
        assert!(out.contains(line), "ibstatus lacks {line:?}:\n{out}");
    }
    // The GID's type, the uverbs node UCX looks for, the program's address,
    // the entries that were there before (a network interface), and the
    // interface that holds the device's address, where tools that map an
    // RDMA device to its netdev look (rxe's `parent`, a NIC's `device/net`).
    let probe = "cat /sys/class/infiniband/softrnic0/ports/1/gid_attrs/types/0; \
                 test -c /dev/infiniband/uverbs-softrnic0 && echo character device; \
                 echo addr=$SOFTRNIC_ADDR; test -e /sys/class/net/lo && echo lo still there; \
                 cat /sys/class/infiniband/softrnic0/parent; \
                 ls /sys/class/infiniband/softrnic0/device/net; \
                 cat /sys/class/infiniband/softrnic0/device/net/lo/mtu";
    let o = run(&["run", "--addr", "127.0.0.9", "--", "sh", "-c", probe]);
    let mtu = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap();
    assert_eq!(text(&o), format!("RoCE v2\ncharacter device\naddr=127.0.0.9\nlo still there\nlo\nlo\n{mtu}"));
    // Outside, nothing changed and nothing was left by these runs (the
    // other test's runs may be staging theirs right now).
    assert!(!Path::new("/sys/class/infiniband/softrnic0").exists());
    let left: Vec<PathBuf> = pids
        .iter()
        .map(|pid| std::env::temp_dir().join(format!("softrnic-run-{pid}")))
        .filter(|path| path.exists())
        .collect();
    assert!(left.is_empty(), "staging left behind: {left:?}");
    // A bad invocation says what to give.
    let o = softrnic().args(["run"]).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("CMD"), "{}", text(&o));
}

#[test]
fn ucx_runs_over_softrnic_rc_and_ud_verbs() {
    if !available("ucx_runs_over_softrnic_rc_and_ud_verbs") {
        return;
    }
    let o = softrnic().args(["run", "--addr", "127.0.0.9", "--", "ucx_info", "-d"]).output().unwrap();
    let out = text(&o);
    for transport in ["rc_verbs", "ud_verbs"] {
        assert!(out.contains(&format!("Transport: {transport}\n#         Device: softrnic0:1")), "{transport}:\n{out}");
    }
    // ucx_perftest's tag latency between two processes, each on its own
    // softrnic device, over each transport.
    for (tls, port) in [("rc_v,self", "13441"), ("ud_v,self", "13442")] {
        let ucx = |addr: &str, extra: &[&str]| {
            let mut c = softrnic();
            c.args(["run", "--addr", addr, "--", "ucx_perftest", "-p", port])
                .args(extra)
                .env("UCX_TLS", tls)
                .env("UCX_NET_DEVICES", "softrnic0:1");
            c
        };
        let mut server = ucx("127.0.61.1", &[]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let client = ucx("127.0.61.2", &["127.0.0.1", "-t", "tag_lat", "-n", "2000"]).output().unwrap();
        let _ = server.kill();
        let _ = server.wait();
        let out = text(&client);
        assert!(client.status.success(), "UCX_TLS={tls}:\n{out}");
        let final_line = out.lines().find(|l| l.starts_with("Final:")).unwrap_or_else(|| panic!("no result:\n{out}"));
        let iterations: u64 = final_line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(iterations, 2000, "{final_line}");
    }
}

/// The processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
        })
        .collect()
}

/// `softrnic run -- true` a hundred times, with two threads keeping both
/// cores busy so that the program often exits before the counters' helper
/// has run at all: no helper may outlive its program. (Helpers that read
/// their parent's pid after the fork took init's and stayed: 75 of 100
/// under this load.)
#[test]
fn a_program_that_exits_at_once_leaves_no_helper_behind() {
    if !available("a_program_that_exits_at_once_leaves_no_helper_behind") {
        return;
    }
    let needle = "run --addr 127.0.0.94 -- true";
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for _ in 0..100 {
        let o = softrnic().args(["run", "--addr", "127.0.0.94", "--", "true"]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    hogs.into_iter().for_each(|h| h.join().unwrap());
    // A helper asked to die with its program gets its signal at once; give
    // the kernel a moment all the same.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut left = processes_with(needle);
    while !left.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        left = processes_with(needle);
    }
    for pid in &left {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    assert!(left.is_empty(), "{} helpers outlived their programs: {left:?}", left.len());
}
