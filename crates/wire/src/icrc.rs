//! The RoCEv2 invariant CRC (IBTA annex A17.3.3).
//!
//! A CRC-32 (the Ethernet polynomial, as `crc32fast` computes it) over
//!
//! 1. eight bytes of 0xFF standing in for the InfiniBand LRH,
//! 2. the IP header with the fields routers may change set to all ones:
//!    IPv4 TOS, TTL and header checksum; IPv6 traffic class, flow label and
//!    hop limit,
//! 3. the UDP header with its checksum set to all ones,
//! 4. the BTH with its byte 4 (FECN, BECN, reserved) set to all ones,
//! 5. the extension headers, payload and pad,
//!
//! stored after the pad in little-endian byte order.
//!
//! softrnic sends over kernel UDP sockets, which never show it the IP header.
//! [`UdpFlow`] rebuilds that header the way Linux writes it for an
//! unconnected socket with DF set: IPv4 ID 0, DF, protocol UDP (see
//! docs/ARCHITECTURE.md, "Why the ICRC is exact").

use std::net::IpAddr;

use crate::packet::ICRC_LEN;
use crate::{Error, Result};

const LRH_PLACEHOLDER: [u8; 8] = [0xff; 8];
const BTH_RESV8A: usize = 4;
const UDP_HEADER_LEN: usize = 8;
const IPV4_HEADER_LEN: usize = 20;
const IPV6_HEADER_LEN: usize = 40;
const PROTOCOL_UDP: u8 = 17;

/// The ICRC of `roce` (BTH through pad, without the ICRC) carried behind
/// these literal IP and UDP headers. `ip_header` is an IPv4 header (any
/// IHL) or a 40-byte IPv6 header, chosen by its version nibble.
pub fn compute(ip_header: &[u8], udp_header: &[u8], roce: &[u8]) -> Result<u32> {
    if udp_header.len() != UDP_HEADER_LEN || roce.len() < 12 || ip_header.is_empty() {
        return Err(Error::Truncated);
    }
    softrnic_account::add(softrnic_account::Cost::IcrcBytes, roce.len() as u64);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&LRH_PLACEHOLDER);
    match ip_header[0] >> 4 {
        4 => {
            let ihl = usize::from(ip_header[0] & 0x0f) * 4;
            if ihl < IPV4_HEADER_LEN || ip_header.len() != ihl {
                return Err(Error::Truncated);
            }
            let mut masked = [0u8; 60];
            masked[..ihl].copy_from_slice(ip_header);
            mask_ipv4(&mut masked[..ihl]);
            hasher.update(&masked[..ihl]);
        }
        6 => {
            let mut masked: [u8; IPV6_HEADER_LEN] = ip_header.try_into().map_err(|_| Error::Truncated)?;
            mask_ipv6(&mut masked);
            hasher.update(&masked);
        }
        _ => return Err(Error::Reserved),
    }
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(udp_header);
    udp[6..8].fill(0xff);
    hasher.update(&udp);
    let mut bth = [0u8; 12];
    bth.copy_from_slice(&roce[..12]);
    bth[BTH_RESV8A] = 0xff;
    hasher.update(&bth);
    hasher.update(&roce[12..]);
    Ok(hasher.finalize())
}

fn mask_ipv4(header: &mut [u8]) {
    header[1] = 0xff; // TOS (DSCP and ECN)
    header[8] = 0xff; // TTL
    header[10..12].fill(0xff); // header checksum
}

fn mask_ipv6(header: &mut [u8; IPV6_HEADER_LEN]) {
    header[0] |= 0x0f; // traffic class, high nibble
    header[1..4].fill(0xff); // traffic class low nibble, flow label
    header[7] = 0xff; // hop limit
}

/// The addresses and ports of a RoCEv2 datagram: everything of the IP and
/// UDP headers that the ICRC covers and a UDP socket does not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpFlow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_port: u16,
    pub dst_port: u16,
}

impl UdpFlow {
    /// The same flow seen from the other end.
    pub fn reversed(self) -> UdpFlow {
        UdpFlow { src: self.dst, dst: self.src, src_port: self.dst_port, dst_port: self.src_port }
    }

