//! In-network aggregation's end hosts (ATP, A2TP): the switch sums
//! gradient chunks in its pool of aggregators (`softrnic-switch`'s
//! aggregation stage), and these are the programs at its edges.
//!
//! - [`worker`]: a worker streams a tensor in chunks under two windows
//!   ([`window`]: DCTCP's link window, A2TP's aggregator window scaled by
//!   the job's health from [`rtt`]) and resends late chunks;
//! - [`server`]: a parameter server sums what the switch could not and
//!   answers every chunk;
//! - [`fixed_point`]: floats as the switch sums them;
//! - [`udp`]: both on real sockets, and an allreduce;
//! - [`ffi`]: the allreduce as a C ABI (`include/softrnic_aggregation.h`),
//!   which the Python example loads.
//!
//! Worker and server are sans-IO (`handle_*` in, `poll_*` out, time passed
//! in), so the simulator runs them unchanged at cluster scale.

pub mod ffi;
pub mod fixed_point;
pub mod rtt;
pub mod server;
pub mod udp;
pub mod window;
pub mod worker;

pub use server::{Destination, ParameterServer, ServerConfig, ServerStats};
pub use udp::{Allreduce, Socket, serve};
pub use window::Policy;
pub use worker::{Worker, WorkerConfig, WorkerStats};

/// The value worker `worker` of job `job` contributes at index `i` in step
/// `step` of the test programs (`softrnic agg worker`, the simulator):
/// varied, signed, and known to every checker, so each sum can be checked
/// against the exact one.
pub fn contribution(job: usize, step: u64, worker: usize, i: usize) -> i32 {
    ((i as i64 * 31 + step as i64 * 7 + worker as i64 * 13 + job as i64 * 101) % 2001 - 1000) as i32
}
