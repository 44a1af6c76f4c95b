//! What a switch counts, per port and per egress queue, and the queue
//! depths it samples over time (the series an incast figure draws).

use crate::Time;
use crate::pipeline::PortId;

/// One port's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Arrived here but matched no route (or was not IP).
    pub no_route: u64,
    /// Lost on this port's link on purpose ([`crate::LinkFaults`]).
    pub link_lost: u64,
    /// Pause (XOFF) signals this port sent upstream, and resumes (XON).
    pub pause_sent: u64,
    pub resume_sent: u64,
    /// Packets that could record no INT hop: their records were full.
    pub int_full: u64,
}

/// One egress queue's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    pub enqueued: u64,
    /// Dropped on arrival: the queue's limit or the shared pool was full.
    pub dropped: u64,
    pub dropped_bytes: u64,
    /// Left with ECN CE set by this switch.
    pub marked: u64,
    /// The most bytes this queue has held.
    pub max_bytes: u64,
}

/// A queue's depth at one moment, and its peak since the sample before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSample {
    pub time: Time,
    pub port: PortId,
    pub queue: usize,
    pub bytes: u64,
    pub peak_bytes: u64,
    /// Counters so far, so rates between samples can be derived.
    pub counters: QueueCounters,
}
