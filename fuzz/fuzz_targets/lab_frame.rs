//! The lab's switch, which forwards whatever Ethernet frames its hosts'
//! TAP devices write, and its topology files: any text is a topology or a
//! one-line error; any frames through a switch of a small topology (with
//! aggregation on) never panic it, and what it sends is what it took or
//! copies of it.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softrnic_lab::eth_frame::EthFrame;
use softrnic_lab::topology::Topology;
use softrnic_switch::Frame;
use softrnic_switch::pipeline::Switch;

const TOPOLOGY: &str = "[[switch]]\nname = \"s0\"\naggregators = 8\n\
                        [[host]]\nname = \"a\"\nswitch = \"s0\"\n\
                        [[host]]\nname = \"b\"\nswitch = \"s0\"\n\
                        [[host]]\nname = \"c\"\nswitch = \"s0\"\n";

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = Topology::parse("fuzz.toml", text) {
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
    let topology = Topology::parse("fuzz.toml", TOPOLOGY).expect("the fuzz topology parses");
    let (config, routes) = topology.switch_config(0);
    let mut switch: Switch<EthFrame> = Switch::new(config, routes);
    // Each frame: a control byte (in port, time), a length byte, then its
    // bytes.
    let mut rest = data;
    let mut now = Duration::ZERO;
    let mut taken = 0usize;
    while rest.len() >= 2 {
        let (control, len) = (rest[0], usize::from(rest[1]) * 8);
        let bytes = rest[2..].get(..len).unwrap_or(&rest[2..]).to_vec();
        rest = &rest[(2 + bytes.len()).min(rest.len())..];
        let frame = EthFrame { bytes };
        let _ = frame.classify();
        taken = taken.max(frame.wire_len());
        switch.handle_packet(now, usize::from(control % 3), frame);
        now += Duration::from_micros(u64::from(control >> 2));
        while let Some((port, frame)) = switch.poll_transmit(now + Duration::from_secs(1)) {
            assert!(port < 3);
            assert!(frame.wire_len() <= taken.max(64), "{} > {taken}", frame.wire_len());
        }
    }
});
