//! Work requests: what the application asks the NIC to do (`ibv_send_wr`,
//! `ibv_recv_wr`).

use std::net::IpAddr;

use smallvec::SmallVec;

use crate::memory::WindowBind;

/// One element of a scatter/gather list (`ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A remote buffer: where a WRITE lands, a READ reads, an ATOMIC acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    pub addr: u64,
    pub rkey: u32,
}

/// The operation of a send work request, with what it alone needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND, optionally with 32 bits of immediate data.
    Send { imm: Option<u32> },
    /// RDMA WRITE, optionally with immediate data (which consumes a receive).
    Write { remote: RemoteAddr, imm: Option<u32> },
    /// RDMA READ into the local scatter list.
    Read { remote: RemoteAddr },
    /// 64-bit compare-and-swap; the original value lands in the local SGE.
    CompareSwap { remote: RemoteAddr, compare: u64, swap: u64 },
    /// 64-bit fetch-and-add; the original value lands in the local SGE.
    FetchAdd { remote: RemoteAddr, add: u64 },
    /// IBTA 1.5's ATOMIC WRITE: `value`'s 8 bytes stored at the remote
    /// address as one (RC only). Like an ATOMIC's operands they are the
    /// request's own, taken at post time; it needs the responder's remote
    /// write right and takes a READ/ATOMIC slot, as rxe has it.
    AtomicWrite { remote: RemoteAddr, value: [u8; 8] },
    /// SEND that has the responder invalidate `rkey`, a type 2 memory
    /// window's, as it arrives (RC only).
    SendWithInvalidate { rkey: u32 },
    /// Binds a memory window: a local operation, done in order with the
    /// requests around it, that sends nothing.
    BindWindow(WindowBind),
    /// Invalidates the type 2 window whose rkey is `rkey`: a local
    /// operation too.
    LocalInvalidate { rkey: u32 },
}

impl SendOp {
    /// Does the NIC write the result into local memory (READ, ATOMIC)?
    pub fn writes_locally(&self) -> bool {
        matches!(self, SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// An 8-byte atomic: compare-and-swap, fetch-and-add, ATOMIC WRITE.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } | SendOp::AtomicWrite { .. })
    }

    /// Does the request wait for the responder's answer (a READ's data,
    /// an atomic's result or acknowledgement), holding a READ/ATOMIC slot?
    pub fn awaits_response(&self) -> bool {
        matches!(self, SendOp::Read { .. }) || self.is_atomic()
    }

    /// Does the NIC carry it out without sending anything (bind, local
    /// invalidate)?
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindWindow(_) | SendOp::LocalInvalidate { .. })
    }

    /// The remote buffer, for RDMA and atomic operations.
    pub fn remote(&self) -> Option<RemoteAddr> {
        match *self {
            SendOp::Write { remote, .. }
            | SendOp::Read { remote }
            | SendOp::CompareSwap { remote, .. }
            | SendOp::FetchAdd { remote, .. }
            | SendOp::AtomicWrite { remote, .. } => Some(remote),
            SendOp::Send { .. }
            | SendOp::SendWithInvalidate { .. }
            | SendOp::BindWindow(_)
            | SendOp::LocalInvalidate { .. } => None,
        }
    }
}

/// Where an unreliable datagram goes: the address handle and remote QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDestination {
    /// The remote port's GID, which in RoCEv2 is an IP address.
    pub addr: IpAddr,
    pub qpn: u32,
    /// The Q_Key to send with; a value with the top bit set means "use
    /// the QP's own Q_Key", as in verbs.
    pub qkey: u32,
}

/// A work request's scatter/gather list. Most requests name one or two
/// entries, which live inline: posting allocates nothing.
pub type SgeList = SmallVec<[Sge; 2]>;

/// Inline send data; small messages, the usual kind, live inline too.
pub type InlineData = SmallVec<[u8; 64]>;

/// The bytes a send draws from: registered memory, or data the caller
/// handed over at post time (`IBV_SEND_INLINE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Gather(SgeList),
    Inline(InlineData),
}

impl Payload {
    pub fn len(&self) -> u64 {
        match self {
            Payload::Gather(sges) => sges.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(bytes) => bytes.len() as u64,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWorkRequest {
    pub wr_id: u64,
    pub op: SendOp,
    /// For SEND and WRITE the data; for READ and ATOMIC where the result
    /// goes (it must then be `Gather`).
    pub payload: Payload,
    /// Generate a completion even if the QP does not signal all requests.
    pub signaled: bool,
    /// Wait for earlier READ and ATOMIC requests to complete first.
    pub fence: bool,
    /// Ask the remote to raise a completion event (SE bit).
    pub solicited: bool,
    /// For UD QPs only.
    pub ud: Option<UdDestination>,
}

impl SendWorkRequest {
    /// A signalled request with no flags.
    pub fn new(wr_id: u64, op: SendOp, payload: Payload) -> SendWorkRequest {
        SendWorkRequest { wr_id, op, payload, signaled: true, fence: false, solicited: false, ud: None }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWorkRequest {
    pub wr_id: u64,
    pub sges: SgeList,
}
