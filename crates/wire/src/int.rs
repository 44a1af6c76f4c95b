//! In-band network telemetry (INT) for HPCC-style congestion control: each
//! switch on the path appends what its egress port looked like when the
//! packet left, and the receiver echoes the records to the sender.
//!
//! RoCEv2 has no room for this, and a packet softrnic sends must stay valid
//! RoCEv2 to any peer (docs/ARCHITECTURE.md, "INT"). So telemetry travels
//! only between two ends that both enable it, and only to a UDP port of its
//! own, [`INT_UDP_PORT`]: the UDP payload is this header followed by the
//! RoCEv2 packet unchanged (BTH through ICRC). A switch stamps only packets
//! to that port; packets to 4791 pass byte for byte. The ICRC is the one the
//! packet would carry without INT (the receiver strips the header first).
//!
//! ```text
//!  0       1       2       3
//! +-------+-------+-------+-------+
//! |version| hops  | flags |  rsvd |   hops: records filled so far
//! +-------+-------+-------+-------+   flags: ECHO (bit 0)
//! | record 0 (16 bytes)           |   MAX_HOPS records, always present,
//! | ...                           |   so a switch never grows the packet
//! | record 4                      |
//! +-------------------------------+
//! | RoCEv2: BTH ... ICRC          |
//! ```
//!
//! A receiver answers with the records its request collected, flagged
//! [`FLAG_ECHO`]: a switch stamps only headers without it, so an echo
//! reaches the sender as the forward path left it.
//!
//! A record, all big-endian: the egress link's rate in Mb/s (u32); the
//! switch's clock in nanoseconds when the packet left, modulo 2^32 (u32);
//! bytes the egress port has sent, modulo 2^32 (u32); the egress queue's
//! length in bytes when the packet left (u32). These are the fields of
//! HPCC's INT header (link rate, timestamp, tx bytes, queue length), wider.

use crate::view::{get_u32, put_u32};
use crate::{Error, Result};

/// The UDP destination port of packets that carry INT.
pub const INT_UDP_PORT: u16 = 4792;
/// The version this module writes and accepts.
pub const VERSION: u8 = 1;
/// Hops a packet records at most (HPCC's maxHop is 5 as well).
pub const MAX_HOPS: usize = 5;
/// Bytes of one hop's record.
pub const RECORD_LEN: usize = 16;
/// Bytes of the whole header, records included.
pub const HEADER_LEN: usize = 4 + MAX_HOPS * RECORD_LEN;
/// The header carries records back to the sender: switches leave it alone.
pub const FLAG_ECHO: u8 = 0x01;

typed_view!(
    /// A view over an INT header at the start of a UDP payload.
    Header,
    HEADER_LEN
);

/// What one switch's egress port looked like as the packet left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Hop {
    pub rate_mbps: u32,
    pub timestamp_ns: u32,
    pub tx_bytes: u32,
    pub queue_bytes: u32,
}

/// What a switch did with a packet's INT header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    Recorded,
    /// Every record was already taken: the path is longer than MAX_HOPS.
    Full,
}

impl<T: AsRef<[u8]>> Header<T> {
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn hops(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[2]
    }

    /// An echo going back to the sender, not a path being recorded.
    pub fn is_echo(&self) -> bool {
        self.flags() & FLAG_ECHO != 0
    }

    /// The `i`th record, if it has been filled.
    pub fn hop(&self, i: usize) -> Option<Hop> {
        if i >= usize::from(self.hops()).min(MAX_HOPS) {
            return None;
        }
        let r = &self.buffer.as_ref()[4 + i * RECORD_LEN..][..RECORD_LEN];
        Some(Hop {
            rate_mbps: get_u32(&r[0..]),
            timestamp_ns: get_u32(&r[4..]),
            tx_bytes: get_u32(&r[8..]),
            queue_bytes: get_u32(&r[12..]),
        })
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Appends `hop` as the next record.
    pub fn push(&mut self, hop: Hop) -> Stamp {
        let filled = usize::from(self.hops());
        if filled >= MAX_HOPS {
            return Stamp::Full;
        }
        let r = &mut self.buffer.as_mut()[4 + filled * RECORD_LEN..][..RECORD_LEN];
        put_u32(&mut r[0..], hop.rate_mbps);
        put_u32(&mut r[4..], hop.timestamp_ns);
        put_u32(&mut r[8..], hop.tx_bytes);
        put_u32(&mut r[12..], hop.queue_bytes);
        self.buffer.as_mut()[1] = filled as u8 + 1;
        Stamp::Recorded
    }
}

/// The meaning of an INT header: the hops recorded so far, and whether
/// they are on their way back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Repr {
    pub hops: Vec<Hop>,
    pub echo: bool,
}

