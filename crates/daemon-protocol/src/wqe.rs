//! The entries of the shared queues: send and receive work queue entries
//! (WQEs) that the program writes, completion queue entries (CQEs) that
//! the daemon writes. Fixed little-endian layouts, as a NIC's are; both
//! sides are on one host.
//!
//! ```text
//! send WQE   0 wr_id u64 | 8 opcode u8 | 9 flags u8 | 10 count u16 (SGEs, or inline bytes)
//!           12 imm u32 (or the rkey to invalidate, or a bind's new rkey)
//!           16 remote addr u64 | 24 rkey u32 | 28 UD dest QPN u32
//!           32 compare/add u64 (a bind's length, an ATOMIC WRITE's 8 bytes)
//!           40 swap u64 (a bind's region lkey u32, then its access u32)
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
    Access, BlockOutcome, Completion, InlineData, Instant, Payload, RecvWorkRequest, RemoteAddr, SendOp,
    SendWorkRequest, Sge, SgeList, UdDestination, WcOpcode, WcStatus, WindowBind,
};

/// The bytes of each entry's fixed part, and of a scatter/gather entry.
pub const SEND_HEADER: usize = 72;
pub const RECV_HEADER: usize = 16;
pub const SGE_LEN: usize = 16;
pub const CQE_LEN: usize = 64;

/// Where each field of an entry lies, as the table above draws it.
mod field {
    use std::ops::Range;

    pub mod send {
        use super::Range;
        pub const WR_ID: Range<usize> = 0..8;
        pub const OPCODE: usize = 8;
        pub const FLAGS: usize = 9;
        pub const COUNT: Range<usize> = 10..12;
        pub const IMM: Range<usize> = 12..16;
        pub const REMOTE_ADDR: Range<usize> = 16..24;
        pub const RKEY: Range<usize> = 24..28;
        pub const UD_QPN: Range<usize> = 28..32;
        pub const COMPARE_ADD: Range<usize> = 32..40;
        pub const SWAP: Range<usize> = 40..48;
        /// A bind's range is `REMOTE_ADDR` and `COMPARE_ADD`, its window
        /// `RKEY`, its new rkey `IMM`; these two take `SWAP`'s place.
        pub const BIND_LKEY: Range<usize> = 40..44;
        pub const BIND_ACCESS: Range<usize> = 44..48;
        pub const UD_QKEY: Range<usize> = 48..52;
        pub const UD_FAMILY: usize = 52;
        pub const UD_ADDR: Range<usize> = 56..72;
    }

    pub mod recv {
        use super::Range;
        pub const WR_ID: Range<usize> = 0..8;
        pub const COUNT: Range<usize> = 8..12;
    }

    pub mod sge {
        use super::Range;
        pub const ADDR: Range<usize> = 0..8;
        pub const LENGTH: Range<usize> = 8..12;
        pub const LKEY: Range<usize> = 12..16;
    }

    pub mod cqe {
        use super::Range;
        pub const WR_ID: Range<usize> = 0..8;
        pub const STATUS: Range<usize> = 8..12;
        pub const OPCODE: Range<usize> = 12..16;
        pub const BYTE_LEN: Range<usize> = 16..20;
        pub const IMM: Range<usize> = 20..24;
        pub const QP_NUM: Range<usize> = 24..28;
        pub const SRC_QP: Range<usize> = 28..32;
        pub const FLAGS: Range<usize> = 32..36;
        /// A block offload's [`BlockOutcome`](softrnic_transport::BlockOutcome), 0 for none.
        pub const BLOCK: usize = 36;
        pub const TIMESTAMP: Range<usize> = 40..48;
        pub const SOURCE: Range<usize> = 48..64;
    }
}

