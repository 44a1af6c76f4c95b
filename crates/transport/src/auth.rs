//! Packet authentication, beyond what RoCE offers (sRDMA, USENIX ATC
//! 2020): where both ends of a connection are softrnic and agree (ECE, or
//! the Rust API's connect options), every packet carries a keyed MAC, and
//! one that does not verify is dropped and counted
//! (`rx_auth_failures`). Anyone can send UDP from a connected peer's
//! address; only a holder of the connection's key can send what the QP
//! accepts.
//!
//! The keys are the connection's, one per direction: derived from a
//! secret both hosts share (`SOFTRNIC_AUTH_KEY`, as WireGuard's
//! pre-shared key) and the sending and receiving ends' addresses and QP
//! numbers, so a packet verifies on no other connection and is not
//! reflected back on its own. The MAC (keyed BLAKE3, 16 bytes) covers
//! every byte from the BTH to the payload's end, PSN included, in one
//! call (the incremental hasher, fed the addresses first, hashed a 4 KiB
//! packet at 1 GB/s where one call does 2.4); it sits between the payload
//! and the ICRC, which covers it too:
//!
//! ```text
//! | BTH | extension headers | payload + pad | MAC (16) | ICRC (4) |
//! ```
//!
//! What it does not do: encrypt (the payload travels in the clear, as in
//! RoCE); protect the connection's set-up (an attacker who forges it is
//! not refused by this); tell a packet replayed a whole PSN wrap (2^24
//! packets) later from a new one; cover CNPs, which may only slow a QP.

use std::net::IpAddr;

/// Bytes of a packet's MAC.
pub const MAC_LEN: usize = 16;

/// Bytes of the ICRC, which follows the MAC.
const ICRC_LEN: usize = 4;

/// The secret both hosts share, from which every connection's key is
/// derived. Never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AuthKey([u8; 32]);

impl AuthKey {
    /// The key a passphrase names: at least 16 bytes of it, stretched by
    /// BLAKE3's key derivation (so any text of that length will do).
    pub fn from_secret(secret: &str) -> Result<AuthKey, String> {
        if secret.len() < 16 {
            return Err(format!("a secret of at least 16 bytes (this one has {})", secret.len()));
        }
        Ok(AuthKey(blake3::derive_key("softrnic 2026-11-28 packet authentication", secret.as_bytes())))
    }

    /// The keys of the connection between `(local address, local QPN)`
    /// and `(remote address, remote QPN)`: what one end sends with, the
    /// other receives with.
    pub fn connection(&self, local: (IpAddr, u32), remote: (IpAddr, u32)) -> PacketAuth {
        PacketAuth { send: self.direction(local, remote), receive: self.direction(remote, local) }
    }

    /// The key of the packets `from` sends `to`.
    fn direction(&self, from: (IpAddr, u32), to: (IpAddr, u32)) -> [u8; 32] {
        let mut ends = [0u8; 40];
        for (at, (addr, qpn)) in [(0, from), (20, to)] {
            ends[at..at + 16].copy_from_slice(&ipv6_octets(addr));
            ends[at + 16..at + 20].copy_from_slice(&qpn.to_be_bytes());
        }
        *blake3::keyed_hash(&self.0, &ends).as_bytes()
    }
}

impl std::fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthKey(..)")
    }
}

/// One connection's keys: seals the packets its QP sends and opens those
/// it receives.
#[derive(Clone, PartialEq, Eq)]
pub struct PacketAuth {
    send: [u8; 32],
    receive: [u8; 32],
}

impl std::fmt::Debug for PacketAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PacketAuth(..)")
    }
}

impl PacketAuth {
    fn mac(key: &[u8; 32], covered: &[u8]) -> [u8; MAC_LEN] {
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&blake3::keyed_hash(key, covered).as_bytes()[..MAC_LEN]);
        mac
    }

    /// Puts the MAC into the packet of `len` bytes (ICRC slot included)
    /// in `buf`, which must have [`MAC_LEN`] bytes of room after it;
    /// returns the packet's new length.
    pub fn seal(&self, buf: &mut [u8], len: usize) -> usize {
        let covered = len - ICRC_LEN;
        let mac = Self::mac(&self.send, &buf[..covered]);
        buf[covered..covered + MAC_LEN].copy_from_slice(&mac);
        len + MAC_LEN
    }

    /// The packet without its MAC (its last four bytes then stand where
    /// the ICRC did, which the caller checked already), if the MAC
    /// verifies; `None` for a forgery, a packet changed on the way, or
    /// one too short to carry a MAC.
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Option<&'a [u8]> {
        let covered = datagram.len().checked_sub(MAC_LEN + ICRC_LEN)?;
        let expected = Self::mac(&self.receive, &datagram[..covered]);
        let carried: &[u8; MAC_LEN] = datagram[covered..covered + MAC_LEN].try_into().expect("MAC_LEN bytes");
        // In constant time, so how long a comparison took tells a forger
        // nothing of how much of his guess was right.
        constant_time_eq::constant_time_eq_16(&expected, carried).then(|| &datagram[..datagram.len() - MAC_LEN])
    }
}

/// An address as the GID it is (IPv4 mapped into IPv6), so both families
/// hash alike.
fn ipv6_octets(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn what_one_end_seals_only_the_other_opens() {
        let key = AuthKey::from_secret("a secret both hosts share").unwrap();
        let a = key.connection((addr(1), 0x11), (addr(2), 0x22));
        let b = key.connection((addr(2), 0x22), (addr(1), 0x11));
        assert_eq!((a.send, a.receive), (b.receive, b.send), "one key per direction, the same at both ends");
        let mut buf = [0u8; 64];
        buf[..20].copy_from_slice(&[7; 20]);
        let len = a.seal(&mut buf, 24);
        assert_eq!(len, 24 + MAC_LEN);
        assert_eq!(b.open(&buf[..len]), Some(&buf[..24]));
        // Reflected back, another connection, a changed byte, no MAC.
        assert_eq!(a.open(&buf[..len]), None);
        let other = key.connection((addr(2), 0x23), (addr(1), 0x11));
        assert_eq!(other.open(&buf[..len]), None);
        let mut changed = buf;
        changed[3] ^= 1;
        assert_eq!(b.open(&changed[..len]), None);
        assert_eq!(b.open(&buf[..10]), None);
        let wrong = AuthKey::from_secret("another secret, as long").unwrap();
        assert_eq!(wrong.connection((addr(2), 0x22), (addr(1), 0x11)).open(&buf[..len]), None);
        assert!(AuthKey::from_secret("short").unwrap_err().contains("at least 16 bytes"));
        assert_eq!(format!("{key:?} {a:?}"), "AuthKey(..) PacketAuth(..)", "never printed");
    }
}
