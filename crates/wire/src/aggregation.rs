//! In-network aggregation: the header of a gradient chunk on its way from a
//! worker to its job's parameter server, summed by the switches it crosses
//! (`softrnic-switch`'s aggregation stage), and of the result the server
//! sends back to every worker.
//!
//! It rides on plain UDP, to a port of its own ([`AGG_UDP_PORT`]), as
//! ATP's does: a switch must consume the chunks it sums, rewrite the one
//! that completes a sum and replicate the server's answer to every worker.
//! Over RoCE (SwitchML's UC WRITE variant) each of those would forge PSNs
//! and ICRCs of QPs the switch does not own; over UDP a chunk is a
//! self-contained datagram, and loss is the workers' concern (they resend).
//!
//! ```text
//!  0       1       2       3
//! +-------+-------+-------+-------+
//! |version| flags |      job      |   flags: RESEND, COLLISION, ACK, ECN,
//! +-------+-------+-------+-------+          OVERFLOW, AGGREGATED, BYPASS
//! |           sequence            |   the chunk's number within the job
//! +-------------------------------+
//! |            bitmap             |   workers whose values are in the sum
//! +-------+-------+---------------+
//! |workers|worker |     slot      |   fan-in; sender (to, in an ACK);
//! +-------+-------+---------------+   the aggregator that held it
//! |     count     |     wait      |   µs the aggregator waited for the
//! +---------------+---------------+   last worker (saturating)
//! | count values, i32 each        |   fixed-point numbers (the sender's
//! | ...                           |   scale), big-endian
//! ```
//!
//! The fields are ATP's (`p4ml`'s bitmap, fan-in, flags, job-and-sequence
//! and aggregator index) with A2TP's collision flag and a value count, so
//! one format carries ATP's 62-value chunks and larger ones up to
//! [`MAX_VALUES`]. The wait is how a job learns it straggles: a switch
//! writes, into a sum it finishes or flushes, how long the aggregator
//! held it from its first packet, and the server copies the longest into
//! its answer.

use crate::view::{get_u16, get_u32, put_u16, put_u32};
use crate::{Error, Result};

/// The UDP port parameter servers listen on, and switches aggregate for.
pub const AGG_UDP_PORT: u16 = 4793;
/// The version this module writes and accepts.
pub const VERSION: u8 = 1;
/// Bytes before the values.
pub const HEADER_LEN: usize = 20;
/// Values one packet carries at most: 1 KiB, so a chunk with its headers
/// fits a 1500-byte Ethernet MTU.
pub const MAX_VALUES: usize = 256;
/// Workers a job has at most: one bit each in the bitmap.
pub const MAX_WORKERS: usize = 32;
/// The slot field of a packet no aggregator held.
pub const NO_SLOT: u16 = 0xffff;
/// The worker field of an ACK for every worker: the switch replicates it.
pub const ALL_WORKERS: u8 = 0xff;

/// A worker sends this chunk again: it is never summed into an aggregator
/// (the first copy may be there already), it goes to the server, and the
/// server answers it even if the chunk is done.
pub const FLAG_RESEND: u8 = 0x01;
/// The chunk's aggregator held another chunk: forwarded unaggregated.
pub const FLAG_COLLISION: u8 = 0x02;
/// The server's answer: the finished sum.
pub const FLAG_ACK: u8 = 0x04;
/// A packet of the chunk arrived marked CE (set by the server in its ACK).
pub const FLAG_ECN: u8 = 0x08;
/// A sum saturated at the limits of an i32.
pub const FLAG_OVERFLOW: u8 = 0x10;
/// The values are the sum of the bitmap's workers, made by a switch.
pub const FLAG_AGGREGATED: u8 = 0x20;
/// The worker asks switches not to aggregate (the parameter-server-only
/// baseline).
pub const FLAG_BYPASS: u8 = 0x40;
const KNOWN_FLAGS: u8 = 0x7f;

