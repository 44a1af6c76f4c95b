//! The entries of the shared queues: send and receive work queue entries
//! (WQEs) that the program writes, completion queue entries (CQEs) that
//! the daemon writes. Fixed little-endian layouts, as a NIC's are; both
//! sides are on one host.
//!
//! ```text
//! send WQE   0 wr_id u64 | 8 opcode u8 | 9 flags u8 | 10 count u16 (SGEs, or inline bytes) | 12 imm u32
//!           16 remote addr u64 | 24 rkey u32 | 28 UD dest QPN u32 | 32 compare/add u64 | 40 swap u64
//!           48 UD qkey u32 | 52 UD address family u8 (0, 4, 6) | 56 UD address [16]
//!           72 SGEs (addr u64, length u32, lkey u32) or inline bytes
//! recv WQE   0 wr_id u64 | 8 SGE count u32 | 12 reserved | 16 SGEs
//! CQE        0 wr_id u64 | 8 status u32 | 12 opcode u32 | 16 byte_len u32 | 20 imm u32 | 24 qp_num u32
//!           28 src_qp u32 | 32 flags u32 | 36 reserved | 40 timestamp u64 | 48 source address [16]
//! ```
//!
//! A decoder reads what an untrusted program wrote: every count is checked
//! against the queue's capabilities and every code against its table; a
//! bad entry is an error naming what is wrong, never a panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use softrnic_transport::{
    Completion, InlineData, Instant, Payload, RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, SgeList,
    UdDestination, WcOpcode, WcStatus,
};

pub const SEND_HEADER: usize = 72;
pub const RECV_HEADER: usize = 16;
pub const SGE_LEN: usize = 16;
pub const CQE_LEN: usize = 64;

const OP_SEND: u8 = 0;
const OP_SEND_IMM: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_WRITE_IMM: u8 = 3;
const OP_READ: u8 = 4;
const OP_COMPARE_SWAP: u8 = 5;
const OP_FETCH_ADD: u8 = 6;

const SIGNALED: u8 = 1;
const FENCE: u8 = 2;
const SOLICITED: u8 = 4;
const INLINE: u8 = 8;

const CQE_IMM: u32 = 1;
const CQE_GRH: u32 = 2;
const CQE_SOLICITED: u32 = 4;
const CQE_SOURCE_V4: u32 = 8;
const CQE_SOURCE_V6: u32 = 16;

/// The bytes a send slot needs for a QP's capabilities.
pub fn send_slot_size(max_sge: u32, max_inline: u32) -> u32 {
    SEND_HEADER as u32 + (max_sge * SGE_LEN as u32).max(max_inline)
}

/// The bytes a receive slot needs.
pub fn recv_slot_size(max_sge: u32) -> u32 {
    RECV_HEADER as u32 + max_sge * SGE_LEN as u32
}

/// What is wrong with an entry a program wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    #[error("unknown opcode {0}")]
    Opcode(u8),
    #[error("{count} scatter/gather entries, the queue allows {max}")]
    TooManySges { count: usize, max: usize },
    #[error("{len} inline bytes, the QP allows {max}")]
    InlineTooLong { len: usize, max: usize },
    #[error("unknown address family {0}")]
    AddressFamily(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u8),
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

fn emit_sges(b: &mut [u8], at: usize, sges: &[Sge]) {
    for (i, sge) in sges.iter().enumerate() {
        let at = at + i * SGE_LEN;
        put(b, at, &sge.addr.to_le_bytes());
        put(b, at + 8, &sge.length.to_le_bytes());
        put(b, at + 12, &sge.lkey.to_le_bytes());
    }
}

fn parse_sges(b: &[u8], at: usize, count: usize) -> SgeList {
    (0..count)
        .map(|i| {
            let at = at + i * SGE_LEN;
            Sge { addr: u64_at(b, at), length: u32_at(b, at + 8), lkey: u32_at(b, at + 12) }
        })
        .collect()
}

fn emit_addr(b: &mut [u8], family_at: usize, addr_at: usize, addr: Option<IpAddr>) {
    match addr {
        None => b[family_at] = 0,
        Some(IpAddr::V4(a)) => {
            b[family_at] = 4;
            put(b, addr_at, &a.octets());
        }
        Some(IpAddr::V6(a)) => {
            b[family_at] = 6;
            put(b, addr_at, &a.octets());
        }
    }
}

