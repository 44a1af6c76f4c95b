//! Whom a program and softrnicd trust (SECURITY.md, issue 31): a program
//! sends softrnicd the memory behind its registrations, so it connects
//! only to a daemon run by its own user or by root; the daemon serves its
//! own user, root and the users its file allows, so many programs at once
//! and so many channels each, and shows a device's counters only where
//! they count one user's traffic.

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{address, daemon_with};
use softrnic_daemon::limits::{DaemonConfig, DaemonLimits, TenantLimits};
use softrnic_daemon_protocol::protocol::{self, PROTOCOL_VERSION, Request};
use softrnic_provider::client::Session;

/// Giving a process another user's identity needs root: CI runs as root
/// and must run these tests; elsewhere they say why they skip.
fn root_or_skip() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root and must run this test");
    eprintln!("skipped: a program of another user needs root");
    false
}

/// A program of user nobody that opens the device on `addr` through the
/// daemon at `socket`, prints the daemon's answer, and holds its
/// connection until its standard input closes.
fn nobody_opens(socket: &std::path::Path, addr: std::net::IpAddr) -> (Child, String) {
    // The request's bytes as the library sends them.
    let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let open = Request::Open { version: PROTOCOL_VERSION, addr, forward: false };
    protocol::send(ours.as_fd(), &open, &[]).unwrap();
    let mut bytes = vec![0u8; 4096];
    let n = theirs.recv(&mut bytes).unwrap();
    let hex: String = bytes[..n].iter().map(|b| format!("{b:02x}")).collect();
    let program = "import socket, sys\n\
                   s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                   s.connect(sys.argv[1])\n\
                   try: s.send(bytes.fromhex(sys.argv[2]))\n\
                   except OSError: pass\n\
                   print(repr(s.recv(4096)), flush=True)\n\
                   sys.stdin.read()\n";
    let mut child = Command::new("python3")
        .args(["-c", program])
        .arg(socket)
        .arg(hex)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (the verbs matrix needs it too)");
    let mut answer = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut answer).unwrap();
    (child, answer)
}

/// The daemon's socket opened to everyone, as an operator might: a
/// program of a user the daemon does not serve is refused at once, saying
/// how to allow it; one the file allows is served. Before, the socket's
/// mode was the only check.
#[test]
fn a_program_of_a_user_not_allowed_is_refused() {
    if !root_or_skip() {
        return;
    }
    for allowed in [false, true] {
        let daemon_uids = if allowed { vec![65534] } else { Vec::new() };
        let config = DaemonConfig {
            daemon: DaemonLimits { allow_uids: daemon_uids, ..DaemonLimits::default() },
            ..DaemonConfig::default()
        };
        let daemon = daemon_with(&format!("uids-{allowed}"), config);
        std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (mut nobody, answer) = nobody_opens(daemon.socket(), address());
        drop(nobody.stdin.take());
        nobody.wait().unwrap();
        let refused = answer.contains("uid 65534 is none of them") && answer.contains("allow_uids");
        assert_eq!(refused, !allowed, "{answer}");
    }
}

/// A program of another user holds the device on an address: the device's
/// counters count its traffic, so a root program on the same device is
/// not shown them; once it leaves, they are the root program's again.
#[test]
fn a_devices_counters_are_shown_only_where_one_user_holds_it() {
    if !root_or_skip() {
        return;
    }
    let config = DaemonConfig {
        daemon: DaemonLimits { allow_uids: vec![65534], ..DaemonLimits::default() },
        ..DaemonConfig::default()
    };
    let daemon = daemon_with("counters", config);
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let addr = address();
    let mine = Session::connect_with(daemon.socket(), addr, false).unwrap();
    assert!(mine.counters().is_ok(), "the device is mine alone");
    let (mut nobody, answer) = nobody_opens(daemon.socket(), addr);
    assert!(!answer.contains("Error"), "{answer}");
    let refused = mine.counters().unwrap_err().to_string();
    assert!(refused.contains("other users' programs"), "{refused}");
    drop(nobody.stdin.take());
    nobody.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while mine.counters().is_err() {
        assert!(Instant::now() < deadline, "the counters never came back");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every connection is a thread of the daemon's, every channel a socket
/// pair: at the daemon's limit a further program is refused with what to
/// do, and at a tenant's a further channel, until one is given back.
#[test]
fn connections_and_channels_are_held_to_their_limits() {
    let config = DaemonConfig {
        tenant: TenantLimits { max_channels: 2, ..TenantLimits::default() },
        daemon: DaemonLimits { max_connections: 2, ..DaemonLimits::default() },
    };
    let daemon = daemon_with("connections", config);
    let first = Session::connect_with(daemon.socket(), address(), false).unwrap();
    let second = Session::connect_with(daemon.socket(), address(), false).unwrap();
    let refused = Session::connect_with(daemon.socket(), address(), false).err().expect("a third program").to_string();
    assert!(refused.contains("at most 2 programs at once") && refused.contains("max_connections"), "{refused}");
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    let _third = loop {
        match Session::connect_with(daemon.socket(), address(), false) {
            Ok(session) => break session,
            Err(e) => assert!(Instant::now() < deadline, "room never came back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let channels = [first.create_channel().unwrap(), first.create_channel().unwrap()];
    let refused = first.create_channel().err().expect("a third channel").to_string();
    assert!(refused.contains("at most 2 completion channels"), "{refused}");
    first.destroy_channel(&channels[0]).unwrap();
    first.create_channel().expect("room for one again");
}

/// A listener bound by another user (nobody) where a program looks for
/// softrnicd: the program refuses it, saying whose it is, before sending
/// anything. Giving a process another user's identity needs root, so this
/// runs as root (CI does) and says why it skips otherwise.
#[test]
fn a_daemon_of_another_user_is_refused() {
    if !root_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("softrnic-trust-{}", std::process::id()));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = dir.join("softrnicd.sock");
    let listen = "import socket, sys\n\
                  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                  s.bind(sys.argv[1]); s.listen()\n\
                  print('ready', flush=True)\n\
                  c, _ = s.accept(); c.recv(1)\n";
    let mut impostor = Command::new("python3")
        .args(["-c", listen])
        .arg(&socket)
        .uid(65534)
        .gid(65534)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (the verbs matrix needs it too)");
    let mut ready = String::new();
    BufReader::new(impostor.stdout.take().unwrap()).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    let refused = Session::connect_with(&socket, "127.0.0.1".parse().unwrap(), false).err().map(|e| e.to_string());
    let _ = impostor.kill();
    let _ = impostor.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let refused = refused.expect("connected to another user's daemon");
    assert!(refused.contains("runs as uid 65534, neither you (uid 0) nor root"), "{refused}");
}
