//! Waiting for a server to listen before its client starts.
//!
//! perftest's and iperf3's clients try to connect once and exit if no one
//! listens, and a server opening its device through a daemon on a loaded
//! machine may take longer than any fixed pause. So the runner watches the
//! server's own network namespace (`/proc/PID/net/tcp`, which is the
//! namespace of that process, container or not) until a socket listens on
//! its port.

use std::process::Child;
use std::time::{Duration, Instant};

/// The state `/proc/net/tcp` writes for a listening socket.
const LISTEN: &str = "0A";

/// Waits up to `limit` until `server` (or a process in its network
/// namespace) listens on TCP `port`; an error if it exits first or the
/// limit passes.
pub(super) fn wait_for_listener(server: &mut Child, port: u16, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if listens(server.id(), port) {
            return Ok(());
        }
        if let Ok(Some(status)) = server.try_wait() {
            return Err(format!("the server exited ({status}) before it listened on port {port}"));
        }
        if start.elapsed() > limit {
            return Err(format!("the server did not listen on port {port} within {}s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a socket in `pid`'s network namespace listens on `port`.
fn listens(pid: u32, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(|table| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
            .is_ok_and(|text| text.lines().skip(1).any(|line| is_listener_on(line, port)))
    })
}

/// Whether one row of `/proc/net/tcp` (`sl local_address rem_address st
/// ...`, the address as `HEXADDR:HEXPORT`) is a listener on `port`.
fn is_listener_on(row: &str, port: u16) -> bool {
    let fields: Vec<&str> = row.split_whitespace().collect();
    let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else { return false };
    let local_port = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
    *state == LISTEN && local_port == Some(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_a_listener_on_its_port_only_in_the_listen_state() {
        let listening =
            "   3: 0100007F:5BA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1";
        let connected =
            "   4: 0100007F:5BA0 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1";
        assert!(is_listener_on(listening, 23456));
        assert!(!is_listener_on(listening, 23457));
        assert!(!is_listener_on(connected, 23456));
        assert!(!is_listener_on("garbage", 23456));
    }

    #[test]
    fn a_listener_in_this_process_is_found_and_a_closed_port_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens(std::process::id(), port));
        drop(listener);
        assert!(!listens(std::process::id(), port));
    }
}
