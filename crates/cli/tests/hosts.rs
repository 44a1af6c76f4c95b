//! `softrnic exp --hosts`: roles on other hosts over SSH, for real. The
//! test builds a small lab: three network namespaces (the runner's and
//! two hosts') on one bridge, Debian's sshd in each host with a key the
//! test generates, and sweeps whose roles run on those hosts. The lab is
//! removed when the test ends, and a crashed run's lab by the next run.
//!
//! It needs root (namespaces), iproute2 and openssh-server: without them
//! it skips on a developer's machine and fails under CI.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PREFIX: &str = "srnic-ssh-";
const SUBNET: &str = "10.233.0";

/// Why the lab cannot be built here, if it cannot.
fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to create network namespaces".into());
    }
    for (path, package) in [("/usr/sbin/sshd", "openssh-server"), ("/usr/bin/ssh", "openssh-client")] {
        if !Path::new(path).exists() {
            return Some(format!("needs {path} (apt-get install {package})"));
        }
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("needs iproute2's ip".into());
    }
    None
}

fn sh(program: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("{program}: {e}"))?;
    match out.status.success() {
        true => Ok(out),
        false => Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// Namespaces `ctl` (the runner, on the bridge), `a` (the server's host)
/// and `b` (the client's), each host with its sshd.
struct Lab {
    /// Names this lab among the test's (they run in parallel).
    tag: &'static str,
    dir: PathBuf,
    namespaces: Vec<String>,
    sshds: Vec<Child>,
}

impl Lab {
    fn ns(&self, which: &str) -> String {
        format!("{PREFIX}{}-{}-{which}", std::process::id(), self.tag)
    }

    fn create(tag: &'static str) -> Result<Lab, String> {
        remove_crashed_labs();
        let dir = std::env::temp_dir().join(format!("softrnic-hosts-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let mut lab = Lab { tag, dir, namespaces: Vec::new(), sshds: Vec::new() };
        for which in ["ctl", "a", "b"] {
            let name = lab.ns(which);
            sh("ip", &["netns", "add", &name])?;
            lab.namespaces.push(name);
        }
        let (ctl, a, b) = (lab.ns("ctl"), lab.ns("a"), lab.ns("b"));
        sh("ip", &["-n", &ctl, "link", "add", "br0", "type", "bridge"])?;
        sh("ip", &["-n", &ctl, "addr", "add", &format!("{SUBNET}.1/24"), "dev", "br0"])?;
        for ns in [&ctl, &a, &b] {
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        sh("ip", &["-n", &ctl, "link", "set", "br0", "up"])?;
        for (host, octet) in [(&a, 2), (&b, 3)] {
            let port = format!("to-{octet}");
            sh("ip", &["-n", &ctl, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", host])?;
            sh("ip", &["-n", &ctl, "link", "set", &port, "master", "br0", "up"])?;
            sh("ip", &["-n", host, "addr", "add", &format!("{SUBNET}.{octet}/24"), "dev", "eth0"])?;
            sh("ip", &["-n", host, "link", "set", "eth0", "up"])?;
        }
        // Keys: the hosts' and the runner's.
        let key = |name: &str| lab.dir.join(name).to_string_lossy().to_string();
        sh("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-f", &key("host_key")])?;
        sh("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-f", &key("id")])?;
        std::fs::copy(lab.dir.join("id.pub"), lab.dir.join("authorized_keys")).map_err(|e| e.to_string())?;
        // sshd's privilege separation directory, which only the service's
        // start creates.
        std::fs::create_dir_all("/run/sshd").map_err(|e| e.to_string())?;
        for (host, octet) in [(a.clone(), 2), (b.clone(), 3)] {
            let config = lab.dir.join(format!("sshd_{octet}.conf"));
            let text = format!(
                "ListenAddress {SUBNET}.{octet}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
                key("host_key"),
                key("authorized_keys")
            );
            std::fs::write(&config, text).map_err(|e| e.to_string())?;
            let log = std::fs::File::create(lab.dir.join(format!("sshd_{octet}.log"))).map_err(|e| e.to_string())?;
            let mut command = Command::new("ip");
            command.args(["netns", "exec", &host, "/usr/sbin/sshd", "-D", "-e", "-f"]).arg(&config);
            // SAFETY: prctl between fork and exec is async-signal-safe and
            // touches only the child: sshd dies with the test, even a
            // killed one.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                })
            };
            let sshd = command.stdin(Stdio::null()).stderr(log).spawn().map_err(|e| format!("sshd: {e}"))?;
            lab.sshds.push(sshd);
        }
        lab.wait_for_sshd()?;
        Ok(lab)
    }

    fn wait_for_sshd(&self) -> Result<(), String> {
        let start = Instant::now();
        for octet in [2, 3] {
            let probe = format!("exec 3<>/dev/tcp/{SUBNET}.{octet}/22");
            while Command::new("ip")
                .args(["netns", "exec", &self.ns("ctl"), "bash", "-c", &probe])
                .output()
                .is_ok_and(|o| !o.status.success())
            {
                if start.elapsed() > Duration::from_secs(10) {
                    let log = std::fs::read_to_string(self.dir.join(format!("sshd_{octet}.log"))).unwrap_or_default();
                    return Err(format!("sshd on {SUBNET}.{octet} did not listen: {log}"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// An inventory placing the server on `a` and the client on `b`;
    /// `extra` goes into the server's table.
    fn inventory(&self, server: &str, extra: &str) -> PathBuf {
        let common = format!(
            "user = \"root\"\nkey = \"{}\"\noptions = [\"UserKnownHostsFile={}\"]\n",
            self.dir.join("id").display(),
            self.dir.join("known_hosts").display()
        );
        let text =
            format!("[server]\naddress = \"{server}\"\n{common}{extra}\n[client]\naddress = \"{SUBNET}.3\"\n{common}");
        let path = self.dir.join(format!("hosts-{}.toml", self.dir.read_dir().map_or(0, |d| d.count())));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `softrnic ARGS` in the runner's namespace.
    fn softrnic(&self, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns("ctl"), env!("CARGO_BIN_EXE_softrnic")]).args(args);
        command
    }

    /// The processes in a host's namespace other than its sshd (the
    /// listener; a session's sshd ends with its session).
    fn strays(&self, which: &str) -> Vec<String> {
        let out = sh("ip", &["netns", "pids", &self.ns(which)]).unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok())
            .map(|cmdline| cmdline.replace('\0', " ").trim().to_string())
            .filter(|cmdline| !cmdline.starts_with("/usr/sbin/sshd") && !cmdline.starts_with("sshd"))
            .collect()
    }
}

impl Lab {
    /// Nothing but sshd runs on the hosts, within the stop ladder's time
    /// (SIGINT, SIGTERM, SIGKILL, 2 s each).
    fn assert_nothing_left(&self, when: &str) {
        let start = Instant::now();
        while !(self.strays("a").is_empty() && self.strays("b").is_empty()) && start.elapsed() < Duration::from_secs(8)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!((self.strays("a"), self.strays("b")), (vec![], vec![]), "left running {when}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for sshd in &mut self.sshds {
            let _ = sshd.kill();
            let _ = sshd.wait();
        }
        for name in &self.namespaces {
            let _ = sh("ip", &["netns", "del", name]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A lab whose test was killed before its Drop: its namespaces named by a
/// pid that is gone.
fn remove_crashed_labs() {
    let Ok(out) = sh("ip", &["netns", "list"]) else { return };
    for name in String::from_utf8_lossy(&out.stdout).split_whitespace().filter(|n| n.starts_with(PREFIX)) {
        let pid = name[PREFIX.len()..].split('-').next().unwrap_or("");
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh("ip", &["netns", "del", name]);
        }
    }
}

fn lab_or_skip(test: &str, tag: &'static str) -> Option<Lab> {
    if let Some(reason) = unavailable() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test} must run under CI: {reason}");
        }
        eprintln!("skipping {test}: {reason}");
        return None;
    }
    Some(Lab::create(tag).unwrap_or_else(|e| panic!("cannot build the SSH lab: {e}")))
}

fn records(path: &Path) -> Vec<Vec<String>> {
    let mut reader = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader.records().map(|r| r.unwrap().iter().map(str::to_string).collect()).collect()
}

/// The sweep succeeded; if not, its output and every role's log say why.
fn assert_ran(out: &Output, logs: &Path) {
    if !out.status.success() {
        let mut text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        for log in std::fs::read_dir(logs).into_iter().flatten().flatten() {
            let body = std::fs::read_to_string(log.path()).unwrap_or_default();
            text += &format!("\n--- {}\n{body}", log.path().display());
        }
        panic!("{text}");
    }
}

#[test]
fn roles_run_on_hosts_over_ssh_and_leave_nothing_behind() {
    let Some(lab) = lab_or_skip("roles_run_on_hosts_over_ssh_and_leave_nothing_behind", "sweep") else { return };
    let hosts = lab.inventory(&format!("{SUBNET}.2"), "");
    let hosts = hosts.to_str().unwrap();
    let out_dir = lab.dir.join("results");
    let out = out_dir.to_str().unwrap();

    // E9: the careful server on host a, its client on host b, over
    // softrnic's UDP wire and over TCP. The server binds an address only
    // host a has, so a row that measured ran there.
    let mut o = lab.softrnic(&["exp", "e9", "--quick", "--compare", "send-udp,tcp", "--hosts", hosts, "--out", out]);
    assert_ran(&o.output().unwrap(), &out_dir.join("e9_logs"));
    let rows = records(&out_dir.join("e9_results.csv"));
    assert_eq!(rows.len(), 10, "{rows:?}");
    assert!(rows.iter().all(|r| r[3] == "ok" && r[2].parse::<f64>().unwrap() > 0.0), "{rows:?}");
    let server_log = std::fs::read_dir(out_dir.join("e9_logs"))
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with("_server.log"))
        .expect("a server log");
    let first = std::fs::read_to_string(server_log.path()).unwrap();
    assert!(first.starts_with(&format!("$ [root@{SUBNET}.2:22] ")), "{first}");

    // E1: rdma_bench both ends over the drop-in library, and sockperf.
    let mut o =
        lab.softrnic(&["exp", "e1", "--quick", "--compare", "softrnic-udp,raw-udp", "--hosts", hosts, "--out", out]);
    assert_ran(&o.output().unwrap(), &out_dir.join("e1_logs"));
    let rows = records(&out_dir.join("e1_results.csv"));
    assert!(rows.len() == 8 && rows.iter().all(|r| r[5] == "ok"), "{rows:?}");

    // Every role ended with its point: nothing runs on the hosts.
    lab.assert_nothing_left("after the sweeps");

    // A runner killed in the middle of a sweep leaves nothing running
    // there either: its ssh processes die with it, and each host's
    // wrapper stops its program when the input closes.
    let said = lab.dir.join("killed-runner.log");
    let mut runner = lab
        .softrnic(&["exp", "e9", "--compare", "tcp", "--hosts", hosts, "--out", out])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    // The runner first checks both hosts over SSH (on a loaded two-core
    // machine that alone has taken more than ten seconds), and the
    // check's own shell on host a comes and goes: wait for the server.
    let server_runs = || lab.strays("a").iter().any(|cmdline| cmdline.contains("careful --server"));
    let start = Instant::now();
    let mut ended = None;
    while !server_runs() && ended.is_none() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        ended = runner.try_wait().unwrap();
    }
    if !server_runs() {
        let _ = runner.kill();
        let _ = runner.wait();
        panic!(
            "the server never started on host a in {:?}; the runner {}, saying:\n{}",
            start.elapsed(),
            ended.map_or("was still running".to_string(), |status| format!("ended ({status})")),
            std::fs::read_to_string(&said).unwrap_or_default(),
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    // `ip netns exec` execs the runner, so the pid is the runner's.
    // SAFETY: kill on our own child's pid, not yet reaped.
    unsafe { libc::kill(runner.id() as libc::pid_t, libc::SIGKILL) };
    runner.wait().unwrap();
    lab.assert_nothing_left("after the runner died");
}

#[test]
fn a_host_ssh_cannot_reach_or_without_a_build_is_named_before_the_sweep() {
    let Some(lab) = lab_or_skip("a_host_ssh_cannot_reach_or_without_a_build_is_named_before_the_sweep", "bad") else {
        return;
    };
    let out = lab.dir.join("results");
    let run = |hosts: &Path| {
        let o = lab
            .softrnic(&["exp", "e9", "--quick", "--hosts", hosts.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).trim().to_string()
    };
    // No host holds .9: SSH gives up after its connect timeout.
    let start = Instant::now();
    let error = run(&lab.inventory(&format!("{SUBNET}.9"), ""));
    assert!(error.contains(&format!("cannot reach the server's host root@{SUBNET}.9:22 over SSH")), "{error}");
    assert!(error.contains("check its address, user, key and port") && error.lines().count() == 1, "{error}");
    assert!(start.elapsed() < Duration::from_secs(30));
    // Host a answers, but has no build where the inventory says.
    let error = run(&lab.inventory(&format!("{SUBNET}.2"), "bin = \"/nonexistent/bin\""));
    assert!(
        error.contains("has no softrnic build in /nonexistent/bin") && error.contains("copy target/release/softrnic"),
        "{error}"
    );
    assert!(!out.join("e9_results.csv").exists(), "nothing ran");
}
