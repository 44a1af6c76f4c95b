//! Starting softrnicd on demand: `SOFTRNIC_DAEMON=start` makes the first
//! program that opens a device start a daemon on the default socket when
//! none listens there, and every program use it. The daemon it starts
//! leaves after [`IDLE_EXIT`] without tenants (`--idle-exit`), so nothing
//! lingers once the programs are gone.
//!
//! Programs that race to start one each start theirs: the first binds the
//! socket, the others find a live daemon there and exit, and every program
//! connects to the one that listens.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};

/// The variable that names the softrnicd to start (else `softrnicd` beside
/// the running program, then on `PATH`).
pub const BIN_ENV: &str = "SOFTRNIC_DAEMON_BIN";
/// The variable that overrides [`IDLE_EXIT`], in seconds.
pub const IDLE_ENV: &str = "SOFTRNIC_DAEMON_IDLE";
/// How long a daemon started on demand stays without tenants.
pub const IDLE_EXIT: Duration = Duration::from_secs(60);
/// How long a program waits for the daemon it started to listen.
const START_WAIT: Duration = Duration::from_secs(10);

/// Whether a daemon listens on `socket`.
pub fn listening(socket: &Path) -> bool {
    probe(socket).is_ok()
}

/// Connects to `socket` as programs do (SOCK_SEQPACKET) and hangs up, or
/// says why not: `NOENT` (nothing there), `CONNREFUSED` (nobody listens),
/// `PROTOTYPE` (a socket of another kind, no softrnicd's).
pub fn probe(socket: &Path) -> rustix::io::Result<()> {
    let addr = SocketAddrUnix::new(socket)?;
    let probe = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None)?;
    rustix::net::connect(&probe, &addr)
}

/// Makes sure a daemon listens on `socket`, starting one if none does.
/// `env` reads the environment (the caller's, or a test's).
pub fn ensure(socket: &Path, env: impl Fn(&str) -> Option<OsString>) -> Result<(), String> {
    if listening(socket) {
        return Ok(());
    }
    let program = daemon_program(&env)?;
    let idle = env(IDLE_ENV).and_then(|v| v.to_str()?.parse::<u64>().ok()).map_or(IDLE_EXIT, Duration::from_secs);
    let log_path = socket.with_extension("log");
    softrnic_daemon_protocol::make_socket_dir(socket).map_err(|e| e.to_string())?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let mut command = Command::new(&program);
    command
        .arg("--socket")
        .arg(socket)
        .arg("--idle-exit")
        .arg(idle.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        // Its own process group: a Ctrl-C meant for the program that
        // started it does not stop the daemon other programs use.
        .process_group(0);
    let mut child =
        command.spawn().map_err(|e| format!("cannot start {} ({e}): set {BIN_ENV} to softrnicd", program.display()))?;
    let deadline = Instant::now() + START_WAIT;
    let mut exited = None;
    while !listening(socket) {
        if exited.is_none() {
            // One that lost a race to another program's exits: wait for
            // the winner's socket all the same.
            exited = child.try_wait().ok().flatten();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the softrnicd started on demand did not listen on {} within {}s; see {}",
                socket.display(),
                START_WAIT.as_secs(),
                log_path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if exited.is_none() {
        // Reap it when it leaves, so that it is no zombie of this program.
        std::thread::spawn(move || child.wait());
    }
    Ok(())
}

/// The softrnicd to start: `SOFTRNIC_DAEMON_BIN`, else beside the running
/// program, else on `PATH`.
fn daemon_program(env: &impl Fn(&str) -> Option<OsString>) -> Result<PathBuf, String> {
    if let Some(bin) = env(BIN_ENV) {
        return Ok(PathBuf::from(bin));
    }
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("softrnicd")));
    let on_path = || std::env::split_paths(&env("PATH")?).map(|dir| dir.join("softrnicd")).find(|p| p.is_file());
    beside.filter(|p| p.is_file()).or_else(on_path).ok_or_else(|| {
        format!("SOFTRNIC_DAEMON=start found no softrnicd beside this program or on PATH: set {BIN_ENV}")
    })
}
