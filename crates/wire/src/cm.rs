//! The Communication Manager's messages (IBTA vol. 1 section 12.6): the
//! data of a CM MAD ([`crate::mad`], class 0x07, class version 2, method
//! Send), which two CM agents exchange over QP1 to connect two QPs.
//!
//! A connection: the active side sends a REQ (its QP, starting PSN, path
//! and up to 92 bytes of private data), the passive side answers with a
//! REP (its QP and PSN) or a REJ, and the active side confirms with an RTU.
//! DREQ and DREP take it down. SIDR_REQ and SIDR_REP resolve a service to
//! a UD QP and Q_Key. Fields are big-endian; bit fields count from the
//! most significant bit of their byte, as the IBTA's tables do.
//!
//! rdma_cm puts its own header ([`IpHeader`]) at the start of the private
//! data of a REQ or SIDR_REQ: the IP addresses and port the connection is
//! for, which the service ID alone cannot carry.

use crate::mad::MAD_DATA_LEN;
use crate::view::{get_u16, get_u24, get_u32, get_u64, put_u16, put_u24, put_u32, put_u64};
use crate::{Error, Result};

/// The class version of the CM this module speaks.
pub const CLASS_VERSION: u8 = 2;

/// Attribute IDs: which message a CM MAD holds.
pub mod attribute {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
}

/// Reasons a REJ gives (table 103), those softrnic sends or interprets.
pub mod reject_reason {
    pub const NO_QP: u16 = 1;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const STALE_CONNECTION: u16 = 10;
    pub const TIMEOUT: u16 = 26;
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// The most private data any message carries (an RTU's or a DREP's).
pub const MAX_PRIVATE_DATA: usize = 224;

/// The private data of a message: as many bytes as its kind carries,
/// zeros past what the sender gave.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    bytes: [u8; MAX_PRIVATE_DATA],
    len: u8,
}

impl PrivateData {
    pub const EMPTY: PrivateData = PrivateData { bytes: [0; MAX_PRIVATE_DATA], len: 0 };

    /// `data`, or `None` if it is longer than any message carries.
    pub fn new(data: &[u8]) -> Option<PrivateData> {
        let mut out = PrivateData::EMPTY;
        out.bytes.get_mut(..data.len())?.copy_from_slice(data);
        out.len = data.len() as u8;
        Some(out)
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn read(area: &[u8]) -> PrivateData {
        PrivateData::new(area).expect("no message carries more than MAX_PRIVATE_DATA")
    }

    /// Writes the data into `area`, zero-filled; too long for it is an
    /// error.
    fn write(&self, area: &mut [u8]) -> Result<()> {
        let data = self.as_slice();
        if data.len() > area.len() {
            return Err(Error::Truncated);
        }
        area.fill(0);
        area[..data.len()].copy_from_slice(data);
        Ok(())
    }
}

impl core::fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// The transport service a REQ asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportService {
    Rc,
    Uc,
    Rd,
}

/// The bits `width` wide, `offset` bits below the top of `byte`.
fn bits(byte: u8, offset: u32, width: u32) -> u8 {
    (byte >> (8 - offset - width)) & ((1u16 << width) - 1) as u8
}

fn set_bits(byte: &mut u8, offset: u32, width: u32, value: u8) {
    let shift = 8 - offset - width;
    let mask = (((1u16 << width) - 1) as u8) << shift;
    *byte = (*byte & !mask) | ((value << shift) & mask);
}

/// A REQ (table 106): the active side asks to connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req {
    pub local_comm_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 4.096 µs × 2^n: how long the remote CM may take to answer.
    pub remote_cm_response_timeout: u8,
    pub transport: TransportService,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    /// The IBTA's MTU code: 1 (256 bytes) to 5 (4096).
    pub path_mtu: u8,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    /// RoCE has no LIDs: both are the permissive LID, 0xffff.
    pub primary_local_lid: u16,
    pub primary_remote_lid: u16,
    pub primary_local_gid: [u8; 16],
    pub primary_remote_gid: [u8; 16],
    pub primary_flow_label: u32,
    pub primary_packet_rate: u8,
    pub primary_traffic_class: u8,
    pub primary_hop_limit: u8,
    pub primary_sl: u8,
    pub primary_subnet_local: bool,
    pub primary_local_ack_timeout: u8,
    pub private_data: PrivateData,
}

/// A REP (table 110): the passive side accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: PrivateData,
}

/// Which message a REJ or an MRA answers (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    Req = 0,
    Rep = 1,
    Other = 2,
}

