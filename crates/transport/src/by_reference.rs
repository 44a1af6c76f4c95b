//! Payloads by reference: one copy between devices on one host.
//!
//! On the same-host wire, to a peer that sees this device's processes
//! ([`crate::Egress::SameHost`]), a packet whose payload lies in memory
//! the peer can map (a memfd the engine registered the region on,
//! [`crate::memory::SharedFile`]) carries, in place of
//! the payload, where it lies: a list of file ranges. The receiving
//! device maps the files once and copies each payload from there straight
//! into the destination, after the same checks as any payload (the rkey,
//! the PD, the bounds, the receive's length): one copy, as a NIC's DMA
//! engine reads the source and writes the destination, where the bytes
//! otherwise cross the ring (four copies: gathered, into the ring, out of
//! it, placed). Everything else about the packet (its headers, PSN, ACK,
//! ordering, errors) is unchanged, and so is every other packet.
//!
//! On a go-back-N RC connection one packet by reference may carry several
//! MTUs' worth of payload, up to [`MAX_SPAN_BYTES`], where the MTU-sized
//! packets would have left back to back: it stands for as many PSNs (the
//! responder moves its expected PSN past them all and acknowledges the
//! last; a READ response is counted as that many responses), with the
//! opcode of the run (FIRST, MIDDLE, LAST or ONLY). Its length says how
//! many: a whole number of MTUs, or for the last packet of a message what
//! is left. The window still bounds it, and selective repeat, UC and
//! payloads in the datagram keep a packet per PSN.
//!
//! The reference is read when the packet is placed, not when it was built:
//! a retransmission reads the source again, and a requester that changes
//! its buffer before the WRITE completes sends whichever bytes are there,
//! as with a NIC that DMAs the source late.
//!
//! ```text
//!  datagram | BTH | extension headers | reference ... | "REF1" |
//!  reference| pid u32 | fd i32 | inode u64 | offset u64 | len u32 | 0 u32 |
//! ```
//!
//! A same-host datagram carries no ICRC; its last four bytes say how its
//! payload travels: zeros, in the datagram; [`MARK`], by reference. Words
//! are in the host's byte order: both ends share the host. A reference the
//! receiver cannot resolve (the file gone, the range outside it, not a
//! memfd sealed against shrinking) drops the packet, counted in
//! `rx_unresolved_references`; the requester retransmits, and a source
//! that never comes back ends in the retry error a dead link gives. (A
//! deregistered region's memory stays open to peers a moment, so that
//! the packets already on their way resolve: the engine's `Lingering`.)

use std::sync::Arc;

use smallvec::SmallVec;
use softrnic_account::{self as account, Cost};
use softrnic_wire::packet::{Headers, PacketRepr};

use crate::memory::{
    AccessFault, DmaBuffer, FileRange, FileRanges, MemoryTable, MemoryView, PdId, PeerMemory, SharedFile, shared_ranges,
};
use crate::work_request::Sge;

/// The last four bytes of a same-host datagram whose payload is by
/// reference (in place of the ICRC, which the same-host path omits).
pub const MARK: [u8; 4] = *b"REF1";

/// Bytes of one reference.
pub const REFERENCE_LEN: usize = 32;

/// Payloads shorter than this travel in the datagram, as a NIC carries
/// small payloads inline with its descriptor: a 32-byte reference saves
/// little on them, and costs the receiver a lookup. (64 B latency and
/// message rate measured the same either way, within this machine's
/// noise.)
pub const MIN_BY_REFERENCE: usize = 256;

/// The most references one packet carries; a payload spread over more
/// files (an SGE list of many small regions) travels in the datagram.
pub const MAX_REFERENCES: usize = 8;

/// Bytes of references one packet carries at most.
pub const MAX_REFERENCES_LEN: usize = MAX_REFERENCES * REFERENCE_LEN;