// The fixed parts end where the table says, and every entry starts with
// its wr_id, so a failed entry can still be completed.
const _: () = assert!(field::send::UD_ADDR.end == SEND_HEADER);
const _: () = assert!(field::recv::COUNT.end <= RECV_HEADER);
const _: () = assert!(field::sge::LKEY.end == SGE_LEN);
const _: () = assert!(field::cqe::SOURCE.end == CQE_LEN);
const _: () = assert!(field::send::WR_ID.start == 0 && field::recv::WR_ID.start == 0);

const OP_SEND: u8 = 0;
const OP_SEND_IMM: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_WRITE_IMM: u8 = 3;
const OP_READ: u8 = 4;
const OP_COMPARE_SWAP: u8 = 5;
const OP_FETCH_ADD: u8 = 6;
const OP_SEND_INV: u8 = 7;
const OP_LOCAL_INV: u8 = 8;
const OP_BIND_MW: u8 = 9;
const OP_ATOMIC_WRITE: u8 = 10;

const SIGNALED: u8 = 1;
const FENCE: u8 = 2;
const SOLICITED: u8 = 4;
const INLINE: u8 = 8;

const CQE_IMM: u32 = 1;
const CQE_GRH: u32 = 2;
const CQE_SOLICITED: u32 = 4;
const CQE_SOURCE_V4: u32 = 8;
const CQE_SOURCE_V6: u32 = 16;
const CQE_INVALIDATED: u32 = 32;

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
    #[error("{len} bytes, shorter than the entry's {need}")]
    Truncated { len: usize, need: usize },
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
    #[error("unknown access flags {0:#x} in a bind")]
    Access(u32),
}

/// A view over the bytes of one entry, at least `need` long: fields read
/// and written by their place in [`field`], little-endian.
struct Entry<T> {
    bytes: T,
}

impl<T: AsRef<[u8]>> Entry<T> {
    fn new_checked(bytes: T, need: usize) -> Result<Entry<T>, WqeError> {
        let len = bytes.as_ref().len();
        if len < need {
            return Err(WqeError::Truncated { len, need });
        }
        Ok(Entry { bytes })
    }

    fn u8(&self, at: usize) -> u8 {
        self.bytes.as_ref()[at]
    }
    fn array<const N: usize>(&self, at: std::ops::Range<usize>) -> [u8; N] {
        self.bytes.as_ref()[at].try_into().expect("a field of N bytes")
    }
    fn u16(&self, at: std::ops::Range<usize>) -> u16 {
        u16::from_le_bytes(self.array(at))
    }
    fn u32(&self, at: std::ops::Range<usize>) -> u32 {
        u32::from_le_bytes(self.array(at))
    }
    fn u64(&self, at: std::ops::Range<usize>) -> u64 {
        u64::from_le_bytes(self.array(at))
    }
    fn bytes(&self, at: std::ops::Range<usize>) -> &[u8] {
        &self.bytes.as_ref()[at]
    }
}

impl<T: AsMut<[u8]>> Entry<T> {
    fn put(&mut self, at: usize, value: &[u8]) {
        self.bytes.as_mut()[at..at + value.len()].copy_from_slice(value);
    }
}

/// Reads `count` scatter/gather entries from `at`; the caller checked
/// that they fit.
fn parse_sges(entry: &Entry<&[u8]>, at: usize, count: usize) -> SgeList {
    (0..count)
        .map(|i| {
            let sge = Entry { bytes: &entry.bytes[at + i * SGE_LEN..at + (i + 1) * SGE_LEN] };
            Sge {
                addr: sge.u64(field::sge::ADDR),
                length: sge.u32(field::sge::LENGTH),
                lkey: sge.u32(field::sge::LKEY),
            }
        })
        .collect()
}

fn emit_sges(entry: &mut Entry<&mut [u8]>, at: usize, sges: &[Sge]) {
    for (i, sge) in sges.iter().enumerate() {
        let at = at + i * SGE_LEN;
        entry.put(at + field::sge::ADDR.start, &sge.addr.to_le_bytes());
        entry.put(at + field::sge::LENGTH.start, &sge.length.to_le_bytes());
        entry.put(at + field::sge::LKEY.start, &sge.lkey.to_le_bytes());
    }
}

