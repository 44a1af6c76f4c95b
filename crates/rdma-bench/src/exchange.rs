//! The TCP conversation around a run: the client names the workload and
//! its QPs; the server answers with its own once they can receive; at the
//! end the server says whether every byte verified.
//!
//! ```text
//! client: rdma_bench threads=2 pack=64 outstanding=48 messages=1000
//! client: qp 17 1234 5 00000000000000000000ffff7f000002      (one per thread)
//! server: qp 18 5678 5 00000000000000000000ffff7f000001      (one per thread)
//! server: done ok                                            (or: done failed)
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::verbs::QpInfo;

/// What the client asks of every QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    pub threads: u32,
    pub pack_size: u32,
    pub outstanding: u32,
    pub messages: u64,
    /// Whether messages carry the pattern and the server checks it (the
    /// client's `-noVerify` turns both off).
    pub verify: bool,
}

/// One end of the conversation.
pub struct Channel {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// How long a client keeps knocking before saying the server is absent.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

impl Channel {
    /// The server's end: waits for one client at `addr`.
    pub fn accept(addr: &str, port: u16) -> Result<Channel, String> {
        let listener = TcpListener::bind((addr, port)).map_err(|e| {
            format!("cannot listen on {addr}:{port} ({e}); is -serverIp an address of this host, and -port free?")
        })?;
        let (stream, _) = listener.accept().map_err(|e| format!("accept on {addr}:{port}: {e}"))?;
        Channel::new(stream)
    }

    /// The client's end: connects to the server, retrying while it starts.
    pub fn connect(addr: &str, port: u16) -> Result<Channel, String> {
        let start = Instant::now();
        loop {
            match TcpStream::connect((addr, port)) {
                Ok(stream) => return Channel::new(stream),
                Err(e) if start.elapsed() >= CONNECT_PATIENCE => {
                    return Err(format!(
                        "no rdma_bench server at {addr}:{port} after {} s ({e}); start it first (-nodeId 0 -serverIp {addr}) or check -serverIp and -port",
                        CONNECT_PATIENCE.as_secs()
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn new(stream: TcpStream) -> Result<Channel, String> {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Channel { reader: BufReader::new(stream), writer })
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.writer, "{line}").map_err(|e| format!("the other end went away: {e}"))
    }

    fn receive(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("the other end closed the connection".to_string()),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) => Err(format!("the other end went away: {e}")),
        }
    }

    pub fn send_workload(&mut self, w: &Workload) -> Result<(), String> {
        self.send(&format!(
            "rdma_bench threads={} pack={} outstanding={} messages={} verify={}",
            w.threads,
            w.pack_size,
            w.outstanding,
            w.messages,
            u8::from(w.verify)
        ))
    }

    pub fn receive_workload(&mut self) -> Result<Workload, String> {
        let line = self.receive()?;
        parse_workload(&line).ok_or_else(|| format!("not an rdma_bench client: it said {line:?}"))
    }

    pub fn send_qps(&mut self, qps: &[QpInfo]) -> Result<(), String> {
        for qp in qps {
            let gid: String = qp.gid.iter().map(|b| format!("{b:02x}")).collect();
            self.send(&format!("qp {} {} {} {gid}", qp.qpn, qp.psn, qp.mtu))?;
        }
        Ok(())
    }

    pub fn receive_qps(&mut self, count: u32) -> Result<Vec<QpInfo>, String> {
        (0..count)
            .map(|_| {
                let line = self.receive()?;
                parse_qp(&line).ok_or_else(|| format!("expected a QP from the other end, got {line:?}"))
            })
            .collect()
    }

    /// The server's verdict on the data.
    pub fn send_verdict(&mut self, ok: bool) -> Result<(), String> {
        self.send(if ok { "done ok" } else { "done failed" })
    }

    pub fn receive_verdict(&mut self) -> Result<bool, String> {
        match self.receive()?.as_str() {
            "done ok" => Ok(true),
            "done failed" => Ok(false),
            other => Err(format!("expected the server's verdict, got {other:?}")),
        }
    }
}

fn parse_workload(line: &str) -> Option<Workload> {
    let mut words = line.split_whitespace();
    (words.next()? == "rdma_bench").then_some(())?;
    let mut field = |name: &str| -> Option<u64> { words.next()?.strip_prefix(name)?.strip_prefix('=')?.parse().ok() };
    Some(Workload {
        threads: field("threads")?.try_into().ok()?,
        pack_size: field("pack")?.try_into().ok()?,
        outstanding: field("outstanding")?.try_into().ok()?,
        messages: field("messages")?,
        // Clients before -noVerify did not say: they verified.
        verify: field("verify").is_none_or(|v| v != 0),
    })
}

fn parse_qp(line: &str) -> Option<QpInfo> {
    let mut words = line.split_whitespace();
    (words.next()? == "qp").then_some(())?;
    let qpn = words.next()?.parse().ok()?;
    let psn = words.next()?.parse().ok()?;
    let mtu = words.next()?.parse().ok()?;
    let hex = words.next()?;
    if hex.len() != 32 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, byte) in gid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(QpInfo { qpn, psn, gid, mtu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let w = Workload { threads: 8, pack_size: 64, outstanding: 48, messages: 512_000, verify: true };
        let line = "rdma_bench threads=8 pack=64 outstanding=48 messages=512000";
        assert_eq!(parse_workload(line), Some(w));
        let quiet = Workload { verify: false, ..w };
        assert_eq!(parse_workload(&format!("{line} verify=0")), Some(quiet));
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 127, 0, 0, 2]);
        let qp = parse_qp("qp 17 1234 5 00000000000000000000ffff7f000002").unwrap();
        assert_eq!(qp, QpInfo { qpn: 17, psn: 1234, gid, mtu: 5 });
        assert_eq!(parse_qp("qp 17 1234 5 00ff"), None);
        assert_eq!(parse_workload("GET / HTTP/1.1"), None);
    }
}