/// The most payload one packet by reference carries on a go-back-N RC
/// connection: the MTU-sized packets of a message that would leave back
/// to back leave as one, which stands for as many PSNs (segmentation
/// offload, as Linux hands a 64 KiB TCP segment over loopback whole and
/// cuts it only for a wire). Their headers, PSNs, ACKs and checks are
/// those of the packets it stands for; what it saves is the per-packet
/// work between the rings, which cost a 64 KiB WRITE 16 times what its
/// one copy did.
pub const MAX_SPAN_BYTES: usize = 64 * 1024;

/// MTUs one packet by reference may carry ([`MAX_SPAN_BYTES`]).
pub fn max_span(mtu: u32) -> u32 {
    (MAX_SPAN_BYTES / mtu.max(1) as usize).max(1) as u32
}

/// PSNs a payload of `len` bytes stands for at `mtu`: at least one.
pub fn span(len: usize, mtu: u32) -> u32 {
    len.div_ceil(mtu.max(1) as usize).max(1) as u32
}

/// Writes `ranges` as references into `out` (at least
/// `ranges.len() * REFERENCE_LEN` bytes); returns the bytes written.
pub fn emit(ranges: &[FileRange], out: &mut [u8]) -> usize {
    for (range, slot) in ranges.iter().zip(out.chunks_exact_mut(REFERENCE_LEN)) {
        slot[0..4].copy_from_slice(&range.file.pid.to_ne_bytes());
        slot[4..8].copy_from_slice(&range.file.fd.to_ne_bytes());
        slot[8..16].copy_from_slice(&range.file.inode.to_ne_bytes());
        slot[16..24].copy_from_slice(&range.offset.to_ne_bytes());
        slot[24..28].copy_from_slice(&range.len.to_ne_bytes());
        slot[28..32].fill(0);
    }
    ranges.len() * REFERENCE_LEN
}

/// Writes references to message bytes `[offset, offset + len)` of a
/// gather list into `out`, if every byte lies in shared memory: as many
/// of them as [`MAX_REFERENCES`] reach, cut to whole `unit`s (MTUs) unless
/// they reach the end, and at least [`MIN_BY_REFERENCE`]. Returns the
/// bytes written and the payload they cover, or `None` (the payload goes
/// in the datagram). One walk of the list, whatever the answer: the
/// requester asks for the widest packet it may send and takes what fits.
pub(crate) fn refer_to_gather(
    table: &MemoryTable,
    pd: PdId,
    sges: &[Sge],
    offset: u64,
    len: usize,
    unit: usize,
    out: &mut [u8],
) -> Result<Option<(usize, usize)>, AccessFault> {
    let mut ranges = FileRanges::new();
    if len < MIN_BY_REFERENCE || !shared_ranges(table, pd, sges, offset, len, &mut ranges)? {
        return Ok(None);
    }
    Ok(refer_up_to(&mut ranges, len, unit, out))
}

/// As [`refer_to_gather`], for the bytes of one checked view (a READ
/// response's).
pub(crate) fn refer_to_view(view: &MemoryView, unit: usize, out: &mut [u8]) -> Option<(usize, usize)> {
    let mut ranges = FileRanges::new();
    if view.len() < MIN_BY_REFERENCE || !view.shared_ranges(&mut ranges) {
        return None;
    }
    refer_up_to(&mut ranges, view.len(), unit, out)
}

/// Writes the references to the first bytes of a `len`-byte payload that
/// `ranges` hold: as many as [`MAX_REFERENCES`] reach, cut to whole
/// `unit`s unless they reach the end. The bytes written and the payload
/// they cover, or `None` if that is less than [`MIN_BY_REFERENCE`].
fn refer_up_to(ranges: &mut FileRanges, len: usize, unit: usize, out: &mut [u8]) -> Option<(usize, usize)> {
    ranges.truncate(MAX_REFERENCES.min(out.len() / REFERENCE_LEN));
    let reached: usize = ranges.iter().map(|range| range.len as usize).sum();
    let covered = if reached >= len { len } else { reached - reached % unit.max(1) };
    if covered < MIN_BY_REFERENCE {
        return None;
    }
    let mut left = covered;
    ranges.retain(|range| {
        let keep = left > 0;
        range.len = range.len.min(u32::try_from(left).unwrap_or(u32::MAX));
        left -= range.len as usize;
        keep
    });
    Some((emit(ranges, out), covered))
}

