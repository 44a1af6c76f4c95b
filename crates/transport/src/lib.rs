//! The RDMA transport as sans-IO state machines.
//!
//! A [`Device`] is one software RNIC: protection domains and memory
//! regions ([`memory`]), completion queues ([`completion`]) and queue pairs
//! ([`qp`]) whose RC side is split into requester, responder and completer
//! as the IBTA splits it. It never reads a clock and never touches a socket:
//! the engine (or the simulator) hands it datagrams and the time, and takes
//! datagrams, completions and deadlines out.

pub mod completion;
pub mod config;
pub mod counters;
pub mod device;
pub mod error;
pub mod event;
pub mod memory;
pub mod qp;
pub mod srq;
pub mod time;
pub mod work_request;

pub use completion::{Completion, CqId, WcOpcode, WcStatus};
pub use config::TransportConfig;
pub use counters::Counters;
pub use device::{Device, MAX_DATAGRAM_LEN};
pub use error::{Result, VerbsError};
pub use event::AsyncEvent;
pub use memory::{Access, DmaBuffer, MrKeys, PdId};
pub use qp::{Mtu, QpAttr, QpCaps, QpInitAttr, QpState, QpType, RcConnection, Transmit, ud_steps};
pub use softrnic_wire::Psn;
pub use srq::{SrqAttr, SrqId};
pub use time::Instant;
pub use work_request::{Payload, RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, UdDestination};
