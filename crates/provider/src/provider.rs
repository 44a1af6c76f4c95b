//! Where a program's verbs run: an engine inside the process, or
//! softrnicd, which serves many processes from one engine. The Rust API and
//! `libibverbs.so.1` hold a [`Provider`] under their objects and call its
//! methods; which of the two it is never leaves this file.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use softrnic_engine::{Nic, NicCounters, ProgressMode};
use softrnic_event::{EventQueue, wait_readable};
use softrnic_transport::{AsyncEvent, Mtu};

use crate::client::{self, Session};
use softrnic_daemon_protocol::block::BlockOffload;
use softrnic_daemon_protocol::protocol::Translation;
use softrnic_daemon_protocol::shared_memory::SharedMapping;
use softrnic_transport::{
    Access, Choice, Completion, CompletionQueue, CqId, DmaBuffer, MrKeys, PdId, PostQueues, QpAttr, QpAttributes,
    QpInitAttr, QpState, RecvWorkRequest, Registration, Result, SendWorkRequest, SharedReceiveQueue, SrqAttr, SrqId,
    VerbsError, WindowType,
};

/// An asynchronous event of a device: about one of its objects, as the
/// transport raises them, or about the device itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    Object(AsyncEvent),
    /// The device is gone (softrnicd stopped under its programs): nothing
    /// more will complete, and no verb will succeed
    /// (`IBV_EVENT_DEVICE_FATAL`).
    Fatal,
}

/// What holds an engine in the process: a `Nic`, or something that shares
/// one (the C library shares one engine among a process's contexts).
pub trait EngineHolder {
    fn nic(&self) -> &Nic;

    /// Where the asynchronous events of this holder's objects queue: the
    /// engine's own queue, unless the holder routes them elsewhere (a
    /// context sharing its engine with others gets those of its objects).
    fn async_events(&self) -> &EventQueue<AsyncEvent> {
        self.nic().async_events()
    }
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

    fn async_events(&self) -> &EventQueue<AsyncEvent> {
        (**self).async_events()
    }
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// softrnicd serves this program's devices and refused, or cannot be
    /// reached.
    #[error(transparent)]
    Daemon(VerbsError),
    /// The engine in the process could not start.
    #[error(transparent)]
    Engine(softrnic_engine::OpenError),
}

/// A completion channel: where the notifications of the CQs attached to
/// it arrive, behind a file descriptor that is readable while one waits.
pub struct CompletionChannel(ChannelOf);

enum ChannelOf {
    Engine(Arc<EventQueue<CqId>>),
    Daemon(client::Channel),
}

impl CompletionChannel {
    /// The descriptor `poll`/`epoll` wait on, and the verbs'
    /// `ibv_comp_channel.fd`.
    pub fn fd(&self) -> RawFd {
        match &self.0 {
            ChannelOf::Engine(queue) => queue.as_raw_fd(),
            ChannelOf::Daemon(channel) => channel.as_fd().as_raw_fd(),
        }
    }

    /// The next notification, the CQ it names: waits for one unless the
    /// program made the descriptor non-blocking (`EAGAIN` then). While
    /// this thread waits, the engine's threads drive the shards of
    /// `shards` (a mask, [`DeviceCq::shards`]) at once, since no poll will.
    pub fn take<E: EngineHolder>(&self, provider: &Provider<E>, shards: u64) -> io::Result<CqId> {
        match &self.0 {
            ChannelOf::Engine(queue) => match queue.try_pop() {
                Some(cq) => Ok(cq),
                None => {
                    let _waiting = provider.application_waits(shards);
                    queue.pop()
                }
            },
            ChannelOf::Daemon(channel) => channel.take(),
        }
    }

    /// The next notification within `timeout`, if one fires.
    pub fn wait<E: EngineHolder>(
        &self,
        provider: &Provider<E>,
        shards: u64,
        timeout: Duration,
    ) -> io::Result<Option<CqId>> {
        match &self.0 {
            ChannelOf::Engine(queue) => {
                if let Some(cq) = queue.try_pop() {
                    return Ok(Some(cq));
                }
                let _waiting = provider.application_waits(shards);
                wait_readable(&[queue.as_raw_fd()], timeout)?;
                Ok(queue.try_pop())
            }
            ChannelOf::Daemon(channel) => channel.get_event(timeout),
        }
    }
}

