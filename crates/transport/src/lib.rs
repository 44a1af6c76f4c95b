//! The RDMA transport as sans-IO state machines.
//!
//! A software RNIC is a [`Control`] plane (protection domains and memory
//! regions ([`memory`]), completion queues ([`completion`]), shared receive
//! queues ([`srq`]), QP numbers) and one or more [`Shard`]s, each owning a
//! set of queue pairs ([`qp`]) whose RC side is split into requester,
//! responder and completer as the IBTA splits it. [`Device`] is the two
//! together with one shard, for a single thread (the simulator). It never reads a clock and never touches a socket:
//! the engine (or the simulator) hands it datagrams and the time, and takes
//! datagrams, completions and deadlines out.

pub mod auth;
pub mod by_reference;
pub mod completion;
pub mod config;
pub mod congestion;
pub mod control;
pub mod counters;
pub mod device;
pub mod entropy;
pub mod error;
pub mod event;
pub mod fetch_on_demand;
pub mod limits;
pub mod memory;
pub mod multicast;
pub mod qp;
pub mod shard;
pub mod srq;
pub mod time;
pub mod work_request;

pub use auth::{AuthKey, MAC_LEN, PacketAuth};
pub use completion::{BlockOutcome, Completion, CompletionQueue, CqId, WcOpcode, WcStatus};
pub use config::TransportConfig;
pub use congestion::{AlgorithmSpec, Choice, CongestionConfig, IntMark, IntRecords, RecvMeta};
pub use control::Control;
pub use counters::Counters;
pub use device::Device;
pub use entropy::Entropy;
pub use error::{Result, VerbsError};
pub use event::AsyncEvent;
pub use fetch_on_demand::{HOLD_FOR, ReceivesWanted};
pub use memory::{
    Access, DmaBuffer, MemoryWindow, MrKeys, PdId, PeerMemory, Registration, SharedFile, SharedPart, WindowBind,
    WindowFault, WindowType, window_handle, with_key,
};
pub use qp::{
    Mtu, PostQueues, Posted, QpAttr, QpAttributes, QpCaps, QpInitAttr, QpState, QpType, RcConnection, Retransmission,
    SendPoster, Transmit, check_recv, check_send, ud_steps,
};
pub use shard::{Egress, MAX_DATAGRAM_LEN, Shard, dest_qpn, shard_of};
pub use smallvec::smallvec;
pub use softrnic_cc as cc;
pub use softrnic_wire::Psn;
pub use srq::{SharedReceiveQueue, SrqAttr, SrqId};
pub use time::Instant;
pub use work_request::{
    InlineData, Payload, RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, SgeList, UdDestination,
};
