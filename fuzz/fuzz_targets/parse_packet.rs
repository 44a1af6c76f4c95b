//! Feeds arbitrary datagrams to the RoCEv2 parser and ICRC checker. Whatever
//! parses must re-emit to the same bytes (up to the ICRC slot and BTH bits
//! the emitter normalises).
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrnic_wire::icrc::UdpFlow;
use softrnic_wire::packet::PacketRepr;

fuzz_target!(|data: &[u8]| {
    let flow = UdpFlow { src: [127, 0, 0, 2].into(), dst: [127, 0, 0, 3].into(), src_port: 4791, dst_port: 4791 };
    let _ = flow.verify(data);
    if let Ok(repr) = PacketRepr::parse(data) {
        let mut out = vec![0u8; repr.buffer_len()];
        let len = repr.emit(&mut out).expect("a parsed packet re-emits");
        assert_eq!(len, data.len());
        let again = PacketRepr::parse(&out).expect("an emitted packet parses");
        assert_eq!(again.payload, repr.payload);
        assert_eq!(again.headers.ext, repr.headers.ext);
    }
});