/// A device: the engine in this process, or softrnicd's through a
/// session. Which it is stays inside this crate.
pub struct Provider<E: EngineHolder = Nic>(Device<E>);

enum Device<E> {
    Engine(E),
    Daemon(Session),
}

/// A completion queue of a [`Provider`].
pub struct DeviceCq(CqOf);

enum CqOf {
    Engine(Arc<CompletionQueue>),
    Daemon(Box<client::Cq>),
}

/// A queue pair of a [`Provider`].
pub struct DeviceQp(QpOf);

enum QpOf {
    Engine(Arc<PostQueues>),
    Daemon(Box<client::Qp>),
}

/// A shared receive queue of a [`Provider`].
pub struct DeviceSrq(SrqOf);

enum SrqOf {
    Engine(Arc<SharedReceiveQueue>),
    Daemon(Box<client::Srq>),
}

impl DeviceSrq {
    pub fn id(&self) -> SrqId {
        match &self.0 {
            SrqOf::Engine(q) => q.id(),
            SrqOf::Daemon(q) => q.id,
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

/// See [`Provider::send_chain`].
pub struct SendChain<'a>(ChainOf<'a>);

enum ChainOf<'a> {
    Engine(softrnic_engine::engine::SendQueue<'a>),
    Daemon(&'a Session, &'a client::Qp),
}

impl SendChain<'_> {
    pub fn post(&mut self, wr: SendWorkRequest) -> Result<()> {
        match &mut self.0 {
            ChainOf::Engine(queue) => queue.post(wr),
            ChainOf::Daemon(session, qp) => session.post_send(qp, &wr),
        }
    }
}

impl DeviceCq {
    /// The engine's shards whose QPs feed this CQ, as a mask (none
    /// through softrnicd, whose engine runs elsewhere).
    pub fn shards(&self) -> u64 {
        match &self.0 {
            CqOf::Engine(cq) => cq.shards(),
            CqOf::Daemon(_) => 0,
        }
    }

    pub fn id(&self) -> CqId {
        match &self.0 {
            CqOf::Engine(cq) => cq.id(),
            CqOf::Daemon(cq) => cq.id,
        }
    }

    /// Takes what the CQ holds, without driving the engine.
    pub fn poll_held(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        match &self.0 {
            CqOf::Engine(cq) => cq.poll(max, out),
            CqOf::Daemon(cq) => cq.poll(max, out),
        }
    }

    /// `ibv_req_notify_cq`.
    pub fn request_notify(&self, solicited_only: bool) {
        match &self.0 {
            CqOf::Engine(cq) => cq.request_notify(solicited_only),
            CqOf::Daemon(cq) => cq.request_notify(solicited_only),
        }
    }
}

impl DeviceQp {
    pub fn qpn(&self) -> u32 {
        match &self.0 {
            QpOf::Engine(posts) => posts.qpn(),
            QpOf::Daemon(qp) => qp.qpn,
        }
    }
}

impl<E: EngineHolder> Provider<E> {
    /// Opens the device on `addr` where the environment says
    /// ([`crate::socket_path::from_env`]): softrnicd's when a daemon
    /// serves this program, else an engine in this process that `engine`
    /// starts (reading its own configuration).
    pub fn open(
        addr: IpAddr,
        engine: impl FnOnce() -> std::result::Result<E, softrnic_engine::OpenError>,
    ) -> std::result::Result<Provider<E>, OpenError> {
        match crate::socket_path::from_env() {
            Some(socket) => Session::connect(&socket, addr).map(Provider::through).map_err(OpenError::Daemon),
            None => engine().map(Provider::in_process).map_err(OpenError::Engine),
        }
    }

    /// The engine `engine` holds, in this process.
    pub fn in_process(engine: E) -> Provider<E> {
        Provider(Device::Engine(engine))
    }

    /// softrnicd's device, through `session`.
    pub fn through(session: Session) -> Provider<E> {
        Provider(Device::Daemon(session))
    }

    /// The engine, when it runs in this process: for tests and tools that
    /// look inside it (its regions, its QPs' state); no verb needs it.
    pub fn engine_in_process(&self) -> Option<&Nic> {
        match &self.0 {
            Device::Engine(e) => Some(e.nic()),
            Device::Daemon(_) => None,
        }
    }