/// An address of `family` (0 none, 4, 6) from the 16 bytes that hold it.
fn parse_addr(family: u8, bytes: &[u8]) -> Result<Option<IpAddr>, WqeError> {
    match family {
        0 => Ok(None),
        4 => Ok(Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[..4]).expect("16 bytes"))))),
        6 => Ok(Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[..16]).expect("16 bytes"))))),
        other => Err(WqeError::AddressFamily(other)),
    }
}

/// The request's `wr_id`, which every WQE starts with: readable even in an
/// entry that fails to parse, so that its failure completes it (0 from
/// one too short to hold it).
pub fn wr_id(slot: &[u8]) -> u64 {
    Entry::new_checked(slot, field::send::WR_ID.end).map_or(0, |e| e.u64(field::send::WR_ID))
}

/// Writes a send WQE into `slot` (as large as [`send_slot_size`] for the
/// QP's capabilities, which the caller has checked the request against);
/// returns the bytes written.
pub fn emit_send(wr: &SendWorkRequest, slot: &mut [u8]) -> usize {
    use field::send::*;
    slot[..SEND_HEADER].fill(0);
    let mut e = Entry { bytes: slot };
    let (opcode, imm, remote) = match wr.op {
        SendOp::Send { imm: None } => (OP_SEND, 0, None),
        SendOp::Send { imm: Some(imm) } => (OP_SEND_IMM, imm, None),
        SendOp::Write { remote, imm: None } => (OP_WRITE, 0, Some(remote)),
        SendOp::Write { remote, imm: Some(imm) } => (OP_WRITE_IMM, imm, Some(remote)),
        SendOp::Read { remote } => (OP_READ, 0, Some(remote)),
        SendOp::CompareSwap { remote, compare, swap } => {
            e.put(COMPARE_ADD.start, &compare.to_le_bytes());
            e.put(SWAP.start, &swap.to_le_bytes());
            (OP_COMPARE_SWAP, 0, Some(remote))
        }
        SendOp::FetchAdd { remote, add } => {
            e.put(COMPARE_ADD.start, &add.to_le_bytes());
            (OP_FETCH_ADD, 0, Some(remote))
        }
        SendOp::AtomicWrite { remote, value } => {
            e.put(COMPARE_ADD.start, &value);
            (OP_ATOMIC_WRITE, 0, Some(remote))
        }
        SendOp::SendWithInvalidate { rkey } => (OP_SEND_INV, rkey, None),
        SendOp::LocalInvalidate { rkey } => (OP_LOCAL_INV, rkey, None),
        SendOp::BindWindow(bind) => {
            e.put(COMPARE_ADD.start, &bind.len.to_le_bytes());
            e.put(BIND_LKEY.start, &bind.region_lkey.to_le_bytes());
            e.put(BIND_ACCESS.start, &bind.access.bits().to_le_bytes());
            (OP_BIND_MW, bind.new_rkey, Some(RemoteAddr { addr: bind.addr, rkey: bind.window }))
        }
    };
    e.put(WR_ID.start, &wr.wr_id.to_le_bytes());
    e.put(OPCODE, &[opcode]);
    let mut flags = 0;
    flags |= if wr.signaled { SIGNALED } else { 0 };
    flags |= if wr.fence { FENCE } else { 0 };
    flags |= if wr.solicited { SOLICITED } else { 0 };
    e.put(IMM.start, &imm.to_le_bytes());
    if let Some(remote) = remote {
        e.put(REMOTE_ADDR.start, &remote.addr.to_le_bytes());
        e.put(RKEY.start, &remote.rkey.to_le_bytes());
    }
    if let Some(ud) = wr.ud {
        e.put(UD_QPN.start, &ud.qpn.to_le_bytes());
        e.put(UD_QKEY.start, &ud.qkey.to_le_bytes());
        match ud.addr {
            IpAddr::V4(a) => {
                e.put(UD_FAMILY, &[4]);
                e.put(UD_ADDR.start, &a.octets());
            }
            IpAddr::V6(a) => {
                e.put(UD_FAMILY, &[6]);
                e.put(UD_ADDR.start, &a.octets());
            }
        }
    }
    let end = match &wr.payload {
        Payload::Gather(sges) => {
            e.put(COUNT.start, &(sges.len() as u16).to_le_bytes());
            emit_sges(&mut e, SEND_HEADER, sges);
            SEND_HEADER + sges.len() * SGE_LEN
        }
        Payload::Inline(bytes) => {
            flags |= INLINE;
            e.put(COUNT.start, &(bytes.len() as u16).to_le_bytes());
            e.put(SEND_HEADER, bytes);
            SEND_HEADER + bytes.len()
        }
    };
    e.put(FLAGS, &[flags]);
    end
}

