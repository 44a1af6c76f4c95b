//! An Ethernet frame as the switch pipeline sees it (IPv4 only: the lab
//! gives hosts IPv4 addresses), and the ARP answers the switch gives in
//! place of a broadcast domain.
//!
//! Rates and buffers count the frame's bytes, Ethernet header included,
//! without preamble and FCS (a veth has neither).

use std::net::{IpAddr, Ipv4Addr};

use etherparse::{EtherType, Ethernet2HeaderSlice, IpNumber, Ipv4HeaderSlice, UdpHeaderSlice};
use softrnic_switch::frame::is_control_opcode;
use softrnic_switch::{Classified, Ecn, Frame};
use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::aggregation;
use softrnic_wire::int::{self, Hop, Stamp};

const ETH_HEADER: usize = 14;
const UDP_HEADER: usize = 8;

/// A frame owned by the switch while it waits in a queue.
#[derive(Debug, Clone)]
pub struct EthFrame {
    pub bytes: Vec<u8>,
}

impl EthFrame {
    fn ipv4(&self) -> Option<Ipv4HeaderSlice<'_>> {
        let eth = Ethernet2HeaderSlice::from_slice(&self.bytes).ok()?;
        if eth.ether_type() != EtherType::IPV4 {
            return None;
        }
        Ipv4HeaderSlice::from_slice(&self.bytes[ETH_HEADER..]).ok()
    }

    /// Where the UDP header starts, and the header, for a UDP packet.
    fn udp(&self) -> Option<(usize, UdpHeaderSlice<'_>)> {
        let ip = self.ipv4()?;
        if ip.protocol() != IpNumber::UDP || ip.is_fragmenting_payload() {
            return None;
        }
        let at = ETH_HEADER + ip.slice().len();
        Some((at, UdpHeaderSlice::from_slice(&self.bytes[at..]).ok()?))
    }

    pub fn source_ipv4(&self) -> Option<Ipv4Addr> {
        Some(self.ipv4()?.source_addr())
    }

    /// Sets the destination and source MAC addresses (leaving by a port).
    pub fn set_macs(&mut self, dst: [u8; 6], src: [u8; 6]) {
        if self.bytes.len() >= ETH_HEADER {
            self.bytes[..6].copy_from_slice(&dst);
            self.bytes[6..12].copy_from_slice(&src);
        }
    }

    /// Writes a fresh IPv4 header checksum.
    fn fix_ip_checksum(&mut self) {
        let Some(ip) = self.ipv4() else { return };
        let checksum = ip.to_header().calc_header_checksum();
        self.bytes[ETH_HEADER + 10..ETH_HEADER + 12].copy_from_slice(&checksum.to_be_bytes());
    }
}

impl AsRef<[u8]> for EthFrame {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Frame for EthFrame {
    fn wire_len(&self) -> usize {
        self.bytes.len()
    }

    fn classify(&self) -> Option<Classified> {
        let ip = self.ipv4()?;
        let tos = self.bytes[ETH_HEADER + 1];
        let (src, dst, protocol) = (ip.source_addr(), ip.destination_addr(), ip.protocol());
        let header_len = ip.slice().len();
        let mut flow = u64::from(u32::from(src)) << 32 | u64::from(u32::from(dst));
        flow ^= u64::from(protocol.0) << 56;
        let (mut control, mut int) = (false, false);
        if matches!(protocol, IpNumber::UDP | IpNumber::TCP) && !ip.is_fragmenting_payload() {
            let l4 = &self.bytes[ETH_HEADER + header_len..];
            if l4.len() >= 4 {
                let (sport, dport) = (u16::from_be_bytes([l4[0], l4[1]]), u16::from_be_bytes([l4[2], l4[3]]));
                flow = flow.rotate_left(17) ^ (u64::from(sport) << 16 | u64::from(dport));
                if protocol == IpNumber::UDP {
                    // A path being recorded; an echo goes back untouched.
                    int = dport == int::INT_UDP_PORT
                        && l4
                            .get(UDP_HEADER..)
                            .and_then(|p| int::Header::new_checked(p).ok())
                            .is_some_and(|h| !h.is_echo());
                    let bth = match dport {
                        ROCEV2_UDP_PORT => l4.get(UDP_HEADER),
                        int::INT_UDP_PORT => l4.get(UDP_HEADER + int::HEADER_LEN),
                        _ => None,
                    };
                    control = bth.is_some_and(|&opcode| is_control_opcode(opcode));
                }
            }
        }
        Some(Classified {
            src: IpAddr::V4(src),
            dst: IpAddr::V4(dst),
            flow,
            ecn: Ecn::from_tos(tos),
            dscp: tos >> 2,
            control,
            int,
        })
    }

