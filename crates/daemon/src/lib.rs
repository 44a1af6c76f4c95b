//! softrnicd, one softrnic engine serving many programs, and the client
//! those programs use to reach it.
//!
//! ```text
//!  program ── control verbs ──> Unix socket (protocol.rs) ──> server/tenant.rs: one thread per tenant
//!     │                                                             │ creates objects on the engine (Nic),
//!     │   send/recv WQEs, CQEs: shared queues (queue.rs, wqe.rs)    │ rings in memfds, maps the program's memory
//!     └──────────── doorbells (doorbell.rs) ───────────────> server/processor.rs: moves WQEs to the
//!                                                                engine's QPs, completions to the rings
//! ```
//!
//! The data path never crosses the socket: `post_send` writes a WQE and
//! maybe an eventfd, `poll_cq` reads CQEs. Memory is shared as sealed
//! memfds (`shared_memory.rs`).

pub mod backend;
pub mod client;
pub mod doorbell;
pub mod launch;
pub mod limits;
pub mod protocol;
pub mod queue;
pub mod remap;
pub mod server;
pub mod shared_memory;
pub mod socket_path;
pub mod wqe;
