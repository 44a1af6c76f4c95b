//! How a switch is built: its ports, queues and thresholds. Sizes are in
//! bytes, rates in bits per second, times as durations.

use std::time::Duration;

use crate::aggregation::AggregationConfig;

/// Egress queues per port unless a configuration says otherwise: the
/// control queue and two data classes.
pub const QUEUES: usize = 3;

/// A whole switch.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchConfig {
    pub ports: Vec<PortConfig>,
    /// Egress queues per port. Queue 0 is the strict-priority class for
    /// CNPs and acknowledgements; data takes queues 1.. by DSCP class.
    pub queues_per_port: usize,
    /// Bytes all queues of all ports share, as a switch's packet buffer.
    pub shared_buffer: u64,
    /// Seeds ECMP's hash and the random choices (RED, link faults), so a
    /// run can be repeated exactly.
    pub seed: u64,
    /// In-network aggregation; `None` forwards aggregation packets like
    /// any other.
    pub aggregation: Option<AggregationConfig>,
}

impl SwitchConfig {
    /// `ports` identical ports with [`QUEUES`] queues each, `shared_buffer`
    /// bytes.
    pub fn uniform(ports: usize, port: PortConfig, shared_buffer: u64, seed: u64) -> SwitchConfig {
        SwitchConfig { ports: vec![port; ports], queues_per_port: QUEUES, shared_buffer, seed, aggregation: None }
    }
}

/// One port: its line rate and what its egress queues may hold.
#[derive(Debug, Clone, PartialEq)]
pub struct PortConfig {
    pub rate_bps: u64,
    /// Bytes the port may send back to back after an idle spell. One
    /// packet gives an exact line rate; a real switch driven by a busy
    /// loop needs a little more to ride over its own scheduling jitter.
    pub burst: u64,
    /// Bytes one egress queue may hold, whatever the shared pool has left.
    pub queue_limit: u64,
    /// ECN marking at dequeue; `None` never marks.
    pub red: Option<RedConfig>,
    /// Priority flow control of the upstream link; `None` drops instead.
    pub pfc: Option<PfcConfig>,
    pub faults: LinkFaults,
}

impl PortConfig {
    /// A port at `rate_bps` with HPCC's ECN thresholds for that rate and a
    /// queue limit of `queue_limit` bytes.
    pub fn new(rate_bps: u64, queue_limit: u64) -> PortConfig {
        PortConfig {
            rate_bps,
            burst: 0,
            queue_limit,
            red: Some(RedConfig::for_rate(rate_bps)),
            pfc: None,
            faults: LinkFaults::NONE,
        }
    }
}

/// RED-style ECN marking, as DCQCN deployments configure it: never below
/// `kmin` bytes queued, with a probability rising linearly to `pmax` at
/// `kmax`, always above `kmax`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RedConfig {
    pub kmin: u64,
    pub kmax: u64,
    pub pmax: f64,
}

impl RedConfig {
    /// HPCC's ns-3 configuration scaled to the link: Kmin 4 KB and Kmax
    /// 16 KB per Gb/s (100 and 400 KB at 25 Gb/s, 400 and 1600 KB at
    /// 100 Gb/s), Pmax 0.2.
    pub fn for_rate(rate_bps: u64) -> RedConfig {
        let gbps = (rate_bps / 1_000_000_000).max(1);
        RedConfig { kmin: 4_000 * gbps, kmax: 16_000 * gbps, pmax: 0.2 }
    }
}

/// Pause the upstream sender of a priority once its packets hold more than
/// `xoff` bytes of this switch's buffer; resume below `xon`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcConfig {
    pub xoff: u64,
    pub xon: u64,
}

/// What a port's outgoing link does to packets, as netem would.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFaults {
    /// Probability (0 to 1) that a packet is lost.
    pub loss: f64,
    /// Every packet arrives this much later.
    pub delay: Duration,
    /// Probability that a packet is held back by up to `reorder_by` more,
    /// so later packets overtake it.
    pub reorder: f64,
    pub reorder_by: Duration,
}

impl LinkFaults {
    pub const NONE: LinkFaults =
        LinkFaults { loss: 0.0, delay: Duration::ZERO, reorder: 0.0, reorder_by: Duration::from_micros(50) };
}
