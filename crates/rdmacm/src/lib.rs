//! softrnic's drop-in `librdmacm.so.1`: unmodified rdma_cm programs
//! (`rping`, `ucmatose`, `udaddy`, `rdma_server`, perftest with `-R`)
//! connect over softrnic, and a softrnic endpoint speaks the protocol a
//! RoCE NIC's kernel CM speaks.
//!
//! rdma-core's librdmacm hands connection management to the kernel
//! through `/dev/infiniband/rdma_cm`; softrnic has no kernel part, so this
//! library runs the IBTA Communication Manager itself, in the process:
//!
//! - [`protocol`]: the CM's state machines, sans I/O (REQ, REP, RTU, REJ,
//!   DREQ, DREP, SIDR), with retries and duplicate handling;
//! - [`device`]: the device and its QP1, opened through softrnic's
//!   `libibverbs.so.1` (the same engine the program's verbs use);
//! - [`agent`]: the thread that receives CM MADs on QP1 and runs timers;
//! - [`id`]: rdma_cm IDs, event channels and events, and what happens to a
//!   QP as its connection comes up and goes down;
//! - [`api`], [`addrinfo`]: the exported calls; [`rsocket`]: the socket
//!   calls over RC connections made with them; [`unsupported`]: what is
//!   refused, and how.
//!
//! The messages travel as MADs in UD SENDs to QP1 with the GSI's Q_Key,
//! over RoCEv2, as a hardware RoCE NIC's do; the REQ's private data starts
//! with rdma_cm's own header (the IP addresses and port), so an rdma_cm
//! peer on a real NIC would understand it.

pub mod abi;
pub mod addrinfo;
pub mod agent;
pub mod api;
pub mod device;
pub mod id;
pub mod multicast;
pub mod protocol;
pub mod rsocket;
pub mod unsupported;
pub mod verbs;

pub use device::device;
