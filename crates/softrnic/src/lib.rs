//! softrnic's Rust API: the verbs, safely.
//!
//! A [`Context`] is an open software RNIC bound to one IP address (its GID)
//! on UDP port 4791. From it come protection domains, memory regions,
//! completion queues and queue pairs, as in libibverbs; objects clean up
//! when dropped.
//!
//! ```
//! use softrnic::{Access, Context, ConnectOptions, QpCaps, SendOp, SendWorkRequest, WcStatusExt};
//!
//! # fn main() -> Result<(), softrnic::Error> {
//! // Two devices on this machine, each on its own loopback address.
//! let (a, b) = (Context::open("127.0.3.2".parse()?)?, Context::open("127.0.3.3".parse()?)?);
//! let (pd_a, pd_b) = (a.alloc_pd()?, b.alloc_pd()?);
//! let src = pd_a.register(4096, Access::LOCAL_WRITE)?;
//! let dst = pd_b.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let (cq_a, cq_b) = (a.create_cq(64)?, b.create_cq(64)?);
//! let qp_a = pd_a.create_rc_qp(&cq_a, &cq_a, QpCaps::default())?;
//! let qp_b = pd_b.create_rc_qp(&cq_b, &cq_b, QpCaps::default())?;
//! // Exchange what each side needs to know (over TCP with `exchange`).
//! qp_a.connect(&qp_b.endpoint(&dst), &ConnectOptions::default())?;
//! qp_b.connect(&qp_a.endpoint(&src), &ConnectOptions::default())?;
//!
//! src.write(0, b"hello, remote memory");
//! let remote = dst.remote(0);
//! qp_a.post_send(SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, src.gather(0, 20)))?;
//! let done = cq_a.wait_one()?;
//! assert!(done.status.is_success());
//! let mut bytes = [0u8; 20];
//! dst.read(0, &mut bytes);
//! assert_eq!(&bytes, b"hello, remote memory");
//! # Ok(())
//! # }
//! ```

mod context;
mod cq;
mod error;
pub mod exchange;
mod mr;
mod mw;
mod pd;
mod qp;

pub use context::Context;
pub use cq::CompletionQueue;
pub use error::{Error, PostListError};
pub use exchange::Endpoint;
pub use mr::MemoryRegion;
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use qp::{ConnectOptions, QueuePair};

pub use softrnic_engine::congestion::choose as choose_congestion_control;
pub use softrnic_engine::{DatapathKind, EngineConfig, FaultConfig, NicCounters, ProgressMode, Role, environment};
pub use softrnic_provider::block;
/// The socket of the softrnicd that [`Context::open`] would use, if any.
pub use softrnic_provider::socket_path::from_env as daemon_socket;
pub use softrnic_transport::{
    Access, BlockOutcome, Choice, Completion, InlineData, Mtu, Payload, Psn, QpAttr, QpCaps, QpState, QpType,
    RecvWorkRequest, RemoteAddr, Retransmission, SendOp, SendWorkRequest, Sge, SgeList, UdDestination, WcOpcode,
    WcStatus, WindowBind, WindowType, smallvec,
};

/// The status helpers verbs users expect.
pub trait WcStatusExt {
    fn is_success(&self) -> bool;
}

impl WcStatusExt for WcStatus {
    fn is_success(&self) -> bool {
        *self == WcStatus::Success
    }
}