typed_view!(
    /// A view over an aggregation packet: the header and its values.
    Packet,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags() & flag != 0
    }

    pub fn job(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[2..])
    }

    pub fn sequence(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[4..])
    }

    pub fn bitmap(&self) -> u32 {
        get_u32(&self.buffer.as_ref()[8..])
    }

    pub fn workers(&self) -> u8 {
        self.buffer.as_ref()[12]
    }

    pub fn worker(&self) -> u8 {
        self.buffer.as_ref()[13]
    }

    pub fn slot(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[14..])
    }

    pub fn count(&self) -> usize {
        usize::from(get_u16(&self.buffer.as_ref()[16..]))
    }

    pub fn wait_us(&self) -> u16 {
        get_u16(&self.buffer.as_ref()[18..])
    }

    /// The `i`th value; `i` below [`count`](Self::count) of a checked
    /// packet.
    pub fn value(&self, i: usize) -> i32 {
        get_u32(&self.buffer.as_ref()[HEADER_LEN + 4 * i..]) as i32
    }

    /// The values, in order (of a checked packet).
    pub fn values(&self) -> impl Iterator<Item = i32> + '_ {
        let bytes = &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + 4 * self.count()];
        bytes.chunks_exact(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Whether the header is one this module writes and the buffer holds
    /// every value it counts: what [`Repr::parse`] checks, without
    /// copying the values.
    pub fn check(&self) -> Result<()> {
        self.check_len()?;
        if self.version() != VERSION || self.flags() & !KNOWN_FLAGS != 0 {
            return Err(Error::Reserved);
        }
        let workers = usize::from(self.workers());
        if workers == 0 || workers > MAX_WORKERS || self.count() > MAX_VALUES {
            return Err(Error::Reserved);
        }
        if self.worker() != ALL_WORKERS && usize::from(self.worker()) >= workers {
            return Err(Error::Reserved);
        }
        if self.buffer.as_ref().len() < HEADER_LEN + 4 * self.count() {
            return Err(Error::Truncated);
        }
        Ok(())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[1] = flags;
    }

    pub fn set_bitmap(&mut self, bitmap: u32) {
        put_u32(&mut self.buffer.as_mut()[8..], bitmap);
    }

    pub fn set_slot(&mut self, slot: u16) {
        put_u16(&mut self.buffer.as_mut()[14..], slot);
    }

    pub fn set_wait_us(&mut self, wait: u16) {
        put_u16(&mut self.buffer.as_mut()[18..], wait);
    }

    pub fn set_count(&mut self, count: usize) {
        put_u16(&mut self.buffer.as_mut()[16..], count as u16);
    }

    pub fn set_value(&mut self, i: usize, value: i32) {
        put_u32(&mut self.buffer.as_mut()[HEADER_LEN + 4 * i..], value as u32);
    }

    /// Overwrites the first `values.len()` values.
    pub fn set_values(&mut self, values: &[i32]) {
        let bytes = &mut self.buffer.as_mut()[HEADER_LEN..HEADER_LEN + 4 * values.len()];
        for (b, v) in bytes.chunks_exact_mut(4).zip(values) {
            b.copy_from_slice(&v.to_be_bytes());
        }
    }
}

/// The meaning of an aggregation packet.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Repr {
    pub flags: u8,
    pub job: u16,
    pub sequence: u32,
    pub bitmap: u32,
    pub workers: u8,
    pub worker: u8,
    pub slot: u16,
    pub wait_us: u16,
    pub values: Vec<i32>,
}