/// Reads the references a payload holds: `None` if it is not a whole
/// number of them (between 1 and [`MAX_REFERENCES`]), or one is malformed.
pub fn parse(payload: &[u8]) -> Option<SmallVec<[FileRange; 4]>> {
    let count = payload.len() / REFERENCE_LEN;
    if !payload.len().is_multiple_of(REFERENCE_LEN) || !(1..=MAX_REFERENCES).contains(&count) {
        return None;
    }
    let word = |slot: &[u8], at: usize| u64::from_ne_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
    let half = |slot: &[u8], at: usize| u32::from_ne_bytes(slot[at..at + 4].try_into().expect("4 bytes"));
    payload
        .chunks_exact(REFERENCE_LEN)
        .map(|slot| {
            let range = FileRange {
                file: SharedFile { pid: half(slot, 0), fd: half(slot, 4) as i32, inode: word(slot, 8) },
                offset: word(slot, 16),
                len: half(slot, 24),
            };
            (half(slot, 28) == 0 && range.len > 0).then_some(range)
        })
        .collect()
}

/// Bytes of a peer's mapped file: what a reference resolved to.
#[derive(Debug, Clone)]
pub struct Mapped {
    buffer: Arc<DmaBuffer>,
    offset: usize,
    len: usize,
}

/// The mapped bytes `ranges` name, in order, through `peers`; `None` if
/// any cannot be reached or lies outside its file.
pub fn resolve(ranges: &[FileRange], peers: &mut dyn PeerMemory) -> Option<SmallVec<[Mapped; 4]>> {
    ranges
        .iter()
        .map(|range| {
            let buffer = peers.map(&range.file)?;
            let offset = usize::try_from(range.offset).ok()?;
            let len = range.len as usize;
            (offset.checked_add(len)? <= buffer.len()).then_some(Mapped { buffer, offset, len })
        })
        .collect()
}

/// A packet as its QP takes it: the parsed headers, and the payload from
/// wherever it is.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    pub headers: Headers,
    pub body: Body<'a>,
}

