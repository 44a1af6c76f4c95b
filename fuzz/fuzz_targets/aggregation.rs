//! In-network aggregation's packet, parameter server and switch stage,
//! which anyone can send UDP port 4793 datagrams to: what parses re-emits
//! the same; a server fed any packets from any sender never panics and
//! keeps its pending chunks within its bound; the switch stage never
//! panics, never resizes a payload, and copies an ACK only to addresses
//! that sent the job's chunks.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softrnic_aggregation::server::{ParameterServer, ServerConfig};
use softrnic_switch::{AggregationConfig, Aggregator, Verdict};
use softrnic_wire::aggregation::Repr;

fn address(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = Repr::parse(data) {
        assert_eq!(Repr::parse(&repr.to_bytes()).expect("an emitted packet parses"), repr);
    }
    let mut server = ParameterServer::new(ServerConfig { max_pending: 16, ..ServerConfig::new(1, 3) });
    let mut stage = Aggregator::new(AggregationConfig { slots: 4, reclaim_after: Duration::from_millis(5) });
    let mut senders = Vec::new();
    // Each packet: a control byte (sender, time), a length byte, then the
    // packet's bytes.
    let mut rest = data;
    let mut now = Duration::ZERO;
    while rest.len() >= 2 {
        let (control, len) = (rest[0], usize::from(rest[1]));
        let mut packet = rest[2..].get(..len).unwrap_or(&rest[2..]).to_vec();
        rest = &rest[(2 + packet.len()).min(rest.len())..];
        let sender = control & 7;
        now += Duration::from_millis(u64::from(control >> 6));
        server.handle_packet((sender < 3).then_some(sender), &packet, control & 8 != 0);
        while server.poll_transmit().is_some() {}
        assert!(server.pending() <= 16);
        let len = packet.len();
        senders.push(address(sender));
        let verdict = stage.handle(now, address(sender), address(100), control & 16 != 0, &mut packet);
        assert_eq!(packet.len(), len, "the stage never resizes a payload");
        if let Verdict::Replicate(to) = verdict {
            assert!(to.iter().all(|a| senders.contains(a)), "copies only to those that sent chunks");
        }
    }
});
