//! The control protocol between a program and softrnicd: one request, one
//! answer, over a Unix `SOCK_SEQPACKET` socket (message boundaries come
//! free, and file descriptors ride along as `SCM_RIGHTS`).
//!
//! Only control verbs travel here. Posting and polling never do: the
//! answers to `CreateQp` and `CreateCq` carry the memory of the queues
//! (memfds), and from then on the program and the engine meet there.
//!
//! Messages are postcard-encoded serde values. The first request of a
//! connection is [`Request::Open`], which names the protocol version; a
//! daemon that speaks another one answers with an error saying so.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use softrnic_engine::NicCounters;

pub use crate::block::BlockOffload;
pub use crate::shared_memory::Segment;
use softrnic_transport::{
    Access, AsyncEvent, CqId, MrKeys, PdId, QpAttr, QpAttributes, QpCaps, QpInitAttr, QpState, SrqAttr, SrqId,
    VerbsError, WindowType,
};

/// Bumped whenever a message or a shared layout changes.
pub const PROTOCOL_VERSION: u32 = 6;

/// What a second tenant on an address is refused (`CreateGsiQp`), as the
/// busy object: "... is still in use".
pub const GSI_HELD: &str = "the GSI QP (QP1) of this address, another program's (rdma_cm through softrnicd serves \
                            one program per address: give each program an address of its own)";

/// The largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 4096;

/// The most descriptors one message carries (and segments one region has).
pub const MAX_FDS: usize = 16;

/// What a program asks of the daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// Opens the device on `addr` (starting it if nobody serves it yet).
    /// The answer is [`Response::Opened`] with three descriptors: the
    /// tenant's doorbell page, the daemon's wake-up eventfd, and the
    /// socket its asynchronous events arrive on (one postcard-encoded
    /// `AsyncEvent` a message: the program's `async_fd`). With
    /// `forward`, the tenant's data commands come over this socket
    /// instead of its queues ([`Request::PostSend`]): FreeFlow's design,
    /// kept as the baseline the shared queues are measured against.
    Open {
        version: u32,
        addr: IpAddr,
        forward: bool,
    },
    AllocPd,
    DeallocPd {
        pd: PdId,
    },
    /// Registers a region over the memfds that come with the request, one
    /// per segment of its translation. Every memfd must be sealed against
    /// shrinking: the engine maps them and must never fault on them.
    RegisterMemory {
        pd: PdId,
        access: Access,
        translation: Translation,
    },
    DeregisterMemory {
        lkey: u32,
    },
    /// A memory window; the answer is its first rkey. Bound by work
    /// requests on the send queues.
    AllocMw {
        pd: PdId,
        kind: WindowType,
    },
    /// Frees the window that `rkey` (any key it has had) names.
    DeallocMw {
        rkey: u32,
    },
    /// A completion channel: the answer carries one end of a datagram
    /// socket that becomes readable when an armed CQ of the channel gets
    /// a completion (one datagram per notification, naming the CQ).
    CreateChannel,
    DestroyChannel {
        channel: u32,
    },
    /// The answer carries the CQ's ring.
    CreateCq {
        capacity: u32,
        channel: Option<u32>,
    },
    DestroyCq {
        cq: CqId,
    },
    /// `ibv_resize_cq`: the answer is [`Response::Cq`] with the new ring,
    /// which holds the completions not polled yet.
    ResizeCq {
        cq: CqId,
        entries: u32,
    },
    /// The answer carries the send ring, then (without an SRQ) the
    /// receive ring.
    CreateQp {
        init: QpInitAttr,
        /// The daemon offloads the QP's storage blocks' CRCs, and places
        /// their payloads ([`crate::block`]).
        blocks: Option<BlockOffload>,
    },
    /// The device's GSI QP (QP1), where rdma_cm's MADs arrive: a UD QP
    /// answered as `CreateQp` is. A device has one, so one program on an
    /// address holds it at a time.
    CreateGsiQp {
        init: QpInitAttr,
    },
    ModifyQp {
        qpn: u32,
        attr: QpAttr,
    },
    QueryQp {
        qpn: u32,
    },
    DestroyQp {
        qpn: u32,
    },
    /// Attaches a UD QP to a multicast group (an IP multicast address).
    AttachMcast {
        qpn: u32,
        group: IpAddr,
    },
    DetachMcast {
        qpn: u32,
        group: IpAddr,
    },
    /// Paces one QP (`None` lifts the limit), within the tenant's limit.
    SetRateLimit {
        qpn: u32,
        bits_per_second: Option<u64>,
    },
    /// Gives a CQ a completion channel after its creation (`None`: none).
    SetCqChannel {
        cq: CqId,
        channel: Option<u32>,
    },
    /// The device's counters.
    Counters,
    /// A forwarding tenant's `ibv_post_send`: one WQE in the layout of
    /// [`crate::wqe`].
    PostSend {
        qpn: u32,
        wqe: Vec<u8>,
    },
    /// A forwarding tenant's `ibv_post_recv`.
    PostRecv {
        qpn: u32,
        wqe: Vec<u8>,
    },
    /// A forwarding tenant's `ibv_poll_cq`: up to `max` CQEs.
    PollCq {
        cq: CqId,
        max: u32,
    },
    /// The answer carries the SRQ's ring of receive WQEs, which the
    /// command processor moves into the engine's SRQ.
    CreateSrq {
        pd: PdId,
        attr: SrqAttr,
    },
    /// `ibv_modify_srq`'s limit: an SRQ-limit event when fewer remain.
    SetSrqLimit {
        srq: SrqId,
        limit: u32,
    },
    QuerySrq {
        srq: SrqId,
    },
    DestroySrq {
        srq: SrqId,
    },
    /// Runs `algorithm` on the QP (`None`: none, at line rate under the
    /// window). A module's bytes come in a memfd with the request.
    SetCongestionControl {
        qpn: u32,
        algorithm: Option<RemoteAlgorithm>,
    },
    /// The rate the QP's congestion control sets it, if it runs one.
    CongestionRate {
        qpn: u32,
    },
    /// `ibv_rereg_mr`: what changes of the region `lkey`, which keeps its
    /// keys; what is `None` stays. A new translation's memfds come with the
    /// request, as [`Request::RegisterMemory`]'s do.
    ReregisterMemory {
        lkey: u32,
        pd: Option<PdId>,
        access: Option<Access>,
        translation: Option<Translation>,
    },
}

