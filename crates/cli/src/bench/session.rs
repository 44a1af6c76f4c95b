//! One end of a benchmark: its device, buffer, CQ and QPs, connected to the
//! other end through the TCP exchange.

use std::time::Duration;

use softrnic::exchange::Exchange;
use softrnic::{
    Access, CompletionQueue, ConnectOptions, Context, Endpoint, MemoryRegion, ProtectionDomain, QpCaps, QueuePair,
};

use super::params::Params;

pub struct Session {
    pub ctx: Context,
    _pd: ProtectionDomain,
    pub mr: MemoryRegion,
    pub cq: CompletionQueue,
    pub qps: Vec<QueuePair>,
    /// The peer's endpoints, one per QP (its buffer is the same for all).
    pub remote: Vec<Endpoint>,
    pub exchange: Exchange,
    pub params: Params,
    pub timeout: Duration,
}

/// Which end of the exchange this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Client,
    Server,
}

impl Session {
    /// Opens the device, allocates everything, swaps endpoints with the
    /// peer and connects every QP (with this end's `qp_timeout`, perftest's
    /// `-u`).
    pub fn open(
        ctx: Context,
        params: Params,
        mut exchange: Exchange,
        end: End,
        timeout: Duration,
        qp_timeout: u8,
    ) -> Result<Session, String> {
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        // Outgoing slots, then as many incoming ones (SEND receives).
        let len = 2 * params.qps * params.qp_stride() + 64;
        let mr = pd
            .register(len, Access::LOCAL_WRITE | Access::REMOTE)
            .map_err(|e| format!("cannot register {len} bytes: {e}"))?;
        let depth = (params.tx_depth * 2 + 16) as u32;
        let cq = ctx.create_cq((depth as usize) * params.qps * 2 + 1024).map_err(|e| e.to_string())?;
        let caps = QpCaps { max_send_wr: depth, max_recv_wr: depth.max(1024), ..QpCaps::default() };
        let qps = (0..params.qps)
            .map(|_| pd.create_rc_qp(&cq, &cq, caps))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut remote = Vec::with_capacity(qps.len());
        let ex = |e: softrnic::Error| e.to_string();
        for qp in &qps {
            let local = qp.endpoint(&mr);
            let peer = match end {
                End::Client => {
                    exchange.send(&local).map_err(ex)?;
                    exchange.receive().map_err(ex)?
                }
                End::Server => {
                    let peer = exchange.receive().map_err(ex)?;
                    exchange.send(&local).map_err(ex)?;
                    peer
                }
            };
            remote.push(peer);
        }
        let options = ConnectOptions {
            mtu: params.mtu,
            selective_repeat: params.selective_repeat,
            authenticate: params.authenticate,
            timeout: qp_timeout,
            ..ConnectOptions::default()
        };
        for (qp, peer) in qps.iter().zip(&remote) {
            qp.connect(peer, &options).map_err(|e| format!("cannot connect QP {:#x}: {e}", qp.qpn()))?;
        }
        exchange.barrier().map_err(ex)?;
        Ok(Session { ctx, _pd: pd, mr, cq, qps, remote, exchange, params, timeout })
    }

    /// This end's address line for the banner.
    pub fn describe_local(&self) -> String {
        let qp = &self.qps[0];
        describe(&qp.endpoint(&self.mr))
    }

    pub fn describe_remote(&self) -> String {
        describe(&self.remote[0])
    }

    /// Offset of message slot `slot` of QP `q` in either end's buffer.
    pub fn offset(&self, q: usize, slot: usize, size: usize) -> usize {
        q * self.params.qp_stride() + slot * size
    }

    /// Offset of receive slot `slot` of QP `q`: apart from the outgoing
    /// slots, so a bidirectional SEND test never overwrites what it sends.
    pub fn recv_offset(&self, q: usize, slot: usize, size: usize) -> usize {
        self.params.qps * self.params.qp_stride() + self.offset(q, slot, size)
    }
}

fn describe(e: &Endpoint) -> String {
    format!("GID {} QPN {:#06x} PSN {:#08x} RKey {:#08x} VAddr {:#016x}", e.gid, e.qpn, e.psn.value(), e.rkey, e.addr)
}

/// The bytes message `seed` of a verified run carries.
pub fn pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

impl Session {
    /// Waits for the peer's next line while its requests keep arriving; fails
    /// only when packets stop coming for longer than the timeout. Sleeps
    /// between looks so the engine thread has the CPU.
    pub fn wait_for_line(&mut self) -> Result<String, String> {
        let mut last_packets = self.ctx.counters().transport.rx_packets;
        let mut last_change = std::time::Instant::now();
        loop {
            if let Some(line) = self.exchange.try_read_line().map_err(|e| e.to_string())? {
                return Ok(line);
            }
            let packets = self.ctx.counters().transport.rx_packets;
            if packets != last_packets {
                (last_packets, last_change) = (packets, std::time::Instant::now());
            } else if last_change.elapsed() > self.timeout {
                return Err(format!("the peer went quiet for {:?}", self.timeout));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
