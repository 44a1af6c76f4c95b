//! The `softrnic` command end to end: every benchmark with data
//! verification, with injected faults, bad input, a peer killed mid-run,
//! and two hosts in network namespaces.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

fn softrnic() -> Command {
    Command::new(env!("CARGO_BIN_EXE_softrnic"))
}

/// Distinct loopback addresses and exchange ports, so tests run in parallel.
static NEXT: AtomicU16 = AtomicU16::new(0);

fn fresh() -> (String, String, u16) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let third = 200 + (n / 100) as u8;
    let fourth = (2 * (n % 100) + 2) as u8;
    (format!("127.0.{third}.{fourth}"), format!("127.0.{third}.{}", fourth + 1), 19000 + n)
}

fn run(args: &[&str]) -> Output {
    softrnic().args(args).output().expect("run softrnic")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A loopback run of `test` with verification, as JSON lines.
fn verified_run(test: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let (client, _, _) = fresh();
    let mut args = vec!["bench", test, "--verify", "--json", "--addr", &client];
    args.extend_from_slice(extra);
    let out = run(&args);
    assert!(out.status.success(), "{test} {extra:?} failed:\n{}", text(&out));
    let rows: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    assert!(!rows.is_empty());
    for row in &rows {
        assert_eq!(row["verified"], true, "{test}: {row}");
    }
    rows
}

#[test]
fn every_bandwidth_test_verifies_its_data() {
    for test in ["write_bw", "send_bw", "read_bw", "atomic_bw"] {
        let size: &[&str] = if test == "atomic_bw" { &[] } else { &["-s", "5000"] };
        let rows = verified_run(test, &[&["-n", "300", "-q", "2"], size].concat());
        let row = &rows[0];
        assert!(row["bw_avg_gbps"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["msg_rate_mpps"].as_f64().unwrap() > 0.0);
        assert_eq!(row["qps"], 2);
        // Each QP's 128 slots out and 128 in, registered (and pinned) at
        // both ends, which this one process holds.
        let message = if test == "atomic_bw" { 8 } else { 5000 };
        let registered = row["registered_bytes"].as_u64().unwrap();
        assert!(registered >= 2 * 2 * 128 * message, "{row}");
        assert!(row["resident_peak_bytes"].as_u64().unwrap() > 2 * registered, "{row}");
        // Between two devices of this host every payload is copied once,
        // by reference; an atomic's 8 bytes travel in the packet.
        let by_reference = row["by_reference"].as_u64().unwrap();
        assert_eq!(by_reference > 0, test != "atomic_bw", "{row}");
    }
}

/// perftest's `-l`: requests posted in lists, by both ends of a
/// bidirectional run (the server takes the list's length from the
/// client's parameters), every byte checked.
#[test]
fn posting_in_lists_verifies_its_data() {
    for test in ["send_bw", "write_bw"] {
        let rows = verified_run(test, &["-s", "64", "-n", "1000", "-l", "16", "-b"]);
        assert_eq!(rows[0]["post_list"], 16, "{}", rows[0]);
    }
}

#[test]
fn every_latency_test_verifies_its_data() {
    for test in ["send_lat", "write_lat", "read_lat", "atomic_lat"] {
        let rows = verified_run(test, &["-n", "200"]);
        let row = &rows[0];
        for field in ["p5_ns", "p25_ns", "p50_ns", "p75_ns", "p95_ns", "p99_ns", "mean_ns", "stddev_ns", "max_ns"] {
            assert!(row[field].as_f64().unwrap() > 0.0, "{test}: {field} in {row}");
        }
        assert!(row["p5_ns"].as_f64() <= row["p95_ns"].as_f64());
    }
}

#[test]
fn sweeps_bidirectional_and_timed_runs() {
    let rows = verified_run("write_bw", &["-a", "-n", "20"]);
    assert_eq!(rows.len(), 23, "2 B to 8 MiB");
    verified_run("send_bw", &["-b", "-n", "500"]);
    let rows = verified_run("write_bw", &["-D", "0.5"]);
    assert!(rows[0]["seconds"].as_f64().unwrap() >= 0.5);
}

#[test]
fn injected_faults_still_deliver_verified_data() {
    let faults = ["--loss", "0.01", "--reorder", "0.01", "--duplicate", "0.01", "--corrupt", "0.01"];
    for test in ["send_bw", "read_bw", "write_lat", "atomic_bw"] {
        let mut args = vec!["-n", "200", "-s", "20000"];
        if test == "atomic_bw" || test == "write_lat" {
            args = vec!["-n", "200"];
        }
        args.extend_from_slice(&faults);
        verified_run(test, &args);
    }
}

#[test]
fn the_table_output_has_perftest_columns_and_the_percentile_block() {
    let (client, _, _) = fresh();
    let out = run(&["bench", "send_lat", "-n", "100", "--addr", &client]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for needle in [
        "t_typical[usec]",
        "99% percentile[usec]",
        "50th percentile (median):",
        "[Mean    =",
        "[Buckets =",
        "SubBuckets     =         2048",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in\n{t}");
    }
    let (client, _, _) = fresh();
    let t = text(&run(&["bench", "write_bw", "-n", "100", "--csv", "--addr", &client]));
    assert!(t.starts_with("test,size,iters,qps,tx_depth,mtu,bw_peak_gbps,bw_avg_gbps,msg_rate_mpps"), "{t}");
}

fn fails_with(args: &[&str], needle: &str) {
    let started = Instant::now();
    let out = run(args);
    let t = text(&out);
    assert!(!out.status.success(), "{args:?} should fail:\n{t}");
    assert!(t.contains(needle), "{args:?}: expected {needle:?} in:\n{t}");
    assert!(started.elapsed() < Duration::from_secs(30), "{args:?} took {:?}", started.elapsed());
}

#[test]
fn the_simulator_runs_seeds_over_every_network_and_replays_one() {
    let out = run(&["sim", "--seeds", "3", "--first", "0", "--threads", "2"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("3 seeds (0..3) over the hostile, switched and one_host networks in") && t.contains(": 0 failed"),
        "{t}"
    );
    let out = run(&["sim", "--seed", "100037", "--network", "switched"]);
    let t = text(&out);
    assert!(out.status.success() && t.contains("switched seed 100037: passed in"), "{t}");
    fails_with(
        &["sim", "--network", "ring"],
        "`ring` is not a simulated network; give hostile, switched or one_host, or all",
    );
    fails_with(&["sim", "--for", "5x"], "give one such as 90s, 10m or 8h");
    fails_with(&["sim", "--seeds", "0"], "--seeds 0 runs nothing");
    fails_with(&["sim", "--seed", "1", "--seeds", "2"], "cannot be used with");
}

#[test]
fn bad_input_gets_a_clear_error_and_no_hang() {
    fails_with(&["bench", "write_bw", "--bogus"], "unexpected argument");
    fails_with(&["bench", "no_such_test"], "invalid value");
    fails_with(&["bench", "write_bw", "-s", "16M"], "larger than the largest");
    fails_with(&["bench", "write_bw", "-m", "1500"], "not an IB MTU");
    fails_with(&["bench", "write_bw", "--loss", "1.5"], "from 0 to 1");
    fails_with(&["bench", "write_bw", "--addr", "192.0.2.1"], "not an address of this machine");
    // A variable the engine reads, with a value it cannot take, is named.
    for (name, value, needle) in [
        ("SOFTRNIC_ECN", "maybe", "SOFTRNIC_ECN=maybe: give ect0, off or ce"),
        ("SOFTRNIC_LOSS", "2", "SOFTRNIC_LOSS=2: 2 is not a probability"),
        ("SOFTRNIC_PROGRESS", "eager", "SOFTRNIC_PROGRESS=eager: `eager` is not a progress mode"),
        ("SOFTRNIC_ENGINE_THREADS", "999", "SOFTRNIC_ENGINE_THREADS=999: give a number of engine threads from 0 to 64"),
    ] {
        let out = softrnic().args(["bench", "write_bw", "--addr", "127.0.0.2"]).env(name, value).output().unwrap();
        let t = text(&out);
        assert!(!out.status.success() && t.contains(needle), "{name}={value}: expected {needle:?} in:\n{t}");
    }
    // Nobody listens there: a clear timeout.
    let (client, server, port) = fresh();
    fails_with(
        &["bench", "write_bw", &server, "--addr", &client, "-p", &port.to_string(), "--timeout", "1"],
        "no softrnic server answered",
    );
}

#[test]
fn a_busy_address_is_reported() {
    let (client, server, port) = fresh();
    let mut holder = server_process(&server, port, &["write_bw"]);
    std::thread::sleep(Duration::from_millis(300));
    fails_with(
        &["bench", "write_bw", "--server", "--addr", &server, "-p", &(port + 1000).to_string()],
        "already in use",
    );
    holder.kill().ok();
    holder.wait().ok();
    let _ = client;
}

fn server_process(addr: &str, port: u16, extra: &[&str]) -> Child {
    let mut args = vec!["bench"];
    args.extend_from_slice(extra);
    let port = port.to_string();
    args.extend_from_slice(&["--server", "--addr", addr, "-p", &port]);
    softrnic().args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start server")
}

/// Two processes, each with its own engine: every payload is copied once,
/// straight out of the other process's region, and every byte arrives.
#[test]
fn two_processes_talk_over_the_exchange() {
    for test in ["send_bw", "write_bw", "read_bw"] {
        let (client, server, port) = fresh();
        let mut srv = server_process(&server, port, &[test]);
        let port = port.to_string();
        let out = run(&["bench", test, &server, "--addr", &client, "-p", &port, "-n", "500", "--verify", "--json"]);
        assert!(out.status.success(), "{test}: {}", text(&out));
        assert!(srv.wait().expect("server exits").success());
        let row: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert!(row["by_reference"].as_u64().unwrap() > 0, "{test}: {row}");
    }
}

/// The server dies while the client WRITEs from its region (the server
/// copies out of it) and while it READs from the server's (the client
/// copies out of the dead process's): the client fails, quickly, and
/// nothing crashes.
#[test]
fn killing_the_server_mid_run_fails_the_client_quickly() {
    for test in ["write_bw", "read_bw"] {
        killing_the_server_mid_run(test);
    }
}

fn killing_the_server_mid_run(test: &str) {
    let (client, server, port) = fresh();
    let mut srv = server_process(&server, port, &[test]);
    let started = Instant::now();
    let cli = softrnic()
        .args(["bench", test, &server, "--addr", &client, "-p", &port.to_string(), "-D", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    srv.kill().unwrap();
    srv.wait().unwrap();
    let out = cli.wait_with_output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{test}: the client should fail:\n{t}");
    assert!(t.contains("retry counter exceeded") || t.contains("stopped answering") || t.contains("closed"), "{t}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

/// Two network namespaces joined by a veth pair, each a host with its own
/// address, removed again when the test ends.
struct Namespaces {
    names: [String; 2],
    /// Each namespace's end of the veth pair.
    devs: [String; 2],
}

impl Namespaces {
    fn create() -> Result<Namespaces, String> {
        let id = std::process::id();
        let names = [format!("srnic-a-{id}"), format!("srnic-b-{id}")];
        let ip = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip").args(args).output().map_err(|e| format!("no `ip` command: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("ip {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        let ns = Namespaces { names: names.clone(), devs: [format!("va{id}"), format!("vb{id}")] };
        ip(&["netns", "add", &names[0]])?;
        ip(&["netns", "add", &names[1]])?;
        let (va, vb) = (format!("va{id}"), format!("vb{id}"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &names[0]])?;
        ip(&["link", "set", &vb, "netns", &names[1]])?;
        for (name, dev, v4, v6) in
            [(&names[0], &va, "10.79.0.1/24", "fd79::1/64"), (&names[1], &vb, "10.79.0.2/24", "fd79::2/64")]
        {
            ip(&["-n", name, "addr", "add", v4, "dev", dev])?;
            // No duplicate address detection: the address is usable at once.
            ip(&["-n", name, "addr", "add", v6, "dev", dev, "nodad"])?;
            ip(&["-n", name, "link", "set", dev, "up"])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    /// Makes the link drop `percent` % of what each end sends: netem, or
    /// where the kernel lacks it, an nftables rule that drops at random.
    /// Returns which.
    fn lose(&self, percent: f64) -> Result<&'static str, String> {
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| format!("{}: {e}", args[0]))?;
            match out.status.success() {
                true => Ok(()),
                false => Err(format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr).trim())),
            }
        };
        let loss = format!("{percent}%");
        let netem = self.names.iter().zip(&self.devs).try_for_each(|(ns, dev)| {
            run(&["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "loss", &loss])
        });
        if netem.is_ok() {
            return Ok("netem");
        }
        let per_ten_thousand = ((percent * 100.0).round() as u32).to_string();
        for (ns, dev) in self.names.iter().zip(&self.devs) {
            let nft = |rest: &[&str]| {
                let mut args = vec!["ip", "netns", "exec", ns.as_str(), "nft"];
                args.extend_from_slice(rest);
                run(&args)
            };
            nft(&["add", "table", "inet", "lossy"])
                .and_then(|()| {
                    nft(&["add", "chain", "inet", "lossy", "out", "{ type filter hook output priority 0; }"])
                })
                .and_then(|()| {
                    nft(&[
                        "add",
                        "rule",
                        "inet",
                        "lossy",
                        "out",
                        "oifname",
                        dev,
                        "numgen",
                        "random",
                        "mod",
                        "10000",
                        "<",
                        &per_ten_thousand,
                        "drop",
                    ])
                })
                .map_err(|e| format!("no netem ({}) and no nftables ({e})", netem.clone().unwrap_err()))?;
        }
        Ok("nftables")
    }

    /// Runs `softrnic bench test` with its server in the first namespace
    /// and its client (with `client_args` after the addresses) in the
    /// second; returns the client's output once the server has exited.
    fn bench(&self, test: &str, (server_addr, client_addr): (&str, &str), client_args: &[&str]) -> Output {
        let server = self
            .exec(0)
            .args(["bench", test, "--server", "--addr", server_addr])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out =
            self.exec(1).args(["bench", test, server_addr, "--addr", client_addr]).args(client_args).output().unwrap();
        let server = server.wait_with_output().unwrap();
        assert!(server.status.success(), "{test} server: {}", String::from_utf8_lossy(&server.stderr));
        out
    }

    fn exec(&self, i: usize) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[i], env!("CARGO_BIN_EXE_softrnic")]);
        c
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// Two namespaced hosts, or why there are none: a skip on a developer's
/// machine, a failure under CI (`CI=true`), which must run every test.
fn namespaces(test: &str) -> Option<Namespaces> {
    let is_root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0")).unwrap_or(false);
    let outcome = if is_root { Namespaces::create() } else { Err("needs root to create network namespaces".into()) };
    match outcome {
        Ok(ns) => Some(ns),
        Err(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{test} must run under CI: {reason}"),
        Err(reason) => {
            eprintln!("SKIPPED {test}: {reason}");
            None
        }
    }
}

#[test]
fn two_hosts_in_network_namespaces() {
    let Some(ns) = namespaces("two_hosts_in_network_namespaces") else {
        return;
    };
    // A veth has a 1500-byte MTU: a 1024-byte path MTU fits, as on RoCE.
    // The last run uses IPv6 addresses as GIDs.
    for (test, server_addr, client_addr) in [
        ("write_bw", "10.79.0.1", "10.79.0.2"),
        ("send_lat", "10.79.0.1", "10.79.0.2"),
        ("read_bw", "10.79.0.1", "10.79.0.2"),
        ("send_bw", "fd79::1", "fd79::2"),
    ] {
        let out = ns.bench(test, (server_addr, client_addr), &["-m", "1024", "-n", "300", "--verify", "--json"]);
        assert!(out.status.success(), "{test} across namespaces:\n{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"verified\":true"), "{}", text(&out));
    }
}

#[test]
fn selective_repeat_delivers_every_byte_across_a_lossy_link() {
    let Some(ns) = namespaces("selective_repeat_delivers_every_byte_across_a_lossy_link") else {
        return;
    };
    // 2 % of what each end sends is lost on the link, in the kernel.
    let how = ns.lose(2.0).unwrap_or_else(|e| panic!("cannot make the link lossy: {e}"));
    eprintln!("loss on the link by {how}");
    // The loss strikes what the kernel is given, and a GSO send of up to
    // 64 KiB is one: 300 messages of 16 KiB were as few as 75 of them,
    // which 2 % loss could miss altogether (a CI run saw no loss). 2000
    // messages make that chance negligible (0.98^500).
    let runs = [("write_bw", &["-n", "2000"][..]), ("send_bw", &["-n", "2000"]), ("read_bw", &["-n", "200"])];
    for (test, extra) in runs {
        let args = [&["-m", "1024", "-s", "16K", "--verify", "--json", "--selective-repeat"][..], extra].concat();
        let out = ns.bench(test, ("10.79.0.1", "10.79.0.2"), &args);
        let t = text(&out);
        assert!(out.status.success(), "{test} across a lossy link:\n{t}");
        let result: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap()).unwrap();
        assert_eq!(result["verified"], true, "{t}");
        if test != "read_bw" {
            // The requester is the client: it repaired what the link lost.
            assert!(result["retransmitted"].as_u64().unwrap() > 0, "2 % loss and nothing sent again? {t}");
        }
    }
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `softrnic devinfo | head -0`: the reader is gone before the first line.
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = softrnic().args(["devinfo", "--addr", "127.0.0.1"]).stdout(writer).output().expect("run softrnic");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "ended by SIGPIPE, as a C tool is");
}

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = run(&["--version"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let rest =
        t.trim().strip_prefix(&format!("softrnic {} (", env!("CARGO_PKG_VERSION"))).unwrap_or_else(|| panic!("{t}"));
    let commit = rest.split([',', ')']).next().unwrap();
    assert!(commit == "unknown commit" || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())), "{t}");
}

/// `--account` counts what the datapath really did (and the time it
/// took). Over UDP a 64-byte
/// round trip (both ends in this process) sends and receives at least its
/// request and its response, each copied out of and into a region and run
/// through the ICRC at both ends; a 64 KiB WRITE crosses the kernel whole.
/// Over shared memory nothing goes through a socket but wake-ups.
#[test]
fn the_account_counts_what_the_datapath_did() {
    let account = |test: &str, size: &str, datapath: &str| {
        let rows = verified_run(test, &["-s", size, "-n", "400", "--account", "--datapath", datapath]);
        let account = rows[0]["account"].clone();
        assert_eq!(account["ends"], "both ends", "{account}");
        let cost = |name: &str| account["costs"][name].as_f64().unwrap_or_else(|| panic!("{name} in {account}"));
        (account.clone(), cost("datagrams_sent"), cost("datagrams_received"), cost("bytes_copied"), cost("icrc_bytes"))
    };
    let (udp, sent, received, copied, icrc) = account("send_lat", "64", "udp");
    assert_eq!(udp["per"], "round trip");
    assert!(sent >= 2.0 && received >= 2.0, "{udp}");
    assert!(udp["costs"]["send_calls"].as_f64().unwrap() >= 1.0, "{udp}");
    // --account times the calls and the passes too.
    assert!(udp["costs"]["send_ns"].as_f64().unwrap() > 0.0, "{udp}");
    assert!(udp["costs"]["transmit_pass_ns"].as_f64().unwrap() >= udp["costs"]["send_ns"].as_f64().unwrap(), "{udp}");
    assert!(copied >= 2.0 * 2.0 * 64.0, "request and response, out and in: {udp}");
    assert!(icrc >= 2.0 * 2.0 * 64.0, "computed and checked, both ways: {udp}");
    let (bw, _, _, _, _) = account("write_bw", "65536", "udp");
    assert!(bw["costs"]["bytes_to_kernel"].as_f64().unwrap() >= 65536.0, "{bw}");
    let (shm, sent, received, copied, _) = account("send_lat", "64", "shm");
    assert_eq!((sent, received), (0.0, 0.0), "the ring, not the socket: {shm}");
    assert!(copied >= 2.0 * 2.0 * 64.0, "{shm}");
}
