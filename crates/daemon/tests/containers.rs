//! A program in namespaces of its own, as a container runtime makes them
//! (network, mount, PID, IPC, UTS), reaches the host's softrnicd through
//! its socket alone, and its devices live in its own network namespace;
//! two such containers reach each other through the daemon's embedded
//! switch.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::{Tenant, daemon, daemon_switched, pattern};
use softrnic_provider::client::Session;
use softrnic_transport::{
    Psn, RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, WcOpcode, WcStatus, smallvec,
};

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

/// The container's side of the switch test: `role` is `a` (sends) or `b`
/// (receives); the lines on stdin and stdout are the rendezvous the
/// parent relays, as a program's out-of-band exchange would be.
const SWITCH_CHILD: &str = "SOFTRNICD_TEST_SWITCH_ROLE";
const A: &str = "127.0.0.5";
const B: &str = "127.0.0.6";
const MESSAGE: usize = 40_000;

fn switched_container(socket: &Path, role: &str) {
    let up = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("ip");
    assert!(up.success(), "lo up in the container");
    let (me, peer): (IpAddr, IpAddr) = match role {
        "a" => (A.parse().unwrap(), B.parse().unwrap()),
        _ => (B.parse().unwrap(), A.parse().unwrap()),
    };
    let tenant = Tenant::open(socket, me);
    println!("hello {} {}", tenant.qp.qpn, tenant.psn.value());
    let mut lines = std::io::stdin().lock().lines().map(|l| l.expect("stdin"));
    let theirs = lines.next().expect("the peer's hello");
    let mut words = theirs.split_whitespace().skip(1).map(|w| w.parse::<u32>().expect("a number"));
    let (qpn, psn) = (words.next().unwrap(), Psn::new(words.next().unwrap()));
    tenant.connect_to(peer, qpn, psn);
    if role == "b" {
        let sges = smallvec![Sge { addr: tenant.iova(0), length: MESSAGE as u32, lkey: tenant.keys.lkey }];
        tenant.session.post_recv(&tenant.qp, &RecvWorkRequest { wr_id: 9, sges }).unwrap();
    }
    println!("connected");
    assert_eq!(lines.next().as_deref(), Some("go"));
    match role {
        "a" => {
            tenant.write(0, &pattern(MESSAGE, 3));
            let send = SendWorkRequest::new(1, SendOp::Send { imm: None }, tenant.sge(0, MESSAGE as u32));
            tenant.session.post_send(&tenant.qp, &send).unwrap();
            assert_eq!(tenant.wait(1)[0].status, WcStatus::Success);
            println!("sent");
        }
        _ => {
            let got = tenant.wait(1);
            assert_eq!((got[0].wr_id, got[0].status, got[0].opcode), (9, WcStatus::Success, WcOpcode::Recv));
            assert_eq!(got[0].byte_len as usize, MESSAGE);
            assert_eq!(tenant.read(0, MESSAGE), pattern(MESSAGE, 3));
            println!("received {MESSAGE} bytes intact");
        }
    }
}

/// A container of the switch test, killed if the test fails first.
struct Container {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Container {
    fn start(socket: &Path, role: &str) -> Container {
        let mut child = Command::new("unshare")
            .args(["--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child"])
            .arg(std::env::current_exe().unwrap())
            .args(["--exact", SWITCH_TEST, "--nocapture", "--test-threads=1"])
            .env(CHILD, socket)
            .env(SWITCH_CHILD, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let (stdin, stdout) = (child.stdin.take(), BufReader::new(child.stdout.take().unwrap()));
        Container { child, stdin, stdout }
    }

    /// What it says from `what` on, in its next line that says it (the
    /// test harness prints too, the test's name ahead of its first line).
    fn says(&mut self, what: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the container ended before it said `{what}`");
            if let Some(at) = line.find(what) {
                return line[at..].trim_end().to_owned();
            }
        }
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{line}").unwrap();
    }
}

const SWITCH_TEST: &str = "two_containers_with_no_network_between_them_talk_through_the_embedded_switch";

/// Each container has only its own loopback: in B's namespace A's address
/// is B's own, so no datagram of A's could reach B through any network.
/// The daemon's embedded switch carries them.
#[test]
fn two_containers_with_no_network_between_them_talk_through_the_embedded_switch() {
    if let (Ok(socket), Ok(role)) = (std::env::var(CHILD), std::env::var(SWITCH_CHILD)) {
        return switched_container(Path::new(&socket), &role);
    }
    if !rustix::process::geteuid().is_root() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root and must run this test");
        eprintln!("skipped: making namespaces and serving them (setns) needs root");
        return;
    }
    let daemon = daemon_switched("switch");
    let (mut a, mut b) = (Container::start(daemon.socket(), "a"), Container::start(daemon.socket(), "b"));
    let (hello_a, hello_b) = (a.says("hello"), b.says("hello"));
    a.tell(&hello_b);
    b.tell(&hello_a);
    a.says("connected");
    b.says("connected");
    a.tell("go");
    b.tell("go");
    assert_eq!(b.says("received"), format!("received {MESSAGE} bytes intact"));
    a.says("sent");
    for mut container in [a, b] {
        container.stdin = None;
        assert!(container.child.wait().unwrap().success());
    }
}
