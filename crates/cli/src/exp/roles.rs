//! Roles: each end of an experiment point runs as its own process, its
//! output in a log file. A role that outlives its point is stopped the
//! way a careful operator would: SIGINT, then SIGTERM, then SIGKILL; and
//! every role dies with the runner, however the runner ends. A role runs
//! here or, given an inventory, on its host over SSH (`hosts.rs`).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::hosts::{self, Build, Inventory};

/// One process of a point.
#[derive(Debug, Clone)]
pub struct Role {
    /// "server", "client": names the log, and the host in an inventory.
    pub name: &'static str,
    pub program: Program,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Runs over softrnic's `libibverbs.so.1` (wherever the build is on
    /// the role's host).
    pub softrnic_lib: bool,
    /// A server that serves until it is stopped (sockperf's): stopped,
    /// not waited for, once the client is done.
    pub until_stopped: bool,
}

/// What a role runs, found where the role runs.
#[derive(Debug, Clone)]
pub enum Program {
    /// A program of softrnic's build (`softrnic`, `rdma_bench`).
    Built(&'static str),
    /// A program on the host's PATH (`sockperf`).
    OnPath(&'static str),
}

/// Where the roles of a sweep run.
#[derive(Debug, Clone)]
pub struct Placement {
    /// This machine's build.
    pub local: Build,
    /// The hosts, when the sweep has an inventory; else all runs here.
    pub hosts: Option<Inventory>,
}

/// Makes `command`'s process one the runner can stop: it dies with the
/// runner (even a killed one) instead of spinning on as an orphan, and it
/// hears SIGINT, the first step of [`stop`]'s ladder, even where the
/// runner was started with SIGINT ignored (a script's background job is),
/// which a child would inherit and a shell could not trap again.
pub fn stoppable_by_runner(command: &mut Command) {
    // SAFETY: runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed; prctl and signal are, and they
    // touch nothing of the parent's.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    };
}

/// A program on PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}

impl Role {
    pub fn new(name: &'static str, program: Program, args: &[&str]) -> Role {
        let args = args.iter().map(|s| s.to_string()).collect();
        Role { name, program, args, env: Vec::new(), softrnic_lib: false, until_stopped: false }
    }

    pub fn on_softrnic_lib(mut self) -> Role {
        self.softrnic_lib = true;
        self
    }

    pub fn until_stopped(mut self) -> Role {
        self.until_stopped = true;
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Role {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The program and environment on a host with `build`.
    fn resolve(&self, build: &Build) -> (String, Vec<(String, String)>) {
        let program = match &self.program {
            Program::Built(name) => build.bin.join(name).to_string_lossy().to_string(),
            Program::OnPath(name) => name.to_string(),
        };
        let mut env = self.env.clone();
        if self.softrnic_lib {
            env.push(("LD_LIBRARY_PATH".to_string(), build.lib.to_string_lossy().to_string()));
        }
        (program, env)
    }

    /// The process that runs this role, here or over SSH, and its command
    /// line as the log's first line shows it.
    fn command(&self, placement: &Placement) -> (Command, String) {
        let line = |program: &str, env: &[(String, String)]| {
            let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} {program} {}", env.join(" "), self.args.join(" ")).trim().to_string()
        };
        match &placement.hosts {
            None => {
                let (program, env) = self.resolve(&placement.local);
                let mut command = Command::new(&program);
                command.args(&self.args).envs(env.iter().map(|(k, v)| (k, v))).stdin(Stdio::null());
                (command, line(&program, &env))
            }
            Some(inventory) => {
                let host = inventory.host(self.name);
                let (program, env) = self.resolve(&host.build(&placement.local));
                let mut ssh = host.ssh();
                // The input stays open while the role should run (hosts.rs).
                ssh.arg(hosts::remote_script(&env, &program, &self.args)).stdin(Stdio::piped());
                (ssh, format!("[{}] {}", host.destination(), line(&program, &env)))
            }
        }
    }
}

/// How long a stopped role gets after each signal before the next.
const GRACE: Duration = Duration::from_secs(2);
/// How long a server may take to finish once its client has.
const SERVER_AFTER_CLIENT: Duration = Duration::from_secs(15);

/// Runs `roles` together: every one but the last is a server, started
/// first; the point ends when the last (the client) exits and every
/// server has followed. Returns each role's log; an error names the role
/// that failed, timed out or had to be stopped.
pub fn run_point(
    roles: &[Role],
    placement: &Placement,
    logs: &Path,
    tag: &str,
    deadline: Duration,
) -> Result<Vec<PathBuf>, String> {
    let start = Instant::now();
    let mut children = Vec::new();
    let mut paths = Vec::new();
    for role in roles {
        let path = logs.join(format!("{tag}_{}.log", role.name));
        let mut log = File::create(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        use std::io::Write as _;
        let (mut command, line) = role.command(placement);
        writeln!(log, "$ {line}").map_err(|e| e.to_string())?;
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        stoppable_by_runner(&mut command);
        let child = command
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start the {} ({line}): {e}", role.name));
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                stop_all(&mut children);
                return Err(e);
            }
        };
        children.push((role.name, child));
        paths.push(path);
    }
    // The client is last; the servers exit once it is done with them
    // (a little later), or are stopped if they serve until stopped.
    let mut failure = None;
    for (i, role) in roles.iter().enumerate().rev() {
        let client = i + 1 == roles.len();
        let left = match client {
            true => deadline.saturating_sub(start.elapsed()),
            false => deadline.saturating_sub(start.elapsed()).min(SERVER_AFTER_CLIENT),
        };
        let (name, child) = &mut children[i];
        if role.until_stopped && !client {
            stop(child);
            continue;
        }
        match wait(child, left.max(GRACE)) {
            Some(status) if status.success() => {}
            Some(status) => failure = failure.or(Some(format!("the {name} exited with {status}"))),
            None => {
                stop(child);
                failure = failure
                    .or(Some(format!("the {name} was still running after {}s and was stopped", deadline.as_secs())));
            }
        }
    }
    match failure {
        None => Ok(paths),
        Some(e) => Err(e),
    }
}

/// Waits up to `timeout` for `child`; None if it is still running.
fn wait(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGINT, SIGTERM, SIGKILL, each after the last has had its grace. A
/// remote role's ladder runs on its host once its input closes; the ssh
/// here ends when the program there has.
pub(crate) fn stop(child: &mut Child) {
    if let Some(input) = child.stdin.take() {
        drop(input);
        if wait(child, GRACE * 3).is_some() {
            return;
        }
    }
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: kill() on our own child's pid, which try_wait has not
        // reaped (it is still running), so the pid is still ours.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        if wait(child, GRACE).is_some() {
            return;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn stop_all(children: &mut [(&'static str, Child)]) {
    for (_, child) in children {
        stop(child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_that_would_run_for_ever_is_stopped() {
        let dir = std::env::temp_dir().join(format!("softrnic-roles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sh = || Program::OnPath("sh");
        let here = Placement { local: Build { bin: dir.clone(), lib: dir.clone() }, hosts: None };
        // A server that ignores SIGINT and waits for ever; a client that
        // finishes at once.
        let server = Role::new("server", sh(), &["-c", "trap '' INT; while :; do sleep 0.1; done"]);
        let client = Role::new("client", sh(), &["-c", "echo hello"]);
        let error = run_point(&[server, client], &here, &dir, "p0", Duration::from_millis(300)).unwrap_err();
        assert!(error.contains("server was still running"), "{error}");
        // One that serves until stopped is stopped, and that is no failure.
        let server = Role::new("server", sh(), &["-c", "while :; do sleep 0.1; done"]).until_stopped();
        let client = Role::new("client", sh(), &["-c", "exit 0"]);
        assert!(run_point(&[server, client], &here, &dir, "p3", Duration::from_secs(5)).is_ok());
        let log = std::fs::read_to_string(dir.join("p0_client.log")).unwrap();
        assert!(log.starts_with("$ sh -c echo hello") && log.contains("hello"), "{log}");
        let ok = run_point(&[Role::new("client", sh(), &["-c", "exit 0"])], &here, &dir, "p1", Duration::from_secs(5));
        assert!(ok.is_ok());
        let failed =
            run_point(&[Role::new("client", sh(), &["-c", "exit 3"])], &here, &dir, "p2", Duration::from_secs(5));
        assert!(failed.unwrap_err().contains("exit status: 3"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
