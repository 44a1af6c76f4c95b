//! Notifications behind file descriptors, as the kernel's uverbs and
//! rdma_cm event files are: an [`EventFd`] that wakes a sleeping thread,
//! and an [`EventQueue`] whose descriptor stays readable while it holds
//! items (completion channels, asynchronous events, rdma_cm's event
//! channels). A crate of its own so that the front ends that need only
//! these (`librdmacm.so.1`) link nothing of the engine.

pub mod event_queue;
pub mod eventfd;

pub use event_queue::EventQueue;
pub use eventfd::{EventFd, wait_readable};
