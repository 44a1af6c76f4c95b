//! `softrnic doctor`: a line per check, the fix beside what fails, and an
//! exit status that says whether what was asked for can work.

use std::net::UdpSocket;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

fn doctor(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_softrnic"));
    command.arg("doctor").args(args).env_remove("SOFTRNIC_ADDR").env_remove("SOFTRNIC_DAEMON");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("softrnic runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The line of check `name`.
fn line<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.get(9..).is_some_and(|rest| rest.starts_with(name)))
        .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
}

#[test]
fn every_check_has_its_line_and_a_free_address_passes() {
    let out = doctor(&["--addr", "127.0.0.71"], &[]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for name in [
        "runtime directory",
        "/dev/shm",
        "UDP port 4791",
        "drop-in libraries",
        "softrnic run",
        "softrnicd",
        "root (the lab)",
        "loss in the kernel",
        "UDP GSO and GRO",
        "ECN",
    ] {
        line(&text, name);
    }
    assert!(line(&text, "UDP port 4791").starts_with("ok"), "{text}");
    assert!(line(&text, "UDP port 4791").contains("127.0.0.71:4791 is free"), "{text}");
    assert!(line(&text, "ECN").contains("ECT(0)"), "{text}");
}

#[test]
fn a_taken_port_fails_with_another_address_to_use() {
    let _holder = UdpSocket::bind("127.0.0.72:4791").expect("the test's own hold on the port");
    let out = doctor(&["--addr", "127.0.0.72"], &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let port = line(&text, "UDP port 4791");
    assert!(
        port.starts_with("FAIL") && port.contains("already in use") && port.contains("--addr 127.0.0.73"),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("not ready: UDP port 4791"), "{out:?}");
}

#[test]
fn a_daemon_asked_for_must_be_reachable() {
    let dir = std::env::temp_dir().join(format!("softrnic-doctor-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("softrnicd.sock");
    let _ = std::fs::remove_file(&socket);
    let path = socket.to_str().unwrap();

    // Nobody listens: missing, and a failure only when asked for.
    let out = doctor(&["--addr", "127.0.0.74"], &[("SOFTRNIC_DAEMON", path)]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(line(&stdout(&out), "softrnicd").starts_with("missing"), "{}", stdout(&out));
    let out = doctor(&["--addr", "127.0.0.74", "--need", "daemon"], &[("SOFTRNIC_DAEMON", path)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let says = line(&stdout(&out), "softrnicd").to_string();
    assert!(says.starts_with("FAIL") && says.contains(&format!("softrnicd --socket {path}")), "{says}");

    // A listener of the wrong kind is no softrnicd.
    let stream = UnixListener::bind(&socket).unwrap();
    let out = doctor(&["--addr", "127.0.0.74", "--need", "daemon"], &[("SOFTRNIC_DAEMON", path)]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(line(&stdout(&out), "softrnicd").contains("no softrnicd's"), "{}", stdout(&out));
    drop(stream);
    std::fs::remove_file(&socket).unwrap();

    // A real softrnicd (built beside softrnic by scripts/build-libibverbs.sh).
    let daemon = Path::new(env!("CARGO_BIN_EXE_softrnic")).with_file_name("softrnicd");
    if !daemon.exists() {
        assert!(!std::env::var("CI").is_ok_and(|v| v == "true"), "CI builds softrnicd beside softrnic");
        eprintln!("skipped the live daemon: no {} (scripts/build-libibverbs.sh)", daemon.display());
        return;
    }
    let mut softrnicd = Command::new(daemon).args(["--socket", path, "--nice", "0"]).spawn().unwrap();
    let start = std::time::Instant::now();
    while !socket.exists() && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = doctor(&["--addr", "127.0.0.74", "--need", "daemon"], &[("SOFTRNIC_DAEMON", path)]);
    softrnicd.kill().unwrap();
    softrnicd.wait().unwrap();
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(line(&stdout(&out), "softrnicd").contains(&format!("accepts connections at {path}")), "{}", stdout(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lab needs root: asked for, the verdict follows who runs the test.
#[test]
fn the_lab_asked_for_follows_root() {
    let out = doctor(&["--addr", "127.0.0.75", "--need", "lab"], &[]);
    let text = stdout(&out);
    let root = rustix::process::geteuid().is_root();
    let lab = line(&text, "root (the lab)");
    if root {
        assert!(lab.starts_with("ok"), "{text}");
    } else {
        assert!(lab.starts_with("FAIL") && lab.contains("sudo"), "{text}");
        assert_eq!(out.status.code(), Some(1), "{text}");
    }
}

#[test]
fn an_unknown_need_names_the_ones_there_are() {
    let out = doctor(&["--need", "warp"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for need in ["programs", "run", "daemon", "lab", "loss"] {
        assert!(err.contains(need), "{need} missing from: {err}");
    }
}

/// `softrnic env`'s lines, evaluated by a shell, put unmodified programs
/// on softrnic: `ibv_devices` lists softrnic0 (the library is built
/// before the tests run; without it or ibverbs-utils a developer's
/// machine skips, CI fails).
#[test]
fn softrnic_env_puts_unmodified_programs_on_softrnic() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let env = Command::new(env!("CARGO_BIN_EXE_softrnic")).args(["env", "--addr", "127.0.0.76"]).output().unwrap();
    let lines = stdout(&env);
    if !env.status.success() {
        let why = String::from_utf8_lossy(&env.stderr);
        assert!(why.contains("scripts/build-libibverbs.sh"), "{why}");
        assert!(!ci, "CI builds the library first: {why}");
        eprintln!("skipped: {why}");
        return;
    }
    assert!(
        lines.starts_with("export LD_LIBRARY_PATH='") && lines.contains("export SOFTRNIC_ADDR='127.0.0.76'"),
        "{lines}"
    );
    // The build's softrnicd, for SOFTRNIC_DAEMON=start.
    assert!(lines.contains("export SOFTRNIC_DAEMON_BIN='") && lines.contains("softrnicd'"), "{lines}");
    // The same variables as NAME=value lines ($GITHUB_ENV, --env-file).
    let plain = Command::new(env!("CARGO_BIN_EXE_softrnic"))
        .args(["env", "--addr", "127.0.0.76", "--format", "plain"])
        .output()
        .unwrap();
    let plain = stdout(&plain);
    assert!(plain.starts_with("LD_LIBRARY_PATH=/") && plain.contains("\nSOFTRNIC_ADDR=127.0.0.76\n"), "{plain}");
    let script = format!("{lines}\nexec ibv_devices");
    let out = Command::new("sh").args(["-c", &script]).env_remove("SOFTRNIC_DAEMON").output().unwrap();
    if out.status.code() == Some(127) && !ci {
        eprintln!("skipped: needs ibv_devices (apt-get install ibverbs-utils)");
        return;
    }
    assert!(stdout(&out).contains("softrnic0"), "{out:?}");
}
