//! The INT wrapper on UDP port 4792 (`softrnic_wire::int`, and the
//! engine's unwrapping of what arrives there): whatever parses re-emits
//! the same, every hop it says it holds can be read, and the engine finds
//! the RoCEv2 packet inside the datagram.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrnic_engine::int::unwrap;
use softrnic_wire::int::{HEADER_LEN, Header, Repr};

fuzz_target!(|data: &[u8]| {
    if let Ok(repr) = Repr::parse(data) {
        let mut out = vec![0u8; HEADER_LEN];
        repr.emit(&mut out).expect("a parsed header re-emits");
        assert_eq!(Repr::parse(&out).expect("an emitted header parses"), repr);
        let header = Header::new_unchecked(data);
        for i in 0..usize::from(header.hops()) {
            assert!(header.hop(i).is_some(), "hop {i} of {}", header.hops());
        }
    }
    if let Some((_, roce)) = unwrap(data) {
        assert_eq!(roce.len(), data.len() - HEADER_LEN);
    }
});
