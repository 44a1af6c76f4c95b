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
//! - [`wakeup`]: how the side that would sleep on a queue (a command
//!   processor, a program waiting on a completion channel) asks the other
//!   to wake it, without a wake-up lost between the two.

pub mod mpsc;
pub mod spsc;
pub mod wakeup;
mod word;

pub use word::Word;
