//! Deregistered memory that peers on this host may still be copying from.
//!
//! A packet whose payload travels by reference
//! ([`softrnic_transport::by_reference`]) is read where its receiver places
//! it, after the ring has carried it: a region deregistered meanwhile
//! would turn the packets already on their way into losses, which
//! retransmission cannot repair (the requester's copy is gone; a READ's
//! replay finds no region). A NIC has read them out of the region before
//! the deregistration returns. So a shared region's memory stays open to
//! peers for [`LINGER`] after it is deregistered (no shard of this device
//! reaches it: the table no longer has it), long past any packet's time in
//! a ring, and is let go at the device's next registration or
//! deregistration after that, or when it closes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softrnic_transport::DmaBuffer;

/// How long deregistered memory stays open to peers: many times the
/// longest a datagram waits in a ring (a stuck peer's is given up on after
/// 20 ms).
pub const LINGER: Duration = Duration::from_millis(250);

/// The memory of deregistered regions, oldest first.
#[derive(Default)]
pub struct Lingering(Mutex<VecDeque<(Instant, Arc<DmaBuffer>)>>);

impl Lingering {
    /// Keeps `buffer` open to peers for a while if they can read it; lets
    /// go of what has lingered long enough.
    pub fn keep(&self, buffer: Arc<DmaBuffer>) {
        let now = Instant::now();
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        forget_before(&mut kept, now);
        if buffer.is_shared() {
            kept.push_back((now, buffer));
        }
    }

    /// Lets go of what has lingered long enough.
    pub fn forget_old(&self) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !kept.is_empty() {
            forget_before(&mut kept, Instant::now());
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

fn forget_before(kept: &mut VecDeque<(Instant, Arc<DmaBuffer>)>, now: Instant) {
    while kept.front().is_some_and(|(at, _)| now.duration_since(*at) >= LINGER) {
        kept.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrnic_transport::{SharedFile, SharedPart};

    fn shared() -> Arc<DmaBuffer> {
        let file = SharedFile { pid: 1, fd: 3, inode: 4 };
        Arc::new(DmaBuffer::new(64).shared_in(vec![SharedPart { at: 0, len: 64, file, file_offset: 0 }]))
    }

    #[test]
    fn shared_memory_lingers_for_a_while_and_private_memory_not_at_all() {
        let lingering = Lingering::default();
        lingering.keep(Arc::new(DmaBuffer::new(64)));
        assert_eq!(lingering.len(), 0, "no peer can read private memory");
        let buffer = shared();
        lingering.keep(buffer.clone());
        lingering.forget_old();
        assert_eq!(Arc::strong_count(&buffer), 2, "kept open to peers");
        std::thread::sleep(LINGER);
        lingering.forget_old();
        assert_eq!(Arc::strong_count(&buffer), 1, "let go");
    }
}