/// Reads a send WQE from a slot's bytes (or a forwarded request's), for a
/// QP allowing `max_sge` gather entries and `max_inline` inline bytes.
pub fn parse_send(slot: &[u8], max_sge: usize, max_inline: usize) -> Result<SendWorkRequest, WqeError> {
    use field::send::*;
    let e = Entry::new_checked(slot, SEND_HEADER)?;
    let flags = e.u8(FLAGS);
    if flags & !(SIGNALED | FENCE | SOLICITED | INLINE) != 0 {
        return Err(WqeError::Flags(flags));
    }
    let count = usize::from(e.u16(COUNT));
    let payload = if flags & INLINE != 0 {
        if count > max_inline || SEND_HEADER + count > slot.len() {
            return Err(WqeError::InlineTooLong { len: count, max: max_inline });
        }
        Payload::Inline(InlineData::from_slice(&slot[SEND_HEADER..SEND_HEADER + count]))
    } else {
        if count > max_sge || SEND_HEADER + count * SGE_LEN > slot.len() {
            return Err(WqeError::TooManySges { count, max: max_sge });
        }
        Payload::Gather(parse_sges(&e, SEND_HEADER, count))
    };
    let imm = e.u32(IMM);
    let remote = RemoteAddr { addr: e.u64(REMOTE_ADDR), rkey: e.u32(RKEY) };
    let op = match e.u8(OPCODE) {
        OP_SEND => SendOp::Send { imm: None },
        OP_SEND_IMM => SendOp::Send { imm: Some(imm) },
        OP_WRITE => SendOp::Write { remote, imm: None },
        OP_WRITE_IMM => SendOp::Write { remote, imm: Some(imm) },
        OP_READ => SendOp::Read { remote },
        OP_COMPARE_SWAP => SendOp::CompareSwap { remote, compare: e.u64(COMPARE_ADD), swap: e.u64(SWAP) },
        OP_FETCH_ADD => SendOp::FetchAdd { remote, add: e.u64(COMPARE_ADD) },
        OP_ATOMIC_WRITE => SendOp::AtomicWrite { remote, value: e.array(COMPARE_ADD) },
        OP_SEND_INV => SendOp::SendWithInvalidate { rkey: imm },
        OP_LOCAL_INV => SendOp::LocalInvalidate { rkey: imm },
        OP_BIND_MW => SendOp::BindWindow(WindowBind {
            window: remote.rkey,
            new_rkey: imm,
            region_lkey: e.u32(BIND_LKEY),
            addr: remote.addr,
            len: e.u64(COMPARE_ADD),
            access: Access::from_bits(e.u32(BIND_ACCESS)).ok_or(WqeError::Access(e.u32(BIND_ACCESS)))?,
        }),
        other => return Err(WqeError::Opcode(other)),
    };
    let ud = parse_addr(e.u8(UD_FAMILY), e.bytes(UD_ADDR))?.map(|addr| UdDestination {
        addr,
        qpn: e.u32(UD_QPN),
        qkey: e.u32(UD_QKEY),
    });
    Ok(SendWorkRequest {
        wr_id: e.u64(WR_ID),
        op,
        payload,
        signaled: flags & SIGNALED != 0,
        fence: flags & FENCE != 0,
        solicited: flags & SOLICITED != 0,
        ud,
    })
}

