//! A program in namespaces of its own, as a container runtime makes them
//! (network, mount, PID, IPC, UTS), reaches the host's softrnicd through
//! its socket alone, and its devices live in its own network namespace.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Tenant, daemon, pattern};
use softrnic_daemon::client::Session;
use softrnic_transport::{RemoteAddr, SendOp, SendWorkRequest, WcStatus};

const CHILD: &str = "SOFTRNICD_TEST_CONTAINER";

/// Runs in the container: two devices on its own loopback addresses, a
/// WRITE between them, and an address whose port the container holds
/// itself, which the daemon must then fail to open (it binds there).
fn container(socket: &Path) {
    let up = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("ip");
    assert!(up.success(), "lo up in the container");
    let taken = std::net::UdpSocket::bind(("127.0.0.7", 4791)).expect("the container's own port");
    let refused = Session::connect(socket, "127.0.0.7".parse().unwrap()).err().expect("the port is the container's");
    assert!(refused.to_string().contains("in use"), "{refused}");
    drop(taken);
    let (a, b) =
        (Tenant::open(socket, "127.0.0.5".parse().unwrap()), Tenant::open(socket, "127.0.0.6".parse().unwrap()));
    a.connect(&b);
    b.connect(&a);
    let data = pattern(8192, 7);
    a.write(0, &data);
    let remote = RemoteAddr { addr: b.iova(0), rkey: b.keys.rkey };
    a.session.post_send(&a.qp, &SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, a.sge(0, 8192))).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    assert_eq!(b.read(0, 8192), data);
    println!("container: the WRITE landed");
}

#[test]
fn a_program_in_namespaces_of_its_own_is_served_on_its_own_addresses() {
    if let Ok(socket) = std::env::var(CHILD) {
        return container(Path::new(&socket));
    }
    if !rustix::process::geteuid().is_root() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root and must run this test");
        eprintln!("skipped: making namespaces and serving them (setns) needs root");
        return;
    }
    let daemon = daemon("container");
    let out = Command::new("unshare")
        .args(["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "a_program_in_namespaces_of_its_own_is_served_on_its_own_addresses", "--nocapture"])
        .env(CHILD, daemon.socket())
        .output()
        .expect("unshare");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("the WRITE landed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Nothing of the container's is in the daemon's own namespace.
    assert!(daemon.counters("127.0.0.5".parse().unwrap()).is_none());
}
