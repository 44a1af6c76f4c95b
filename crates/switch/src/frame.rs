//! What the pipeline needs to know about a packet, whatever carries it: an
//! Ethernet frame in the real switch, a datagram with its addresses in the
//! simulator. Each driver implements [`Frame`] for its own packets.

use std::net::IpAddr;

use softrnic_wire::Opcode;
use softrnic_wire::int::{Hop, Stamp};

/// The ECN field of the IP header (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecn {
    NotEct = 0b00,
    Ect1 = 0b01,
    Ect0 = 0b10,
    Ce = 0b11,
}

impl Ecn {
    /// The codepoint in the low two bits of a TOS or traffic-class byte.
    pub fn from_tos(tos: u8) -> Ecn {
        match tos & 0b11 {
            0b00 => Ecn::NotEct,
            0b01 => Ecn::Ect1,
            0b10 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// Whether a congested queue may mark it rather than drop it.
    pub fn capable(self) -> bool {
        self != Ecn::NotEct
    }
}

/// A packet's routing facts, read once when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// A hash of the flow (addresses, protocol, ports): ECMP keeps a flow
    /// on one path. RoCE NICs give each QP its own UDP source port, so QPs
    /// spread.
    pub flow: u64,
    pub ecn: Ecn,
    /// The DSCP (upper six bits of the TOS): picks the data queue.
    pub dscp: u8,
    /// A CNP or an acknowledgement: it goes to the strict-priority queue,
    /// so feedback is never stuck behind the data it is about.
    pub control: bool,
    /// It carries an INT header (`softrnic_wire::int`): the switch stamps
    /// it as it leaves.
    pub int: bool,
}

/// A packet the pipeline can carry.
pub trait Frame {
    /// Bytes the packet takes on a link: what rates, buffers and counters
    /// count.
    fn wire_len(&self) -> usize;

    /// Where it goes and how it is treated; `None` for what the switch
    /// cannot route (not IP, truncated), which is dropped and counted.
    fn classify(&self) -> Option<Classified>;

    /// Sets ECN to CE (Congestion Experienced), fixing any checksum.
    fn mark_ce(&mut self);

    /// Records `hop` in the packet's INT header; called only for packets
    /// classified as carrying one. `None` if the header is not there
    /// after all.
    fn stamp_int(&mut self, hop: Hop) -> Option<Stamp>;

    /// The UDP payload of an aggregation packet (to
    /// `softrnic_wire::aggregation::AGG_UDP_PORT`), which the aggregation
    /// stage reads and may rewrite in place (never resizing it); `None`
    /// for any other packet. The frame fixes whatever checksum a rewrite
    /// breaks.
    fn aggregation_payload(&mut self) -> Option<&mut [u8]>;

    /// A copy of this packet addressed to `dst`: the aggregation stage
    /// replicates a parameter server's answer to every worker.
    fn copy_to(&self, dst: IpAddr) -> Self
    where
        Self: Sized;
}

/// Whether a RoCEv2 BTH opcode is congestion feedback or an
/// acknowledgement (CNP, ACK/NAK, atomic ACK), given the first byte after
/// the UDP header.
pub fn is_control_opcode(first_byte: u8) -> bool {
    matches!(Opcode::try_from(first_byte), Ok(Opcode::Cnp | Opcode::RcAck | Opcode::RcAtomicAck))
}