fn parse_addr(family: u8, b: &[u8]) -> Result<Option<IpAddr>, WqeError> {
    match family {
        0 => Ok(None),
        4 => Ok(Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&b[..4]).unwrap())))),
        6 => Ok(Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&b[..16]).unwrap())))),
        other => Err(WqeError::AddressFamily(other)),
    }
}

/// The request's `wr_id`, which every WQE starts with: readable even in an
/// entry that fails to parse, so that its failure completes it.
pub fn wr_id(slot: &[u8]) -> u64 {
    u64_at(slot, 0)
}

/// Writes a send WQE into `slot` (as large as [`send_slot_size`] for the
/// QP's capabilities, which the caller has checked the request against).
pub fn emit_send(wr: &SendWorkRequest, slot: &mut [u8]) -> usize {
    slot[..SEND_HEADER].fill(0);
    let (opcode, imm, remote) = match wr.op {
        SendOp::Send { imm: None } => (OP_SEND, 0, None),
        SendOp::Send { imm: Some(imm) } => (OP_SEND_IMM, imm, None),
        SendOp::Write { remote, imm: None } => (OP_WRITE, 0, Some(remote)),
        SendOp::Write { remote, imm: Some(imm) } => (OP_WRITE_IMM, imm, Some(remote)),
        SendOp::Read { remote } => (OP_READ, 0, Some(remote)),
        SendOp::CompareSwap { remote, compare, swap } => {
            put(slot, 32, &compare.to_le_bytes());
            put(slot, 40, &swap.to_le_bytes());
            (OP_COMPARE_SWAP, 0, Some(remote))
        }
        SendOp::FetchAdd { remote, add } => {
            put(slot, 32, &add.to_le_bytes());
            (OP_FETCH_ADD, 0, Some(remote))
        }
    };
    put(slot, 0, &wr.wr_id.to_le_bytes());
    slot[8] = opcode;
    let mut flags = 0;
    flags |= if wr.signaled { SIGNALED } else { 0 };
    flags |= if wr.fence { FENCE } else { 0 };
    flags |= if wr.solicited { SOLICITED } else { 0 };
    put(slot, 12, &imm.to_le_bytes());
    if let Some(remote) = remote {
        put(slot, 16, &remote.addr.to_le_bytes());
        put(slot, 24, &remote.rkey.to_le_bytes());
    }
    if let Some(ud) = wr.ud {
        put(slot, 28, &ud.qpn.to_le_bytes());
        put(slot, 48, &ud.qkey.to_le_bytes());
        emit_addr(slot, 52, 56, Some(ud.addr));
    }
    let end = match &wr.payload {
        Payload::Gather(sges) => {
            put(slot, 10, &(sges.len() as u16).to_le_bytes());
            emit_sges(slot, SEND_HEADER, sges);
            SEND_HEADER + sges.len() * SGE_LEN
        }
        Payload::Inline(bytes) => {
            flags |= INLINE;
            put(slot, 10, &(bytes.len() as u16).to_le_bytes());
            put(slot, SEND_HEADER, bytes);
            SEND_HEADER + bytes.len()
        }
    };
    slot[9] = flags;
    end
}

/// Reads a send WQE from a slot's bytes, for a QP allowing `max_sge`
/// gather entries and `max_inline` inline bytes.
pub fn parse_send(slot: &[u8], max_sge: usize, max_inline: usize) -> Result<SendWorkRequest, WqeError> {
    let flags = slot[9];
    if flags & !(SIGNALED | FENCE | SOLICITED | INLINE) != 0 {
        return Err(WqeError::Flags(flags));
    }
    let count = usize::from(u16_at(slot, 10));
    let payload = if flags & INLINE != 0 {
        if count > max_inline || SEND_HEADER + count > slot.len() {
            return Err(WqeError::InlineTooLong { len: count, max: max_inline });
        }
        Payload::Inline(InlineData::from_slice(&slot[SEND_HEADER..SEND_HEADER + count]))
    } else {
        if count > max_sge || SEND_HEADER + count * SGE_LEN > slot.len() {
            return Err(WqeError::TooManySges { count, max: max_sge });
        }
        Payload::Gather(parse_sges(slot, SEND_HEADER, count))
    };
    let imm = u32_at(slot, 12);
    let remote = RemoteAddr { addr: u64_at(slot, 16), rkey: u32_at(slot, 24) };
    let op = match slot[8] {
        OP_SEND => SendOp::Send { imm: None },
        OP_SEND_IMM => SendOp::Send { imm: Some(imm) },
        OP_WRITE => SendOp::Write { remote, imm: None },
        OP_WRITE_IMM => SendOp::Write { remote, imm: Some(imm) },
        OP_READ => SendOp::Read { remote },
        OP_COMPARE_SWAP => SendOp::CompareSwap { remote, compare: u64_at(slot, 32), swap: u64_at(slot, 40) },
        OP_FETCH_ADD => SendOp::FetchAdd { remote, add: u64_at(slot, 32) },
        other => return Err(WqeError::Opcode(other)),
    };
    let ud = parse_addr(slot[52], &slot[56..72])?.map(|addr| UdDestination {
        addr,
        qpn: u32_at(slot, 28),
        qkey: u32_at(slot, 48),
    });
    Ok(SendWorkRequest {
        wr_id: u64_at(slot, 0),
        op,
        payload,
        signaled: flags & SIGNALED != 0,
        fence: flags & FENCE != 0,
        solicited: flags & SOLICITED != 0,
        ud,
    })
}

