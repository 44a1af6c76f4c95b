//! What several test binaries set up alike.

use softrnic::{Access, CompletionQueue, Context, MemoryRegion, QpCaps, QueuePair};

/// One end of an RC connection on `ctx`: `len` bytes registered for
/// remote access, a CQ for both queues, and the QP (not yet connected).
pub fn rc_end(ctx: &Context, len: usize) -> (MemoryRegion, CompletionQueue, QueuePair) {
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(len, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    (mr, cq, qp)
}
