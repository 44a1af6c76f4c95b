//! The index protocols of softrnic's shared-memory rings, apart from the
//! memory they run on, so that the model checker (loom) runs the very code
//! the engine runs: `RUSTFLAGS="--cfg loom" cargo test --release -p
//! softrnic-ring`.
//!
//! - [`mpsc`]: many producers, one consumer: the inboxes of the
//!   shared-memory wire between devices of one host.
//! - [`spsc`]: one producer, one consumer, as the Linux rxe driver's
//!   mmap'd queues: a verbs queue (send, receive, completion) that a
//!   program and the engine serving it share, where the other side may be
//!   a program that is not trusted.

pub mod mpsc;
pub mod spsc;
mod word;

pub use word::Word;