    /// Whether softrnicd serves this device (for reports; nothing else
    /// needs to know).
    pub fn served_by_daemon(&self) -> bool {
        matches!(self.0, Device::Daemon(_))
    }

    /// The largest path MTU the device's network interface carries.
    pub fn active_mtu(&self) -> Mtu {
        match &self.0 {
            Device::Engine(e) => softrnic_engine::interface::active_mtu(e.nic().addr()),
            Device::Daemon(session) => Mtu::from_bytes(session.active_mtu()).unwrap_or(Mtu::Mtu1024),
        }
    }

    /// The descriptor the device's asynchronous events arrive on (the
    /// verbs' `async_fd`): readable while one waits.
    pub fn async_fd(&self) -> RawFd {
        match &self.0 {
            Device::Engine(e) => e.async_events().as_raw_fd(),
            Device::Daemon(session) => session.async_fd().as_raw_fd(),
        }
    }

    /// The next asynchronous event, waiting for one unless the program
    /// made [`Provider::async_fd`] non-blocking (`EAGAIN` then). An engine
    /// in the process never goes away; softrnicd may.
    pub fn next_async_event(&self) -> io::Result<DeviceEvent> {
        match &self.0 {
            Device::Engine(e) => e.async_events().pop().map(DeviceEvent::Object),
            Device::Daemon(session) => session.next_device_event(),
        }
    }

    /// A new completion channel.
    pub fn create_channel(&self) -> Result<CompletionChannel> {
        match &self.0 {
            Device::Engine(_) => EventQueue::new()
                .map(|queue| CompletionChannel(ChannelOf::Engine(Arc::new(queue))))
                .map_err(|e| VerbsError::OutOfResources(format!("a completion channel's eventfd: {e}"))),
            Device::Daemon(session) => session.create_channel().map(|c| CompletionChannel(ChannelOf::Daemon(c))),
        }
    }

    /// Closes a channel no CQ uses any more.
    pub fn destroy_channel(&self, channel: &CompletionChannel) -> Result<()> {
        match (&self.0, &channel.0) {
            (Device::Daemon(session), ChannelOf::Daemon(channel)) => session.destroy_channel(channel),
            _ => Ok(()),
        }
    }

    /// Sends `cq`'s notifications to `channel`; `None` stops them.
    pub fn attach_cq(&self, cq: CqId, channel: Option<&CompletionChannel>) -> Result<()> {
        match (&self.0, channel.map(|c| &c.0)) {
            (Device::Engine(e), None) => {
                e.nic().set_channel(cq, None);
                Ok(())
            }
            (Device::Engine(e), Some(ChannelOf::Engine(queue))) => {
                e.nic().set_channel(cq, Some(queue.clone()));
                Ok(())
            }
            (Device::Daemon(session), None) => session.set_cq_channel(cq, None),
            (Device::Daemon(session), Some(ChannelOf::Daemon(channel))) => session.set_cq_channel(cq, Some(channel)),
            _ => Err(VerbsError::invalid("the completion channel belongs to another device")),
        }
    }

    /// After `cq` is destroyed: its notifications stop and those waiting in
    /// `channel` go (softrnicd stops them itself, and a reader skips those
    /// it already sent).
    pub fn forget_cq(&self, cq: CqId, channel: &CompletionChannel) {
        if let (Device::Engine(e), ChannelOf::Engine(queue)) = (&self.0, &channel.0) {
            e.nic().set_channel(cq, None);
            queue.retain(|&fired| fired != cq);
        }
    }

    /// `ibv_resize_cq`: the CQ holds at least `entries` from now on; how
    /// many it holds (through softrnicd its ring is a power of two).
    pub fn resize_cq(&self, cq: &DeviceCq, entries: u32) -> Result<u32> {
        match (&self.0, &cq.0) {
            (_, CqOf::Engine(queue)) => queue.resize(entries as usize).map(|()| entries),
            (Device::Daemon(session), CqOf::Daemon(ring)) => session.resize_cq(ring, entries),
            (Device::Engine(_), CqOf::Daemon(_)) => {
                Err(VerbsError::Device("a CQ of softrnicd's on a context without it".into()))
            }
        }
    }