/// Writes a receive WQE into `slot`; returns the bytes written.
pub fn emit_recv(wr: &RecvWorkRequest, slot: &mut [u8]) -> usize {
    use field::recv::*;
    slot[..RECV_HEADER].fill(0);
    let mut e = Entry { bytes: slot };
    e.put(WR_ID.start, &wr.wr_id.to_le_bytes());
    e.put(COUNT.start, &(wr.sges.len() as u32).to_le_bytes());
    emit_sges(&mut e, RECV_HEADER, &wr.sges);
    RECV_HEADER + wr.sges.len() * SGE_LEN
}

/// Reads a receive WQE, for a queue allowing `max_sge` scatter entries.
pub fn parse_recv(slot: &[u8], max_sge: usize) -> Result<RecvWorkRequest, WqeError> {
    use field::recv::*;
    let e = Entry::new_checked(slot, RECV_HEADER)?;
    let count = e.u32(COUNT) as usize;
    if count > max_sge || RECV_HEADER + count * SGE_LEN > slot.len() {
        return Err(WqeError::TooManySges { count, max: max_sge });
    }
    Ok(RecvWorkRequest { wr_id: e.u64(WR_ID), sges: parse_sges(&e, RECV_HEADER, count) })
}

/// Writes a CQE.
pub fn emit_completion(c: &Completion, slot: &mut [u8; CQE_LEN]) {
    use field::cqe::*;
    slot.fill(0);
    let mut e = Entry { bytes: &mut slot[..] };
    e.put(WR_ID.start, &c.wr_id.to_le_bytes());
    e.put(STATUS.start, &(c.status as u32).to_le_bytes());
    e.put(OPCODE.start, &(c.opcode as u32).to_le_bytes());
    e.put(BYTE_LEN.start, &c.byte_len.to_le_bytes());
    // The immediate and the invalidated rkey share the field, as they
    // share `ibv_wc`'s: no message carries both.
    e.put(IMM.start, &c.imm_data.or(c.invalidated_rkey).unwrap_or(0).to_le_bytes());
    e.put(QP_NUM.start, &c.qp_num.to_le_bytes());
    e.put(SRC_QP.start, &c.src_qp.to_le_bytes());
    let mut flags = 0;
    flags |= if c.imm_data.is_some() { CQE_IMM } else { 0 };
    flags |= if c.grh { CQE_GRH } else { 0 };
    flags |= if c.solicited { CQE_SOLICITED } else { 0 };
    flags |= if c.invalidated_rkey.is_some() { CQE_INVALIDATED } else { 0 };
    match c.source {
        Some(IpAddr::V4(a)) => {
            flags |= CQE_SOURCE_V4;
            e.put(SOURCE.start, &a.octets());
        }
        Some(IpAddr::V6(a)) => {
            flags |= CQE_SOURCE_V6;
            e.put(SOURCE.start, &a.octets());
        }
        None => {}
    }
    e.put(FLAGS.start, &flags.to_le_bytes());
    e.put(BLOCK, &[c.block.map_or(0, |b| b as u8)]);
    e.put(TIMESTAMP.start, &c.timestamp.as_nanos().to_le_bytes());
}

