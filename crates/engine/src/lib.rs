//! The softrnic NIC at run time: a transport [`Device`] driven over a real
//! UDP socket on port 4791 by engine threads and by the application's own
//! polling. See [`engine`] for how progress is made.
//!
//! [`Device`]: softrnic_transport::Device

pub mod counters_file;
pub mod engine;
pub mod event_queue;
pub mod eventfd;
pub mod faults;
pub mod socket;

pub use engine::{EngineConfig, Nic, NicCounters, OpenError, Role};
pub use event_queue::EventQueue;
pub use eventfd::EventFd;
pub use faults::{FaultConfig, FaultStats};
pub use socket::BindError;
