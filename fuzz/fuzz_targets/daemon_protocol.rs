//! What a tenant sends softrnicd: requests on the control socket
//! (postcard), work requests in its rings or forwarded over the socket
//! (`wqe`), and the storage blocks its block offload parses in messages
//! (`block`). Whatever decodes re-encodes to what decodes the same; the
//! WQE parsers never panic and never take more SGEs or inline bytes than
//! the QP's caps; a block header that parses asks for no more than a
//! block.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrnic_daemon_protocol::block::{Ack, BLOCK_LEN, BlockRepr, HEADER_LEN};
use softrnic_daemon_protocol::protocol::Request;
use softrnic_daemon_protocol::wqe::{self, CQE_LEN};
use softrnic_transport::Payload;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = postcard::from_bytes::<Request>(data) {
        let again = postcard::to_stdvec(&request).expect("a decoded request encodes");
        let twice: Request = postcard::from_bytes(&again).expect("an encoded request decodes");
        assert_eq!(format!("{twice:?}"), format!("{request:?}"));
    }
    let (max_sge, max_inline) = (usize::from(data.first().copied().unwrap_or(0) % 32), 256);
    if let Ok(wr) = wqe::parse_send(data, max_sge, max_inline) {
        match &wr.payload {
            Payload::Gather(sges) => assert!(sges.len() <= max_sge),
            Payload::Inline(bytes) => assert!(bytes.len() <= max_inline),
        }
    }
    if let Ok(wr) = wqe::parse_recv(data, max_sge) {
        assert!(wr.sges.len() <= max_sge);
    }
    if let Ok(block) = BlockRepr::parse_bytes(data) {
        assert!(block.message_len() <= HEADER_LEN + BLOCK_LEN);
        assert_eq!(BlockRepr::parse_bytes(&block.to_bytes()), Ok(block));
    }
    if let Ok(ack) = Ack::parse(data) {
        assert_eq!(Ack::parse(&ack.to_bytes()), Ok(ack));
    }
    if let Some(cqe) = data.get(..CQE_LEN) {
        let _ = wqe::parse_completion(cqe.try_into().expect("CQE_LEN bytes"));
    }
});
