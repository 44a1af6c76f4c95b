//! The network interface a device's address lives on, and the largest IB
//! MTU whose packets it carries whole: the port's active MTU, one fact
//! for the C library's `ibv_query_port` and the Rust API's connections.

use std::net::IpAddr;

use softrnic_transport::Mtu;

/// The bytes a RoCEv2 packet adds to its payload at most: IP, UDP, BTH,
/// the largest extended headers (RETH and ImmDt, and the SRETH a
/// selective-repeat connection adds) and the ICRC.
fn overhead(addr: IpAddr) -> u32 {
    let ip = if addr.is_ipv4() { 20 } else { 40 };
    ip + 8 + 12 + 16 + 4 + 24 + 4
}

/// The interface whose subnet holds `addr` (loopback's /8 holds every
/// 127.x address): its name and index.
pub fn interface_of(addr: IpAddr) -> Option<(String, u32)> {
    let interfaces = if_addrs::get_if_addrs().ok()?;
    let exact = interfaces.iter().find(|i| i.ip() == addr);
    let within = || {
        interfaces.iter().find(|i| match (&i.addr, addr) {
            (if_addrs::IfAddr::V4(v4), IpAddr::V4(a)) => {
                let mask = u32::from(v4.netmask);
                u32::from(v4.ip) & mask == u32::from(a) & mask
            }
            _ => false,
        })
    };
    exact.or_else(within).map(|i| (i.name.clone(), i.index.unwrap_or(0)))
}

/// The largest IB MTU whose packets fit the MTU of `addr`'s interface
/// (Ethernet's 1500 when it has none): 1024 on a 1500-byte link, 4096 on
/// loopback. A larger path MTU would send datagrams the link cannot carry.
pub fn active_mtu(addr: IpAddr) -> Mtu {
    let link = interface_of(addr).and_then(|(name, _)| interface_mtu(&name)).unwrap_or(1500);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() + overhead(addr) <= link)
        .unwrap_or(Mtu::Mtu256)
}

fn interface_mtu(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_find_the_loopback_interface() {
        let (name, index) = interface_of("127.0.9.9".parse().unwrap()).expect("lo holds 127/8");
        assert_eq!(name, "lo");
        assert!(index > 0);
        // lo's MTU (65536) fits 4096-byte packets.
        assert_eq!(active_mtu("127.0.9.9".parse().unwrap()), Mtu::Mtu4096);
    }

    #[test]
    fn an_ethernet_mtu_fits_1024_byte_packets() {
        let addr: IpAddr = "10.0.0.1".parse().unwrap();
        assert!(1024 + overhead(addr) <= 1500 && 2048 + overhead(addr) > 1500);
    }
}