impl Answered {
    fn from_bits(bits: u8) -> Result<Answered> {
        match bits {
            0 => Ok(Answered::Req),
            1 => Ok(Answered::Rep),
            2 => Ok(Answered::Other),
            _ => Err(Error::Reserved),
        }
    }
}

/// A REJ (table 108): a refusal, of a REQ or a REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub rejected: Answered,
    pub reason: u16,
    pub private_data: PrivateData,
}

/// An MRA (table 107): "received, answer coming later".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub acknowledged: Answered,
    pub service_timeout: u8,
}

/// A message that names the connection by both ends' IDs: an RTU, a DREP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: PrivateData,
}

/// A DREQ (table 112): disconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    pub private_data: PrivateData,
}

/// A SIDR_REQ (table 119): which UD QP serves this service?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: PrivateData,
}

/// SIDR_REP statuses (table 121).
pub mod sidr_status {
    pub const VALID: u8 = 0;
    pub const SERVICE_ID_NOT_SUPPORTED: u8 = 1;
    pub const REJECTED: u8 = 2;
}

/// A SIDR_REP (table 120): this QP and Q_Key, or a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep {
    pub request_id: u32,
    pub status: u8,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub private_data: PrivateData,
}

/// One CM message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    Req(Req),
    Mra(Mra),
    Rej(Rej),
    Rep(Rep),
    Rtu(Ids),
    Dreq(Dreq),
    Drep(Ids),
    SidrReq(SidrReq),
    SidrRep(SidrRep),
}

/// Where each message's private data lies in the MAD's data, and so how
/// much of it the message carries.
mod private_area {
    use core::ops::Range;
    pub const REQ: Range<usize> = 140..232;
    pub const REJ: Range<usize> = 84..232;
    pub const REP: Range<usize> = 36..232;
    pub const RTU: Range<usize> = 8..232;
    pub const DREQ: Range<usize> = 12..232;
    pub const DREP: Range<usize> = 8..232;
    pub const SIDR_REQ: Range<usize> = 16..232;
    pub const SIDR_REP: Range<usize> = 96..232;
}

/// How much private data a REQ carries (rdma_cm's header included).
pub const REQ_PRIVATE_DATA: usize = private_area::REQ.end - private_area::REQ.start;
/// How much a REP carries.
pub const REP_PRIVATE_DATA: usize = private_area::REP.end - private_area::REP.start;
/// How much a REJ carries.
pub const REJ_PRIVATE_DATA: usize = private_area::REJ.end - private_area::REJ.start;
/// How much a SIDR_REQ carries (rdma_cm's header included).
pub const SIDR_REQ_PRIVATE_DATA: usize = private_area::SIDR_REQ.end - private_area::SIDR_REQ.start;
/// How much a SIDR_REP carries.
pub const SIDR_REP_PRIVATE_DATA: usize = private_area::SIDR_REP.end - private_area::SIDR_REP.start;
/// How much a DREQ carries.
pub const DREQ_PRIVATE_DATA: usize = private_area::DREQ.end - private_area::DREQ.start;