/// Reads a CQE. The daemon wrote it, but the program checks it anyway: a
/// status or opcode it does not know reads as a general error.
pub fn parse_completion(slot: &[u8; CQE_LEN]) -> Completion {
    use field::cqe::*;
    const STATUSES: [WcStatus; 15] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
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
    const OPCODES: [WcOpcode; 10] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::BindMw,
        WcOpcode::LocalInv,
        WcOpcode::AtomicWrite,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];
    const BLOCK_OUTCOMES: [BlockOutcome; 4] =
        [BlockOutcome::Verified, BlockOutcome::Placed, BlockOutcome::Corrupt, BlockOutcome::OutOfRange];
    let e = Entry { bytes: &slot[..] };
    let (status, opcode, flags) = (e.u32(STATUS), e.u32(OPCODE), e.u32(FLAGS));
    let family = match flags {
        f if f & CQE_SOURCE_V4 != 0 => 4,
        f if f & CQE_SOURCE_V6 != 0 => 6,
        _ => 0,
    };
    Completion {
        wr_id: e.u64(WR_ID),
        status: STATUSES.into_iter().find(|s| *s as u32 == status).unwrap_or(WcStatus::GeneralErr),
        opcode: OPCODES.into_iter().find(|o| *o as u32 == opcode).unwrap_or(WcOpcode::Send),
        byte_len: e.u32(BYTE_LEN),
        imm_data: (flags & CQE_IMM != 0).then(|| e.u32(IMM)),
        invalidated_rkey: (flags & CQE_INVALIDATED != 0).then(|| e.u32(IMM)),
        qp_num: e.u32(QP_NUM),
        src_qp: e.u32(SRC_QP),
        source: parse_addr(family, e.bytes(SOURCE)).ok().flatten(),
        grh: flags & CQE_GRH != 0,
        solicited: flags & CQE_SOLICITED != 0,
        timestamp: Instant::from_nanos(e.u64(TIMESTAMP)),
        block: BLOCK_OUTCOMES.into_iter().find(|b| *b as u8 == e.bytes(BLOCK..BLOCK + 1)[0]),
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
        // Entries shorter than their fixed part (a forwarded request is
        // as long as the program made it) are refused, not read past.
        for len in [0, 5, 11, SEND_HEADER - 1] {
            assert_eq!(parse_send(&slot[..len], 4, 16), Err(WqeError::Truncated { len, need: SEND_HEADER }));
        }
        for len in [0, 3, RECV_HEADER - 1] {
            assert_eq!(parse_recv(&recv[..len], 2), Err(WqeError::Truncated { len, need: RECV_HEADER }));
        }
        assert_eq!(wr_id(&[1, 2, 3]), 0);
        assert_eq!(wr_id(&7u64.to_le_bytes()), 7);
    }

    #[test]
    fn a_receive_with_one_sge_in_bytes() {
        let wr =
            RecvWorkRequest { wr_id: 0x0102, sges: smallvec![Sge { addr: 0x1_0000_2000, length: 300, lkey: 0x77 }] };
        let mut slot = [0xeeu8; 40];
        assert_eq!(emit_recv(&wr, &mut slot), 32);
        #[rustfmt::skip]
        let expected: [u8; 32] = [
            0x02, 0x01, 0, 0, 0, 0, 0, 0,                   // wr_id
            1, 0, 0, 0, 0, 0, 0, 0,                         // 1 SGE, reserved
            0x00, 0x20, 0, 0, 1, 0, 0, 0, 0x2c, 0x01, 0, 0, 0x77, 0, 0, 0,
        ];
        assert_eq!(slot[..32], expected);
        assert_eq!(parse_recv(&slot[..32], 1).unwrap(), wr);
    }

    #[test]
    fn a_ud_completion_round_trips() {
        let c = Completion {
            wr_id: 5,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 40 + 12,
            imm_data: Some(7),
            invalidated_rkey: None,
            qp_num: 0x12,
            src_qp: 0x34,
            source: Some("127.0.0.9".parse().unwrap()),
            grh: true,
            solicited: false,
            timestamp: Instant::from_nanos(1234),
            block: Some(BlockOutcome::Placed),
        };
        let mut slot = [0u8; CQE_LEN];
        emit_completion(&c, &mut slot);
        assert_eq!(slot[8..16], [0, 0, 0, 0, 128, 0, 0, 0], "status, opcode");
        assert_eq!(slot[48..52], [127, 0, 0, 9]);
        assert_eq!(slot[36], 2, "placed by the block offload");
        assert_eq!(parse_completion(&slot), c);
    }

    /// A bind carries its window, new key, region, range and rights in the
    /// fields the table gives them; a bind with rights no one knows is
    /// refused. An ATOMIC WRITE, a SEND with invalidate and a local
    /// invalidate round-trip too.
    #[test]
    fn a_bind_in_bytes_and_the_other_new_operations() {
        let bind = WindowBind {
            window: 0xaabb_cc01,
            new_rkey: 0x02,
            region_lkey: 0x1234_5678,
            addr: 0x7000,
            len: 0x100,
            access: Access::REMOTE_WRITE | Access::ZERO_BASED,
        };
        let wr = SendWorkRequest::new(3, SendOp::BindWindow(bind), Payload::Gather(SgeList::new()));
        let mut slot = [0xeeu8; SEND_HEADER + 8];
        assert_eq!(emit_send(&wr, &mut slot), SEND_HEADER);
        assert_eq!(slot[8], OP_BIND_MW);
        assert_eq!(slot[12..16], [0x02, 0, 0, 0], "new rkey");
        assert_eq!(slot[16..24], [0, 0x70, 0, 0, 0, 0, 0, 0], "address");
        assert_eq!(slot[24..28], [0x01, 0xcc, 0xbb, 0xaa], "window");
        assert_eq!(slot[32..40], [0, 1, 0, 0, 0, 0, 0, 0], "length");
        assert_eq!(slot[40..48], [0x78, 0x56, 0x34, 0x12, 0x22, 0, 0, 0], "region lkey, access");
        assert_eq!(parse_send(&slot, 1, 0).unwrap(), wr);
        slot[44] = 0x80;
        assert_eq!(parse_send(&slot, 1, 0), Err(WqeError::Access(0x80)));
        let remote = RemoteAddr { addr: 0x8000, rkey: 0x77 };
        let op = SendOp::AtomicWrite { remote, value: [9; 8] };
        let wr = SendWorkRequest::new(5, op, Payload::Gather(SgeList::new()));
        emit_send(&wr, &mut slot);
        assert_eq!((slot[8], &slot[32..40]), (OP_ATOMIC_WRITE, &[9u8; 8][..]), "the 8 bytes in compare/add");
        assert_eq!(parse_send(&slot, 1, 0).unwrap(), wr);
        for op in [SendOp::SendWithInvalidate { rkey: 0x99 }, SendOp::LocalInvalidate { rkey: 0x99 }] {
            let wr = SendWorkRequest::new(4, op, Payload::Gather(SgeList::new()));
            emit_send(&wr, &mut slot);
            assert_eq!(slot[12..16], [0x99, 0, 0, 0]);
            assert_eq!(parse_send(&slot, 1, 0).unwrap(), wr);
        }
        let mut c = parse_completion(&[0; CQE_LEN]);
        c.invalidated_rkey = Some(0x4242_4201);
        let mut cqe = [0u8; CQE_LEN];
        emit_completion(&c, &mut cqe);
        assert_eq!(cqe[20..24], [0x01, 0x42, 0x42, 0x42]);
        assert_eq!(parse_completion(&cqe), c);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = parse_send(&bytes, 3, 56);
            let _ = parse_recv(&bytes, 7);
            let _ = wr_id(&bytes);
            if let Ok(cqe) = <&[u8; CQE_LEN]>::try_from(bytes.get(..CQE_LEN).unwrap_or_default()) {
                let _ = parse_completion(cqe);
            }
        }
    }
}
