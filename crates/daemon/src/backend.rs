//! Where a program's verbs run: an engine inside the process, or
//! softrnicd, which serves many processes from one engine. The Rust API and
//! `libibverbs.so.1` hold one of these under their objects and ask which
//! only for what one side alone offers.

use std::sync::Arc;

use softrnic_engine::{Nic, NicCounters, ProgressMode};

use crate::client::{self, Session};
use crate::protocol::Translation;
use crate::shared_memory::SharedMapping;
use softrnic_transport::{
    Access, Choice, Completion, CompletionQueue, CqId, DmaBuffer, MrKeys, PdId, PostQueues, QpAttr, QpAttributes,
    QpInitAttr, QpState, RecvWorkRequest, Result, SendWorkRequest, SharedReceiveQueue, SrqAttr, SrqId, VerbsError,
};

/// What holds an engine in the process: a `Nic`, or something that shares
/// one (the C library shares one engine among a process's contexts).
pub trait EngineHolder {
    fn nic(&self) -> &Nic;
}

impl EngineHolder for Nic {
    fn nic(&self) -> &Nic {
        self
    }
}

impl<T: EngineHolder> EngineHolder for Arc<T> {
    fn nic(&self) -> &Nic {
        (**self).nic()
    }
}

pub enum Backend<E: EngineHolder = Nic> {
    Engine(E),
    Daemon(Session),
}

pub enum CqBackend {
    Engine(Arc<CompletionQueue>),
    Daemon(Box<client::Cq>),
}

pub enum QpBackend {
    Engine(Arc<PostQueues>),
    Daemon(Box<client::Qp>),
}

pub enum SrqBackend {
    Engine(Arc<SharedReceiveQueue>),
    Daemon(Box<client::Srq>),
}

impl SrqBackend {
    pub fn id(&self) -> SrqId {
        match self {
            SrqBackend::Engine(q) => q.id(),
            SrqBackend::Daemon(q) => q.id,
        }
    }
}

/// Where softrnic places a region it allocates in the address space that
/// work requests and peers use: a fixed base plus the buffer's page, so
/// each region gets its own IOVA range and a stray address of one never
/// lands in another.
const IOVA_BASE: u64 = 0x1000_0000_0000;

fn iova_of(ptr: *const u8) -> u64 {
    IOVA_BASE + (ptr as u64 & 0xffff_ffff_f000)
}

/// See [`Backend::send_chain`].
pub enum SendChain<'a> {
    Engine(softrnic_engine::engine::SendQueue<'a>),
    Daemon(&'a Session, &'a client::Qp),
}

impl SendChain<'_> {
    pub fn post(&mut self, wr: SendWorkRequest) -> Result<()> {
        match self {
            SendChain::Engine(queue) => queue.post(wr),
            SendChain::Daemon(session, qp) => session.post_send(qp, &wr),
        }
    }
}

impl CqBackend {
    pub fn id(&self) -> CqId {
        match self {
            CqBackend::Engine(cq) => cq.id(),
            CqBackend::Daemon(cq) => cq.id,
        }
    }

    /// Takes what the CQ holds, without driving the engine.
    pub fn poll_held(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        match self {
            CqBackend::Engine(cq) => cq.poll(max, out),
            CqBackend::Daemon(cq) => cq.poll(max, out),
        }
    }

    /// `ibv_req_notify_cq`.
    pub fn request_notify(&self, solicited_only: bool) {
        match self {
            CqBackend::Engine(cq) => cq.request_notify(solicited_only),
            CqBackend::Daemon(cq) => cq.request_notify(solicited_only),
        }
    }
}

impl QpBackend {
    pub fn qpn(&self) -> u32 {
        match self {
            QpBackend::Engine(posts) => posts.qpn(),
            QpBackend::Daemon(qp) => qp.qpn,
        }
    }
}

impl<E: EngineHolder> Backend<E> {
    pub fn addr(&self) -> std::net::IpAddr {
        match self {
            Backend::Engine(e) => e.nic().addr(),
            Backend::Daemon(session) => session.addr(),
        }
    }

    pub fn alloc_pd(&self) -> Result<PdId> {
        match self {
            Backend::Engine(e) => Ok(e.nic().alloc_pd()),
            Backend::Daemon(session) => session.alloc_pd(),
        }
    }