impl Message {
    /// The attribute ID a MAD carrying this message has.
    pub fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(_) => attribute::REQ,
            Message::Mra(_) => attribute::MRA,
            Message::Rej(_) => attribute::REJ,
            Message::Rep(_) => attribute::REP,
            Message::Rtu(_) => attribute::RTU,
            Message::Dreq(_) => attribute::DREQ,
            Message::Drep(_) => attribute::DREP,
            Message::SidrReq(_) => attribute::SIDR_REQ,
            Message::SidrRep(_) => attribute::SIDR_REP,
        }
    }

    /// Parses the data of a CM MAD whose attribute ID is `attribute_id`.
    pub fn parse(attribute_id: u16, data: &[u8]) -> Result<Message> {
        let d = data.get(..MAD_DATA_LEN).ok_or(Error::Truncated)?;
        let id = |at: usize| get_u32(&d[at..]);
        Ok(match attribute_id {
            attribute::REQ => Message::Req(Req {
                local_comm_id: id(0),
                service_id: get_u64(&d[8..]),
                local_ca_guid: get_u64(&d[16..]),
                local_qkey: id(28),
                local_qpn: get_u24(&d[32..]),
                responder_resources: d[35],
                initiator_depth: d[39],
                remote_cm_response_timeout: bits(d[43], 0, 5),
                transport: match bits(d[43], 5, 2) {
                    0 => TransportService::Rc,
                    1 => TransportService::Uc,
                    2 => TransportService::Rd,
                    _ => return Err(Error::Reserved),
                },
                end_to_end_flow_control: bits(d[43], 7, 1) == 1,
                starting_psn: get_u24(&d[44..]),
                local_cm_response_timeout: bits(d[47], 0, 5),
                retry_count: bits(d[47], 5, 3),
                pkey: get_u16(&d[48..]),
                path_mtu: bits(d[50], 0, 4),
                rnr_retry_count: bits(d[50], 5, 3),
                max_cm_retries: bits(d[51], 0, 4),
                srq: bits(d[51], 4, 1) == 1,
                primary_local_lid: get_u16(&d[52..]),
                primary_remote_lid: get_u16(&d[54..]),
                primary_local_gid: d[56..72].try_into().expect("16 bytes"),
                primary_remote_gid: d[72..88].try_into().expect("16 bytes"),
                primary_flow_label: id(88) >> 12,
                primary_packet_rate: bits(d[91], 2, 6),
                primary_traffic_class: d[92],
                primary_hop_limit: d[93],
                primary_sl: bits(d[94], 0, 4),
                primary_subnet_local: bits(d[94], 4, 1) == 1,
                primary_local_ack_timeout: bits(d[95], 0, 5),
                private_data: PrivateData::read(&d[private_area::REQ]),
            }),
            attribute::MRA => Message::Mra(Mra {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                acknowledged: Answered::from_bits(bits(d[8], 0, 2))?,
                service_timeout: bits(d[9], 0, 5),
            }),
            attribute::REJ => Message::Rej(Rej {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                rejected: Answered::from_bits(bits(d[8], 0, 2))?,
                reason: get_u16(&d[10..]),
                private_data: PrivateData::read(&d[private_area::REJ]),
            }),
            attribute::REP => Message::Rep(Rep {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                local_qkey: id(8),
                local_qpn: get_u24(&d[12..]),
                starting_psn: get_u24(&d[20..]),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: bits(d[26], 0, 5),
                failover_accepted: bits(d[26], 5, 2),
                end_to_end_flow_control: bits(d[26], 7, 1) == 1,
                rnr_retry_count: bits(d[27], 0, 3),
                srq: bits(d[27], 3, 1) == 1,
                local_ca_guid: get_u64(&d[28..]),
                private_data: PrivateData::read(&d[private_area::REP]),
            }),
            attribute::RTU => Message::Rtu(Ids {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                private_data: PrivateData::read(&d[private_area::RTU]),
            }),
            attribute::DREQ => Message::Dreq(Dreq {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                remote_qpn: get_u24(&d[8..]),
                private_data: PrivateData::read(&d[private_area::DREQ]),
            }),
            attribute::DREP => Message::Drep(Ids {
                local_comm_id: id(0),
                remote_comm_id: id(4),
                private_data: PrivateData::read(&d[private_area::DREP]),
            }),
            attribute::SIDR_REQ => Message::SidrReq(SidrReq {
                request_id: id(0),
                pkey: get_u16(&d[4..]),
                service_id: get_u64(&d[8..]),
                private_data: PrivateData::read(&d[private_area::SIDR_REQ]),
            }),
            attribute::SIDR_REP => Message::SidrRep(SidrRep {
                request_id: id(0),
                status: d[4],
                qpn: get_u24(&d[8..]),
                service_id: get_u64(&d[12..]),
                qkey: id(20),
                private_data: PrivateData::read(&d[private_area::SIDR_REP]),
            }),
            _ => return Err(Error::Reserved),
        })
    }

    /// Writes the message into the data of a CM MAD (`data`, at least
    /// [`MAD_DATA_LEN`] bytes; every byte is written). Fails if its
    /// private data is longer than the message carries.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        let d = data.get_mut(..MAD_DATA_LEN).ok_or(Error::Truncated)?;
        d.fill(0);
        match self {
            Message::Req(r) => {
                put_u32(&mut d[0..], r.local_comm_id);
                put_u64(&mut d[8..], r.service_id);
                put_u64(&mut d[16..], r.local_ca_guid);
                put_u32(&mut d[28..], r.local_qkey);
                put_u24(&mut d[32..], r.local_qpn);
                d[35] = r.responder_resources;
                d[39] = r.initiator_depth;
                set_bits(&mut d[43], 0, 5, r.remote_cm_response_timeout);
                set_bits(&mut d[43], 5, 2, r.transport as u8);
                set_bits(&mut d[43], 7, 1, r.end_to_end_flow_control as u8);
                put_u24(&mut d[44..], r.starting_psn);
                set_bits(&mut d[47], 0, 5, r.local_cm_response_timeout);
                set_bits(&mut d[47], 5, 3, r.retry_count);
                put_u16(&mut d[48..], r.pkey);
                set_bits(&mut d[50], 0, 4, r.path_mtu);
                set_bits(&mut d[50], 5, 3, r.rnr_retry_count);
                set_bits(&mut d[51], 0, 4, r.max_cm_retries);
                set_bits(&mut d[51], 4, 1, r.srq as u8);
                put_u16(&mut d[52..], r.primary_local_lid);
                put_u16(&mut d[54..], r.primary_remote_lid);
                d[56..72].copy_from_slice(&r.primary_local_gid);
                d[72..88].copy_from_slice(&r.primary_remote_gid);
                put_u32(&mut d[88..], r.primary_flow_label << 12);
                set_bits(&mut d[91], 2, 6, r.primary_packet_rate);
                d[92] = r.primary_traffic_class;
                d[93] = r.primary_hop_limit;
                set_bits(&mut d[94], 0, 4, r.primary_sl);
                set_bits(&mut d[94], 4, 1, r.primary_subnet_local as u8);
                set_bits(&mut d[95], 0, 5, r.primary_local_ack_timeout);
                r.private_data.write(&mut d[private_area::REQ])
            }
            Message::Mra(m) => {
                put_u32(&mut d[0..], m.local_comm_id);
                put_u32(&mut d[4..], m.remote_comm_id);
                set_bits(&mut d[8], 0, 2, m.acknowledged as u8);
                set_bits(&mut d[9], 0, 5, m.service_timeout);
                Ok(())
            }
            Message::Rej(r) => {
                put_u32(&mut d[0..], r.local_comm_id);
                put_u32(&mut d[4..], r.remote_comm_id);
                set_bits(&mut d[8], 0, 2, r.rejected as u8);
                put_u16(&mut d[10..], r.reason);
                r.private_data.write(&mut d[private_area::REJ])
            }
            Message::Rep(r) => {
                put_u32(&mut d[0..], r.local_comm_id);
                put_u32(&mut d[4..], r.remote_comm_id);
                put_u32(&mut d[8..], r.local_qkey);
                put_u24(&mut d[12..], r.local_qpn);
                put_u24(&mut d[20..], r.starting_psn);
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                set_bits(&mut d[26], 0, 5, r.target_ack_delay);
                set_bits(&mut d[26], 5, 2, r.failover_accepted);
                set_bits(&mut d[26], 7, 1, r.end_to_end_flow_control as u8);
                set_bits(&mut d[27], 0, 3, r.rnr_retry_count);
                set_bits(&mut d[27], 3, 1, r.srq as u8);
                put_u64(&mut d[28..], r.local_ca_guid);
                r.private_data.write(&mut d[private_area::REP])
            }
            Message::Rtu(m) | Message::Drep(m) => {
                put_u32(&mut d[0..], m.local_comm_id);
                put_u32(&mut d[4..], m.remote_comm_id);
                m.private_data.write(&mut d[private_area::RTU])
            }
            Message::Dreq(m) => {
                put_u32(&mut d[0..], m.local_comm_id);
                put_u32(&mut d[4..], m.remote_comm_id);
                put_u24(&mut d[8..], m.remote_qpn);
                m.private_data.write(&mut d[private_area::DREQ])
            }
            Message::SidrReq(m) => {
                put_u32(&mut d[0..], m.request_id);
                put_u16(&mut d[4..], m.pkey);
                put_u64(&mut d[8..], m.service_id);
                m.private_data.write(&mut d[private_area::SIDR_REQ])
            }
            Message::SidrRep(m) => {
                put_u32(&mut d[0..], m.request_id);
                d[4] = m.status;
                put_u24(&mut d[8..], m.qpn);
                put_u64(&mut d[12..], m.service_id);
                put_u32(&mut d[20..], m.qkey);
                m.private_data.write(&mut d[private_area::SIDR_REP])
            }
        }
    }
}

