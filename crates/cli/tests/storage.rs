//! `softrnic storage` (E7's service) with the engine in each program: the
//! designs that need no daemon serve and check every block, the offloaded
//! ones are refused with what to do, and a connection that speaks
//! nonsense ends alone while the server goes on serving.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const SERVER: &str = "127.62.0.1";
const PORT: u16 = 23_700;

fn softrnic() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_softrnic"));
    command.env("SOFTRNIC_DAEMON", "off");
    command
}

/// The server, once it listens.
fn server() -> Child {
    let child = softrnic()
        .args(["storage", "--server", "--addr", SERVER, "--port", &PORT.to_string(), "--store-mib", "4"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the storage server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect((SERVER, PORT)).is_err() {
        assert!(Instant::now() < deadline, "the server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn client(design: &str, addr: &str) -> Output {
    softrnic()
        .args(["storage", "--client", "--addr", addr, "--server-addr", SERVER, "--port", &PORT.to_string()])
        .args(["--design", design, "--threads", "2", "--blocks", "32", "--seconds", "0.5", "--corrupt"])
        .output()
        .expect("run the storage client")
}

#[test]
fn blocks_round_trip_checked_and_the_offloads_are_refused_without_a_daemon() {
    let mut server = server();
    // Nonsense first: this connection ends, the server does not.
    let mut stranger = TcpStream::connect((SERVER, PORT)).unwrap();
    stranger.write_all(b"GET / HTTP/1.1\n").unwrap();
    stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut line = String::new();
    assert_eq!(BufReader::new(&stranger).read_line(&mut line).unwrap_or(0), 0, "closed: {line:?}");

    for (design, addr) in [("cpu", "127.62.0.2"), ("tcp", "127.62.0.3")] {
        let out = client(design, addr);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{design}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("corrupt block: refused with a CRC error"), "{design}: {text}");
        let mops: f64 = text.split_once("Total Speed: ").unwrap().1.split_whitespace().next().unwrap().parse().unwrap();
        assert!(mops > 0.0, "{text}");
        assert!(text.contains("every CRC and byte checked"), "{text}");
    }
    let out = client("crc-copy", "127.62.0.4");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("block offloads run in softrnicd"), "{err}");

    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn bad_flags_say_what_is_wrong() {
    let out = softrnic().args(["storage", "--client", "--addr", "127.62.0.9"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--server-addr"), "{err}");
    let out = softrnic()
        .args(["storage", "--client", "--addr", "127.62.0.9", "--server-addr", SERVER, "--seconds", "0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--seconds"), "{err}");
    let out = softrnic().args(["storage", "--server", "--design", "gzip"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("crc-copy"), "possible values named: {err}");
}
