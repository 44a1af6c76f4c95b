//! Where the receives of a QP (or an SRQ) fetched on demand come from:
//! what a front end that holds a program's receives (softrnicd, whose
//! program writes them into a shared ring) gives the engine to post them
//! when a message needs one ([`softrnic_transport::fetch_on_demand`]).
//!
//! A shard asks with an event; the pass that raised it runs the source
//! after the shard's locks are released, and then answers the shard. So
//! a source may take its own locks and post to the engine freely: no lock
//! of the engine's is held while it runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use softrnic_transport::{ReceivesWanted, SrqId};

/// Posts the receives a program has written.
pub type Fetch = Arc<dyn Fn() + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Qp(u32),
    Srq(SrqId),
}

/// Every source of the device, by the queue it feeds.
#[derive(Default)]
pub(crate) struct ReceiveSources {
    sources: Mutex<HashMap<Source, Fetch>>,
}

impl ReceiveSources {
    pub fn add_qp(&self, qpn: u32, fetch: Fetch) {
        self.lock().insert(Source::Qp(qpn), fetch);
    }

    pub fn add_srq(&self, srq: SrqId, fetch: Fetch) {
        self.lock().insert(Source::Srq(srq), fetch);
    }

    /// The queue is gone: a QP number or SRQ handle used again starts
    /// with no source.
    pub fn forget_qp(&self, qpn: u32) {
        self.lock().remove(&Source::Qp(qpn));
    }

    pub fn forget_srq(&self, srq: SrqId) {
        self.lock().remove(&Source::Srq(srq));
    }

    /// Runs the source that feeds the queue `wanted` names, if it has one
    /// (with this table's lock released: a source may add or forget one).
    pub fn fetch(&self, wanted: ReceivesWanted) {
        let source = wanted.srq.map_or(Source::Qp(wanted.qpn), Source::Srq);
        let fetch = self.lock().get(&source).cloned();
        if let Some(fetch) = fetch {
            fetch();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Source, Fetch>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }
}