/// A program's congestion control, as the daemon makes it again: a
/// built-in, or a WebAssembly module of `len` bytes (in the memfd that
/// comes with the request), each with its `key=value,...` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum RemoteAlgorithm {
    Builtin { name: String, params: String },
    Module { name: String, params: String, len: u64 },
}

/// The largest module a program may hand the daemon to compile.
pub const MAX_MODULE: u64 = 16 << 20;

/// Where a region's bytes are: its segments, mapped one after the other,
/// hold `len` bytes from `lead` on, addressed as `iova`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Translation {
    pub iova: u64,
    pub lead: u64,
    pub len: u64,
    pub segments: Vec<Segment>,
}

/// The daemon's answer to one [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    Opened(Opened),
    Done,
    Pd(PdId),
    Mr(MrKeys),
    /// A memory window's rkey.
    Window(u32),
    Channel(u32),
    Cq(CqLayout),
    Qp(QpLayout),
    Srq(SrqLayout),
    SrqAttr(SrqAttr),
    /// Bits per second, if an algorithm sets the QP's rate.
    Rate(Option<u64>),
    State(QpState),
    Query {
        state: QpState,
        attributes: QpAttributes,
    },
    Counters(Box<NicCounters>),
    /// CQEs in the layout of [`crate::wqe`], one after the other.
    Completions(Vec<u8>),
    Error(RemoteError),
}

/// A new SRQ: its handle and its ring of receive WQEs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SrqLayout {
    pub srq: SrqId,
    pub max_sge: u32,
    pub slots: u32,
    pub slot_size: u32,
}

/// What a program learns when it opens a device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Opened {
    /// The daemon's number for this connection, in its logs.
    pub tenant: u64,
    /// Bytes of the largest packet payload the device's port carries.
    pub active_mtu: u32,
    pub engine_threads: u32,
    /// Whether peers on this host reach the device through shared memory.
    pub shared_memory: bool,
    /// The device runs inline progress (a machine with few cores): the
    /// command processor shares the cores with the programs, so a program
    /// that finds its CQ empty yields its core instead of spinning on.
    pub inline_progress: bool,
    /// The device's time zero (completion timestamps count from it), in
    /// nanoseconds since the Unix epoch.
    pub epoch_unix_ns: u64,
}