    /// While the guard lives, the engine's threads drive the shards of
    /// `shards` at once: the calling thread is about to block instead of
    /// polling them (nothing to do through softrnicd).
    pub fn application_waits(&self, shards: u64) -> Option<softrnic_engine::progress::ApplicationWait<'_>> {
        match &self.0 {
            Device::Engine(e) => Some(e.nic().application_waits(shards)),
            Device::Daemon(_) => None,
        }
    }

    pub fn addr(&self) -> IpAddr {
        match &self.0 {
            Device::Engine(e) => e.nic().addr(),
            Device::Daemon(session) => session.addr(),
        }
    }

    pub fn alloc_pd(&self) -> Result<PdId> {
        match &self.0 {
            Device::Engine(e) => Ok(e.nic().alloc_pd()),
            Device::Daemon(session) => session.alloc_pd(),
        }
    }

    pub fn dealloc_pd(&self, pd: PdId) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().dealloc_pd(pd),
            Device::Daemon(session) => session.dealloc_pd(pd),
        }
    }

    /// Registers `len` new zeroed bytes: the process's own heap for an
    /// engine in the process, a memfd both sides map for the daemon.
    pub fn register(&self, pd: PdId, len: usize, access: Access) -> Result<(Arc<DmaBuffer>, MrKeys, u64)> {
        match &self.0 {
            Device::Engine(e) => {
                let buffer = Arc::new(engine_memory(e.nic(), len)?);
                crate::pin::pin(buffer.as_ptr(), len, access);
                let iova = iova_of(buffer.as_ptr());
                let keys = self.register_buffer(pd, buffer.clone(), iova, access)?;
                Ok((buffer, keys, iova))
            }
            Device::Daemon(session) => {
                let memory = SharedMapping::create("softrnic-mr", len.max(1))
                    .map_err(|e| VerbsError::OutOfResources(format!("shared memory for a region: {e}")))?;
                // Faulted in by this program, whose memory it is.
                crate::pin::pin(memory.as_ptr(), len, access);
                let iova = iova_of(memory.as_ptr());
                let keys = session.register_memory(pd, &memory, 0, len, iova, access)?;
                Ok((Arc::new(memory.into_buffer(0, len)), keys, iova))
            }
        }
    }

    pub fn register_buffer(&self, pd: PdId, buffer: Arc<DmaBuffer>, iova: u64, access: Access) -> Result<MrKeys> {
        match &self.0 {
            Device::Engine(e) => e.nic().register_memory(Registration::whole(pd, buffer, iova, access)),
            Device::Daemon(_) => Err(VerbsError::NotSupported(
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
        match &self.0 {
            Device::Engine(e) => {
                // SAFETY: forwarded.
                let buffer = Arc::new(unsafe { program_memory(e.nic(), addr, len) });
                crate::pin::pin(addr, len, access);
                e.nic().register_memory(Registration { pd, buffer, offset: 0, len, iova, access })
            }
            Device::Daemon(session) => {
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
    /// As for [`Provider::register_program_memory`], for the range.
    pub unsafe fn reregister_program_memory(
        &self,
        lkey: u32,
        pd: PdId,
        (addr, len, moved): (*mut u8, usize, bool),
        access: Option<Access>,
    ) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => {
                let nic = e.nic();
                let region = nic.memory_region(lkey).ok_or(VerbsError::NotFound("memory region"))?;
                let iova = if moved { addr as u64 } else { region.iova };
                // SAFETY: the caller's promise, as at registration.
                let buffer = Arc::new(unsafe { program_memory(nic, addr, len) });
                let access = access.unwrap_or(region.access);
                nic.reregister_memory(lkey, Registration { pd, buffer, offset: 0, len, iova, access }).map(|_| ())
            }
            Device::Daemon(session) if moved => {
                // SAFETY: forwarded.
                let shared = unsafe { crate::remap::share(addr, len) }.map_err(share_error)?;
                let fds: Vec<_> = shared.parts.iter().map(|(remap, _)| remap.fd()).collect();
                let segments = shared.parts.iter().map(|(_, segment)| *segment).collect();
                let translation =
                    Translation { iova: addr as u64, lead: shared.lead as u64, len: len as u64, segments };
                session.reregister_memory(lkey, Some(pd), access, Some(translation), &fds)
            }
            Device::Daemon(session) => session.reregister_memory(lkey, Some(pd), access, None, &[]),
        }
    }

    /// The device's clock, which stamps completions.
    pub fn now(&self) -> softrnic_transport::Instant {
        match &self.0 {
            Device::Engine(e) => e.nic().now(),
            Device::Daemon(session) => session.now(),
        }
    }

    pub fn deregister(&self, lkey: u32) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().deregister_memory(lkey),
            Device::Daemon(session) => session.deregister_memory(lkey),
        }
    }

    /// Allocates a memory window (`ibv_alloc_mw`); returns its rkey.
    pub fn alloc_window(&self, pd: PdId, kind: WindowType) -> Result<u32> {
        match &self.0 {
            Device::Engine(e) => e.nic().alloc_window(pd, kind),
            Device::Daemon(session) => session.alloc_window(pd, kind),
        }
    }

    /// Frees the window `rkey` names, bound or not (`ibv_dealloc_mw`).
    pub fn dealloc_window(&self, rkey: u32) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().dealloc_window(rkey),
            Device::Daemon(session) => session.dealloc_window(rkey),
        }
    }

    pub fn create_cq(&self, capacity: usize) -> Result<DeviceCq> {
        match &self.0 {
            Device::Engine(e) => Ok(DeviceCq(CqOf::Engine(e.nic().create_cq(capacity)))),
            Device::Daemon(session) => session.create_cq(capacity, None).map(|cq| DeviceCq(CqOf::Daemon(Box::new(cq)))),
        }
    }

    pub fn destroy_cq(&self, cq: &DeviceCq) -> Result<()> {
        self.destroy_cq_id(cq.id())
    }

    pub fn destroy_cq_id(&self, cq: CqId) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().destroy_cq(cq),
            Device::Daemon(session) => session.destroy_cq(cq),
        }
    }

    pub fn poll_cq(&self, cq: &DeviceCq, max: usize, out: &mut Vec<Completion>) -> usize {
        match (&self.0, &cq.0) {
            (Device::Engine(e), CqOf::Engine(cq)) => e.nic().poll_cq(cq, max, out),
            (Device::Daemon(_), CqOf::Daemon(cq)) => cq.poll(max, out),
            _ => unreachable!("a CQ belongs to the device that made it"),
        }
    }

    pub fn create_qp(&self, init: QpInitAttr) -> Result<DeviceQp> {
        match &self.0 {
            Device::Engine(e) => e.nic().create_qp(init).map(|posts| DeviceQp(QpOf::Engine(posts))),
            Device::Daemon(session) => session.create_qp(init).map(|qp| DeviceQp(QpOf::Daemon(Box::new(qp)))),
        }
    }

    /// A QP whose storage blocks the device offloads (E7): softrnicd's
    /// command processors compute and check their CRCs, and place their
    /// payloads. The engine in the process has no cores of its own to
    /// offload to, so it refuses.
    pub fn create_block_qp(&self, init: QpInitAttr, offload: BlockOffload) -> Result<DeviceQp> {
        match &self.0 {
            Device::Engine(_) => Err(VerbsError::NotSupported(
                "block offloads run in softrnicd: start one and set SOFTRNIC_DAEMON (or SOFTRNIC_DAEMON=start)".into(),
            )),
            Device::Daemon(session) => {
                session.create_block_qp(init, offload).map(|qp| DeviceQp(QpOf::Daemon(Box::new(qp))))
            }
        }
    }

    pub fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<DeviceSrq> {
        match &self.0 {
            Device::Engine(e) => e.nic().create_srq(pd, attr).map(|q| DeviceSrq(SrqOf::Engine(q))),
            Device::Daemon(session) => session.create_srq(pd, attr).map(|q| DeviceSrq(SrqOf::Daemon(Box::new(q)))),
        }
    }

    /// `ibv_post_srq_recv`, one request.
    pub fn post_srq_recv(&self, srq: &DeviceSrq, wr: RecvWorkRequest) -> Result<()> {
        match (&self.0, &srq.0) {
            (_, SrqOf::Engine(q)) => q.post(wr),
            (Device::Daemon(session), SrqOf::Daemon(q)) => session.post_srq_recv(q, &wr),
            _ => Err(foreign_srq()),
        }
    }

    /// Arms the SRQ's limit event.
    pub fn set_srq_limit(&self, srq: &DeviceSrq, limit: u32) -> Result<()> {
        match (&self.0, &srq.0) {
            (_, SrqOf::Engine(q)) => q.set_limit(limit),
            (Device::Daemon(session), SrqOf::Daemon(q)) => session.set_srq_limit(q, limit),
            _ => Err(foreign_srq()),
        }
    }

    pub fn query_srq(&self, srq: &DeviceSrq) -> Result<SrqAttr> {
        match (&self.0, &srq.0) {
            (_, SrqOf::Engine(q)) => Ok(q.query().0),
            (Device::Daemon(session), SrqOf::Daemon(q)) => session.query_srq(q),
            _ => Err(foreign_srq()),
        }
    }

    pub fn destroy_srq(&self, srq: &DeviceSrq) -> Result<()> {
        match (&self.0, &srq.0) {
            (Device::Engine(e), SrqOf::Engine(q)) => e.nic().destroy_srq(q.id()),
            (Device::Daemon(session), SrqOf::Daemon(q)) => session.destroy_srq(q),
            _ => Err(foreign_srq()),
        }
    }

    /// Destroys an SRQ its program left when the program's context closes:
    /// the engine's at once; softrnicd's go with the session, which closes
    /// with the context.
    pub fn release_srq(&self, srq: SrqId) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().destroy_srq(srq),
            Device::Daemon(_) => Ok(()),
        }
    }

    /// The device's GSI QP (QP1), for rdma_cm.
    pub fn create_gsi_qp(&self, init: QpInitAttr) -> Result<DeviceQp> {
        match &self.0 {
            Device::Engine(e) => e.nic().create_gsi_qp(init).map(|posts| DeviceQp(QpOf::Engine(posts))),
            Device::Daemon(session) => session.create_gsi_qp(init).map(|qp| DeviceQp(QpOf::Daemon(Box::new(qp)))),
        }
    }

    /// A QP's send queue, for posting a chain of requests: one lock and
    /// one doorbell for an engine in the process.
    pub fn send_chain<'a>(&'a self, qp: &'a DeviceQp) -> SendChain<'a> {
        match (&self.0, &qp.0) {
            (Device::Engine(e), QpOf::Engine(posts)) => SendChain(ChainOf::Engine(e.nic().send_queue(posts))),
            (Device::Daemon(session), QpOf::Daemon(qp)) => SendChain(ChainOf::Daemon(session, qp)),
            _ => unreachable!("a QP belongs to the device that made it"),
        }
    }

    pub fn modify_qp(&self, qp: &DeviceQp, attr: &QpAttr) -> Result<QpState> {
        match (&self.0, &qp.0) {
            (Device::Engine(e), _) => e.nic().modify_qp(qp.qpn(), attr),
            (Device::Daemon(session), QpOf::Daemon(qp)) => session.modify_qp(qp, attr),
            _ => unreachable!("a QP belongs to the device that made it"),
        }
    }

    pub fn query_qp(&self, qpn: u32) -> Option<(QpState, QpAttributes)> {
        match &self.0 {
            Device::Engine(e) => e.nic().query_qp(qpn),
            Device::Daemon(session) => session.query_qp(qpn).ok(),
        }
    }

    pub fn post_send(&self, qp: &DeviceQp, wr: SendWorkRequest) -> Result<()> {
        match (&self.0, &qp.0) {
            (Device::Engine(e), QpOf::Engine(posts)) => e.nic().post_send(posts, wr),
            (Device::Daemon(session), QpOf::Daemon(qp)) => session.post_send(qp, &wr),
            _ => unreachable!("a QP belongs to the device that made it"),
        }
    }

    pub fn post_recv(&self, qp: &DeviceQp, wr: RecvWorkRequest) -> Result<()> {
        match (&self.0, &qp.0) {
            (Device::Engine(e), QpOf::Engine(posts)) => e.nic().post_recv(posts, wr),
            (Device::Daemon(session), QpOf::Daemon(qp)) => session.post_recv(qp, &wr),
            _ => unreachable!("a QP belongs to the device that made it"),
        }
    }

    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().destroy_qp(qpn),
            Device::Daemon(session) => session.destroy_qp(qpn),
        }
    }

    /// Attaches UD QP `qpn` to multicast `group` (`ibv_attach_mcast`).
    pub fn attach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().attach_multicast(qpn, group),
            Device::Daemon(session) => session.attach_multicast(qpn, group),
        }
    }

    pub fn detach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().detach_multicast(qpn, group),
            Device::Daemon(session) => session.detach_multicast(qpn, group),
        }
    }

    pub fn set_qp_rate_limit(&self, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().set_qp_rate_limit(qpn, bits_per_second),
            Device::Daemon(session) => session.set_qp_rate_limit(qpn, bits_per_second),
        }
    }

    pub fn set_qp_congestion_control(&self, qpn: u32, algorithm: Option<Choice>) -> Result<()> {
        match &self.0 {
            Device::Engine(e) => e.nic().set_qp_congestion_control(qpn, algorithm),
            Device::Daemon(session) => session.set_qp_congestion_control(qpn, algorithm.map(|a| a.0.spec())),
        }
    }

    pub fn qp_congestion_rate(&self, qpn: u32) -> Option<u64> {
        match &self.0 {
            Device::Engine(e) => e.nic().qp_congestion_rate(qpn),
            Device::Daemon(session) => session.qp_congestion_rate(qpn).ok().flatten(),
        }
    }

    /// The device's counters (zero if the daemon is gone).
    pub fn counters(&self) -> NicCounters {
        match &self.0 {
            Device::Engine(e) => e.nic().counters(),
            Device::Daemon(session) => session.counters().unwrap_or_default(),
        }
    }

    pub fn shared_memory(&self) -> bool {
        match &self.0 {
            Device::Engine(e) => e.nic().shared_memory(),
            Device::Daemon(session) => session.shared_memory(),
        }
    }

    pub fn engine_threads(&self) -> usize {
        match &self.0 {
            Device::Engine(e) => e.nic().engine_threads(),
            Device::Daemon(session) => session.engine_threads(),
        }
    }

    pub fn progress_mode(&self) -> ProgressMode {
        match &self.0 {
            Device::Engine(e) => e.nic().progress_mode(),
            // The daemon's engine threads poll: nobody else drives them.
            Device::Daemon(_) => ProgressMode::Dedicated,
        }
    }

    /// Drives the engine once, if it runs in this process.
    pub fn progress(&self) -> bool {
        match &self.0 {
            Device::Engine(e) => e.nic().progress(),
            Device::Daemon(_) => false,
        }
    }
}

