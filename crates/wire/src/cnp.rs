//! RoCEv2 Congestion Notification Packet (annex A17.9.3): a BTH with opcode
//! 0x81 and BECN set, addressed to the QP whose traffic was marked, then 16
//! reserved bytes. The notification point sends one when it sees ECN CE on
//! a packet; the reaction point's congestion control slows the flow down.

use crate::packet::{Extensions, Headers};
use crate::{Opcode, Psn, bth};

/// Reserved bytes between the BTH and the ICRC.
pub const RESERVED_LEN: usize = 16;

/// The headers of a CNP to `dest_qpn`.
pub fn headers(dest_qpn: u32, pkey: u16) -> Headers {
    Headers {
        bth: bth::Repr { pkey, becn: true, ..bth::Repr::new(Opcode::Cnp, dest_qpn, Psn::new(0)) },
        ext: Extensions::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::PacketRepr;

    #[test]
    fn literal_bytes() {
        let mut buf = [0xeeu8; 12 + 16 + 4];
        let len = headers(0x2a, 0xffff).emit_packet(&mut buf, &[]).unwrap();
        assert_eq!(len, 32);
        let mut expected = [0u8; 32];
        expected[..12].copy_from_slice(&[0x81, 0, 0xff, 0xff, 0x40, 0, 0, 0x2a, 0, 0, 0, 0]);
        // The ICRC is left for icrc::seal; emit zeroes it.
        assert_eq!(buf, expected);
        let parsed = PacketRepr::parse(&buf).unwrap();
        assert_eq!(parsed.headers.bth.opcode, Opcode::Cnp);
        assert!(parsed.headers.bth.becn);
        assert_eq!(parsed.headers.bth.dest_qpn, 0x2a);
        assert!(parsed.payload.is_empty());
    }
}
