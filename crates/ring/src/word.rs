//! The atomic word the protocols run on: the std one in shared memory,
//! loom's under the model checker.

use std::sync::atomic::Ordering::{self, AcqRel, Acquire, SeqCst};

/// A 64-bit atomic word.
pub trait Word {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn swap(&self, value: u64) -> u64;
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64>;
    /// A sequentially consistent fence of the same kind of memory.
    fn fence()
    where
        Self: Sized;
}

impl Word for std::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        self.load(order)
    }
    fn store(&self, value: u64, order: Ordering) {
        self.store(value, order)
    }
    fn swap(&self, value: u64) -> u64 {
        self.swap(value, AcqRel)
    }
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        self.compare_exchange(current, new, AcqRel, Acquire)
    }
    fn fence() {
        std::sync::atomic::fence(SeqCst)
    }
}

#[cfg(all(test, loom))]
impl Word for loom::sync::atomic::AtomicU64 {
    fn load(&self, order: Ordering) -> u64 {
        loom::sync::atomic::AtomicU64::load(self, order)
    }
    fn store(&self, value: u64, order: Ordering) {
        loom::sync::atomic::AtomicU64::store(self, value, order)
    }
    fn swap(&self, value: u64) -> u64 {
        loom::sync::atomic::AtomicU64::swap(self, value, AcqRel)
    }
    fn compare_exchange(&self, current: u64, new: u64) -> Result<u64, u64> {
        loom::sync::atomic::AtomicU64::compare_exchange(self, current, new, AcqRel, Acquire)
    }
    fn fence() {
        loom::sync::atomic::fence(SeqCst)
    }
}
