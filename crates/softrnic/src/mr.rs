use std::sync::Arc;

use softrnic_transport::{DmaBuffer, MrKeys, Payload, RemoteAddr, Sge};

use crate::ProtectionDomain;

/// A registered memory region over a buffer that the application and the
/// NIC share. Reads and writes copy; as with any RDMA buffer, the
/// application must not touch bytes the NIC is working on (completions say
/// when it is done).
pub struct MemoryRegion {
    pub(crate) pd: ProtectionDomain,
    pub(crate) buffer: Arc<DmaBuffer>,
    pub(crate) keys: MrKeys,
    pub(crate) iova: u64,
}

impl MemoryRegion {
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }

    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }

    /// The address of the first byte, as work requests and peers use it.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn buffer(&self) -> &Arc<DmaBuffer> {
        &self.buffer
    }

    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.buffer.read(offset, dst)
    }

    pub fn write(&self, offset: usize, src: &[u8]) {
        self.buffer.write(offset, src)
    }

    /// An SGE over `len` bytes from `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.iova + offset as u64, length: len, lkey: self.keys.lkey }
    }

    /// A one-element gather (or scatter) list.
    pub fn gather(&self, offset: usize, len: u32) -> Payload {
        Payload::Gather(softrnic_transport::smallvec![self.sge(offset, len)])
    }

    /// Where a peer writes to or reads from this region, at `offset`.
    pub fn remote(&self, offset: usize) -> RemoteAddr {
        RemoteAddr { addr: self.iova + offset as u64, rkey: self.keys.rkey }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let lkey = self.keys.lkey;
        let _ = self.pd.ctx.provider.deregister(lkey);
    }
}