/// Writes a receive WQE into `slot`.
pub fn emit_recv(wr: &RecvWorkRequest, slot: &mut [u8]) -> usize {
    put(slot, 0, &wr.wr_id.to_le_bytes());
    put(slot, 8, &(wr.sges.len() as u32).to_le_bytes());
    put(slot, 12, &[0; 4]);
    emit_sges(slot, RECV_HEADER, &wr.sges);
    RECV_HEADER + wr.sges.len() * SGE_LEN
}

/// Reads a receive WQE, for a queue allowing `max_sge` scatter entries.
pub fn parse_recv(slot: &[u8], max_sge: usize) -> Result<RecvWorkRequest, WqeError> {
    let count = u32_at(slot, 8) as usize;
    if count > max_sge || RECV_HEADER + count * SGE_LEN > slot.len() {
        return Err(WqeError::TooManySges { count, max: max_sge });
    }
    Ok(RecvWorkRequest { wr_id: u64_at(slot, 0), sges: parse_sges(slot, RECV_HEADER, count) })
}

/// Writes a CQE.
pub fn emit_completion(c: &Completion, slot: &mut [u8; CQE_LEN]) {
    slot.fill(0);
    put(slot, 0, &c.wr_id.to_le_bytes());
    put(slot, 8, &(c.status as u32).to_le_bytes());
    put(slot, 12, &(c.opcode as u32).to_le_bytes());
    put(slot, 16, &c.byte_len.to_le_bytes());
    put(slot, 20, &c.imm_data.unwrap_or(0).to_le_bytes());
    put(slot, 24, &c.qp_num.to_le_bytes());
    put(slot, 28, &c.src_qp.to_le_bytes());
    let mut flags = 0;
    flags |= if c.imm_data.is_some() { CQE_IMM } else { 0 };
    flags |= if c.grh { CQE_GRH } else { 0 };
    flags |= if c.solicited { CQE_SOLICITED } else { 0 };
    match c.source {
        Some(IpAddr::V4(a)) => {
            flags |= CQE_SOURCE_V4;
            put(slot, 48, &a.octets());
        }
        Some(IpAddr::V6(a)) => {
            flags |= CQE_SOURCE_V6;
            put(slot, 48, &a.octets());
        }
        None => {}
    }
    put(slot, 32, &flags.to_le_bytes());
    put(slot, 40, &c.timestamp.as_nanos().to_le_bytes());
}

