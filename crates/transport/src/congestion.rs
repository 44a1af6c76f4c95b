//! Congestion control as a device sees it: which algorithm its QPs run,
//! the notification point's settings, and what travels beside a datagram
//! (the ECN mark it arrived with, INT records).
//!
//! The algorithms themselves are in the `softrnic-cc` crate; a QP holds
//! one algorithm's state (`qp/congestion.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use softrnic_cc::{Builtin, CongestionControl, IntHop, MAX_HOPS, Path};
use softrnic_wire::int;

/// Makes the per-QP state of one algorithm: a built-in, or a WebAssembly
/// module (the engine's `softrnic-cc-wasm`).
pub trait Algorithm: Send + Sync + fmt::Debug {
    /// The name users gave (`dcqcn`, `./algo.wasm`).
    fn name(&self) -> &str;
    /// A new QP's state on `path`.
    fn build(&self, path: &Path) -> Box<dyn CongestionControl + Send>;
    /// What it is made of, for another process to make it again
    /// (softrnicd runs the algorithm a program chose for its QP).
    fn spec(&self) -> AlgorithmSpec;
}

/// An algorithm as it travels between processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlgorithmSpec {
    /// A built-in by name, with its `key=value,...` parameters.
    Builtin { name: String, params: String },
    /// A WebAssembly module's bytes, the name it was given, its
    /// parameters.
    Module { name: String, bytes: Arc<[u8]>, params: String },
}

impl Algorithm for Builtin {
    fn name(&self) -> &str {
        Builtin::name(self)
    }

    fn spec(&self) -> AlgorithmSpec {
        AlgorithmSpec::Builtin { name: Builtin::name(self).to_string(), params: self.params().to_string() }
    }

    fn build(&self, path: &Path) -> Box<dyn CongestionControl + Send> {
        Builtin::build(self, path)
    }
}

/// The algorithm a QP runs, shared by the QPs that run it; `None` in
/// [`CongestionConfig::algorithm`] sends at line rate under the window.
#[derive(Clone)]
pub struct Choice(pub Arc<dyn Algorithm>);

impl Choice {
    /// A built-in by name with `key=value,...` parameters.
    pub fn builtin(name: &str, params: &str) -> Result<Choice, String> {
        Ok(Choice(Arc::new(Builtin::new(name, params)?)))
    }

    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Whether the algorithm steers by INT (asked of a QP built on a
    /// nominal path).
    pub fn wants_int(&self) -> bool {
        let path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };
        self.0.build(&path).wants_int()
    }
}

impl fmt::Debug for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Choice {
    fn eq(&self, other: &Choice) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Choice {}

/// A device's congestion settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CongestionConfig {
    /// What new QPs run unless told otherwise.
    pub algorithm: Option<Choice>,
    /// The link's rate, bits per second: the most an algorithm sets.
    pub line_rate_bps: u64,
    /// The path's round trip without queues, for algorithms that need it.
    pub base_rtt: Duration,
    /// Answer CE-marked packets with CNPs (NVIDIA's `roce_np` enable):
    /// on by default, whatever this device's own QPs run.
    pub notification_point: bool,
    /// The notification point sends a QP at most one CNP this often
    /// (NVIDIA's `min_time_between_cnps`, 4 µs by default).
    pub min_time_between_cnps: Duration,
    /// The DSCP CNPs carry (NVIDIA's `cnp_dscp`, 48 by default), so a
    /// switch can queue them ahead of data.
    pub cnp_dscp: u8,
    /// Accept and echo INT: a peer's HPCC may then stamp this device's
    /// path. Off, packets with INT are dropped as foreign.
    pub int: bool,
}

impl Default for CongestionConfig {
    fn default() -> Self {
        CongestionConfig {
            algorithm: None,
            notification_point: true,
            line_rate_bps: 100_000_000_000,
            base_rtt: Duration::from_micros(10),
            min_time_between_cnps: Duration::from_micros(4),
            cnp_dscp: 48,
            int: false,
        }
    }
}

// The algorithms' crate has no dependencies (a user's module builds
// against it alone), so it states the wire's bound again; here the two
// meet, and a packet's every record must reach the algorithm.
const _: () = assert!(MAX_HOPS == softrnic_wire::int::MAX_HOPS, "softrnic_cc::MAX_HOPS is the wire's int::MAX_HOPS");

/// The INT records a packet carried, hop by hop, in the algorithms' units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct IntRecords {
    hops: [IntHop; MAX_HOPS],
    len: u8,
}

impl IntRecords {
    pub fn new(hops: &[IntHop]) -> IntRecords {
        let mut records = IntRecords::default();
        let n = hops.len().min(MAX_HOPS);
        records.hops[..n].copy_from_slice(&hops[..n]);
        records.len = n as u8;
        records
    }

    /// Appends a switch's record; false when every record is taken.
    pub fn push(&mut self, hop: IntHop) -> bool {
        let Some(slot) = self.hops.get_mut(usize::from(self.len)) else {
            return false;
        };
        *slot = hop;
        self.len += 1;
        true
    }

    pub fn hops(&self) -> &[IntHop] {
        &self.hops[..usize::from(self.len)]
    }

    /// From the wire's records (rates in Mb/s).
    pub fn from_wire(hops: impl IntoIterator<Item = int::Hop>) -> IntRecords {
        let mut records = IntRecords::default();
        for (slot, hop) in records.hops.iter_mut().zip(hops) {
            *slot = IntHop {
                rate_bps: u64::from(hop.rate_mbps) * 1_000_000,
                timestamp_ns: hop.timestamp_ns,
                tx_bytes: hop.tx_bytes,
                queue_bytes: hop.queue_bytes,
                _reserved: 0,
            };
            records.len += 1;
        }
        records
    }

    /// In the wire's units.
    pub fn to_wire(&self) -> impl Iterator<Item = int::Hop> + '_ {
        self.hops().iter().map(|hop| int::Hop {
            rate_mbps: (hop.rate_bps / 1_000_000) as u32,
            timestamp_ns: hop.timestamp_ns,
            tx_bytes: hop.tx_bytes,
            queue_bytes: hop.queue_bytes,
        })
    }
}

/// What the network said about a datagram beside its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct RecvMeta {
    /// The IP header's ECN field was CE: a switch on the way was congested.
    pub ce: bool,
    /// The datagram came with an INT header: fresh records (a request
    /// whose path the switches stamped), or an echo of them (an answer).
    pub int: Option<IntRecords>,
    /// It came over a path within this host that carries no ICRC
    /// ([`crate::Egress::SameHost`]): none is checked.
    pub same_host: bool,
    /// It was sent to this multicast group (which the datapath joined),
    /// not to the device's own address.
    pub multicast_group: Option<std::net::IpAddr>,
}

/// What a datagram to send carries beside its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IntMark {
    /// Plain RoCEv2.
    #[default]
    None,
    /// Data whose path switches should record: an empty INT header.
    Collect,
    /// An answer that echoes the records its request collected.
    Echo(IntRecords),
}
