//! The softrnic NIC at run time: the transport's control plane and shards,
//! driven over UDP sockets on port 4791 by engine threads (one per shard)
//! and by the application's own posting and polling. [`engine`] draws the
//! map; [`progress`] is the policy of who moves packets when.

pub mod congestion;
pub mod counters_file;
pub mod datapath;
pub mod engine;
pub mod environment;
pub mod faults;
pub mod int;
pub mod interface;
mod lingering;
pub mod peer_files;
pub mod progress;
mod receive_sources;
pub mod runtime_dir;
mod shard;
pub mod shm;
pub mod socket;
mod trace;

pub use datapath::DatapathKind;
pub use engine::{EngineConfig, MAX_SHARDS, Nic, NicCounters, OpenError, Role, SendQueue};
pub use faults::{FaultConfig, FaultStats};
pub use progress::ProgressMode;
pub use socket::BindError;