    pub fn dealloc_pd(&self, pd: PdId) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().dealloc_pd(pd),
            Backend::Daemon(session) => session.dealloc_pd(pd),
        }
    }

    /// Registers `len` new zeroed bytes: the process's own heap for an
    /// engine in the process, a memfd both sides map for the daemon.
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Result<(Arc<DmaBuffer>, MrKeys, u64)> {
        match self {
            Backend::Engine(_) => {
                let buffer = Arc::new(DmaBuffer::new(len));
                let iova = iova_of(buffer.as_ptr());
                let keys = self.register_buffer(pd, buffer.clone(), iova, access)?;
                Ok((buffer, keys, iova))
            }
            Backend::Daemon(session) => {
                let memory = SharedMapping::create("softrnic-mr", len.max(1))
                    .map_err(|e| VerbsError::OutOfResources(format!("shared memory for a region: {e}")))?;
                let iova = iova_of(memory.as_ptr());
                let keys = session.register_memory(pd, &memory, 0, len, iova, access)?;
                Ok((Arc::new(memory.into_buffer(0, len)), keys, iova))
            }
        }
    }

    pub fn register_buffer(&self, pd: PdId, buffer: Arc<DmaBuffer>, iova: u64, access: Access) -> Result<MrKeys> {
        match self {
            Backend::Engine(e) => {
                let len = buffer.len();
                e.nic().register_memory(pd, buffer, 0, len, iova, access)
            }
            Backend::Daemon(_) => Err(VerbsError::NotSupported(
                "softrnicd cannot reach a buffer of this process; allocate it with ProtectionDomain::register".into(),
            )),
        }
    }

    /// Registers memory the program allocated itself (`ibv_reg_mr`): in
    /// place for an engine in the process, remapped onto a memfd the
    /// daemon maps too ([`crate::remap`]) for softrnicd.
    ///
    /// # Safety
    /// `[addr, addr + len)` is the program's memory, readable and
    /// writable, and stays mapped until the region is deregistered; nothing
    /// writes it while this runs.
    pub unsafe fn register_program_memory(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys> {
        match self {
            Backend::Engine(e) => {
                // SAFETY: the caller's promise; the engine stops reaching
                // the region when it is deregistered.
                let buffer = Arc::new(unsafe { DmaBuffer::from_raw_parts(addr, len) });
                e.nic().register_memory(pd, buffer, 0, len, iova, access)
            }
            Backend::Daemon(session) => {
                // SAFETY: forwarded.
                let shared = unsafe { crate::remap::share(addr, len) }.map_err(share_error)?;
                let parts: Vec<_> = shared.parts.iter().map(|(remap, segment)| (remap.fd(), *segment)).collect();
                session.register_segments(pd, &parts, shared.lead, len, iova, access)
            }
        }
    }

    /// `ibv_rereg_mr`: the region `lkey` moves to `pd`, takes `access`
    /// (`None`: keeps its own) and covers `len` bytes at `addr`; `moved`
    /// says whether that range is new (addressed then as `addr`), or the
    /// region's own. On failure the region is as it was.
    ///
    /// # Safety
    /// As for [`Backend::register_program_memory`], for the range.
    pub unsafe fn reregister_program_memory(
        &self,
        lkey: u32,
        pd: PdId,
        (addr, len, moved): (*mut u8, usize, bool),
        access: Option<Access>,
    ) -> Result<()> {
        match self {
            Backend::Engine(e) => {
                let nic = e.nic();
                let region = nic.memory_region(lkey).ok_or(VerbsError::NotFound("memory region"))?;
                let iova = if moved { addr as u64 } else { region.iova };
                // SAFETY: the caller's promise, as at registration.
                let buffer = Arc::new(unsafe { DmaBuffer::from_raw_parts(addr, len) });
                nic.reregister_memory(lkey, pd, buffer, 0, len, iova, access.unwrap_or(region.access)).map(|_| ())
            }
            Backend::Daemon(session) if moved => {
                // SAFETY: forwarded.
                let shared = unsafe { crate::remap::share(addr, len) }.map_err(share_error)?;
                let fds: Vec<_> = shared.parts.iter().map(|(remap, _)| remap.fd()).collect();
                let segments = shared.parts.iter().map(|(_, segment)| *segment).collect();
                let translation =
                    Translation { iova: addr as u64, lead: shared.lead as u64, len: len as u64, segments };
                session.reregister_memory(lkey, Some(pd), access, Some(translation), &fds)
            }
            Backend::Daemon(session) => session.reregister_memory(lkey, Some(pd), access, None, &[]),
        }
    }

    /// The device's clock, which stamps completions.
    pub fn now(&self) -> softrnic_transport::Instant {
        match self {
            Backend::Engine(e) => e.nic().now(),
            Backend::Daemon(session) => session.now(),
        }
    }

    pub fn deregister(&self, lkey: u32) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().deregister_memory(lkey),
            Backend::Daemon(session) => session.deregister_memory(lkey),
        }
    }

    pub fn create_cq(&self, capacity: usize) -> Result<CqBackend> {
        match self {
            Backend::Engine(e) => Ok(CqBackend::Engine(e.nic().create_cq(capacity))),
            Backend::Daemon(session) => session.create_cq(capacity, None).map(|cq| CqBackend::Daemon(Box::new(cq))),
        }
    }

    pub fn destroy_cq(&self, cq: &CqBackend) -> Result<()> {
        self.destroy_cq_id(cq.id())
    }

    pub fn destroy_cq_id(&self, cq: CqId) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().destroy_cq(cq),
            Backend::Daemon(session) => session.destroy_cq(cq),
        }
    }

    pub fn poll_cq(&self, cq: &CqBackend, max: usize, out: &mut Vec<Completion>) -> usize {
        match (self, cq) {
            (Backend::Engine(e), CqBackend::Engine(cq)) => e.nic().poll_cq(cq, max, out),
            (Backend::Daemon(_), CqBackend::Daemon(cq)) => cq.poll(max, out),
            _ => unreachable!("a CQ belongs to the backend that made it"),
        }
    }

    pub fn create_qp(&self, init: QpInitAttr) -> Result<QpBackend> {
        match self {
            Backend::Engine(e) => e.nic().create_qp(init).map(QpBackend::Engine),
            Backend::Daemon(session) => session.create_qp(init).map(|qp| QpBackend::Daemon(Box::new(qp))),
        }
    }

    pub fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<SrqBackend> {
        match self {
            Backend::Engine(e) => e.nic().create_srq(pd, attr).map(SrqBackend::Engine),
            Backend::Daemon(session) => session.create_srq(pd, attr).map(|q| SrqBackend::Daemon(Box::new(q))),
        }
    }

    /// `ibv_post_srq_recv`, one request.
    pub fn post_srq_recv(&self, srq: &SrqBackend, wr: RecvWorkRequest) -> Result<()> {
        match (self, srq) {
            (_, SrqBackend::Engine(q)) => q.post(wr),
            (Backend::Daemon(session), SrqBackend::Daemon(q)) => session.post_srq_recv(q, &wr),
            _ => Err(foreign_srq()),
        }
    }

    /// Arms the SRQ's limit event.
    pub fn set_srq_limit(&self, srq: &SrqBackend, limit: u32) -> Result<()> {
        match (self, srq) {
            (_, SrqBackend::Engine(q)) => q.set_limit(limit),
            (Backend::Daemon(session), SrqBackend::Daemon(q)) => session.set_srq_limit(q, limit),
            _ => Err(foreign_srq()),
        }
    }

    pub fn query_srq(&self, srq: &SrqBackend) -> Result<SrqAttr> {
        match (self, srq) {
            (_, SrqBackend::Engine(q)) => Ok(q.query().0),
            (Backend::Daemon(session), SrqBackend::Daemon(q)) => session.query_srq(q),
            _ => Err(foreign_srq()),
        }
    }

    pub fn destroy_srq(&self, srq: &SrqBackend) -> Result<()> {
        match (self, srq) {
            (Backend::Engine(e), SrqBackend::Engine(q)) => e.nic().destroy_srq(q.id()),
            (Backend::Daemon(session), SrqBackend::Daemon(q)) => session.destroy_srq(q),
            _ => Err(foreign_srq()),
        }
    }

    /// The device's GSI QP (QP1), for rdma_cm.
    pub fn create_gsi_qp(&self, init: QpInitAttr) -> Result<QpBackend> {
        match self {
            Backend::Engine(e) => e.nic().create_gsi_qp(init).map(QpBackend::Engine),
            Backend::Daemon(session) => session.create_gsi_qp(init).map(|qp| QpBackend::Daemon(Box::new(qp))),
        }
    }

    /// A QP's send queue, for posting a chain of requests: one lock and
    /// one doorbell for an engine in the process.
    pub fn send_chain<'a>(&'a self, qp: &'a QpBackend) -> SendChain<'a> {
        match (self, qp) {
            (Backend::Engine(e), QpBackend::Engine(posts)) => SendChain::Engine(e.nic().send_queue(posts)),
            (Backend::Daemon(session), QpBackend::Daemon(qp)) => SendChain::Daemon(session, qp),
            _ => unreachable!("a QP belongs to the backend that made it"),
        }
    }

    pub fn modify_qp(&self, qp: &QpBackend, attr: &QpAttr) -> Result<QpState> {
        match (self, qp) {
            (Backend::Engine(e), qp) => e.nic().modify_qp(qp.qpn(), attr),
            (Backend::Daemon(session), QpBackend::Daemon(qp)) => session.modify_qp(qp, attr),
            _ => unreachable!("a QP belongs to the backend that made it"),
        }
    }

    pub fn query_qp(&self, qpn: u32) -> Option<(QpState, QpAttributes)> {
        match self {
            Backend::Engine(e) => e.nic().query_qp(qpn),
            Backend::Daemon(session) => session.query_qp(qpn).ok(),
        }
    }

    pub fn post_send(&self, qp: &QpBackend, wr: SendWorkRequest) -> Result<()> {
        match (self, qp) {
            (Backend::Engine(e), QpBackend::Engine(posts)) => e.nic().post_send(posts, wr),
            (Backend::Daemon(session), QpBackend::Daemon(qp)) => session.post_send(qp, &wr),
            _ => unreachable!("a QP belongs to the backend that made it"),
        }
    }

    pub fn post_recv(&self, qp: &QpBackend, wr: RecvWorkRequest) -> Result<()> {
        match (self, qp) {
            (Backend::Engine(e), QpBackend::Engine(posts)) => e.nic().post_recv(posts, wr),
            (Backend::Daemon(session), QpBackend::Daemon(qp)) => session.post_recv(qp, &wr),
            _ => unreachable!("a QP belongs to the backend that made it"),
        }
    }

    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().destroy_qp(qpn),
            Backend::Daemon(session) => session.destroy_qp(qpn),
        }
    }

    pub fn set_qp_rate_limit(&self, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().set_qp_rate_limit(qpn, bits_per_second),
            Backend::Daemon(session) => session.set_qp_rate_limit(qpn, bits_per_second),
        }
    }

    pub fn set_qp_congestion_control(&self, qpn: u32, algorithm: Option<Choice>) -> Result<()> {
        match self {
            Backend::Engine(e) => e.nic().set_qp_congestion_control(qpn, algorithm),
            Backend::Daemon(session) => session.set_qp_congestion_control(qpn, algorithm.map(|a| a.0.spec())),
        }
    }

    pub fn qp_congestion_rate(&self, qpn: u32) -> Option<u64> {
        match self {
            Backend::Engine(e) => e.nic().qp_congestion_rate(qpn),
            Backend::Daemon(session) => session.qp_congestion_rate(qpn).ok().flatten(),
        }
    }

    /// The device's counters (zero if the daemon is gone).
    pub fn counters(&self) -> NicCounters {
        match self {
            Backend::Engine(e) => e.nic().counters(),
            Backend::Daemon(session) => session.counters().unwrap_or_default(),
        }
    }

    pub fn shared_memory(&self) -> bool {
        match self {
            Backend::Engine(e) => e.nic().shared_memory(),
            Backend::Daemon(session) => session.shared_memory(),
        }
    }

    pub fn engine_threads(&self) -> usize {
        match self {
            Backend::Engine(e) => e.nic().engine_threads(),
            Backend::Daemon(session) => session.engine_threads(),
        }
    }

    pub fn progress_mode(&self) -> ProgressMode {
        match self {
            Backend::Engine(e) => e.nic().progress_mode(),
            // The daemon's engine threads poll: nobody else drives them.
            Backend::Daemon(_) => ProgressMode::Dedicated,
        }
    }

    /// Drives the engine once, if it runs in this process.
    pub fn progress(&self) -> bool {
        match self {
            Backend::Engine(e) => e.nic().progress(),
            Backend::Daemon(_) => false,
        }
    }
}

/// Why a program's pages could not be shared with softrnicd.
fn share_error(e: std::io::Error) -> VerbsError {
    match e.kind() {
        std::io::ErrorKind::Unsupported => VerbsError::NotSupported(e.to_string()),
        _ => VerbsError::OutOfResources(format!("sharing the region's pages with softrnicd: {e}")),
    }
}

/// An SRQ used with a context whose backend did not make it.
fn foreign_srq() -> VerbsError {
    VerbsError::invalid("the SRQ belongs to a context of another backend")
}
