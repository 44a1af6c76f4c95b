//! What an rsocket peer sends (`softrnic_rdmacm::rsocket::message`): the
//! connection's private data and the control messages' payloads, which any
//! program that connects to a listening rsocket chooses. Whatever the
//! bytes, parsing answers without a panic, and what parses re-emits to the
//! same bytes' meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrnic_rdmacm::rsocket::message::{self, Hello, Kind, Mapping};

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = Hello::parse(data) {
        assert_eq!(Hello::parse(&hello.emit()), Ok(hello));
    }
    if let Some(mapping) = Mapping::parse(data) {
        assert_eq!(Mapping::parse(&mapping.emit()), Some(mapping));
        let _ = mapping.holds(message::parse_unmap(data).unwrap_or(0));
    }
    if let Some(word) = data.get(..4) {
        let imm = u32::from_be_bytes(word.try_into().expect("four bytes"));
        if let Some(kind) = Kind::from_immediate(imm) {
            assert_eq!(kind.immediate() >> 24, imm >> 24);
        }
    }
});