/// Reads a CQE. The daemon wrote it, but the program checks it anyway: a
/// status or opcode it does not know reads as a general error.
pub fn parse_completion(slot: &[u8; CQE_LEN]) -> Completion {
    const STATUSES: [WcStatus; 14] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::FatalErr,
        WcStatus::GeneralErr,
    ];
    const OPCODES: [WcOpcode; 7] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];
    let status = u32_at(slot, 8);
    let opcode = u32_at(slot, 12);
    let flags = u32_at(slot, 32);
    let source = if flags & CQE_SOURCE_V4 != 0 {
        parse_addr(4, &slot[48..]).ok().flatten()
    } else if flags & CQE_SOURCE_V6 != 0 {
        parse_addr(6, &slot[48..]).ok().flatten()
    } else {
        None
    };
    Completion {
        wr_id: u64_at(slot, 0),
        status: STATUSES.into_iter().find(|s| *s as u32 == status).unwrap_or(WcStatus::GeneralErr),
        opcode: OPCODES.into_iter().find(|o| *o as u32 == opcode).unwrap_or(WcOpcode::Send),
        byte_len: u32_at(slot, 16),
        imm_data: (flags & CQE_IMM != 0).then(|| u32_at(slot, 20)),
        qp_num: u32_at(slot, 24),
        src_qp: u32_at(slot, 28),
        source,
        grh: flags & CQE_GRH != 0,
        solicited: flags & CQE_SOLICITED != 0,
        timestamp: Instant::from_nanos(u64_at(slot, 40)),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use softrnic_transport::smallvec;

    use super::*;

    #[test]
    fn a_write_with_immediate_and_two_sges_in_bytes() {
        let wr = SendWorkRequest {
            wr_id: 0x1122334455667788,
            op: SendOp::Write {
                remote: RemoteAddr { addr: 0xaabb_ccdd_0000_1000, rkey: 0x0102_0304 },
                imm: Some(0xdead_beef),
            },
            payload: Payload::Gather(smallvec![
                Sge { addr: 0x7000, length: 64, lkey: 9 },
                Sge { addr: 0x8000, length: 0x100, lkey: 10 }
            ]),
            signaled: true,
            fence: false,
            solicited: true,
            ud: None,
        };
        let mut slot = [0xeeu8; 128];
        assert_eq!(emit_send(&wr, &mut slot), 104);
        #[rustfmt::skip]
        let expected: [u8; 104] = [
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // wr_id
            OP_WRITE_IMM, SIGNALED | SOLICITED, 2, 0,       // opcode, flags, 2 SGEs
            0xef, 0xbe, 0xad, 0xde,                         // imm
            0x00, 0x10, 0x00, 0x00, 0xdd, 0xcc, 0xbb, 0xaa, // remote address
            0x04, 0x03, 0x02, 0x01,                         // rkey
            0, 0, 0, 0,                                     // UD QPN
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // compare, swap
            0, 0, 0, 0, 0, 0, 0, 0,                         // qkey, family, reserved
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // UD address
            0x00, 0x70, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 9, 0, 0, 0,
            0x00, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x01, 0, 0, 10, 0, 0, 0,
        ];
        assert_eq!(slot[..104], expected);
        assert_eq!(parse_send(&slot, 2, 0).unwrap(), wr);
        assert_eq!(parse_send(&slot, 1, 0), Err(WqeError::TooManySges { count: 2, max: 1 }));
    }

    #[test]
    fn hostile_entries_are_named_errors() {
        let mut slot = [0u8; 96];
        slot[8] = 99;
        assert_eq!(parse_send(&slot, 4, 16), Err(WqeError::Opcode(99)));
        slot[8] = OP_SEND;
        slot[9] = 0x80;
        assert_eq!(parse_send(&slot, 4, 16), Err(WqeError::Flags(0x80)));
        slot[9] = INLINE;
        slot[10] = 200;
        assert_eq!(parse_send(&slot, 4, 16), Err(WqeError::InlineTooLong { len: 200, max: 16 }));
        slot[9] = 0;
        slot[10] = 0;
        slot[52] = 5;
        assert_eq!(parse_send(&slot, 4, 16), Err(WqeError::AddressFamily(5)));
        let mut recv = [0u8; 48];
        recv[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_recv(&recv, 2), Err(WqeError::TooManySges { count: u32::MAX as usize, max: 2 }));
    }

    #[test]
    fn a_ud_completion_round_trips() {
        let c = Completion {
            wr_id: 5,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 40 + 12,
            imm_data: Some(7),
            qp_num: 0x12,
            src_qp: 0x34,
            source: Some("127.0.0.9".parse().unwrap()),
            grh: true,
            solicited: false,
            timestamp: Instant::from_nanos(1234),
        };
        let mut slot = [0u8; CQE_LEN];
        emit_completion(&c, &mut slot);
        assert_eq!(slot[8..16], [0, 0, 0, 0, 128, 0, 0, 0], "status, opcode");
        assert_eq!(slot[48..52], [127, 0, 0, 9]);
        assert_eq!(parse_completion(&slot), c);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 128)) {
            let _ = parse_send(&bytes, 3, 56);
            let _ = parse_recv(&bytes, 7);
            let _ = parse_completion(bytes[..CQE_LEN].try_into().unwrap());
        }
    }
}