/// A CQ's ring, as created.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CqLayout {
    pub cq: CqId,
    pub slots: u32,
}

/// A QP's rings, as created.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct QpLayout {
    pub qpn: u32,
    /// The capabilities granted (never less than asked for).
    pub caps: QpCaps,
    pub send_slots: u32,
    pub send_slot_size: u32,
    /// Zero when the QP takes its receives from an SRQ.
    pub recv_slots: u32,
    pub recv_slot_size: u32,
}

/// A verb's failure as it crosses the socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteError {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    InvalidArgument,
    OutOfResources,
    NotFound,
    Busy,
    NotSupported,
    Device,
    PermissionDenied,
}

impl From<VerbsError> for RemoteError {
    fn from(e: VerbsError) -> RemoteError {
        let kind = match e {
            VerbsError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            VerbsError::OutOfResources(_) => ErrorKind::OutOfResources,
            VerbsError::NotFound(_) => ErrorKind::NotFound,
            VerbsError::Busy(_) => ErrorKind::Busy,
            VerbsError::NotSupported(_) => ErrorKind::NotSupported,
            VerbsError::Device(_) => ErrorKind::Device,
            VerbsError::PermissionDenied(_) => ErrorKind::PermissionDenied,
        };
        let message = match e {
            VerbsError::InvalidArgument(m)
            | VerbsError::OutOfResources(m)
            | VerbsError::NotSupported(m)
            | VerbsError::Device(m)
            | VerbsError::PermissionDenied(m) => m,
            VerbsError::NotFound(what) | VerbsError::Busy(what) => what.to_string(),
        };
        RemoteError { kind, message }
    }
}

impl RemoteError {
    pub fn invalid(message: impl Into<String>) -> RemoteError {
        RemoteError { kind: ErrorKind::InvalidArgument, message: message.into() }
    }

    pub fn exhausted(message: impl Into<String>) -> RemoteError {
        RemoteError { kind: ErrorKind::OutOfResources, message: message.into() }
    }

    pub fn not_found(what: &'static str) -> RemoteError {
        RemoteError { kind: ErrorKind::NotFound, message: what.to_string() }
    }

    /// The verbs error a local engine would have returned.
    pub fn into_verbs(self) -> VerbsError {
        /// `VerbsError` names objects (and says why the GSI QP is busy)
        /// with static strings.
        fn object(name: &str) -> &'static str {
            ["PD", "MR", "CQ", "QP", "SRQ", "completion channel", "device", GSI_HELD]
                .into_iter()
                .find(|known| known.eq_ignore_ascii_case(name))
                .unwrap_or("object")
        }
        match self.kind {
            ErrorKind::InvalidArgument => VerbsError::InvalidArgument(self.message),
            ErrorKind::OutOfResources => VerbsError::OutOfResources(self.message),
            ErrorKind::NotFound => VerbsError::NotFound(object(&self.message)),
            ErrorKind::Busy => VerbsError::Busy(object(&self.message)),
            ErrorKind::NotSupported => VerbsError::NotSupported(self.message),
            ErrorKind::Device => VerbsError::Device(self.message),
            ErrorKind::PermissionDenied => VerbsError::PermissionDenied(self.message),
        }
    }
}

/// The longest asynchronous event a daemon sends on a program's event
/// socket, encoded.
pub const MAX_EVENT: usize = 64;

/// One asynchronous event as a message of the event socket.
pub fn encode_event(event: &AsyncEvent) -> Vec<u8> {
    postcard::to_stdvec(event).expect("an AsyncEvent always encodes")
}

/// An event socket's message, or why it is not one.
pub fn decode_event(bytes: &[u8]) -> io::Result<AsyncEvent> {
    postcard::from_bytes(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Sends one message with `fds` attached.
pub fn send<T: Serialize>(socket: BorrowedFd<'_>, message: &T, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let bytes = postcard::to_stdvec(message).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if bytes.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "control message too large"));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        control.push(SendAncillaryMessage::ScmRights(fds));
    }
    let sent = rustix::net::sendmsg(socket, &[IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != bytes.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "control message cut short"));
    }
    Ok(())
}