impl Repr {
    pub fn parse(bytes: &[u8]) -> Result<Repr> {
        let packet = Packet::new_checked(bytes)?;
        packet.check()?;
        Ok(Repr {
            flags: packet.flags(),
            job: packet.job(),
            sequence: packet.sequence(),
            bitmap: packet.bitmap(),
            workers: packet.workers(),
            worker: packet.worker(),
            slot: packet.slot(),
            wait_us: packet.wait_us(),
            values: packet.values().collect(),
        })
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn len(&self) -> usize {
        HEADER_LEN + 4 * self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Writes the packet into the first [`len`](Self::len) bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.values.len() > MAX_VALUES || self.flags & !KNOWN_FLAGS != 0 {
            return Err(Error::Reserved);
        }
        let bytes = buf.get_mut(..self.len()).ok_or(Error::Truncated)?;
        bytes[0] = VERSION;
        bytes[1] = self.flags;
        put_u16(&mut bytes[2..], self.job);
        put_u32(&mut bytes[4..], self.sequence);
        put_u32(&mut bytes[8..], self.bitmap);
        bytes[12] = self.workers;
        bytes[13] = self.worker;
        put_u16(&mut bytes[14..], self.slot);
        put_u16(&mut bytes[16..], self.values.len() as u16);
        put_u16(&mut bytes[18..], self.wait_us);
        for (i, v) in self.values.iter().enumerate() {
            put_u32(&mut bytes[HEADER_LEN + 4 * i..], *v as u32);
        }
        Ok(())
    }

    /// Writes the header (its `values` left out) and then `values` into
    /// `buf`, resized to fit: a sender's chunk without copying its values
    /// into a `Repr` first.
    pub fn emit_with_values(&self, values: &[i32], buf: &mut Vec<u8>) -> Result<()> {
        if values.len() > MAX_VALUES || !self.values.is_empty() {
            return Err(Error::Reserved);
        }
        buf.clear();
        buf.resize(HEADER_LEN + 4 * values.len(), 0);
        self.emit(buf)?;
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_count(values.len());
        packet.set_values(values);
        Ok(())
    }

    /// The packet as a new buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut buf = vec![0; self.len()];
        self.emit(&mut buf).expect("sized to fit");
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes() {
        let repr = Repr {
            flags: FLAG_RESEND | FLAG_ECN,
            job: 7,
            sequence: 0x0102_0304,
            bitmap: 0b100,
            workers: 4,
            worker: 2,
            slot: NO_SLOT,
            wait_us: 300,
            values: vec![1, -2],
        };
        let bytes = repr.to_bytes();
        #[rustfmt::skip]
        let expected = [
            1, 0x09, 0x00, 0x07,        // version, RESEND|ECN, job 7
            0x01, 0x02, 0x03, 0x04,     // sequence
            0x00, 0x00, 0x00, 0x04,     // bitmap: worker 2
            4, 2, 0xff, 0xff,           // 4 workers, from worker 2, no slot
            0x00, 0x02, 0x01, 0x2c,     // two values, waited 300 µs
            0x00, 0x00, 0x00, 0x01,     // 1
            0xff, 0xff, 0xff, 0xfe,     // -2
        ];
        assert_eq!(bytes, expected);
        assert_eq!(Repr::parse(&bytes).unwrap(), repr);
    }

    #[test]
    fn values_written_beside_the_header_make_the_same_packet() {
        let repr = Repr { job: 3, sequence: 9, workers: 2, values: vec![7, -8, 9], ..Repr::default() };
        let mut buf = vec![0xee; 5];
        Repr { values: Vec::new(), ..repr.clone() }.emit_with_values(&repr.values, &mut buf).unwrap();
        assert_eq!(buf, repr.to_bytes());
    }

    #[test]
    fn a_switch_rewrites_in_place() {
        let mut bytes = Repr { workers: 2, values: vec![5, 6], ..Repr::default() }.to_bytes();
        let mut packet = Packet::new_checked(&mut bytes[..]).unwrap();
        packet.set_value(1, -60);
        packet.set_bitmap(0b11);
        packet.set_slot(9);
        packet.set_flags(FLAG_AGGREGATED);
        let repr = Repr::parse(&bytes).unwrap();
        assert_eq!((repr.values, repr.bitmap, repr.slot, repr.flags), (vec![5, -60], 0b11, 9, FLAG_AGGREGATED));
    }

    #[test]
    fn hostile_headers_are_refused() {
        let good = Repr { workers: 4, worker: 3, values: vec![1; 3], ..Repr::default() }.to_bytes();
        assert!(Repr::parse(&good).is_ok());
        assert_eq!(Repr::parse(&good[..good.len() - 1]), Err(Error::Truncated), "a value cut short");
        assert_eq!(Repr::parse(&good[..10]), Err(Error::Truncated));
        let bad = |at: usize, byte: u8| {
            let mut b = good.clone();
            b[at] = byte;
            Repr::parse(&b)
        };
        assert_eq!(bad(0, 2), Err(Error::Reserved), "version");
        assert_eq!(bad(1, 0x80), Err(Error::Reserved), "an unknown flag");
        assert_eq!(bad(12, 0), Err(Error::Reserved), "no workers");
        assert_eq!(bad(12, 33), Err(Error::Reserved), "more workers than bits");
        assert_eq!(bad(13, 4), Err(Error::Reserved), "a worker beyond the fan-in");
        assert!(bad(13, ALL_WORKERS).is_ok(), "an ACK for all");
        assert_eq!(bad(16, 1), Err(Error::Reserved), "more values than a packet holds");
    }
}