/// The header rdma_cm puts before the user's private data of a REQ or
/// SIDR_REQ (36 bytes): version 0, the IP version in the top nibble of the
/// second byte, the source port, then both addresses as 16 bytes each (an
/// IPv4 address in the last four).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpHeader {
    pub src_port: u16,
    pub src: core::net::IpAddr,
    pub dst: core::net::IpAddr,
}

impl IpHeader {
    pub const LEN: usize = 36;

    pub fn parse(bytes: &[u8]) -> Result<IpHeader> {
        let b = bytes.get(..Self::LEN).ok_or(Error::Truncated)?;
        if b[0] != 0 {
            return Err(Error::UnsupportedVersion(b[0]));
        }
        let addr = |at: usize| -> Result<core::net::IpAddr> {
            let raw: [u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
            match b[1] >> 4 {
                4 => Ok(core::net::Ipv4Addr::from(<[u8; 4]>::try_from(&raw[12..]).expect("4 bytes")).into()),
                6 => Ok(core::net::Ipv6Addr::from(raw).into()),
                _ => Err(Error::Reserved),
            }
        };
        Ok(IpHeader { src_port: get_u16(&b[2..]), src: addr(4)?, dst: addr(20)? })
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<()> {
        let b = bytes.get_mut(..Self::LEN).ok_or(Error::Truncated)?;
        b.fill(0);
        b[1] = if self.src.is_ipv4() { 4 << 4 } else { 6 << 4 };
        put_u16(&mut b[2..], self.src_port);
        for (at, addr) in [(4, self.src), (20, self.dst)] {
            match addr {
                core::net::IpAddr::V4(v4) => b[at + 12..at + 16].copy_from_slice(&v4.octets()),
                core::net::IpAddr::V6(v6) => b[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(ip: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        g
    }

    /// A REQ's fields land where table 106 puts them: every multi-bit
    /// field checked against hand-placed bytes.
    #[test]
    fn req_literal_bytes() {
        let req = Req {
            local_comm_id: 0x0102_0304,
            service_id: 0x0000_0000_0106_4e21,
            local_ca_guid: 0x1122_3344_5566_7788,
            local_qkey: 0,
            local_qpn: 0x00_0011,
            responder_resources: 16,
            initiator_depth: 16,
            remote_cm_response_timeout: 20,
            transport: TransportService::Rc,
            end_to_end_flow_control: true,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 5,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            primary_local_lid: 0xffff,
            primary_remote_lid: 0xffff,
            primary_local_gid: gid([127, 0, 0, 2]),
            primary_remote_gid: gid([127, 0, 0, 3]),
            primary_flow_label: 0,
            primary_packet_rate: 2,
            primary_traffic_class: 0,
            primary_hop_limit: 64,
            primary_sl: 0,
            primary_subnet_local: false,
            primary_local_ack_timeout: 14,
            private_data: PrivateData::new(b"hello").unwrap(),
        };
        let mut data = [0xeeu8; MAD_DATA_LEN];
        Message::Req(req).emit(&mut data).unwrap();
        assert_eq!(&data[0..4], &[1, 2, 3, 4]);
        assert_eq!(&data[4..8], &[0, 0, 0, 0], "reserved");
        assert_eq!(&data[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x4e, 0x21]);
        assert_eq!(&data[16..24], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&data[32..36], &[0, 0, 0x11, 16], "QPN, responder resources");
        assert_eq!(data[39], 16, "initiator depth");
        assert_eq!(data[43], 20 << 3 | 1, "timeout 20, RC, flow control");
        assert_eq!(&data[44..48], &[0xab, 0xcd, 0xef, 20 << 3 | 7]);
        assert_eq!(&data[48..52], &[0xff, 0xff, 5 << 4 | 7, 15 << 4]);
        assert_eq!(&data[52..56], &[0xff; 4]);
        assert_eq!(&data[56..72], &gid([127, 0, 0, 2]));
        assert_eq!(&data[72..88], &gid([127, 0, 0, 3]));
        assert_eq!(&data[88..96], &[0, 0, 0, 2, 0, 64, 0, 14 << 3]);
        assert_eq!(&data[140..146], b"hello\0");
        assert_eq!(data[231], 0);
        let back = Message::parse(attribute::REQ, &data).unwrap();
        let Message::Req(parsed) = back else { panic!("{back:?}") };
        assert_eq!(parsed.private_data.len(), REQ_PRIVATE_DATA, "the whole area comes back");
        assert_eq!(Req { private_data: req.private_data, ..parsed }, req);
    }

    #[test]
    fn rep_literal_bytes() {
        let rep = Rep {
            local_comm_id: 9,
            remote_comm_id: 0x0102_0304,
            local_qkey: 0,
            local_qpn: 0x12_3456,
            starting_psn: 0x65_4321,
            responder_resources: 1,
            initiator_depth: 2,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: 7,
            private_data: PrivateData::EMPTY,
        };
        let mut data = [0u8; MAD_DATA_LEN];
        Message::Rep(rep).emit(&mut data).unwrap();
        let expected: [u8; 36] = [
            0,
            0,
            0,
            9,
            1,
            2,
            3,
            4,
            0,
            0,
            0,
            0,
            0x12,
            0x34,
            0x56,
            0,
            0,
            0,
            0,
            0,
            0x65,
            0x43,
            0x21,
            0,
            1,
            2,
            15 << 3 | 1,
            7 << 5 | 1 << 4,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            7,
        ];
        assert_eq!(&data[..36], &expected);
        let Message::Rep(parsed) = Message::parse(attribute::REP, &data).unwrap() else { panic!() };
        assert_eq!(Rep { private_data: PrivateData::EMPTY, ..parsed }, rep);
    }

    #[test]
    fn the_short_messages_literal_bytes() {
        let mut data = [0u8; MAD_DATA_LEN];
        let rej = Rej {
            local_comm_id: 5,
            remote_comm_id: 6,
            rejected: Answered::Req,
            reason: reject_reason::CONSUMER_DEFINED,
            private_data: PrivateData::new(&[0xaa]).unwrap(),
        };
        Message::Rej(rej).emit(&mut data).unwrap();
        assert_eq!(&data[..12], &[0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0, 28]);
        assert_eq!(data[84], 0xaa);

        let dreq = Dreq { local_comm_id: 5, remote_comm_id: 6, remote_qpn: 0x11, private_data: PrivateData::EMPTY };
        Message::Dreq(dreq).emit(&mut data).unwrap();
        assert_eq!(&data[..12], &[0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0x11, 0]);

        let sidr = SidrRep {
            request_id: 3,
            status: sidr_status::VALID,
            qpn: 0x22,
            service_id: 0x0111_1389,
            qkey: 0x0123_4567,
            private_data: PrivateData::EMPTY,
        };
        Message::SidrRep(sidr).emit(&mut data).unwrap();
        assert_eq!(
            &data[..24],
            &[0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0x22, 0, 0, 0, 0, 0, 0x01, 0x11, 0x13, 0x89, 0x01, 0x23, 0x45, 0x67]
        );
        let Message::SidrRep(parsed) = Message::parse(attribute::SIDR_REP, &data).unwrap() else { panic!() };
        assert_eq!((parsed.qpn, parsed.qkey, parsed.service_id), (0x22, 0x0123_4567, 0x0111_1389));
    }

    #[test]
    fn hostile_bytes_are_refused_not_trusted() {
        let data = [0xffu8; MAD_DATA_LEN];
        assert_eq!(Message::parse(attribute::REQ, &data), Err(Error::Reserved), "transport service 3");
        assert_eq!(Message::parse(attribute::REJ, &data), Err(Error::Reserved), "rejected message 3");
        assert_eq!(Message::parse(0x0019, &data), Err(Error::Reserved), "LAP is not spoken");
        assert_eq!(Message::parse(attribute::RTU, &data[..100]), Err(Error::Truncated));
        let long = PrivateData::new(&[1; 93]).unwrap();
        let req = Message::parse(attribute::REQ, &[0u8; MAD_DATA_LEN]).unwrap();
        let Message::Req(req) = req else { panic!() };
        assert_eq!(
            Message::Req(Req { private_data: long, ..req }).emit(&mut [0u8; MAD_DATA_LEN]),
            Err(Error::Truncated)
        );
        assert!(PrivateData::new(&[0; 225]).is_none());
    }

    #[test]
    fn rdma_cm_ip_header_literal_bytes() {
        let header = IpHeader { src_port: 0x9c40, src: [127, 0, 0, 2].into(), dst: [127, 0, 0, 3].into() };
        let mut bytes = [0xffu8; 36];
        header.emit(&mut bytes).unwrap();
        let mut expected = [0u8; 36];
        expected[1] = 0x40;
        expected[2..4].copy_from_slice(&[0x9c, 0x40]);
        expected[16..20].copy_from_slice(&[127, 0, 0, 2]);
        expected[32..36].copy_from_slice(&[127, 0, 0, 3]);
        assert_eq!(bytes, expected);
        assert_eq!(IpHeader::parse(&bytes), Ok(header));
        expected[1] = 0x50;
        assert_eq!(IpHeader::parse(&expected), Err(Error::Reserved));
    }
}