    fn mark_ce(&mut self) {
        if self.ipv4().is_some() {
            self.bytes[ETH_HEADER + 1] |= Ecn::Ce as u8;
            self.fix_ip_checksum();
        }
    }

    fn stamp_int(&mut self, hop: Hop) -> Option<Stamp> {
        let (at, udp) = self.udp()?;
        if udp.destination_port() != int::INT_UDP_PORT {
            return None;
        }
        let payload = self.bytes.get_mut(at + UDP_HEADER..)?;
        let mut header = int::Header::new_checked(payload).ok()?;
        let stamp = header.push(hop);
        self.clear_udp_checksum(at);
        Some(stamp)
    }

    fn aggregation_payload(&mut self) -> Option<&mut [u8]> {
        let (at, udp) = self.udp()?;
        let end = at + usize::from(udp.length());
        if udp.destination_port() != aggregation::AGG_UDP_PORT || end > self.bytes.len() {
            return None;
        }
        // The stage may rewrite it.
        self.clear_udp_checksum(at);
        Some(&mut self.bytes[at + UDP_HEADER..end])
    }

    fn copy_to(&self, dst: IpAddr) -> EthFrame {
        let mut copy = self.clone();
        if let (IpAddr::V4(dst), Some(_)) = (dst, self.ipv4()) {
            copy.bytes[ETH_HEADER + 16..ETH_HEADER + 20].copy_from_slice(&dst.octets());
            copy.fix_ip_checksum();
        }
        copy
    }
}

impl EthFrame {
    /// A stamp or a rewrite changed the UDP payload: IPv4 lets UDP go
    /// without a checksum.
    fn clear_udp_checksum(&mut self, udp_at: usize) {
        self.bytes[udp_at + 6..udp_at + 8].fill(0);
    }
}

/// The reply to an ARP request for `known` addresses, answered with `mac`
/// (the port's own: every host reaches every other through the switch).
pub fn arp_reply(frame: &[u8], mac: [u8; 6], known: impl Fn(Ipv4Addr) -> bool) -> Option<Vec<u8>> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).ok()?;
    let arp = frame.get(ETH_HEADER..ETH_HEADER + 28)?;
    // Ethernet/IPv4 request: htype 1, ptype 0x0800, sizes 6 and 4, op 1.
    if eth.ether_type() != EtherType::ARP || arp[..8] != [0, 1, 8, 0, 6, 4, 0, 1] {
        return None;
    }
    let (sender_mac, sender_ip, target_ip) = (&arp[8..14], &arp[14..18], &arp[24..28]);
    let target = Ipv4Addr::new(target_ip[0], target_ip[1], target_ip[2], target_ip[3]);
    if !known(target) {
        return None;
    }
    let mut reply = Vec::with_capacity(ETH_HEADER + 28);
    reply.extend_from_slice(sender_mac);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
    reply.extend_from_slice(&mac);
    reply.extend_from_slice(target_ip);
    reply.extend_from_slice(sender_mac);
    reply.extend_from_slice(sender_ip);
    Some(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RoCEv2 packet of `opcode` from 10.77.0.1:49152 to 10.77.0.2.
    fn roce_frame(opcode: u8, tos: u8, dport: u16) -> EthFrame {
        let builder = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 77, 0, 1], [10, 77, 0, 2], 64)
            .udp(49152, dport);
        let mut payload = vec![0u8; 12 + 4];
        payload[0] = opcode;
        let mut bytes = Vec::new();
        builder.write(&mut bytes, &payload).unwrap();
        bytes[ETH_HEADER + 1] = tos;
        let mut frame = EthFrame { bytes };
        frame.fix_ip_checksum();
        frame
    }

    #[test]
    fn classifies_roce_data_and_feedback() {
        let data = roce_frame(0x0a, 0b10, ROCEV2_UDP_PORT).classify().unwrap();
        assert_eq!(data.dst, IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)));
        assert_eq!((data.ecn, data.control), (Ecn::Ect0, false));
        assert!(roce_frame(0x11, 0b10, ROCEV2_UDP_PORT).classify().unwrap().control, "an ACK");
        assert!(roce_frame(0x81, 0, ROCEV2_UDP_PORT).classify().unwrap().control, "a CNP");
        assert!(!roce_frame(0x11, 0, 5000).classify().unwrap().control, "not RoCE");
    }

    #[test]
    fn marking_ce_keeps_the_ip_checksum_valid() {
        let mut frame = roce_frame(0x0a, 0b10 | (26 << 2), ROCEV2_UDP_PORT);
        frame.mark_ce();
        let (header, _) = etherparse::Ipv4Header::from_slice(&frame.bytes[ETH_HEADER..]).unwrap();
        assert_eq!(frame.bytes[ETH_HEADER + 1], (26 << 2) | 0b11, "DSCP kept, ECN CE");
        assert_eq!(header.header_checksum, header.calc_header_checksum());
    }

    #[test]
    fn only_packets_to_the_int_port_are_stamped() {
        let mut plain = roce_frame(0x0a, 0, ROCEV2_UDP_PORT);
        assert!(!plain.classify().unwrap().int);
        let before = plain.bytes.clone();
        assert_eq!(plain.stamp_int(Hop::default()), None);
        assert_eq!(plain.bytes, before, "RoCEv2 to 4791 passes byte for byte");

        let builder_to = |port| {
            etherparse::PacketBuilder::ethernet2([0; 6], [0; 6])
                .ipv4([10, 77, 0, 1], [10, 77, 0, 2], 64)
                .udp(49152, port)
        };
        let mut payload = vec![0u8; int::HEADER_LEN + 16];
        int::Repr::default().emit(&mut payload).unwrap();
        let mut bytes = Vec::new();
        builder_to(int::INT_UDP_PORT).write(&mut bytes, &payload).unwrap();
        let mut frame = EthFrame { bytes };
        assert!(frame.classify().unwrap().int);
        let hop = Hop { rate_mbps: 10_000, timestamp_ns: 5, tx_bytes: 6, queue_bytes: 7 };
        assert_eq!(frame.stamp_int(hop), Some(Stamp::Recorded));
        let at = ETH_HEADER + 20 + UDP_HEADER;
        assert_eq!(int::Repr::parse(&frame.bytes[at..]).unwrap().hops, vec![hop]);

        // The receiver's echo of those records goes back unstamped.
        let mut echo = vec![0u8; int::HEADER_LEN + 16];
        int::Repr { hops: vec![hop], echo: true }.emit(&mut echo).unwrap();
        let mut bytes = Vec::new();
        builder_to(int::INT_UDP_PORT).write(&mut bytes, &echo).unwrap();
        assert!(!EthFrame { bytes }.classify().unwrap().int, "an echo is not a path to record");
    }

    #[test]
    fn aggregation_packets_are_found_and_copied_to_another_host() {
        let chunk = aggregation::Repr { workers: 2, values: vec![1, 2, 3], ..Default::default() }.to_bytes();
        let mut bytes = Vec::new();
        etherparse::PacketBuilder::ethernet2([0; 6], [0; 6])
            .ipv4([10, 77, 0, 1], [10, 77, 0, 5], 64)
            .udp(40000, aggregation::AGG_UDP_PORT)
            .write(&mut bytes, &chunk)
            .unwrap();
        // A veth pads short frames: the payload ends where UDP says.
        bytes.resize(bytes.len() + 6, 0);
        let mut frame = EthFrame { bytes };
        assert_eq!(frame.aggregation_payload().unwrap(), &chunk[..]);
        let copy = frame.copy_to(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 9)));
        let (header, _) = etherparse::Ipv4Header::from_slice(&copy.bytes[ETH_HEADER..]).unwrap();
        assert_eq!(header.destination, [10, 77, 0, 9]);
        assert_eq!(header.header_checksum, header.calc_header_checksum());
        assert!(roce_frame(0x0a, 0, ROCEV2_UDP_PORT).aggregation_payload().is_none());
    }

    #[test]
    fn answers_arp_for_known_addresses_only() {
        let mut request = vec![0xff; 6];
        request.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
        request.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 77, 0, 1, 0, 0, 0, 0, 0, 0, 10, 77, 0, 2]);
        let mac = [2, 0x53, 0x4e, 1, 0, 0];
        let reply = arp_reply(&request, mac, |ip| ip == Ipv4Addr::new(10, 77, 0, 2)).unwrap();
        assert_eq!(&reply[..6], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&reply[20..22], &[0, 2], "a reply");
        assert_eq!(&reply[22..28], &mac, "10.77.0.2 is at the port's MAC");
        assert_eq!(&reply[28..32], &[10, 77, 0, 2]);
        assert!(arp_reply(&request, mac, |_| false).is_none());
    }
}
