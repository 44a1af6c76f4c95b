//! `SOFTRNIC_TRACE=1`: one line per datagram sent or received, with the
//! decoded headers, from whichever shard moved it.

use std::net::{IpAddr, SocketAddr};

/// Prints datagrams of one device, timed from its opening.
#[derive(Debug)]
pub(crate) struct Tracer {
    pub local: IpAddr,
    pub epoch: std::time::Instant,
}

impl Tracer {
    pub fn datagram(&self, direction: &str, peer: SocketAddr, bytes: &[u8]) {
        let t = self.epoch.elapsed().as_nanos();
        eprintln!(
            "{:>10}.{:06} {} {direction} {} {}",
            t / 1_000_000_000,
            t / 1000 % 1_000_000,
            self.local,
            peer.ip(),
            softrnic_wire::packet::summary(bytes)
        );
    }
}
