//! Deterministic simulation: real [`softrnic_transport::Device`]s joined by
//! a simulated network that loses, reorders, duplicates and corrupts
//! packets, all driven from one seed and a virtual clock, in the manner of
//! TigerBeetle's simulator. A failing seed replays exactly.
//!
//! - [`network`]: the links and their faults;
//! - [`world`]: hosts, the event loop and virtual time;
//! - [`workload`]: random mixes of every verb with an oracle that says what
//!   every byte of memory must hold afterwards;
//! - [`fabric`]: hosts on switches running the switch pipeline; [`incast`],
//!   [`fct`] and [`aggregation`] (in-network aggregation's jobs) on it.

pub mod aggregation;
pub mod fabric;
pub mod fct;
pub mod flows;
pub mod harness;
pub mod incast;
pub mod network;
pub mod scenario;
pub mod workload;
pub mod world;

pub use network::Faults;
pub use world::World;