/// Receives one message and the descriptors that came with it. `Ok(None)`
/// means the other side closed the connection.
pub fn receive<T: for<'de> Deserialize<'de>>(socket: BorrowedFd<'_>) -> io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut bytes = [0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut bytes)], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::CONNRESET) => return Ok(None),
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if received.bytes == 0 {
        return Ok(None);
    }
    if received.flags.contains(rustix::net::ReturnFlags::TRUNC)
        || received.flags.contains(rustix::net::ReturnFlags::CTRUNC)
    {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "control message truncated"));
    }
    let message = postcard::from_bytes(&bytes[..received.bytes])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("malformed control message: {e}")))?;
    Ok(Some((message, fds)))
}

/// A request and its answer, for the client: sends, then waits.
pub fn call(socket: impl AsFd, request: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<(Response, Vec<OwnedFd>)> {
    if let Err(e) = send(socket.as_fd(), request, fds) {
        // A daemon that refuses a program says why and hangs up before its
        // first request arrives: the answer may be waiting all the same
        // (and with the connection closed, reading it cannot block).
        let hung_up = matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset);
        if hung_up && let Ok(Some(answer @ (Response::Error(_), _))) = receive(socket.as_fd()) {
            return Ok(answer);
        }
        return Err(e);
    }
    receive(socket.as_fd())?
        .ok_or_else(|| io::Error::new(io::ErrorKind::ConnectionAborted, "softrnicd closed the connection"))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};

    use rustix::net::{AddressFamily, SocketFlags, SocketType};

    use super::*;

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap()
    }

    #[test]
    fn an_async_event_in_bytes() {
        // The variant's index, then the number as a varint.
        let event = AsyncEvent::QpAccessError { qpn: 0x1234 };
        assert_eq!(encode_event(&event), [2, 0xb4, 0x24]);
        assert_eq!(decode_event(&[2, 0xb4, 0x24]).unwrap(), event);
        assert_eq!(decode_event(&[5, 7]).unwrap(), AsyncEvent::CqError { cq: CqId(7) });
        assert!(decode_event(&[9, 1]).is_err(), "no such event");
        assert!(decode_event(&[]).is_err());
        let longest = AsyncEvent::SrqLimitReached { srq: SrqId(u32::MAX) };
        assert!(encode_event(&longest).len() <= MAX_EVENT);
    }

    #[test]
    fn a_request_and_a_descriptor_arrive_together() {
        let (a, b) = pair();
        let mut file = std::fs::File::from(rustix::fs::memfd_create("t", rustix::fs::MemfdFlags::CLOEXEC).unwrap());
        file.write_all(b"registered").unwrap();
        let segments = vec![Segment { offset: 0, len: 10 }];
        let translation = Translation { iova: 0x1000, lead: 0, len: 10, segments };
        let request = Request::RegisterMemory { pd: PdId(3), access: Access::REMOTE_WRITE, translation };
        send(a.as_fd(), &request, &[file.as_fd()]).unwrap();
        let (got, fds): (Request, _) = receive(b.as_fd()).unwrap().unwrap();
        assert!(matches!(
            got,
            Request::RegisterMemory { pd: PdId(3), translation: Translation { iova: 0x1000, len: 10, .. }, .. }
        ));
        let mut same = std::fs::File::from(fds.into_iter().next().unwrap());
        same.rewind().unwrap();
        let mut text = String::new();
        same.read_to_string(&mut text).unwrap();
        assert_eq!(text, "registered", "the descriptor is the same memfd");
    }

    #[test]
    fn garbage_is_an_error_and_a_closed_peer_is_none() {
        let (a, b) = pair();
        rustix::net::send(&a, &[0xff, 0xff, 0xff, 0xff, 0x7f], SendFlags::empty()).unwrap();
        let err = receive::<Request>(b.as_fd()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        drop(a);
        assert!(receive::<Request>(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn errors_cross_with_their_kind() {
        let e = RemoteError::from(VerbsError::NotFound("QP"));
        assert_eq!(e.clone().into_verbs(), VerbsError::NotFound("QP"));
        let e = RemoteError::from(VerbsError::invalid("max_send_wr 0"));
        assert_eq!(e.into_verbs(), VerbsError::InvalidArgument("max_send_wr 0".into()));
    }
}
