//! `SOFTRNIC_DAEMON=start`: the first program starts softrnicd on demand,
//! programs that race it share the one that listens, and the daemon
//! leaves once no program is connected (`--idle-exit`).

mod common;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use softrnic_provider::client::Session;
use softrnic_provider::launch::{self, BIN_ENV, IDLE_ENV};

fn on_demand(key: &str) -> Option<OsString> {
    match key {
        BIN_ENV => Some(env!("CARGO_BIN_EXE_softrnicd").into()),
        IDLE_ENV => Some("1".into()),
        _ => None,
    }
}

#[test]
fn a_daemon_started_on_demand_serves_racing_programs_and_leaves_when_idle() {
    let dir = std::env::temp_dir().join(format!("softrnic-launch-{}", std::process::id()));
    let socket: PathBuf = dir.join("softrnicd.sock");
    assert!(!launch::listening(&socket));
    // Three programs open at once: each may start a daemon; one listens.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| launch::ensure(&socket, on_demand).unwrap());
        }
    });
    assert!(launch::listening(&socket));
    let session = Session::connect(&socket, common::address()).unwrap();
    session.alloc_pd().unwrap();
    // Connected, it stays past its idle time.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(launch::listening(&socket), "it left while a program was connected");
    drop(session);
    let deadline = Instant::now() + Duration::from_secs(10);
    while launch::listening(&socket) || socket.exists() {
        assert!(Instant::now() < deadline, "the idle daemon is still there after 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(socket.with_extension("log")).unwrap();
    assert!(log.contains("no program for 1s (--idle-exit); leaving"), "{log}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_daemon_program_is_named_in_the_error() {
    let socket = std::env::temp_dir().join(format!("softrnic-launch-missing-{}.sock", std::process::id()));
    let env = |key: &str| (key == BIN_ENV).then(|| OsString::from("/nonexistent/softrnicd"));
    let err = launch::ensure(&socket, env).unwrap_err();
    // The log it opened for the daemon it could not start.
    let _ = std::fs::remove_file(socket.with_extension("log"));
    assert!(err.contains("cannot start /nonexistent/softrnicd") && err.contains(BIN_ENV), "{err}");
}

/// `--print-config`: the file's values, the defaults for the rest, as
/// JSON, without starting (the Kubernetes device plugin reads it); a bad
/// file says what is wrong.
#[test]
fn print_config_shows_the_limits_it_would_run_with() {
    let dir = std::env::temp_dir().join(format!("softrnic-print-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("softrnicd.toml");
    std::fs::write(&file, "[tenant]\nmax_connections = 8\n[daemon]\nmax_connections = 64\n").unwrap();
    let print_config = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_softrnicd"))
            .arg("--config")
            .arg(&file)
            .arg("--print-config")
            .output()
            .unwrap()
    };
    let out = print_config();
    assert!(out.status.success(), "{out:?}");
    let config: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(config["tenant"]["max_connections"], 8);
    assert_eq!(config["daemon"]["max_connections"], 64);
    assert_eq!(config["tenant"]["max_qps"], 4096, "a default fills what the file leaves out");

    std::fs::write(&file, "[tenant]\nmax_conections = 8\n").unwrap();
    let out = print_config();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conections"), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
