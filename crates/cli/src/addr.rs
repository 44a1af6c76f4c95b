//! Which address a command's device takes: the one place that reads
//! `SOFTRNIC_ADDR` for the command-line tool.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};

/// `SOFTRNIC_ADDR`, if set.
pub fn from_env() -> Result<Option<IpAddr>, String> {
    match std::env::var("SOFTRNIC_ADDR") {
        Ok(text) => text.parse().map(Some).map_err(|_| format!("SOFTRNIC_ADDR={text:?} is not an IP address")),
        Err(_) => Ok(None),
    }
}

/// This end's device address: `given` (`--addr`), else `SOFTRNIC_ADDR`,
/// else the address this machine would use to reach `peer`.
pub fn device_addr(given: Option<IpAddr>, peer: Option<IpAddr>) -> Result<IpAddr, String> {
    if let Some(addr) = given.map_or_else(from_env, |a| Ok(Some(a)))? {
        return Ok(addr);
    }
    match peer {
        // Connecting a UDP socket sends nothing; it only picks the route.
        Some(peer) => UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
            .and_then(|s| s.connect((peer, 9)).and_then(|()| s.local_addr()))
            .map(|a| a.ip())
            .map_err(|e| format!("no route to {peer}: {e}")),
        None => Err("a server needs its device address: give --addr (or SOFTRNIC_ADDR), e.g. --addr 127.0.0.3".into()),
    }
}

/// The flags of a command with two ends, a server and a client
/// (`softrnic careful`, `softrnic storage`).
#[derive(clap::Args, Debug, Clone)]
pub struct Ends {
    /// Serve clients instead of measuring.
    #[arg(long, conflicts_with = "client")]
    pub server: bool,
    /// Measure against a server.
    #[arg(long)]
    pub client: bool,
    /// This end's address: its softrnic device, and where a server listens
    /// (default: SOFTRNIC_ADDR, else the address that reaches the server).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// The server's address (client).
    #[arg(long, required_if_eq("client", "true"))]
    pub server_addr: Option<IpAddr>,
}

/// Which end runs, with its device's address.
pub enum End {
    Server(IpAddr),
    Client { addr: IpAddr, server: IpAddr },
}

impl Ends {
    pub fn end(&self) -> Result<End, String> {
        let addr = device_addr(self.addr, self.server_addr)?;
        match (self.server, self.client, self.server_addr) {
            (true, _, _) => Ok(End::Server(addr)),
            (false, true, Some(server)) => Ok(End::Client { addr, server }),
            (false, true, None) => Err("--client needs --server-addr".into()),
            (false, false, _) => Err("give --server or --client (the other end runs the other)".into()),
        }
    }
}
