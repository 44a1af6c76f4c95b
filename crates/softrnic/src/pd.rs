use std::sync::Arc;

use softrnic_transport::{Access, DmaBuffer, PdId, QpCaps, QpInitAttr, QpType};

use crate::{CompletionQueue, Context, Error, MemoryRegion, QueuePair};

pub(crate) struct PdHandle {
    pub ctx: Context,
    pub id: PdId,
}

impl Drop for PdHandle {
    fn drop(&mut self) {
        let id = self.id;
        let _ = self.ctx.nic.dealloc_pd(id);
    }
}

/// A protection domain: memory regions and queue pairs work together only
/// within one. Regions and QPs keep their domain alive.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) ctx: Context,
    pub(crate) id: Arc<PdHandle>,
}

/// Where softrnic places a region it allocates in the address space that
/// work requests and peers use.
const IOVA_BASE: u64 = 0x1000_0000_0000;

impl ProtectionDomain {
    /// Allocates and registers a zeroed buffer of `len` bytes.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        let buffer = Arc::new(DmaBuffer::new(len));
        // Each region gets its own IOVA range, so a stray address of one
        // never lands in another.
        let iova = IOVA_BASE + (buffer.as_ptr() as u64 & 0xffff_ffff_f000);
        self.register_buffer(buffer, iova, access)
    }

    /// Registers an existing buffer, addressed from `iova`.
    pub fn register_buffer(&self, buffer: Arc<DmaBuffer>, iova: u64, access: Access) -> Result<MemoryRegion, Error> {
        let (pd, len) = (self.id.id, buffer.len());
        let keys = self.ctx.nic.register_memory(pd, buffer.clone(), 0, len, iova, access)?;
        Ok(MemoryRegion { pd: self.clone(), buffer, keys, iova })
    }

    /// A reliable connected QP.
    pub fn create_rc_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> Result<QueuePair, Error> {
        self.create_qp(QpType::Rc, send_cq, recv_cq, caps, false)
    }

    /// A QP of either type; `sq_sig_all` makes every send signal.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        sq_sig_all: bool,
    ) -> Result<QueuePair, Error> {
        let init = QpInitAttr {
            qp_type,
            pd: self.id.id,
            send_cq: send_cq.id(),
            recv_cq: recv_cq.id(),
            caps,
            sq_sig_all,
            srq: None,
        };
        let posts = self.ctx.nic.create_qp(init)?;
        Ok(QueuePair::new(self.clone(), posts, qp_type, [send_cq.handle(), recv_cq.handle()]))
    }
}
