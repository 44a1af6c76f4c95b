//! The out-of-band exchange that connects two QPs, over TCP the way
//! perftest does it (port 18515 by default): each side sends one line with
//! its GID, QPN, PSN and a memory region's rkey, address and length.
//!
//! ```text
//! SOFTRNIC gid=127.0.0.2 qpn=0x11 psn=0x3f2a1c rkey=0x101 addr=0x7f0000001000 len=65536 sr=1
//! ```
//!
//! `sr=1` offers selective repeat; a peer that does not write it (an
//! older softrnic) does not offer it, and a connection uses it only when
//! both ends offer it and ask for it ([`crate::ConnectOptions`]).
//!
//! The same connection then serves as a barrier between the two ends.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrnic_transport::Psn;

use crate::Error;

/// perftest's default exchange port.
pub const DEFAULT_PORT: u16 = 18515;

/// What one side tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub gid: IpAddr,
    pub qpn: u32,
    pub psn: Psn,
    pub rkey: u32,
    pub addr: u64,
    pub len: u64,
    /// This end can recover from loss by selective repeat.
    pub selective_repeat: bool,
    /// This end can authenticate packets (it holds the shared secret).
    pub authenticate: bool,
}

impl Endpoint {
    pub fn to_line(&self) -> String {
        format!(
            "SOFTRNIC gid={} qpn={:#x} psn={:#x} rkey={:#x} addr={:#x} len={} sr={} auth={}\n",
            self.gid,
            self.qpn,
            self.psn.value(),
            self.rkey,
            self.addr,
            self.len,
            u8::from(self.selective_repeat),
            u8::from(self.authenticate)
        )
    }

    pub fn parse(line: &str) -> Result<Endpoint, Error> {
        let bad = |what: &str| Error::Exchange(format!("{what} in peer's line {:?}", line.trim()));
        let mut words = line.split_whitespace();
        if words.next() != Some("SOFTRNIC") {
            return Err(bad("not a softrnic peer (no SOFTRNIC tag)"));
        }
        let (mut gid, mut qpn, mut psn, mut rkey, mut addr, mut len) = (None, None, None, None, None, None);
        let (mut selective_repeat, mut authenticate) = (false, false);
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(|| bad("a word without '='"))?;
            let hex = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| bad(key));
            match key {
                "gid" => gid = Some(value.parse::<IpAddr>().map_err(|_| bad("gid"))?),
                "qpn" => qpn = Some(hex(value)? as u32),
                "psn" => psn = Some(Psn::new(hex(value)? as u32)),
                "rkey" => rkey = Some(hex(value)? as u32),
                "addr" => addr = Some(hex(value)?),
                "len" => len = Some(value.parse::<u64>().map_err(|_| bad("len"))?),
                "sr" => selective_repeat = value == "1",
                "auth" => authenticate = value == "1",
                _ => {}
            }
        }
        Ok(Endpoint {
            gid: gid.ok_or_else(|| bad("no gid"))?,
            qpn: qpn.ok_or_else(|| bad("no qpn"))?,
            psn: psn.ok_or_else(|| bad("no psn"))?,
            rkey: rkey.unwrap_or(0),
            addr: addr.unwrap_or(0),
            len: len.unwrap_or(0),
            selective_repeat,
            authenticate,
        })
    }
}

/// A connected exchange channel.
pub struct Exchange {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Exchange {
    fn new(stream: TcpStream, timeout: Duration) -> Result<Exchange, Error> {
        stream.set_read_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Exchange { reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    /// Waits for a client on `listener` (up to `timeout`).
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Exchange, Error> {
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    return Exchange::new(stream, timeout);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(Error::Exchange(format!("no client connected within {timeout:?}")));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Connects to a server, retrying until `timeout` while it starts up.
    pub fn connect(server: SocketAddr, timeout: Duration) -> Result<Exchange, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            match TcpStream::connect_timeout(&server, Duration::from_millis(500)) {
                Ok(stream) => return Exchange::new(stream, timeout),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => {
                    return Err(Error::Exchange(format!(
                        "no softrnic server answered at {server} within {timeout:?} ({e}); start one with `softrnic bench --server` there"
                    )));
                }
            }
        }
    }

    pub fn send(&mut self, endpoint: &Endpoint) -> Result<(), Error> {
        self.writer.write_all(endpoint.to_line().as_bytes())?;
        Ok(())
    }

    pub fn receive(&mut self) -> Result<Endpoint, Error> {
        Endpoint::parse(&self.read_line()?)
    }

    /// Sends a line of text (bench parameters, "done").
    pub fn send_text(&mut self, text: &str) -> Result<(), Error> {
        self.writer.write_all(format!("{}\n", text.trim_end()).as_bytes())?;
        Ok(())
    }

    pub fn read_line(&mut self) -> Result<String, Error> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(Error::Exchange("the peer closed the connection".into())),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(Error::Exchange("the peer stopped answering".into()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A line if one has arrived, without waiting.
    pub fn try_read_line(&mut self) -> Result<Option<String>, Error> {
        if !self.reader.buffer().contains(&b'\n') {
            self.writer.set_nonblocking(true)?;
            let mut byte = [0u8; 1];
            let ready = self.writer.peek(&mut byte);
            self.writer.set_nonblocking(false)?;
            match ready {
                Ok(0) => return Err(Error::Exchange("the peer closed the connection".into())),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
        self.read_line().map(Some)
    }

    /// Both sides wait here until both have arrived.
    pub fn barrier(&mut self) -> Result<(), Error> {
        self.send_text("sync")?;
        match self.read_line()?.as_str() {
            "sync" => Ok(()),
            other => Err(Error::Exchange(format!("expected sync, got {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_lines_round_trip() {
        let e = Endpoint {
            gid: "127.0.0.2".parse().unwrap(),
            qpn: 0x11,
            psn: Psn::new(0xabcdef),
            rkey: 0x101,
            addr: 0x7f00_0000_1000,
            len: 65536,
            selective_repeat: true,
            authenticate: true,
        };
        assert_eq!(Endpoint::parse(&e.to_line()).unwrap(), e);
        // An older peer's line, without `sr`, offers no selective repeat.
        let old = Endpoint::parse("SOFTRNIC gid=127.0.0.2 qpn=0x11 psn=0x1 rkey=0x1 addr=0x0 len=0").unwrap();
        assert!(!old.selective_repeat && !old.authenticate);
        assert!(Endpoint::parse("HELLO gid=1.2.3.4").is_err());
        assert!(Endpoint::parse("SOFTRNIC gid=nope qpn=1 psn=2").is_err());
    }
}
