//! The network lab: hosts in network namespaces, each with a veth to a
//! software switch that runs softrnic's switch pipeline
//! (`softrnic-switch`), so that any program (softrnic bench, perftest over
//! the drop-in library, iperf3) crosses a real congested fabric on one
//! Linux machine.
//!
//! - [`topology`]: switches, hosts and links from TOML or a shape, and
//!   each switch's routes.
//! - [`namespaces`]: the hosts' namespaces and veths, the processes run in
//!   them, and their removal (also of a killed run's leftovers).
//! - [`packet_socket`]: a switch port's `AF_PACKET` socket (the `unsafe`
//!   edge).
//! - [`eth_frame`]: Ethernet frames as the pipeline sees them; ARP.
//! - [`runner`]: the loop that moves frames between ports and pipelines
//!   and samples the queues.

pub mod eth_frame;
pub mod namespaces;
pub mod packet_socket;
pub mod runner;
pub mod topology;

pub use namespaces::Namespaces;
pub use runner::{RunOptions, Runner};
pub use topology::{LinkSpec, Topology};
