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
//! a ring. It is let go after that when an engine thread next rests (a
//! standby or a sleep, at most 20 ms apart while it rests), at the
//! device's next registration or deregistration, or when it closes: the
//! pages of a freed buffer go back to the system without waiting for the
//! program's next verb. A region given new memory by `ibv_rereg_mr`
//! leaves its old memory lingering the same way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use softrnic_transport::DmaBuffer;

/// How long deregistered memory stays open to peers: many times the
/// longest a datagram waits in a ring (a stuck peer's is given up on after
/// 20 ms).
pub const LINGER: Duration = Duration::from_millis(250);

/// The memory of deregistered regions, oldest first.
#[derive(Default)]
pub struct Lingering {
    kept: Mutex<VecDeque<(Instant, Arc<DmaBuffer>)>>,
    /// Whether anything is kept: an engine thread's rest asks without the
    /// lock.
    any: AtomicBool,
}

impl Lingering {
    /// Keeps `buffer` open to peers for a while if they can read it; lets
    /// go of what has lingered long enough.
    pub fn keep(&self, buffer: Arc<DmaBuffer>) {
        let now = Instant::now();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if buffer.is_shared() {
            kept.push_back((now, buffer));
        }
        self.forget_before(&mut kept, now);
    }

    /// Lets go of what has lingered long enough.
    pub fn forget_old(&self) {
        if self.any.load(Ordering::Relaxed) {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            self.forget_before(&mut kept, Instant::now());
        }
    }

    fn forget_before(&self, kept: &mut VecDeque<(Instant, Arc<DmaBuffer>)>, now: Instant) {
        while kept.front().is_some_and(|(at, _)| now.duration_since(*at) >= LINGER) {
            kept.pop_front();
        }
        self.any.store(!kept.is_empty(), Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kept.lock().unwrap().len()
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

    /// Memory a region had lingers after a deregistration and after
    /// `ibv_rereg_mr` gives the region other memory (not after one that
    /// changes only its access), and an engine thread at rest lets it go
    /// once it has lingered long enough, without another registration.
    #[test]
    fn an_engine_thread_at_rest_lets_lingering_memory_go() {
        use crate::{EngineConfig, Nic, ProgressMode};
        use softrnic_transport::{Access, Registration};
        for (progress, addr) in [(ProgressMode::Inline, "127.0.9.31"), (ProgressMode::Dedicated, "127.0.9.32")] {
            let nic = Nic::open(EngineConfig { progress, ..EngineConfig::new(addr.parse().unwrap()) }).expect("open");
            let pd = nic.alloc_pd();
            let (first, second, third) = (shared(), shared(), shared());
            let keys = nic.register_memory(Registration::whole(pd, first.clone(), 0, Access::LOCAL_WRITE)).unwrap();
            nic.reregister_memory(keys.lkey, Registration::whole(pd, second.clone(), 0, Access::LOCAL_WRITE)).unwrap();
            nic.reregister_memory(keys.lkey, Registration::whole(pd, second.clone(), 0, Access::empty())).unwrap();
            assert_eq!(nic.core.lingering.len(), 1, "{progress}: the first memory, not the second again");
            let other = nic.register_memory(Registration::whole(pd, third.clone(), 0, Access::LOCAL_WRITE)).unwrap();
            nic.deregister_memory(other.lkey).unwrap();
            assert_eq!((Arc::strong_count(&first), Arc::strong_count(&third)), (2, 2), "{progress}: kept for peers");
            let deadline = Instant::now() + LINGER + Duration::from_secs(5);
            while Arc::strong_count(&first) > 1 || Arc::strong_count(&third) > 1 {
                assert!(
                    Instant::now() < deadline,
                    "{progress}: still kept {:?} after it",
                    LINGER + Duration::from_secs(5)
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(Arc::strong_count(&second), 2, "{progress}: the region's own memory stays");
        }
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
