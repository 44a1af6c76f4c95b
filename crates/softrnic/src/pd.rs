use std::sync::Arc;

use softrnic_transport::{Access, DmaBuffer, PdId, Psn, QpCaps, QpInitAttr, QpType, VerbsError, WindowType};

use crate::block::BlockOffload;
use crate::{CompletionQueue, Context, Error, MemoryRegion, MemoryWindow, QueuePair};

pub(crate) struct PdHandle {
    pub ctx: Context,
    pub id: PdId,
}

impl Drop for PdHandle {
    fn drop(&mut self) {
        let _ = self.ctx.provider.dealloc_pd(self.id);
    }
}

/// A protection domain: memory regions and queue pairs work together only
/// within one. Regions and QPs keep their domain alive.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) ctx: Context,
    pub(crate) id: Arc<PdHandle>,
}

impl ProtectionDomain {
    /// Allocates and registers a zeroed buffer of `len` bytes (memory the
    /// daemon shares, when softrnicd serves the device).
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, Error> {
        let (buffer, keys, iova) = self.ctx.provider.register(self.id.id, len, access)?;
        Ok(MemoryRegion { pd: self.clone(), buffer, keys, iova })
    }

    /// Registers an existing buffer, addressed from `iova`.
    pub fn register_buffer(&self, buffer: Arc<DmaBuffer>, iova: u64, access: Access) -> Result<MemoryRegion, Error> {
        let keys = self.ctx.provider.register_buffer(self.id.id, buffer.clone(), iova, access)?;
        Ok(MemoryRegion { pd: self.clone(), buffer, keys, iova })
    }

    /// A memory window of `kind` in this domain, unbound.
    pub fn alloc_window(&self, kind: WindowType) -> Result<MemoryWindow, Error> {
        let rkey = self.ctx.provider.alloc_window(self.id.id, kind)?;
        Ok(MemoryWindow { pd: self.clone(), rkey, kind })
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
        self.create_qp_with(qp_type, [send_cq, recv_cq], caps, sq_sig_all, None)
    }

    /// A reliable connected QP whose storage blocks ([`crate::block`])
    /// softrnicd offloads, as a storage NIC would (E7): it computes the
    /// CRC of each block sent and checks it on each block received,
    /// saying what it found in the receive's [`Completion::block`]; with
    /// a `store` it also places each received write's payload there at
    /// the block's offset (the receive gets the header alone), and gives
    /// a read's answer posted as a header alone its payload from there.
    /// Refused by the engine in the process: the offload is the daemon's.
    ///
    /// [`Completion::block`]: crate::Completion::block
    pub fn create_block_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        store: Option<&MemoryRegion>,
    ) -> Result<QueuePair, Error> {
        let offload = match store {
            None => BlockOffload::Crc,
            Some(store) => BlockOffload::CrcAndPlacement { store: store.lkey() },
        };
        self.create_qp_with(QpType::Rc, [send_cq, recv_cq], caps, false, Some(offload))
    }

    fn create_qp_with(
        &self,
        qp_type: QpType,
        [send_cq, recv_cq]: [&CompletionQueue; 2],
        caps: QpCaps,
        sq_sig_all: bool,
        blocks: Option<BlockOffload>,
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
        // A random initial PSN, as perftest picks one, drawn first: a QP
        // made is not left behind by a failure.
        let psn = getrandom::u32()
            .map_err(|e| VerbsError::Device(format!("no random initial PSN from the operating system: {e}")))?;
        let qp = match blocks {
            None => self.ctx.provider.create_qp(init)?,
            Some(offload) => self.ctx.provider.create_block_qp(init, offload)?,
        };
        Ok(QueuePair::new(self.clone(), qp, qp_type, Psn::new(psn), [send_cq.handle(), recv_cq.handle()]))
    }
}
