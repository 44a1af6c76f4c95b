//! A program's end of softrnicd: control verbs as calls over the socket,
//! the data path as memory operations on the shared queues.
//!
//! `post_send` checks the request as the engine would (the same
//! [`check_send`]), writes a WQE into the send ring and rings the doorbell
//! only if the command processor sleeps; `poll` copies CQEs out of the
//! CQ's ring. Neither makes a system call while the daemon is busy.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use softrnic_engine::NicCounters;
use softrnic_ring::spsc::{Consumer, Producer};
use softrnic_transport::{
    Access, AlgorithmSpec, AsyncEvent, Completion, CqId, MrKeys, PdId, QpAttr, QpAttributes, QpCaps, QpInitAttr,
    QpState, QpType, RecvWorkRequest, Result, SendWorkRequest, SrqAttr, SrqId, VerbsError, WindowType, check_recv,
    check_send,
};

use softrnic_daemon_protocol::block::BlockOffload;
use softrnic_daemon_protocol::doorbell::DoorbellPage;
use softrnic_daemon_protocol::protocol::{
    self, Opened, PROTOCOL_VERSION, RemoteAlgorithm, Request, Response, Translation,
};
use softrnic_daemon_protocol::queue::{ARMED_NEXT, ARMED_SOLICITED, SharedQueue};
use softrnic_daemon_protocol::shared_memory::{Segment, SharedMapping};
use softrnic_daemon_protocol::wqe::{self, CQE_LEN};

use crate::provider::DeviceEvent;

/// `SOFTRNIC_FORWARD=1`: every data command travels over the socket (the
/// forwarding design, FreeFlow's), the baseline for the shared queues.
pub const FORWARD_ENV: &str = "SOFTRNIC_FORWARD";

/// An open device served by softrnicd.
pub struct Session {
    socket: Arc<Mutex<OwnedFd>>,
    /// Data commands go over the socket ([`FORWARD_ENV`]).
    forward: bool,
    doorbell: DoorbellPage,
    wake: OwnedFd,
    /// Where the daemon writes this program's asynchronous events.
    events: OwnedFd,
    /// The daemon's going has been reported ([`Session::next_device_event`]).
    gone_reported: AtomicBool,
    addr: IpAddr,
    opened: Opened,
}

