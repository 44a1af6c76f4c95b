//! Roles: each end of an experiment point runs as its own process, its
//! output in a log file. A role that outlives its point is stopped the
//! way a careful operator would: SIGINT, then SIGTERM, then SIGKILL; and
//! every role dies with the runner, however the runner ends.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One process of a point.
#[derive(Debug, Clone)]
pub struct Role {
    /// "server", "client": names the log.
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// A server that serves until it is stopped (sockperf's): stopped,
    /// not waited for, once the client is done.
    pub until_stopped: bool,
}

impl Role {
    pub fn new(name: &'static str, program: &Path, args: &[&str]) -> Role {
        let args = args.iter().map(|s| s.to_string()).collect();
        Role { name, program: program.to_path_buf(), args, env: Vec::new(), until_stopped: false }
    }

    pub fn until_stopped(mut self) -> Role {
        self.until_stopped = true;
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Role {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// The command line, as a log's first line shows it.
    pub fn command_line(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let args = self.args.join(" ");
        format!("{} {} {args}", env.join(" "), self.program.display()).trim().to_string()
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
pub fn run_point(roles: &[Role], logs: &Path, tag: &str, deadline: Duration) -> Result<Vec<PathBuf>, String> {
    let start = Instant::now();
    let mut children = Vec::new();
    let mut paths = Vec::new();
    for role in roles {
        let path = logs.join(format!("{tag}_{}.log", role.name));
        let mut log = File::create(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        use std::io::Write as _;
        writeln!(log, "$ {}", role.command_line()).map_err(|e| e.to_string())?;
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(&role.program);
        // SAFETY: runs in the child between fork and exec, where only
        // async-signal-safe calls are allowed; prctl is one, and it touches
        // nothing of the parent's. A role dies with the runner (even a
        // killed one) instead of spinning on as an orphan.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            })
        };
        let child = command
            .args(&role.args)
            .envs(role.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", role.program.display()));
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

/// SIGINT, SIGTERM, SIGKILL, each after the last has had its grace.
fn stop(child: &mut Child) {
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
        let sh = Path::new("/bin/sh");
        // A server that ignores SIGINT and waits for ever; a client that
        // finishes at once.
        let server = Role::new("server", sh, &["-c", "trap '' INT; while :; do sleep 0.1; done"]);
        let client = Role::new("client", sh, &["-c", "echo hello"]);
        let error = run_point(&[server, client], &dir, "p0", Duration::from_millis(300)).unwrap_err();
        assert!(error.contains("server was still running"), "{error}");
        // One that serves until stopped is stopped, and that is no failure.
        let server = Role::new("server", sh, &["-c", "while :; do sleep 0.1; done"]).until_stopped();
        let client = Role::new("client", sh, &["-c", "exit 0"]);
        assert!(run_point(&[server, client], &dir, "p3", Duration::from_secs(5)).is_ok());
        let log = std::fs::read_to_string(dir.join("p0_client.log")).unwrap();
        assert!(log.starts_with("$ /bin/sh -c echo hello") && log.contains("hello"), "{log}");
        let ok = run_point(&[Role::new("client", sh, &["-c", "exit 0"])], &dir, "p1", Duration::from_secs(5));
        assert!(ok.is_ok());
        let failed = run_point(&[Role::new("client", sh, &["-c", "exit 3"])], &dir, "p2", Duration::from_secs(5));
        assert!(failed.unwrap_err().contains("exit status: 3"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
