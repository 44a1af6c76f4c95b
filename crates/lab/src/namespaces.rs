//! The lab's hosts as network namespaces: one per host, each with a veth
//! `eth0` whose other end lives in the switch's own namespace, and the
//! processes run in them. Everything is named after the lab's process id
//! (`srn-<pid>-h0`, `srn-<pid>-sw`), so that:
//!
//! - dropping [`Namespaces`] (normal exit, an error, Ctrl-C) kills every
//!   process in them and deletes them, which deletes the veths;
//! - a run that was killed outright leaves names whose process is gone:
//!   the next run removes them, and says so.
//!
//! Host-side veths turn checksum offload off: a frame handed to a veth
//! with its checksum left for "the hardware" would reach the switch's
//! packet socket unfinished, and the far host would drop it. With it off,
//! the kernel also cuts GSO and TSO batches into MTU-sized frames before
//! the veth, as a real NIC's wire would carry them.

use std::fs;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::topology::Topology;

const PREFIX: &str = "srn-";
/// Frames up to this size cross the veths: RoCE's 4096-byte MTU with its
/// headers fits, as on a jumbo-frame fabric.
pub const VETH_MTU: u32 = 8000;

/// The MAC address of host `i`'s `eth0`, and of its switch port.
pub fn host_mac(i: usize) -> [u8; 6] {
    [0x02, 0x53, 0x4e, 0x00, (i >> 8) as u8, i as u8]
}
pub fn port_mac(i: usize) -> [u8; 6] {
    [0x02, 0x53, 0x4e, 0x01, (i >> 8) as u8, i as u8]
}

fn mac_text(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// The name of host `i`'s interface in the switch's namespace.
pub fn port_interface(i: usize) -> String {
    format!("p{i}")
}

/// The namespaces of one lab, removed when dropped.
#[derive(Debug)]
pub struct Namespaces {
    pub switch_ns: String,
    /// Each host's namespace, in topology order.
    pub host_ns: Vec<String>,
    created: Vec<String>,
}

/// Why a lab cannot run here, in words a user can act on; also the reason
/// tests skip with.
pub fn unavailable() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("the lab creates network namespaces and veths, which needs root: run it with sudo".into());
    }
    for (program, package) in [("ip", "iproute2"), ("ethtool", "ethtool")] {
        let found = Command::new(program)
            .arg(if program == "ip" { "-V" } else { "--version" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!("`{program}` is not installed: apt install {package}"));
        }
    }
    // A name of this call's own: threads of one process may ask at once.
    static PROBES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = format!("{PREFIX}probe-{}-{n}", std::process::id());
    if !ip(&["netns", "add", &probe]).is_ok_and(|_| ip(&["netns", "del", &probe]).is_ok()) {
        return Some("this machine does not let us create network namespaces (`ip netns add` failed)".into());
    }
    None
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// `ip [-n NAMESPACE] -batch -` with these lines: one process for many
/// commands.
fn ip_batch(namespace: Option<&str>, lines: &[String]) -> Result<(), String> {
    let mut command = Command::new("ip");
    if let Some(ns) = namespace {
        command.args(["-n", ns]);
    }
    let mut child = command
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    child.stdin.take().expect("piped").write_all(lines.join("\n").as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("setting up the lab's namespaces failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Namespaces of earlier runs whose process is gone: their processes are
/// killed and the namespaces removed, with a message.
pub fn remove_leftovers() {
    let Ok(entries) = fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        eprintln!("softrnic lab: removing namespace {name}, left by run {pid}, which ended without cleaning up");
        remove(&name);
    }
}

/// Kills whatever runs in namespace `name`, then deletes it.
fn remove(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                // SAFETY: kill(2) with a pid and a signal number has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _ = ip(&["netns", "del", name]);
}

impl Namespaces {
    /// Creates the switch's namespace, one per host, and the veths between
    /// them, with addresses, MTUs and offloads set.
    pub fn create(topology: &Topology) -> Result<Namespaces, String> {
        if let Some(reason) = unavailable() {
            return Err(reason);
        }
        remove_leftovers();
        let pid = std::process::id();
        let switch_ns = format!("{PREFIX}{pid}-sw");
        let host_ns: Vec<String> = topology.hosts.iter().map(|h| format!("{PREFIX}{pid}-{}", h.name)).collect();
        let mut namespaces = Namespaces { switch_ns: switch_ns.clone(), host_ns: host_ns.clone(), created: Vec::new() };
        let mut lines = vec![format!("netns add {switch_ns}")];
        namespaces.created.push(switch_ns.clone());
        for ns in &host_ns {
            lines.push(format!("netns add {ns}"));
            namespaces.created.push(ns.clone());
        }
        let mut switch_side = vec!["link set lo up".to_string()];
        for (i, ns) in host_ns.iter().enumerate() {
            let port = port_interface(i);
            lines.push(format!(
                "link add eth0 netns {ns} address {} mtu {VETH_MTU} type veth peer name {port} netns {switch_ns} address {} mtu {VETH_MTU}",
                mac_text(host_mac(i)),
                mac_text(port_mac(i)),
            ));
            switch_side.push(format!("link set {port} up"));
        }
        ip_batch(None, &lines)?;
        ip_batch(Some(&switch_ns), &switch_side)?;
        for (host, ns) in topology.hosts.iter().zip(&host_ns) {
            let mut lines = vec!["link set lo up".to_string()];
            lines.extend(host.addrs().map(|addr| format!("addr add {addr}/16 dev eth0")));
            lines.push("link set eth0 up".into());
            ip_batch(Some(ns), &lines)?;
        }
        for ns in &host_ns {
            let script = "ethtool -K eth0 tx off >/dev/null 2>&1 && sysctl -qw net.ipv6.conf.all.disable_ipv6=1";
            let ok =
                Command::new("ip").args(["netns", "exec", ns, "sh", "-c", script]).status().is_ok_and(|s| s.success());
            if !ok {
                return Err(format!("cannot turn checksum offload off in {ns} (ethtool -K eth0 tx off)"));
            }
        }
        Ok(namespaces)
    }

    /// Starts `command` (a shell line) on host `i`, with its address in
    /// `ADDR` and `SOFTRNIC_ADDR`, its name in `HOST`, and every host's
    /// address in a variable named after it (`h0`; more addresses in
    /// `h0_1`, `h0_2`, ...). It dies with the lab.
    pub fn spawn(
        &self,
        topology: &Topology,
        i: usize,
        command: &str,
        stdout: Stdio,
        stderr: Stdio,
    ) -> Result<Child, String> {
        let host = &topology.hosts[i];
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host_ns[i], "sh", "-c", command]);
        cmd.env("ADDR", host.addr.to_string()).env("SOFTRNIC_ADDR", host.addr.to_string()).env("HOST", &host.name);
        for other in &topology.hosts {
            cmd.env(&other.name, other.addr.to_string());
            for (k, alias) in other.aliases.iter().enumerate() {
                cmd.env(format!("{}_{}", other.name, k + 1), alias.to_string());
            }
        }
        cmd.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure only calls prctl, which
        // is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
                Ok(())
            });
        }
        cmd.spawn().map_err(|e| format!("cannot start `{command}` on {}: {e}", host.name))
    }

    /// The host addresses, for messages.
    pub fn describe(&self, topology: &Topology) -> Vec<(String, Ipv4Addr, String)> {
        topology.hosts.iter().zip(&self.host_ns).map(|(h, ns)| (h.name.clone(), h.addr, ns.clone())).collect()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.created.iter().rev() {
            remove(name);
        }
    }
}