fn call(socket: &Mutex<OwnedFd>, request: Request, fds: &[BorrowedFd<'_>]) -> Result<(Response, Vec<OwnedFd>)> {
    let socket = socket.lock().unwrap_or_else(|e| e.into_inner());
    protocol::call(&*socket, &request, fds).map_err(lost)
}

fn lost(e: io::Error) -> VerbsError {
    VerbsError::Device(format!("softrnicd: {e}"))
}

fn unexpected(response: Response) -> VerbsError {
    match response {
        Response::Error(e) => e.into_verbs(),
        other => VerbsError::Device(format!("softrnicd answered out of turn: {other:?}")),
    }
}

/// A program hands the daemon the memory behind its registrations, so the
/// daemon must be its own user's or root's, as the kernel says of the
/// process that listens (`SO_PEERCRED`), not whoever bound a socket where
/// the program looked.
fn check_daemon_user(fd: &OwnedFd, socket: &Path) -> Result<()> {
    let daemon = softrnic_daemon_protocol::peer::credentials(fd.as_fd()).map_err(lost)?.uid;
    let me = rustix::process::getuid().as_raw();
    if daemon == me || daemon == 0 {
        return Ok(());
    }
    Err(VerbsError::Device(format!(
        "softrnicd at {} runs as uid {}, neither you (uid {}) nor root: it gets none of your memory; \
         start your own (SOFTRNIC_DAEMON=start) or set SOFTRNIC_DAEMON=off",
        socket.display(),
        daemon,
        me
    )))
}

impl Session {
    /// Connects to the daemon at `socket` and opens its device on `addr`,
    /// forwarding data commands if [`FORWARD_ENV`] says so.
    pub fn connect(socket: &Path, addr: IpAddr) -> Result<Session> {
        Session::connect_with(socket, addr, std::env::var(FORWARD_ENV).is_ok_and(|v| v == "1"))
    }

    /// [`Session::connect`], forwarding data commands over the socket or
    /// not as `forward` says.
    pub fn connect_with(socket: &Path, addr: IpAddr, forward: bool) -> Result<Session> {
        let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| lost(e.into()))?;
        let unix = SocketAddrUnix::new(socket).map_err(|e| lost(e.into()))?;
        rustix::net::connect(&fd, &unix).map_err(|e| {
            VerbsError::Device(format!(
                "cannot reach softrnicd at {} ({e}); start it (softrnicd --socket {0}) or set SOFTRNIC_DAEMON=off",
                socket.display()
            ))
        })?;
        check_daemon_user(&fd, socket)?;
        let open = Request::Open { version: PROTOCOL_VERSION, addr, forward };
        let (response, fds) = protocol::call(&fd, &open, &[]).map_err(lost)?;
        let Response::Opened(opened) = response else { return Err(unexpected(response)) };
        let [page, wake, events]: [OwnedFd; 3] =
            fds.try_into().map_err(|_| VerbsError::Device("softrnicd's answer lacks its descriptors".into()))?;
        let doorbell = DoorbellPage::attach(page).map_err(lost)?;
        let gone_reported = AtomicBool::new(false);
        Ok(Session { socket: Arc::new(Mutex::new(fd)), forward, doorbell, wake, events, gone_reported, addr, opened })
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn active_mtu(&self) -> u32 {
        self.opened.active_mtu
    }

    pub fn engine_threads(&self) -> usize {
        self.opened.engine_threads as usize
    }

    pub fn shared_memory(&self) -> bool {
        self.opened.shared_memory
    }

    /// The device's clock, which stamps completions: nanoseconds since it
    /// opened.
    pub fn now(&self) -> softrnic_transport::Instant {
        softrnic_transport::Instant::from_nanos(unix_ns().saturating_sub(self.opened.epoch_unix_ns))
    }

    /// Whether the daemon's engine runs inline progress.
    pub fn inline_progress(&self) -> bool {
        self.opened.inline_progress
    }

    /// The descriptor the daemon writes this program's asynchronous events
    /// to (the verbs' `async_fd`): readable when one waits.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.events.as_fd()
    }

    /// The next asynchronous event about one of this program's objects,
    /// waiting for one unless the descriptor was made non-blocking (then
    /// `EAGAIN` when none waits).
    pub fn next_async_event(&self) -> io::Result<AsyncEvent> {
        let mut buffer = [0u8; protocol::MAX_EVENT];
        let (n, _) = rustix::net::recv(&self.events, &mut buffer, rustix::net::RecvFlags::empty())?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "softrnicd closed the event socket"));
        }
        protocol::decode_event(&buffer[..n])
    }

    /// [`Session::next_async_event`] as a device gives it: once softrnicd
    /// has closed the event socket (it stopped, or died), the device is
    /// gone, said once as [`DeviceEvent::Fatal`] and after that as `EIO`,
    /// as the kernel says it of a device removed under its programs.
    pub fn next_device_event(&self) -> io::Result<DeviceEvent> {
        match self.next_async_event() {
            Ok(event) => Ok(DeviceEvent::Object(event)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                let told = self.gone_reported.swap(true, Ordering::AcqRel);
                if told { Err(daemon_gone()) } else { Ok(DeviceEvent::Fatal) }
            }
            Err(e) => Err(e),
        }
    }

    pub fn set_qp_rate_limit(&self, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        self.call_done(Request::SetRateLimit { qpn, bits_per_second })
    }

    /// Runs `algorithm` on QP `qpn` (`None`: none). A module travels as
    /// its bytes, in a memfd: the daemon compiles it into its sandbox.
    pub fn set_qp_congestion_control(&self, qpn: u32, algorithm: Option<AlgorithmSpec>) -> Result<()> {
        let (algorithm, module) = match algorithm {
            None => (None, None),
            Some(AlgorithmSpec::Builtin { name, params }) => (Some(RemoteAlgorithm::Builtin { name, params }), None),
            Some(AlgorithmSpec::Module { name, bytes, params }) => {
                let memfd = SharedMapping::create("softrnic-cc-module", bytes.len()).map_err(lost)?;
                memfd.bytes(0, bytes.len()).write(0, &bytes);
                (Some(RemoteAlgorithm::Module { name, params, len: bytes.len() as u64 }), Some(memfd))
            }
        };
        let fds: Vec<BorrowedFd<'_>> = module.iter().map(|m| m.fd()).collect();
        match self.call(Request::SetCongestionControl { qpn, algorithm }, &fds)?.0 {
            Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// The rate QP `qpn`'s congestion control sets it, if it runs one.
    pub fn qp_congestion_rate(&self, qpn: u32) -> Result<Option<u64>> {
        match self.call(Request::CongestionRate { qpn }, &[])?.0 {
            Response::Rate(rate) => Ok(rate),
            other => Err(unexpected(other)),
        }
    }

    pub fn counters(&self) -> Result<NicCounters> {
        match self.call(Request::Counters, &[])?.0 {
            Response::Counters(counters) => Ok(*counters),
            other => Err(unexpected(other)),
        }
    }

    fn call(&self, request: Request, fds: &[BorrowedFd<'_>]) -> Result<(Response, Vec<OwnedFd>)> {
        call(&self.socket, request, fds)
    }

    /// Whether data commands travel over the socket ([`FORWARD_ENV`]).
    pub fn forwarding(&self) -> bool {
        self.forward
    }

    fn call_done(&self, request: Request) -> Result<()> {
        match self.call(request, &[])?.0 {
            Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub fn alloc_pd(&self) -> Result<PdId> {
        match self.call(Request::AllocPd, &[])?.0 {
            Response::Pd(pd) => Ok(pd),
            other => Err(unexpected(other)),
        }
    }

    pub fn dealloc_pd(&self, pd: PdId) -> Result<()> {
        self.call_done(Request::DeallocPd { pd })
    }

    pub fn alloc_window(&self, pd: PdId, kind: WindowType) -> Result<u32> {
        match self.call(Request::AllocMw { pd, kind }, &[])?.0 {
            Response::Window(rkey) => Ok(rkey),
            other => Err(unexpected(other)),
        }
    }

    pub fn dealloc_window(&self, rkey: u32) -> Result<()> {
        self.call_done(Request::DeallocMw { rkey })
    }

    /// Registers `len` bytes of `memory` from `offset` on, addressed as
    /// `iova`.
    pub fn register_memory(
        &self,
        pd: PdId,
        memory: &SharedMapping,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys> {
        let whole = Segment { offset: 0, len: memory.len() as u64 };
        self.register_segments(pd, &[(memory.fd(), whole)], offset, len, iova, access)
    }

    /// Registers a region over memfd segments (see
    /// [`Request::RegisterMemory`]).
    pub fn register_segments(
        &self,
        pd: PdId,
        parts: &[(BorrowedFd<'_>, Segment)],
        lead: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys> {
        let segments = parts.iter().map(|(_, s)| *s).collect();
        let fds: Vec<BorrowedFd<'_>> = parts.iter().map(|(fd, _)| *fd).collect();
        let translation = Translation { iova, lead: lead as u64, len: len as u64, segments };
        let request = Request::RegisterMemory { pd, access, translation };
        match self.call(request, &fds)?.0 {
            Response::Mr(keys) => Ok(keys),
            other => Err(unexpected(other)),
        }
    }

    /// `ibv_rereg_mr`: the region `lkey` moves to `pd`, takes `access`,
    /// or covers `translation`, whose segments are those of `fds`; what is
    /// `None` stays.
    pub fn reregister_memory(
        &self,
        lkey: u32,
        pd: Option<PdId>,
        access: Option<Access>,
        translation: Option<Translation>,
        fds: &[BorrowedFd<'_>],
    ) -> Result<()> {
        match self.call(Request::ReregisterMemory { lkey, pd, access, translation }, fds)?.0 {
            Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub fn deregister_memory(&self, lkey: u32) -> Result<()> {
        self.call_done(Request::DeregisterMemory { lkey })
    }

    pub fn create_channel(&self) -> Result<Channel> {
        match self.call(Request::CreateChannel, &[])? {
            (Response::Channel(id), fds) => {
                let fd = fds.into_iter().next().ok_or_else(|| VerbsError::Device("channel without socket".into()))?;
                Ok(Channel { id, fd })
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    pub fn destroy_channel(&self, channel: &Channel) -> Result<()> {
        self.call_done(Request::DestroyChannel { channel: channel.id })
    }

    pub fn create_cq(&self, capacity: usize, channel: Option<&Channel>) -> Result<Cq> {
        let capacity = u32::try_from(capacity).map_err(|_| VerbsError::invalid("CQ too large"))?;
        match self.call(Request::CreateCq { capacity, channel: channel.map(|c| c.id) }, &[])? {
            (Response::Cq(layout), fds) => {
                let fd = fds.into_iter().next().ok_or_else(|| VerbsError::Device("CQ without ring".into()))?;
                let ring = SharedQueue::attach(fd, layout.slots, CQE_LEN as u32).map_err(lost)?;
                let yield_when_empty = self.opened.inline_progress;
                let forward = self.forward.then(|| self.socket.clone());
                let ring = Mutex::new(CqRing { ring, consumer: Consumer::default() });
                Ok(Cq { id: layout.cq, ring, yield_when_empty, forward })
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    /// Gives `cq` a completion channel (or takes it away).
    pub fn set_cq_channel(&self, cq: CqId, channel: Option<&Channel>) -> Result<()> {
        self.call_done(Request::SetCqChannel { cq, channel: channel.map(|c| c.id) })
    }

    pub fn destroy_cq(&self, cq: CqId) -> Result<()> {
        self.call_done(Request::DestroyCq { cq })
    }

    /// `ibv_resize_cq` (not while the CQ is polled, as verbs say): the
    /// daemon moves the unpolled completions to a ring of `entries` (a
    /// power of two at least), which replaces the CQ's. Returns its size.
    pub fn resize_cq(&self, cq: &Cq, entries: u32) -> Result<u32> {
        match self.call(Request::ResizeCq { cq: cq.id, entries }, &[])? {
            (Response::Cq(layout), fds) => {
                let fd = fds.into_iter().next().ok_or_else(|| VerbsError::Device("CQ without ring".into()))?;
                let ring = SharedQueue::attach(fd, layout.slots, CQE_LEN as u32).map_err(lost)?;
                *cq.ring.lock().unwrap_or_else(|e| e.into_inner()) = CqRing { ring, consumer: Consumer::default() };
                Ok(layout.slots)
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    pub fn create_qp(&self, init: QpInitAttr) -> Result<Qp> {
        self.create_qp_by(Request::CreateQp { init, blocks: None }, init)
    }

    /// A QP whose storage blocks the daemon offloads
    /// ([`softrnic_daemon_protocol::block`]).
    pub fn create_block_qp(&self, init: QpInitAttr, offload: BlockOffload) -> Result<Qp> {
        self.create_qp_by(Request::CreateQp { init, blocks: Some(offload) }, init)
    }

    /// The device's GSI QP (QP1), for rdma_cm.
    pub fn create_gsi_qp(&self, init: QpInitAttr) -> Result<Qp> {
        self.create_qp_by(Request::CreateGsiQp { init }, init)
    }

    fn create_qp_by(&self, request: Request, init: QpInitAttr) -> Result<Qp> {
        match self.call(request, &[])? {
            (Response::Qp(layout), fds) => {
                let [send, recv]: [OwnedFd; 2] =
                    fds.try_into().map_err(|_| VerbsError::Device("QP without its rings".into()))?;
                let send = SharedQueue::attach(send, layout.send_slots, layout.send_slot_size).map_err(lost)?;
                let recv = SharedQueue::attach(recv, layout.recv_slots, layout.recv_slot_size).map_err(lost)?;
                Ok(Qp {
                    qpn: layout.qpn,
                    qp_type: init.qp_type,
                    caps: layout.caps,
                    srq: init.srq.is_some(),
                    state: AtomicU8::new(QpState::Reset as u8),
                    send: Mutex::new((send, Producer::default())),
                    recv: Mutex::new((recv, Producer::default())),
                })
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    pub fn modify_qp(&self, qp: &Qp, attr: &QpAttr) -> Result<QpState> {
        match self.call(Request::ModifyQp { qpn: qp.qpn, attr: *attr }, &[])?.0 {
            Response::State(state) => {
                qp.state.store(state as u8, Ordering::Release);
                Ok(state)
            }
            other => Err(unexpected(other)),
        }
    }

    pub fn query_qp(&self, qpn: u32) -> Result<(QpState, QpAttributes)> {
        match self.call(Request::QueryQp { qpn }, &[])?.0 {
            Response::Query { state, attributes } => Ok((state, attributes)),
            other => Err(unexpected(other)),
        }
    }

    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        self.call_done(Request::DestroyQp { qpn })
    }

    pub fn attach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        self.call_done(Request::AttachMcast { qpn, group })
    }

    pub fn detach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        self.call_done(Request::DetachMcast { qpn, group })
    }

    /// `ibv_post_send`.
    pub fn post_send(&self, qp: &Qp, wr: &SendWorkRequest) -> Result<()> {
        check_send(qp.qpn, qp.qp_type, &qp.caps, qp.state(), wr)?;
        let size = wqe::send_slot_size(qp.caps.max_send_sge, qp.caps.max_inline_data);
        if self.forward {
            let wqe = entry(size, |slot| wqe::emit_send(wr, slot).max(wqe::SEND_HEADER));
            return self.call_done(Request::PostSend { qpn: qp.qpn, wqe });
        }
        self.publish(&qp.send, "the send queue of QP", qp.qpn, &entry(size, |slot| wqe::emit_send(wr, slot)))
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, qp: &Qp, wr: &RecvWorkRequest) -> Result<()> {
        check_recv(qp.qpn, &qp.caps, qp.srq, qp.state(), wr)?;
        let wqe = entry(wqe::recv_slot_size(qp.caps.max_recv_sge), |slot| wqe::emit_recv(wr, slot));
        if self.forward {
            return self.call_done(Request::PostRecv { qpn: qp.qpn, wqe });
        }
        self.publish(&qp.recv, "the receive queue of QP", qp.qpn, &wqe)
    }

    /// `ibv_create_srq`: its receives go into a ring the daemon moves into
    /// the engine's SRQ.
    pub fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<Srq> {
        match self.call(Request::CreateSrq { pd, attr }, &[])? {
            (Response::Srq(layout), fds) => {
                let fd = fds.into_iter().next().ok_or_else(|| VerbsError::Device("SRQ without ring".into()))?;
                let ring = SharedQueue::attach(fd, layout.slots, layout.slot_size).map_err(lost)?;
                Ok(Srq { id: layout.srq, max_sge: layout.max_sge, ring: Mutex::new((ring, Producer::default())) })
            }
            (other, _) => Err(unexpected(other)),
        }
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&self, srq: &Srq, wr: &RecvWorkRequest) -> Result<()> {
        if wr.sges.len() > srq.max_sge as usize {
            return Err(VerbsError::invalid(format!(
                "{} SGEs exceed the SRQ's max_sge {}",
                wr.sges.len(),
                srq.max_sge
            )));
        }
        let wqe = entry(wqe::recv_slot_size(srq.max_sge), |slot| wqe::emit_recv(wr, slot));
        self.publish(&srq.ring, "SRQ", srq.id.0, &wqe)
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`.
    pub fn set_srq_limit(&self, srq: &Srq, limit: u32) -> Result<()> {
        self.call_done(Request::SetSrqLimit { srq: srq.id, limit })
    }

    pub fn query_srq(&self, srq: &Srq) -> Result<SrqAttr> {
        match self.call(Request::QuerySrq { srq: srq.id }, &[])?.0 {
            Response::SrqAttr(attr) => Ok(attr),
            other => Err(unexpected(other)),
        }
    }

    pub fn destroy_srq(&self, srq: &Srq) -> Result<()> {
        self.call_done(Request::DestroySrq { srq: srq.id })
    }

    /// Writes `entry` into the next slot of a QP's ring and rings the
    /// doorbell if the daemon sleeps.
    fn publish(&self, queue: &Mutex<(SharedQueue, Producer)>, which: &str, owner: u32, entry: &[u8]) -> Result<()> {
        let mut guard = queue.lock().unwrap_or_else(|e| e.into_inner());
        let (ring, producer) = &mut *guard;
        let slot = producer.slot(ring).map_err(|e| VerbsError::Device(e.to_string()))?;
        let slot = slot.ok_or_else(|| {
            VerbsError::OutOfResources(format!("{which} {owner:#x} is full ({} requests)", ring.slot_count()))
        })?;
        ring.write_slot(slot, entry);
        producer.publish(ring);
        drop(guard);
        self.doorbell.ring(&self.wake);
        Ok(())
    }
}

/// A work queue entry of at most `size` bytes, as `emit` writes it.
fn entry(size: u32, emit: impl FnOnce(&mut [u8]) -> usize) -> Vec<u8> {
    let mut entry = vec![0u8; size as usize];
    let len = emit(&mut entry);
    entry.truncate(len);
    entry
}

/// Nanoseconds since the Unix epoch, the clock both sides share.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A QP whose queues live in shared memory.
pub struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub caps: QpCaps,
    /// It takes its receives from an SRQ.
    srq: bool,
    /// The state as of this program's last `modify_qp` (the engine may
    /// have moved it to error since: posting then flushes, as it should).
    state: AtomicU8,
    send: Mutex<(SharedQueue, Producer)>,
    recv: Mutex<(SharedQueue, Producer)>,
}

impl Qp {
    pub fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }
}

/// An SRQ whose receives go through shared memory.
pub struct Srq {
    pub id: SrqId,
    max_sge: u32,
    ring: Mutex<(SharedQueue, Producer)>,
}

/// A CQ whose completions arrive in shared memory.
pub struct Cq {
    pub id: CqId,
    /// The ring and the program's side of it, replaced by a resize.
    ring: Mutex<CqRing>,
    /// See [`Opened::inline_progress`].
    yield_when_empty: bool,
    /// The session's socket, when polls travel over it.
    forward: Option<Arc<Mutex<OwnedFd>>>,
}

struct CqRing {
    ring: SharedQueue,
    consumer: Consumer,
}

impl Cq {
    /// `ibv_poll_cq`: a read of the ring (a request to the daemon, when
    /// forwarding).
    pub fn poll(&self, max: usize, out: &mut Vec<Completion>) -> usize {
        if let Some(socket) = &self.forward {
            return self.poll_forwarded(socket, max, out);
        }
        let mut end = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let CqRing { ring, consumer } = &mut *end;
        let mut entry = [0u8; CQE_LEN];
        let mut taken = 0;
        while taken < max {
            // A scribbled producer index cannot come from the daemon; read
            // it as an empty queue rather than trust it.
            let Ok(Some(slot)) = consumer.slot(ring) else { break };
            ring.read_slot(slot, &mut entry);
            consumer.release(ring);
            out.push(wqe::parse_completion(&entry));
            taken += 1;
        }
        drop(end);
        if taken == 0 && self.yield_when_empty {
            std::thread::yield_now();
        }
        taken
    }

    fn poll_forwarded(&self, socket: &Mutex<OwnedFd>, max: usize, out: &mut Vec<Completion>) -> usize {
        let request = Request::PollCq { cq: self.id, max: u32::try_from(max).unwrap_or(u32::MAX) };
        let Ok((Response::Completions(bytes), _)) = call(socket, request, &[]) else { return 0 };
        let before = out.len();
        for entry in bytes.chunks_exact(CQE_LEN) {
            out.push(wqe::parse_completion(entry.try_into().expect("CQE_LEN bytes")));
        }
        out.len() - before
    }

    /// `ibv_req_notify_cq`: the next completion (or the next solicited
    /// one) is announced on the CQ's channel. A completion the daemon
    /// wrote before it could see the request is in the ring for the
    /// program's next poll ([`softrnic_ring::wakeup`]).
    pub fn request_notify(&self, solicited_only: bool) {
        let armed = if solicited_only { ARMED_SOLICITED } else { ARMED_NEXT };
        softrnic_ring::wakeup::request(self.ring.lock().unwrap_or_else(|e| e.into_inner()).ring.armed(), armed);
    }

    /// How many completions wait in its ring, not polled yet.
    pub fn ready(&self) -> u64 {
        let end = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let produced = <SharedQueue as softrnic_ring::spsc::Queue>::produced(&end.ring).load(Ordering::Acquire);
        let consumed = <SharedQueue as softrnic_ring::spsc::Queue>::consumed(&end.ring).load(Ordering::Acquire);
        produced.wrapping_sub(consumed).min(u64::from(end.ring.slot_count()))
    }

    /// How many completions its ring holds.
    pub fn capacity(&self) -> u32 {
        self.ring.lock().unwrap_or_else(|e| e.into_inner()).ring.slot_count()
    }
}

/// What a channel's read says once softrnicd has closed its end (the
/// daemon stopped, or died): `EIO`, as the kernel's event files say it of a
/// device removed under them. (A zero-length message comes only then: the
/// daemon's notifications are four bytes.)
fn daemon_gone() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// A completion channel: readable when an armed CQ gets a completion.
pub struct Channel {
    pub id: u32,
    fd: OwnedFd,
}

impl Channel {
    /// Takes one notification, waiting up to `timeout` for it: the CQ it
    /// names.
    pub fn get_event(&self, timeout: Duration) -> io::Result<Option<CqId>> {
        let mut waited = false;
        loop {
            let mut cq = [0u8; 4];
            match rustix::net::recv(&self.fd, &mut cq, rustix::net::RecvFlags::DONTWAIT) {
                Ok((4, _)) => return Ok(Some(CqId(u32::from_le_bytes(cq)))),
                Ok((0, _)) => return Err(daemon_gone()),
                // Not the daemon's: skip it.
                Ok(_) => continue,
                Err(rustix::io::Errno::AGAIN) if waited => return Ok(None),
                Err(rustix::io::Errno::AGAIN) => {
                    softrnic_event::wait_readable(&[self.fd.as_raw_fd()], timeout)?;
                    waited = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Channel {
    /// Takes one notification as a read of the kernel's event file does:
    /// blocking unless the program made the descriptor non-blocking
    /// (`EAGAIN`), and `EINTR` when a signal comes first.
    pub fn take(&self) -> io::Result<CqId> {
        let mut cq = [0u8; 4];
        loop {
            match rustix::net::recv(&self.fd, &mut cq, rustix::net::RecvFlags::empty()) {
                Ok((4, _)) => return Ok(CqId(u32::from_le_bytes(cq))),
                Ok((0, _)) => return Err(daemon_gone()),
                Ok(_) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
