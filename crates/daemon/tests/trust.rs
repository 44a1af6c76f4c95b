//! Whom a program trusts with its memory (SECURITY.md, issue 31): a
//! program sends softrnicd the memory behind its registrations, so it
//! connects only to a daemon run by its own user or by root.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use softrnic_provider::client::Session;

/// A listener bound by another user (nobody) where a program looks for
/// softrnicd: the program refuses it, saying whose it is, before sending
/// anything. Giving a process another user's identity needs root, so this
/// runs as root (CI does) and says why it skips otherwise.
#[test]
fn a_daemon_of_another_user_is_refused() {
    if !rustix::process::geteuid().is_root() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root and must run this test");
        eprintln!("skipped: a listener of another user needs root");
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