impl Repr {
    /// Parses the header at the start of `payload`; the RoCEv2 packet
    /// follows at [`HEADER_LEN`].
    pub fn parse(payload: &[u8]) -> Result<Repr> {
        let header = Header::new_checked(payload)?;
        if header.version() != VERSION {
            return Err(Error::Reserved);
        }
        if usize::from(header.hops()) > MAX_HOPS || header.flags() & !FLAG_ECHO != 0 {
            return Err(Error::Reserved);
        }
        Ok(Repr { hops: (0..MAX_HOPS).map_while(|i| header.hop(i)).collect(), echo: header.is_echo() })
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if self.hops.len() > MAX_HOPS {
            return Err(Error::Reserved);
        }
        let bytes = buf.get_mut(..HEADER_LEN).ok_or(Error::Truncated)?;
        bytes.fill(0);
        bytes[0] = VERSION;
        if self.echo {
            bytes[2] = FLAG_ECHO;
        }
        let mut header = Header::new_unchecked(bytes);
        for hop in &self.hops {
            header.push(*hop);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes() {
        let mut buf = [0xeeu8; HEADER_LEN];
        let hop = Hop { rate_mbps: 100_000, timestamp_ns: 0x0102_0304, tx_bytes: 0xa0b0_c0d0, queue_bytes: 4096 };
        Repr { hops: vec![hop], echo: false }.emit(&mut buf).unwrap();
        let mut expected = [0u8; HEADER_LEN];
        expected[..4].copy_from_slice(&[1, 1, 0, 0]);
        expected[4..20].copy_from_slice(&[
            0x00, 0x01, 0x86, 0xa0, // 100 000 Mb/s
            0x01, 0x02, 0x03, 0x04, // timestamp
            0xa0, 0xb0, 0xc0, 0xd0, // tx bytes
            0x00, 0x00, 0x10, 0x00, // 4096 bytes queued
        ]);
        assert_eq!(buf, expected);
        assert_eq!(Repr::parse(&buf).unwrap().hops, vec![hop]);
    }

    #[test]
    fn an_echo_is_flagged() {
        let mut buf = [0u8; HEADER_LEN];
        let repr = Repr { hops: vec![Hop { queue_bytes: 9, ..Hop::default() }], echo: true };
        repr.emit(&mut buf).unwrap();
        assert_eq!(buf[..4], [1, 1, FLAG_ECHO, 0]);
        assert!(Header::new_checked(&buf[..]).unwrap().is_echo());
        assert_eq!(Repr::parse(&buf).unwrap(), repr);
    }

    #[test]
    fn a_switch_appends_until_the_records_run_out() {
        let mut buf = [0u8; HEADER_LEN];
        Repr::default().emit(&mut buf).unwrap();
        let mut header = Header::new_checked(&mut buf[..]).unwrap();
        for i in 0..MAX_HOPS as u32 {
            assert_eq!(header.push(Hop { queue_bytes: i, ..Hop::default() }), Stamp::Recorded);
        }
        assert_eq!(header.push(Hop::default()), Stamp::Full);
        let parsed = Repr::parse(&buf).unwrap();
        assert_eq!(parsed.hops.iter().map(|h| h.queue_bytes).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn hostile_headers_are_refused() {
        assert_eq!(Repr::parse(&[1, 0, 0]), Err(Error::Truncated));
        let mut buf = [0u8; HEADER_LEN];
        buf[0] = 2;
        assert_eq!(Repr::parse(&buf), Err(Error::Reserved));
        buf[0] = VERSION;
        buf[1] = MAX_HOPS as u8 + 1;
        assert_eq!(Repr::parse(&buf), Err(Error::Reserved));
        buf[1] = 0;
        buf[2] = 0x80;
        assert_eq!(Repr::parse(&buf), Err(Error::Reserved), "an unknown flag");
    }
}
