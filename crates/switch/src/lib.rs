//! The switch pipeline: what a switch does to a packet, as a sans-IO state
//! machine in the shape of the transport (`handle_*` in, `poll_*` out, time
//! passed in). The real switch (`softrnic lab`, frames between the veths of
//! network namespaces) and the simulator (packets between simulated links)
//! drive this same code, so a queue seen in one is the queue of the other.
//!
//! A packet's way through a [`Switch`]:
//!
//! ```text
//! handle_packet(in_port) ─> route (longest prefix, ECMP by flow hash and seed)
//!   ─> aggregate (chunks to AGG_UDP_PORT: sum, consume, rewrite; replicate ACKs)
//!   ─> classify (control: CNP/ACK/NAK to the strict-priority queue 0; data by DSCP)
//!   ─> admit (per-queue limit and the shared pool; PFC pauses in_port above XOFF)
//!   ─> egress queue ─> [port's token bucket says go] ─> dequeue (strict priority)
//!   ─> RED/ECN mark (Kmin, Kmax, Pmax) ─> INT stamp ─> link faults (loss, delay, reorder)
//!   ─> poll_transmit(out_port)
//! ```
//!
//! Files, one concept each: [`frame`] (what the pipeline needs of a packet),
//! [`config`] (ports, queues, thresholds), [`token_bucket`] (line rate),
//! [`red`] (marking probability), [`routes`] (forwarding and ECMP),
//! [`counters`] (per port and per queue, and depth samples), [`graph`]
//! (ports and shortest-path routes of a network of switches), [`pipeline`]
//! (the state machine), [`aggregation`] (in-network aggregation, between
//! route and admit).

#![forbid(unsafe_code)]

pub mod aggregation;
pub mod config;
pub mod counters;
pub mod frame;
pub mod graph;
pub mod pipeline;
pub mod red;
pub mod routes;
pub mod token_bucket;

pub use aggregation::{AggregationConfig, Aggregator, JobCounters, Verdict};
pub use config::{LinkFaults, PfcConfig, PortConfig, QUEUES, RedConfig, SwitchConfig};
pub use counters::{PortCounters, QueueCounters, QueueSample};
pub use frame::{Classified, Ecn, Frame};
pub use graph::{Graph, PortPeer};
pub use pipeline::{PfcSignal, PortId, Switch};
pub use routes::{Prefix, Routes};
pub use token_bucket::TokenBucket;

/// Time as the pipeline sees it: since the driver's start. The simulator
/// passes virtual time, the real switch a monotonic clock.
pub type Time = std::time::Duration;
