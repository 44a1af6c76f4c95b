//! rdma_cm's MADs and the CM's state machine (`softrnic_rdmacm::protocol`),
//! which anyone on the network can send MADs to: every message that parses
//! re-emits to a message that parses the same, and an agent fed any
//! sequence of MADs from two addresses, with time passing, never panics
//! and keeps its queue of MADs to send within its bound.
#![no_main]

use std::net::IpAddr;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softrnic_rdmacm::protocol::{Cm, MAX_TRANSMITS, RESPONSE_TIMEOUT};
use softrnic_wire::cm::{self, CLASS_VERSION, Message};
use softrnic_wire::mad::{self, MAD_DATA_LEN, MAD_LEN};

const SERVICE: u64 = 0x0106_4e21;
const PEERS: [IpAddr; 2] =
    [IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)), IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3))];

fuzz_target!(|data: &[u8]| {
    if data.len() >= 2 {
        let attribute = u16::from_be_bytes([data[0], data[1]]);
        if let Ok(message) = Message::parse(attribute, &data[2..]) {
            let mut out = [0u8; MAD_DATA_LEN];
            message.emit(&mut out).expect("a parsed message re-emits");
            assert_eq!(Message::parse(message.attribute_id(), &out).expect("an emitted message parses"), message);
        }
    }

    let Ok(Message::Req(req)) = Message::parse(cm::attribute::REQ, &[0u8; MAD_DATA_LEN]) else { unreachable!() };
    let mut agent = Cm::new([7; 32]);
    agent.listen(SERVICE, 4).expect("a free service");
    let mut now = Duration::ZERO;
    agent.connect(now, PEERS[0], cm::Req { service_id: SERVICE, local_qpn: 0x11, ..req });
    // Each step: a control byte (which peer, whether to make the header
    // a CM MAD's, how far time moves), then up to a MAD's bytes.
    for step in data.chunks(MAD_LEN + 1) {
        let (control, bytes) = (step[0], &step[1..]);
        let mut mad = bytes.to_vec();
        if control & 2 != 0 && mad.len() >= 3 {
            mad[0] = 1;
            mad[1] = mad::class::CM;
            mad[2] = CLASS_VERSION;
        }
        agent.handle_mad(now, PEERS[usize::from(control & 1)], &mad);
        now += RESPONSE_TIMEOUT * u32::from(control >> 5);
        agent.handle_timeout(now);
        while agent.poll_event().is_some() {}
        let mut sent = 0;
        while agent.poll_transmit().is_some() {
            sent += 1;
        }
        assert!(sent <= MAX_TRANSMITS);
    }
});
