//! Property tests: every packet softrnic can emit parses back to itself, and
//! no byte string makes the parser panic or read out of bounds.

use proptest::prelude::*;
use softrnic_wire::aeth::{NakCode, Syndrome};
use softrnic_wire::icrc::UdpFlow;
use softrnic_wire::packet::SelectiveRepeatLayout;
use softrnic_wire::packet::{Extensions, Headers, PacketRepr};
use softrnic_wire::{Opcode, Psn, aeth, atomic_eth, bth, deth, reth, sack, sreth};

fn opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::ALL.to_vec())
}

fn syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credit_code| Syndrome::Ack { credit_code }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        prop::sample::select(vec![
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ])
        .prop_map(Syndrome::Nak),
    ]
}

prop_compose! {
    fn headers()(
        opcode in opcode(),
        solicited: bool, migration: bool, pkey: u16, fecn: bool, becn: bool,
        dest_qpn in 0u32..1 << 24, ack_request: bool, psn in 0u32..1 << 24,
        qkey: u32, src_qpn in 0u32..1 << 24,
        va: u64, rkey: u32, len: u32, swap: u64, compare: u64,
        syndrome in syndrome(), msn in 0u32..1 << 24, original: u64, imm: u32, inv: u32,
        selective: bool, offset: u32, receive_number: u32, sack_words: [u64; 8],
    ) -> Headers {
        let l = opcode.layout();
        let mut bth = bth::Repr { opcode, solicited, migration, pad_count: 0, pkey, fecn, becn, dest_qpn, ack_request, psn: Psn::new(psn), selective_repeat: selective };
        // Version 1 only where softrnic's selective-repeat headers exist.
        bth.selective_repeat &= SelectiveRepeatLayout::of(&bth).is_ok();
        let s = SelectiveRepeatLayout::of(&bth).unwrap();
        Headers {
            bth,
            ext: Extensions {
                deth: l.deth.then_some(deth::Repr { qkey, src_qpn }),
                reth: l.reth.then_some(reth::Repr { virtual_address: va, rkey, dma_length: len }),
                atomic_eth: l.atomic_eth.then_some(atomic_eth::Repr { virtual_address: va, rkey, swap_or_add: swap, compare }),
                aeth: l.aeth.then_some(aeth::Repr { syndrome, msn }),
                atomic_ack: l.atomic_ack_eth.then_some(original),
                immediate: l.immdt.then_some(imm),
                invalidate_rkey: l.ieth.then_some(inv),
                sreth: s.sreth.then_some(sreth::Repr { virtual_address: va, rkey, message_length: len, offset, receive_number }),
                sack: s.sack.then_some(sack::Repr { words: sack_words }),
            },
        }
    }
}

proptest! {
    #[test]
    fn emit_then_parse_is_identity(headers in headers(), payload in prop::collection::vec(any::<u8>(), 0..600)) {
        let payload: &[u8] = if headers.bth.opcode.layout().payload { &payload } else { &[] };
        let repr = PacketRepr { headers, payload };
        let mut buf = vec![0u8; repr.buffer_len()];
        let len = repr.emit(&mut buf).unwrap();
        prop_assert_eq!(len, buf.len());
        prop_assert_eq!(len % 4, 0);
        let parsed = PacketRepr::parse(&buf).unwrap();
        prop_assert_eq!(parsed.payload, payload);
        prop_assert_eq!(parsed.headers.ext, headers.ext);
        let mut bth = headers.bth;
        bth.pad_count = parsed.headers.bth.pad_count;
        prop_assert_eq!(parsed.headers.bth, bth);
        prop_assert_eq!((payload.len() + usize::from(bth.pad_count)) % 4, 0);
    }

    #[test]
    fn sealed_packets_verify_and_any_flip_is_caught(headers in headers(), payload in prop::collection::vec(any::<u8>(), 0..300), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let payload: &[u8] = if headers.bth.opcode.layout().payload { &payload } else { &[] };
        let repr = PacketRepr { headers, payload };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf).unwrap();
        let flow = UdpFlow { src: [127, 0, 0, 2].into(), dst: [127, 0, 0, 3].into(), src_port: 4791, dst_port: 4791 };
        flow.seal(&mut buf).unwrap();
        prop_assert!(flow.verify(&buf).is_ok());
        let index = flip.index(buf.len());
        // Byte 4 of the BTH is masked out of the ICRC by design.
        prop_assume!(index != 4);
        buf[index] ^= 1 << bit;
        prop_assert!(flow.verify(&buf).is_err());
    }

    #[test]
    fn parsing_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(repr) = PacketRepr::parse(&bytes) {
            // Whatever parses re-emits to the same length.
            prop_assert_eq!(repr.buffer_len(), bytes.len());
        }
        let flow = UdpFlow { src: [127, 0, 0, 1].into(), dst: [127, 0, 0, 1].into(), src_port: 4791, dst_port: 4791 };
        let _ = flow.verify(&bytes);
    }
}
