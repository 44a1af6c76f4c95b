//! The network namespaces an experiment makes for itself are named after
//! its process (`PREFIX<pid>...`), so that a run can remove what a killed
//! one left behind (its pid is gone) and never another's; removing one
//! stops what still runs in it first, so nothing spins on detached.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use super::daemon::ip;

/// `program` in namespace `ns` (`ip netns exec`), dying with the runner.
pub(super) fn exec_in(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    super::roles::stoppable_by_runner(&mut command);
    command
}

/// Removes the namespaces named `prefix<pid>...` whose pid is gone.
pub(super) fn remove_leftovers(prefix: &str, exp: &str) {
    let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else { continue };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = digits.parse::<u32>() else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("{exp}: removing namespace {name}, left by run {pid}, which ended without cleaning up");
            kill_and_remove(&name);
        }
    }
}

/// Stops what runs in namespace `name`, then deletes it.
pub(super) fn kill_and_remove(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        let text = String::from_utf8_lossy(&out.stdout);
        let pids = text.split_whitespace().filter_map(|p| p.parse().ok()).filter_map(rustix::process::Pid::from_raw);
        for pid in pids {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    let _ = ip(&["netns", "del", name]);
}