/// `len` new zeroed bytes for a region of an engine in this process: on a
/// memfd where the engine has the same-host wire (and one copy is not
/// turned off, `SOFTRNIC_NO_ONE_COPY`), so that its peers on
/// this host copy payloads straight out of it (one copy,
/// [`softrnic_transport::by_reference`]); the heap otherwise.
fn engine_memory(nic: &Nic, len: usize) -> Result<DmaBuffer> {
    if !nic.one_copy() {
        return Ok(DmaBuffer::new(len));
    }
    let memory = SharedMapping::create("softrnic-mr", len.max(1))
        .map_err(|e| VerbsError::OutOfResources(format!("shared memory for a region: {e}")))?;
    Ok(memory.into_buffer(0, len))
}

/// The program's `[addr, addr + len)` as a region's buffer: remapped onto
/// memfds ([`crate::remap`]) where the engine has the same-host wire, so
/// that its peers on this host copy payloads straight out of it; in place
/// where it does not, or where the pages must not or cannot be remapped
/// (memory shared with another process; the stack), and payloads then
/// cross the ring.
///
/// # Safety
/// As for [`Provider::register_program_memory`].
unsafe fn program_memory(nic: &Nic, addr: *mut u8, len: usize) -> DmaBuffer {
    if nic.one_copy() && len > 0 && crate::remap::only_this_process_sees(addr, len) {
        // SAFETY: forwarded.
        let shared = unsafe { crate::remap::share(addr, len) };
        if let Ok(shared) = shared
            && let Ok(parts) = shared.shared_parts(len)
        {
            // SAFETY: the caller's promise; the memfds stay mapped at these
            // addresses while `shared` holds them, and the buffer holds it.
            return unsafe { DmaBuffer::with_keeper(addr, len, Box::new(shared)) }.shared_in(parts);
        }
    }
    // SAFETY: the caller's promise; the engine stops reaching the region
    // when it is deregistered.
    unsafe { DmaBuffer::from_raw_parts(addr, len) }
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
    VerbsError::invalid("the SRQ belongs to another device")
}
