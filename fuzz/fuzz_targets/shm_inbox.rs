//! The shared-memory inbox's consumer, whose rings a broken or hostile
//! peer of the same user writes: whatever bytes lie in a ring's header and
//! slots, the consumer never panics, never reads past a slot, delivers
//! only datagrams that fit one, and gets past slots claimed and never
//! published.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    softrnic_engine::shm::fuzzing::consume_scribbled(data);
});
