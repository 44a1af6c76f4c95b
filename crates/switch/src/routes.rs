//! Forwarding by destination address: the longest matching prefix names
//! the ports that lead there, and ECMP picks one of them by the flow's hash
//! mixed with the switch's seed, so a flow keeps its path (no reordering)
//! and flows spread over equal paths.

use std::net::IpAddr;

use crate::pipeline::PortId;

/// An address prefix, such as 10.0.1.0/24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// The prefix that matches `addr` alone.
    pub fn host(addr: IpAddr) -> Prefix {
        Prefix { addr, len: if addr.is_ipv4() { 32 } else { 128 } }
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len.min(32))).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.len.min(128))).unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// A forwarding table.
#[derive(Debug, Clone, Default)]
pub struct Routes {
    entries: Vec<(Prefix, Vec<PortId>)>,
}

impl Routes {
    /// Traffic to `prefix` leaves by one of `ports` (several: ECMP).
    pub fn add(&mut self, prefix: Prefix, ports: Vec<PortId>) {
        assert!(!ports.is_empty(), "a route needs a port");
        self.entries.push((prefix, ports));
        // Longest prefix first, so the first match is the best.
        self.entries.sort_by_key(|entry| std::cmp::Reverse(entry.0.len));
    }

    /// The port for a packet of `flow` to `dst`.
    pub fn lookup(&self, dst: IpAddr, flow: u64, seed: u64) -> Option<PortId> {
        let (_, ports) = self.entries.iter().find(|(prefix, _)| prefix.contains(dst))?;
        Some(ports[ecmp_index(flow, seed, ports.len())])
    }
}

/// Which of `n` equal paths a flow takes: a 64-bit mix (splitmix64's
/// finaliser) of the flow hash and the seed, so that two switches with
/// different seeds split the same flows differently (no polarisation).
pub fn ecmp_index(flow: u64, seed: u64, n: usize) -> usize {
    let mut x = flow ^ seed.rotate_left(17);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_prefix_wins() {
        let mut routes = Routes::default();
        routes.add(Prefix { addr: "10.0.0.0".parse().unwrap(), len: 8 }, vec![1]);
        routes.add(Prefix { addr: "10.0.2.0".parse().unwrap(), len: 24 }, vec![2]);
        routes.add(Prefix::host("10.0.2.7".parse().unwrap()), vec![3]);
        assert_eq!(routes.lookup("10.9.9.9".parse().unwrap(), 0, 0), Some(1));
        assert_eq!(routes.lookup("10.0.2.9".parse().unwrap(), 0, 0), Some(2));
        assert_eq!(routes.lookup("10.0.2.7".parse().unwrap(), 0, 0), Some(3));
        assert_eq!(routes.lookup("11.0.0.1".parse().unwrap(), 0, 0), None);
        assert_eq!(routes.lookup("::1".parse().unwrap(), 0, 0), None);
    }

    /// 4 paths, 40 000 flows: each path within 3 % of a quarter, and a
    /// flow always on the same one.
    #[test]
    fn ecmp_spreads_flows_evenly_and_keeps_each_on_its_path() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0usize; 4];
        for _ in 0..40_000 {
            let flow = rng.u64(..);
            let path = ecmp_index(flow, 99, 4);
            assert_eq!(path, ecmp_index(flow, 99, 4));
            counts[path] += 1;
        }
        for count in counts {
            assert!((9_700..=10_300).contains(&count), "{counts:?}");
        }
        // Consecutive flow hashes (UDP source ports) spread as well.
        let mut counts = [0usize; 4];
        for port in 49152u64..49152 + 4000 {
            counts[ecmp_index(port, 99, 4)] += 1;
        }
        assert!(counts.iter().all(|&c| (900..=1100).contains(&c)), "{counts:?}");
    }
}
