//! In-band telemetry on the UDP engine: a packet whose QP collects INT (or
//! echoes it) leaves for the peer's UDP port 4792 with the INT header in
//! front of the RoCEv2 packet (`softrnic_wire::int`); what arrives on 4792
//! is unwrapped before the transport sees it, its records handed over
//! beside the bytes. Packets that carry no INT stay plain RoCEv2 to 4791,
//! byte for byte.

use std::net::SocketAddr;
use std::ops::Range;

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

/// Room a send buffer keeps in front of the RoCEv2 packet, as a driver
/// keeps headroom for headers: an INT header is written there rather than
/// the packet moved.
pub const HEADROOM: usize = int::HEADER_LEN;

/// Wraps the `len`-byte RoCEv2 packet written at `frame[HEADROOM..]` for
/// `mark`: as it is for none, else behind an INT header in the headroom
/// (empty to collect the path, the records with the echo flag to answer).
/// Returns the UDP port to send it to and where the datagram lies.
pub fn wrap(mark: IntMark, frame: &mut [u8], len: usize) -> (u16, Range<usize>) {
    let repr = match mark {
        IntMark::None => return (ROCEV2_UDP_PORT, HEADROOM..HEADROOM + len),
        IntMark::Collect => int::Repr::default(),
        IntMark::Echo(records) => int::Repr { hops: records.to_wire().collect(), echo: true },
    };
    repr.emit(&mut frame[..HEADROOM]).expect("at most MAX_HOPS records, and the header fits the headroom");
    (INT_UDP_PORT, 0..HEADROOM + len)
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
        let mut frame = [7u8; HEADROOM + 200];
        assert_eq!(wrap(IntMark::None, &mut frame, 100), (ROCEV2_UDP_PORT, HEADROOM..HEADROOM + 100));
        assert_eq!(frame, [7u8; HEADROOM + 200]);
    }

    #[test]
    fn collected_and_echoed_records_round_trip() {
        let packet: Vec<u8> = (0..40).collect();
        let mut frame = vec![0u8; HEADROOM + 40];
        frame[HEADROOM..].copy_from_slice(&packet);
        let (port, at) = wrap(IntMark::Collect, &mut frame, 40);
        assert_eq!((port, at.clone()), (INT_UDP_PORT, 0..HEADROOM + 40));
        let dst = SocketAddr::new("127.0.0.2".parse().unwrap(), port);
        assert_eq!(roce_packet(dst, &frame[at.clone()]), &packet[..]);
        let (records, inner) = unwrap(&frame[at]).unwrap();
        assert_eq!((records.hops().len(), inner), (0, &packet[..]));

        let hop = int::Hop { rate_mbps: 25_000, timestamp_ns: 1, tx_bytes: 2, queue_bytes: 3 };
        let (_, at) = wrap(IntMark::Echo(IntRecords::from_wire([hop])), &mut frame, 40);
        assert!(int::Header::new_checked(&frame[at.clone()]).unwrap().is_echo(), "switches leave an echo alone");
        let (records, inner) = unwrap(&frame[at]).unwrap();
        assert_eq!((records.to_wire().collect::<Vec<_>>(), inner), (vec![hop], &packet[..]));
    }

    #[test]
    fn what_is_not_an_int_header_is_dropped() {
        assert!(unwrap(&[1, 0, 0]).is_none());
        assert!(unwrap(&[9u8; 200]).is_none());
    }
}
