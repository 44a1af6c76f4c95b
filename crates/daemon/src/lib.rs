//! softrnicd, one softrnic engine serving many programs. What it and its
//! programs share is `softrnic-daemon-protocol`; the programs' side is
//! `softrnic-provider`'s client.
//!
//! ```text
//!  program ── control verbs ──> Unix socket (protocol) ──> server/tenant.rs: one thread per tenant
//!     │                                                       │ creates objects on the engine (Nic),
//!     │   send/recv WQEs, CQEs: shared queues (queue, wqe)    │ rings in memfds, maps the program's memory
//!     └──────────── doorbells (doorbell) ──────────────> server/processor.rs: moves WQEs to the
//!                                                          engine's QPs, completions to the rings
//! ```
//!
//! The data path never crosses the socket: `post_send` writes a WQE and
//! maybe an eventfd, `poll_cq` reads CQEs. Memory is shared as sealed
//! memfds (`shared_memory`).

pub mod command_line;
pub mod limits;
pub mod server;