    /// The ICRC of `roce` (BTH through pad) in this flow.
    pub fn icrc(&self, roce: &[u8]) -> Result<u32> {
        let udp_len = u16::try_from(UDP_HEADER_LEN + roce.len() + ICRC_LEN).map_err(|_| Error::Truncated)?;
        let mut udp = [0u8; UDP_HEADER_LEN];
        udp[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let total = (IPV4_HEADER_LEN as u16).checked_add(udp_len).ok_or(Error::Truncated)?;
                let mut ip = [0u8; IPV4_HEADER_LEN];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&total.to_be_bytes());
                // Identification 0 (bytes 4..6), then flags: Don't Fragment.
                ip[6] = 0x40;
                ip[9] = PROTOCOL_UDP;
                ip[12..16].copy_from_slice(&src.octets());
                ip[16..20].copy_from_slice(&dst.octets());
                compute(&ip, &udp, roce)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let mut ip = [0u8; IPV6_HEADER_LEN];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
                ip[6] = PROTOCOL_UDP;
                ip[8..24].copy_from_slice(&src.octets());
                ip[24..40].copy_from_slice(&dst.octets());
                compute(&ip, &udp, roce)
            }
            _ => Err(Error::Reserved),
        }
    }

    /// Writes the ICRC into the last four bytes of `packet` (a datagram
    /// emitted by [`crate::packet`], whose ICRC slot is still zero).
    pub fn seal(&self, packet: &mut [u8]) -> Result<()> {
        let body = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated)?;
        let crc = self.icrc(&packet[..body])?;
        packet[body..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Checks the ICRC at the end of a received datagram.
    pub fn verify(&self, packet: &[u8]) -> Result<()> {
        let body = packet.len().checked_sub(ICRC_LEN).ok_or(Error::Truncated)?;
        if body < 12 {
            return Err(Error::Truncated);
        }
        let carried = u32::from_le_bytes(packet[body..].try_into().expect("4 bytes"));
        if self.icrc(&packet[..body])? == carried { Ok(()) } else { Err(Error::BadIcrc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// IPv4 10.0.0.1 -> 10.0.0.2, UDP 49152 -> 4791, RC SEND_ONLY to QP 0x11,
    /// PSN 0x123456, payload 00..0f, then its ICRC.
    const VECTOR: &str = "4502003c00010000401166ac0a0000010a000002c00012b7002829fb0400ffff0000001180123456000102030405060708090a0b0c0d0e0f32fccb32";

    #[test]
    fn reference_vector_checks_out() {
        let bytes = hex(VECTOR);
        let (ip, rest) = bytes.split_at(20);
        let (udp, roce) = rest.split_at(8);
        let (body, icrc) = roce.split_at(roce.len() - 4);
        let crc = compute(ip, udp, body).unwrap();
        assert_eq!(crc.to_le_bytes(), icrc);
        assert_eq!(crc, 0x32cb_fc32);
    }

    #[test]
    fn masked_fields_do_not_change_the_crc() {
        let mut bytes = hex(VECTOR);
        bytes[1] = 0x03; // ECN CE, as a switch marks it
        bytes[8] = 0x3f; // a router decremented the TTL
        bytes[10] = 0x12; // and rewrote the checksum
        bytes[26] = 0xab; // UDP checksum
        bytes[28 + 4] = 0x40; // BECN
        let (ip, rest) = bytes.split_at(20);
        let (udp, roce) = rest.split_at(8);
        assert_eq!(compute(ip, udp, &roce[..roce.len() - 4]).unwrap(), 0x32cb_fc32);
    }

    #[test]
    fn covered_fields_change_the_crc() {
        let bytes = hex(VECTOR);
        for index in [4usize, 12, 19, 20, 28, 28 + 7, 28 + 11, bytes.len() - 5] {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0x01;
            let (ip, rest) = flipped.split_at(20);
            let (udp, roce) = rest.split_at(8);
            // Byte 4 of the IPv4 header is the ID; 28.. is the BTH onward.
            assert_ne!(compute(ip, udp, &roce[..roce.len() - 4]).unwrap(), 0x32cb_fc32, "byte {index}");
        }
    }

    #[test]
    fn flow_reconstructs_a_linux_dont_fragment_header() {
        // The vector's header with ID 0 and DF, as Linux sends it.
        let mut bytes = hex(VECTOR);
        bytes[4..6].fill(0);
        bytes[6] = 0x40;
        let (ip, rest) = bytes.split_at(20);
        let (udp, roce) = rest.split_at(8);
        let expected = compute(ip, udp, &roce[..roce.len() - 4]).unwrap();
        let flow = UdpFlow {
            src: Ipv4Addr::new(10, 0, 0, 1).into(),
            dst: Ipv4Addr::new(10, 0, 0, 2).into(),
            src_port: 49152,
            dst_port: 4791,
        };
        assert_eq!(flow.icrc(&roce[..roce.len() - 4]).unwrap(), expected);
        let mut sealed = roce.to_vec();
        flow.seal(&mut sealed).unwrap();
        assert_eq!(&sealed[sealed.len() - 4..], expected.to_le_bytes());
        assert_eq!(flow.verify(&sealed), Ok(()));
        sealed[20] ^= 0x80;
        assert_eq!(flow.verify(&sealed), Err(Error::BadIcrc));
        assert_eq!(flow.reversed().verify(&sealed), Err(Error::BadIcrc));
    }

    #[test]
    fn ipv6_masks_class_flow_label_and_hop_limit() {
        let flow = UdpFlow {
            src: Ipv6Addr::LOCALHOST.into(),
            dst: Ipv6Addr::LOCALHOST.into(),
            src_port: 4791,
            dst_port: 4791,
        };
        let roce = hex("0400ffff0000001180123456000102030405060708090a0b0c0d0e0f");
        let mut ip = [0u8; 40];
        ip[0] = 0x6a; // traffic class and flow label that the ICRC ignores
        ip[1..4].copy_from_slice(&[0xbc, 0xde, 0xf1]);
        ip[4..6].copy_from_slice(&((8 + roce.len() + 4) as u16).to_be_bytes());
        ip[6] = 17;
        ip[7] = 3;
        ip[8..24].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        ip[24..40].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        let mut udp = [0u8; 8];
        udp[0..2].copy_from_slice(&4791u16.to_be_bytes());
        udp[2..4].copy_from_slice(&4791u16.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + roce.len() + 4) as u16).to_be_bytes());
        assert_eq!(compute(&ip, &udp, &roce).unwrap(), flow.icrc(&roce).unwrap());
    }

    #[test]
    fn mixed_families_and_short_inputs_are_errors() {
        let flow =
            UdpFlow { src: Ipv4Addr::LOCALHOST.into(), dst: Ipv6Addr::LOCALHOST.into(), src_port: 1, dst_port: 2 };
        assert_eq!(flow.icrc(&[0u8; 12]), Err(Error::Reserved));
        assert_eq!(compute(&[0x45; 19], &[0; 8], &[0; 12]), Err(Error::Truncated));
        assert_eq!(compute(&[], &[0; 8], &[0; 12]), Err(Error::Truncated));
        assert_eq!(compute(&[0x45; 20], &[0; 7], &[0; 12]), Err(Error::Truncated));
    }
}
