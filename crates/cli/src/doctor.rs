//! `softrnic doctor`: whether this machine has what softrnic needs, one
//! line per check, each with how to fix what is missing.
//!
//! Three checks every device needs (its run-time directory, `/dev/shm` for
//! the same-host wire, UDP port 4791 on its address) fail the command when
//! they fail; the rest say what a feature needs (the drop-in libraries
//! for unmodified programs, user namespaces for `softrnic run`, a reachable softrnicd, root for the lab, netem for the
//! lossy-link benchmarks) and fail it only when asked for with `--need`.
//! GSO, GRO and ECN on the device's socket are reported, never required.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use clap::{Args, ValueEnum};
use softrnic_engine::environment::{self, Ecn};
use softrnic_engine::socket::{BindError, RoceSocket};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The device's address to check (default: SOFTRNIC_ADDR, else 127.0.0.2).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// A feature that must work here: its check failing fails the command.
    #[arg(long, value_enum)]
    pub need: Vec<Feature>,
}

/// What a user may ask the machine to be ready for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Feature {
    /// Unmodified RDMA programs (the drop-in libibverbs.so.1 and librdmacm.so.1).
    Programs,
    /// `softrnic run` (a mount namespace: user namespaces, or root).
    Run,
    /// A softrnicd the programs reach (`SOFTRNIC_DAEMON`, or the default socket).
    Daemon,
    /// The network lab (root, iproute2, ethtool, network namespaces).
    Lab,
    /// Loss in the kernel for the lossy-link benchmarks (netem, or nftables).
    Loss,
}

/// The address checked when none is given: the first device address the
/// README's examples use.
const DEFAULT_ADDR: &str = "127.0.0.2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    /// Not here; what needs it says so (`--need`).
    Missing,
    /// Not here, and every device needs it.
    Fail,
}

struct Check {
    name: &'static str,
    verdict: Verdict,
    /// What was found, and for anything not ok, how to fix it.
    says: String,
    /// The feature this check stands for, if any.
    feature: Option<Feature>,
}

impl Check {
    fn new(name: &'static str, feature: Option<Feature>, result: Result<String, String>) -> Check {
        let (verdict, says) = match result {
            Ok(says) => (Verdict::Ok, says),
            Err(says) => (if feature.is_some() { Verdict::Missing } else { Verdict::Fail }, says),
        };
        Check { name, verdict, says, feature }
    }

    fn info(name: &'static str, says: String) -> Check {
        Check { name, verdict: Verdict::Ok, says, feature: None }
    }
}

pub fn run(args: &DoctorArgs) -> Result<(), String> {
    let addr = match args.addr.map_or_else(crate::addr::from_env, |a| Ok(Some(a)))? {
        Some(addr) => addr,
        None => DEFAULT_ADDR.parse().expect("an address"),
    };
    let (port, offloads) = roce_port(addr);
    let checks = [
        Check::new("runtime directory", None, runtime_dir()),
        Check::new("/dev/shm", None, dev_shm()),
        Check::new("UDP port 4791", None, port),
        Check::new("drop-in libraries", Some(Feature::Programs), libraries()),
        Check::new("softrnic run", Some(Feature::Run), softrnic_run(addr)),
        Check::new("softrnicd", Some(Feature::Daemon), daemon()),
        Check::new("root (the lab)", Some(Feature::Lab), lab()),
        Check::new("loss in the kernel", Some(Feature::Loss), loss()),
        Check::info("UDP GSO and GRO", offloads),
        Check::info("ECN", ecn()),
    ];
    println!("softrnic doctor: the device at {addr}");
    let mut failed = Vec::new();
    for check in &checks {
        let needed = check.feature.is_some_and(|f| args.need.contains(&f));
        let label = match (check.verdict, needed) {
            (Verdict::Ok, _) => "ok",
            (Verdict::Missing, false) => "missing",
            (Verdict::Missing, true) | (Verdict::Fail, _) => "FAIL",
        };
        if label == "FAIL" {
            failed.push(check.name);
        }
        println!("{label:<8} {:<20} {}", check.name, check.says);
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(format!("not ready: {} (each line above says how to fix it)", failed.join(", "))),
    }
}

fn runtime_dir() -> Result<String, String> {
    softrnic_engine::runtime_dir::ensure()
        .map(|dir| format!("{}, private to you", dir.display()))
        .map_err(|e| e.to_string())
}