impl<'a> Packet<'a> {
    /// A packet whose payload is in the datagram.
    pub fn inline(repr: &PacketRepr<'a>) -> Packet<'a> {
        Packet { headers: repr.headers, body: Body::Bytes(repr.payload) }
    }
}

/// An arriving packet's payload as its QP places it: the datagram's own
/// bytes, or a peer's memory that a reference named.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    Bytes(&'a [u8]),
    Mapped(&'a [Mapped]),
    /// A payload that came by reference, read into bytes while its packet
    /// was held for receives ([`crate::fetch_on_demand`]): placed as
    /// bytes, judged as sent by reference (it may span several MTUs).
    Held(&'a [u8]),
}

impl Body<'_> {
    pub fn len(&self) -> usize {
        match self {
            Body::Bytes(bytes) | Body::Held(bytes) => bytes.len(),
            Body::Mapped(mapped) => mapped.iter().map(|m| m.len).sum(),
        }
    }

    /// Whether the payload was sent by reference (and so may stand for
    /// several MTUs, [`MAX_SPAN_BYTES`]).
    pub fn by_reference(&self) -> bool {
        matches!(self, Body::Mapped(_) | Body::Held(_))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The eight bytes an ATOMIC WRITE carries: only ever in the datagram.
    pub fn word(&self) -> Option<[u8; 8]> {
        match self {
            Body::Bytes(bytes) => (*bytes).try_into().ok(),
            Body::Mapped(_) | Body::Held(_) => None,
        }
    }

    /// Copies bytes `[from, from + view.len())` of the payload into
    /// `view`: one copy, from wherever the payload is.
    pub fn place(&self, from: usize, view: &MemoryView) {
        match self {
            Body::Bytes(bytes) | Body::Held(bytes) => view.write(&bytes[from..from + view.len()]),
            Body::Mapped(mapped) => {
                each_stretch(mapped, from, view.len(), |m, offset, at, n| view.part(at, n).copy_from(&m.buffer, offset))
            }
        }
    }

    /// Copies bytes `[from, from + dst.len())` of the payload into `dst`
    /// (a datagram rebuilt to be held).
    pub fn read(&self, from: usize, dst: &mut [u8]) {
        match self {
            Body::Bytes(bytes) | Body::Held(bytes) => dst.copy_from_slice(&bytes[from..from + dst.len()]),
            Body::Mapped(mapped) => each_stretch(mapped, from, dst.len(), |m, offset, at, n| {
                m.buffer.read(offset, &mut dst[at..at + n]);
                account::add(Cost::BytesCopied, n as u64);
            }),
        }
    }
}

/// Calls `copy(stretch, offset in its buffer, offset in the range, bytes)`
/// for each piece of the mapped payload that covers bytes
/// `[from, from + len)`, in order.
fn each_stretch(mapped: &[Mapped], from: usize, len: usize, mut copy: impl FnMut(&Mapped, usize, usize, usize)) {
    let (mut skip, mut done) = (from, 0);
    for m in mapped {
        if done == len {
            break;
        }
        if skip >= m.len {
            skip -= m.len;
            continue;
        }
        let n = (m.len - skip).min(len - done);
        copy(m, m.offset + skip, done, n);
        done += n;
        skip = 0;
    }
    assert_eq!(done, len, "a range past the payload's end");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(fd: i32, offset: u64, len: u32) -> FileRange {
        FileRange { file: SharedFile { pid: 4242, fd, inode: 9_000_000_001 }, offset, len }
    }

    #[test]
    fn references_round_trip_through_their_bytes() {
        let ranges = [range(7, 4096, 1000), range(8, 0, 3096)];
        let mut out = [0xAAu8; 2 * REFERENCE_LEN];
        assert_eq!(emit(&ranges, &mut out), 64);
        let mut expected = Vec::new();
        expected.extend_from_slice(&4242u32.to_ne_bytes());
        expected.extend_from_slice(&7i32.to_ne_bytes());
        expected.extend_from_slice(&9_000_000_001u64.to_ne_bytes());
        expected.extend_from_slice(&4096u64.to_ne_bytes());
        expected.extend_from_slice(&1000u32.to_ne_bytes());
        expected.extend_from_slice(&[0; 4]);
        assert_eq!(&out[..32], &expected[..]);
        assert_eq!(parse(&out).unwrap().as_slice(), &ranges);
    }

    /// A payload spread over more files than a packet names is referred
    /// to as far as the references reach, in whole units; one they reach
    /// whole keeps its ragged end; less than the minimum goes inline.
    #[test]
    fn references_reach_as_far_as_whole_units_allow() {
        let mut out = [0u8; MAX_REFERENCES_LEN];
        // Ten pieces of 1000 bytes in ten files, units of 4096: eight
        // reach 8000 bytes, of which one unit is whole.
        let mut ranges: FileRanges = (0..10).map(|fd| range(fd, 0, 1000)).collect();
        assert_eq!(refer_up_to(&mut ranges, 10_000, 4096, &mut out), Some((5 * REFERENCE_LEN, 4096)));
        let cut = parse(&out[..5 * REFERENCE_LEN]).unwrap();
        assert_eq!(cut.iter().map(|r| r.len).collect::<Vec<_>>(), [1000, 1000, 1000, 1000, 96]);
        // Reached whole: every byte, the last unit short.
        let mut ranges: FileRanges = (0..2).map(|fd| range(fd, 0, 3000)).collect();
        assert_eq!(refer_up_to(&mut ranges, 6000, 4096, &mut out), Some((2 * REFERENCE_LEN, 6000)));
        // Nine pieces of 100 bytes with units of 1024: not one unit.
        let mut ranges: FileRanges = (0..9).map(|fd| range(fd, 0, 100)).collect();
        assert_eq!(refer_up_to(&mut ranges, 900, 1024, &mut out), None);
    }

    #[test]
    fn malformed_references_are_refused() {
        let mut out = [0u8; REFERENCE_LEN];
        emit(&[range(7, 0, 10)], &mut out);
        assert!(parse(&out[..31]).is_none(), "not a whole reference");
        assert!(parse(&[]).is_none(), "none at all");
        assert!(parse(&[0u8; REFERENCE_LEN * (MAX_REFERENCES + 1)]).is_none(), "too many");
        let mut reserved = out;
        reserved[31] = 1;
        assert!(parse(&reserved).is_none(), "a reserved word set");
        emit(&[range(7, 0, 0)], &mut out);
        assert!(parse(&out).is_none(), "an empty range");
    }

    struct OneFile(Arc<DmaBuffer>);

    impl PeerMemory for OneFile {
        fn map(&mut self, file: &SharedFile) -> Option<Arc<DmaBuffer>> {
            (file.fd == 7).then(|| self.0.clone())
        }
    }

    #[test]
    fn a_body_by_reference_places_and_reads_like_bytes() {
        let file = Arc::new(DmaBuffer::from_bytes(&(0..=255u8).collect::<Vec<_>>()));
        let mut peers = OneFile(file);
        let mapped = resolve(&[range(7, 10, 5), range(7, 100, 5)], &mut peers).unwrap();
        let body = Body::Mapped(&mapped);
        assert_eq!(body.len(), 10);
        let mut out = [0u8; 6];
        body.read(2, &mut out);
        assert_eq!(out, [12, 13, 14, 100, 101, 102]);
        assert!(body.word().is_none());
        assert!(resolve(&[range(8, 0, 5)], &mut peers).is_none(), "a file it cannot map");
        assert!(resolve(&[range(7, 250, 10)], &mut peers).is_none(), "a range past the file's end");
        assert!(resolve(&[range(7, u64::MAX, 10)], &mut peers).is_none(), "a range that wraps");
    }

    /// A payload that lies in two stretches of a peer's file, scattered
    /// over two elements of a receive: one copy each piece, every byte
    /// where a payload in the datagram would have put it.
    #[test]
    fn a_body_by_reference_scatters_across_elements() {
        use crate::memory::{Access, PdId, Registration, scatter};
        use crate::work_request::Sge;
        let file = Arc::new(DmaBuffer::from_bytes(&(0..=255u8).collect::<Vec<_>>()));
        let mapped = resolve(&[range(7, 16, 6), range(7, 200, 6)], &mut OneFile(file)).unwrap();
        let mut table = MemoryTable::new();
        let pd = PdId(0);
        let dst = Arc::new(DmaBuffer::new(32));
        let registration =
            Registration { pd, buffer: dst.clone(), offset: 0, len: 32, iova: 1000, access: Access::LOCAL_WRITE };
        let keys = table.register(registration, &mut crate::entropy::Entropy::from_u64(2).into_draw()).unwrap();
        let sges = [Sge { addr: 1000, length: 5, lkey: keys.lkey }, Sge { addr: 1020, length: 10, lkey: keys.lkey }];
        scatter(&table, pd, &sges, 2, Body::Mapped(&mapped)).unwrap();
        let out = dst.to_vec();
        assert_eq!(&out[2..5], &[16, 17, 18], "the first element, after the offset");
        assert_eq!(&out[20..29], &[19, 20, 21, 200, 201, 202, 203, 204, 205], "the second, across both stretches");
        assert!(out[..2].iter().chain(&out[5..20]).chain(&out[29..]).all(|&b| b == 0), "nothing else");
    }
}
