//! In-band telemetry on the UDP engine: a packet whose QP collects INT (or
//! echoes it) leaves for the peer's UDP port 4792 with the INT header in
//! front of the RoCEv2 packet (`softrnic_wire::int`); what arrives on 4792
//! is unwrapped before the transport sees it, its records handed over
//! beside the bytes. Packets that carry no INT stay plain RoCEv2 to 4791,
//! byte for byte.

use std::net::SocketAddr;

use softrnic_transport::{IntMark, IntRecords};
use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::int::{self, INT_UDP_PORT};

/// Where the RoCEv2 packet starts in the UDP payload of a datagram to
/// `port`: past the INT header on the INT port.
pub fn roce_offset(port: u16) -> usize {
    if port == INT_UDP_PORT { int::HEADER_LEN } else { 0 }
}

/// The RoCEv2 packet of a datagram to `dst` (empty if it is too short).
pub fn roce_packet(dst: SocketAddr, datagram: &[u8]) -> &[u8] {
    datagram.get(roce_offset(dst.port())..).unwrap_or_default()
}

/// Wraps the `len`-byte RoCEv2 packet at the start of `buf` for `mark`:
/// unchanged for none, else moved behind an INT header (empty to collect
/// the path, the records with the echo flag to answer). Returns the UDP
/// port to send it to and its new length. `buf` must have
/// [`int::HEADER_LEN`] bytes to spare.
pub fn wrap(mark: IntMark, buf: &mut [u8], len: usize) -> (u16, usize) {
    let repr = match mark {
        IntMark::None => return (ROCEV2_UDP_PORT, len),
        IntMark::Collect => int::Repr::default(),
        IntMark::Echo(records) => int::Repr { hops: records.to_wire().collect(), echo: true },
    };
    buf.copy_within(..len, int::HEADER_LEN);
    repr.emit(buf).expect("at most MAX_HOPS records, and room for the header");
    (INT_UDP_PORT, int::HEADER_LEN + len)
}

/// The records and the RoCEv2 packet of a datagram that arrived on the
/// INT port; `None` if its header is not one (the datagram is dropped).
pub fn unwrap(datagram: &[u8]) -> Option<(IntRecords, &[u8])> {
    let repr = int::Repr::parse(datagram).ok()?;
    Some((IntRecords::from_wire(repr.hops), &datagram[int::HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_packets_are_left_alone() {
        let mut buf = [7u8; 200];
        assert_eq!(wrap(IntMark::None, &mut buf, 100), (ROCEV2_UDP_PORT, 100));
        assert_eq!(buf, [7u8; 200]);
    }

    #[test]
    fn collected_and_echoed_records_round_trip() {
        let packet: Vec<u8> = (0..40).collect();
        let mut buf = vec![0u8; 40 + int::HEADER_LEN];
        buf[..40].copy_from_slice(&packet);
        let (port, len) = wrap(IntMark::Collect, &mut buf, 40);
        assert_eq!((port, len), (INT_UDP_PORT, 40 + int::HEADER_LEN));
        let dst = SocketAddr::new("127.0.0.2".parse().unwrap(), port);
        assert_eq!(roce_packet(dst, &buf[..len]), &packet[..]);
        let (records, inner) = unwrap(&buf[..len]).unwrap();
        assert_eq!((records.hops().len(), inner), (0, &packet[..]));

        let hop = int::Hop { rate_mbps: 25_000, timestamp_ns: 1, tx_bytes: 2, queue_bytes: 3 };
        buf[..40].copy_from_slice(&packet);
        let (_, len) = wrap(IntMark::Echo(IntRecords::from_wire([hop])), &mut buf, 40);
        assert!(int::Header::new_checked(&buf[..len]).unwrap().is_echo(), "switches leave an echo alone");
        let (records, inner) = unwrap(&buf[..len]).unwrap();
        assert_eq!((records.to_wire().collect::<Vec<_>>(), inner), (vec![hop], &packet[..]));
    }

    #[test]
    fn what_is_not_an_int_header_is_dropped() {
        assert!(unwrap(&[1, 0, 0]).is_none());
        assert!(unwrap(&[9u8; 200]).is_none());
    }
}