/// The same-host wire's rings live in shared memory.
fn dev_shm() -> Result<String, String> {
    let fix = "the same-host wire needs a writable tmpfs at /dev/shm (in a container: --shm-size=256m, or mount one)";
    let probe = Path::new("/dev/shm").join(format!("softrnic-doctor-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(|e| format!("cannot write there ({e}): {fix}"))?;
    let _ = std::fs::remove_file(&probe);
    let free = rustix::fs::statvfs("/dev/shm").map(|s| s.f_bavail * s.f_frsize).unwrap_or(0);
    Ok(format!("writable, {:.1} GiB free", free as f64 / (1u64 << 30) as f64))
}

/// The device's own socket, bound as the engine binds it: whether UDP
/// port 4791 is free on the address, and which offloads the kernel gave.
fn roce_port(addr: IpAddr) -> (Result<String, String>, String) {
    match RoceSocket::bind(addr) {
        Ok(socket) => {
            let (gso, gro) = socket.offloads();
            let word = |on: bool| if on { "yes" } else { "no" };
            let note = if gso && gro { "" } else { " (without them each datagram is a system call)" };
            (Ok(format!("{addr}:4791 is free for the device")), format!("GSO {}, GRO {}{note}", word(gso), word(gro)))
        }
        Err(e @ BindError::InUse(..)) => {
            (Err(format!("{e}: for example --addr {}", next_loopback(addr))), "not checked (the port is taken)".into())
        }
        Err(e) => (Err(e.to_string()), "not checked (no socket)".into()),
    }
}

fn next_loopback(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) if v4.is_loopback() && v4.octets()[3] < 254 => {
            let [a, b, c, d] = v4.octets();
            IpAddr::V4([a, b, c, d + 1].into())
        }
        _ => DEFAULT_ADDR.parse().expect("an address"),
    }
}

fn libraries() -> Result<String, String> {
    crate::layout::dir()
        .map(|lib| format!("libibverbs.so.1 and librdmacm.so.1 in {} (softrnic env exports it)", lib.display()))
        .ok_or_else(crate::layout::missing)
}

/// `softrnic run -- true`, for real: the mount namespace (a user
/// namespace without root) and the view it mounts.
fn softrnic_run(addr: IpAddr) -> Result<String, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let out = Command::new(me)
        .args(["run", "--addr", &addr.to_string(), "--", "true"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start softrnic run: {e}"))?;
    match (out.status.success(), rustix::process::geteuid().is_root()) {
        (true, true) => Ok("softrnic run works (as root)".into()),
        (true, false) => Ok("softrnic run works without root (a user namespace)".into()),
        (false, _) => Err(String::from_utf8_lossy(&out.stderr).trim().trim_start_matches("softrnic: ").to_string()),
    }
}

fn daemon() -> Result<String, String> {
    let var = std::env::var_os(softrnic_provider::socket_path::ENV);
    if var.as_deref().is_some_and(|v| v == "off") {
        return Err("SOFTRNIC_DAEMON=off: each program runs its own engine (unset it to use softrnicd)".into());
    }
    let socket = match var.filter(|v| !v.is_empty() && v != "start") {
        Some(path) => std::path::PathBuf::from(path),
        None => softrnic_provider::socket_path::default_path(),
    };
    let at = socket.display();
    let start = format!(
        "programs run the engine themselves; start one with softrnicd --socket {at}, or let the first program start it (SOFTRNIC_DAEMON=start)"
    );
    // As programs connect: a stream probe is refused by the daemon
    // (EPROTOTYPE) and would pass a listener that is no softrnicd.
    match softrnic_provider::launch::probe(&socket) {
        Ok(()) => Ok(format!("accepts connections at {at}")),
        Err(rustix::io::Errno::NOENT) => Err(format!("none at {at}: {start}")),
        Err(rustix::io::Errno::CONNREFUSED) => {
            Err(format!("a socket at {at} that nobody answers (a softrnicd that died?): remove it; {start}"))
        }
        Err(rustix::io::Errno::PROTOTYPE) => {
            Err(format!("{at} is some other program's socket, no softrnicd's: {start}"))
        }
        Err(e) => Err(format!("cannot reach {at} ({e}): {start}")),
    }
}

fn lab() -> Result<String, String> {
    match softrnic_lab::namespaces::unavailable() {
        None => Ok("root, iproute2 and ethtool: softrnic lab can make its hosts".into()),
        Some(why) => Err(why),
    }
}

/// netem, or nftables' random drop where the kernel has no netem (what
/// `scripts/bench.py --loss` uses).
fn loss() -> Result<String, String> {
    let release = rustix::system::uname().release().to_string_lossy().into_owned();
    let netem = Path::new("/sys/module/sch_netem").exists()
        || ["ko", "ko.xz", "ko.zst"]
            .iter()
            .any(|ext| Path::new(&format!("/lib/modules/{release}/kernel/net/sched/sch_netem.{ext}")).exists());
    let found =
        |program: &str| Command::new(program).arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok();
    match (netem && found("tc"), found("nft")) {
        (true, _) => Ok("netem (tc) can drop in the kernel".into()),
        (false, true) => Ok("no netem; nftables' random drop serves instead".into()),
        (false, false) => {
            Err("neither netem (apt install iproute2, and the kernel's sch_netem) nor nftables (apt install nftables)"
                .into())
        }
    }
}

/// What the device's packets carry in their ECN field (`SOFTRNIC_ECN`).
fn ecn() -> String {
    match environment::ecn() {
        Ok(Ecn::Capable) => "ECT(0) on every packet: a congested switch can mark them for DCQCN and DCTCP".into(),
        Ok(Ecn::Off) => "SOFTRNIC_ECN=off: packets leave Not-ECT, so no switch marks them".into(),
        Ok(Ecn::Congested) => "SOFTRNIC_ECN=ce: every packet leaves marked CE (a test setting)".into(),
        Err(why) => format!("SOFTRNIC_ECN: {why}"),
    }
}
