//! IBTA 1.5's ATOMIC WRITE: 8 bytes stored whole at an aligned address
//! under the remote write right, answered by a READ RESPONSE ONLY without
//! data, completed as `IBV_WC_ATOMIC_WRITE`; repeated, it is answered
//! again and never stored twice, as rxe has it.

use softrnic_sim::harness::{IOVA, Pair, PairOptions};
use softrnic_transport::{
    Access, MAX_DATAGRAM_LEN, Payload, QpType, RecvMeta, RemoteAddr, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};
use softrnic_wire::Opcode;
use softrnic_wire::packet::PacketRepr;

fn remote(pair: &Pair, offset: u64) -> RemoteAddr {
    RemoteAddr { addr: IOVA + offset, rkey: pair.b.mr.rkey }
}

fn word(pair: &Pair, offset: usize) -> [u8; 8] {
    pair.b.buffer.to_vec()[offset..offset + 8].try_into().unwrap()
}

fn atomic_write(pair: &mut Pair, wr_id: u64, offset: u64, value: [u8; 8]) {
    let to = remote(pair, offset);
    pair.post(0, wr_id, SendOp::AtomicWrite { remote: to, value }, Payload::Gather(Default::default()));
}

/// The packets `host` has to send now, in order.
fn burst(pair: &mut Pair, host: usize) -> Vec<Vec<u8>> {
    let now = pair.world.now;
    let mut buf = vec![0; MAX_DATAGRAM_LEN];
    let mut out = Vec::new();
    while let Some(t) = pair.world.device(host).poll_transmit(now, &mut buf) {
        out.push(buf[..t.len].to_vec());
    }
    out
}

fn deliver(pair: &mut Pair, to: usize, datagrams: &[Vec<u8>]) {
    let (now, from) = (pair.world.now, pair.world.hosts[1 - to].addr);
    for datagram in datagrams {
        pair.world.device(to).handle_datagram(now, from, RecvMeta::default(), datagram);
    }
}

fn opcode(datagram: &[u8]) -> Opcode {
    PacketRepr::parse(datagram).unwrap().headers.bth.opcode
}

#[test]
fn eight_bytes_land_whole_and_a_read_response_without_data_completes_them() {
    let mut pair = Pair::new(PairOptions::default());
    atomic_write(&mut pair, 1, 16, *b"one word");
    atomic_write(&mut pair, 2, 24, *b"and more");
    let done = pair.wait(0, 2);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect::<Vec<_>>(),
        [(1, WcStatus::Success, WcOpcode::AtomicWrite), (2, WcStatus::Success, WcOpcode::AtomicWrite)]
    );
    assert_eq!((&word(&pair, 16), &word(&pair, 24)), (b"one word", b"and more"));
    assert_eq!(pair.b.buffer.to_vec()[32..40], [0; 8], "nothing past the word");
}

#[test]
fn on_the_wire_a_reth_and_8_bytes_out_and_an_empty_read_response_back() {
    let mut pair = Pair::new(PairOptions::default());
    atomic_write(&mut pair, 1, 8, [7; 8]);
    let request = burst(&mut pair, 0);
    assert_eq!(request.len(), 1);
    let parsed = PacketRepr::parse(&request[0]).unwrap();
    assert_eq!(parsed.headers.bth.opcode, Opcode::RcAtomicWrite);
    let reth = parsed.headers.ext.reth.unwrap();
    assert_eq!((reth.virtual_address, reth.dma_length, parsed.payload), (IOVA + 8, 8, &[7u8; 8][..]));
    deliver(&mut pair, 1, &request);
    let answer = burst(&mut pair, 1);
    let parsed = PacketRepr::parse(&answer[0]).unwrap();
    assert_eq!((parsed.headers.bth.opcode, parsed.payload.len()), (Opcode::RcReadResponseOnly, 0));
    assert!(parsed.headers.ext.aeth.is_some());
}

/// Its response lost, the ATOMIC WRITE goes again with the WRITE after
/// it; the responder answers the repeat from what it kept and does not
/// store it again over the WRITE that followed.
#[test]
fn a_repeat_is_answered_and_not_stored_again() {
    let mut pair = Pair::new(PairOptions::default());
    atomic_write(&mut pair, 1, 0, *b"atomicly");
    pair.a.buffer.write(0, b"overwrit");
    pair.post(0, 2, SendOp::Write { remote: remote(&pair, 0), imm: None }, pair.a.gather(0, 8));
    let requests = burst(&mut pair, 0);
    assert_eq!(requests.iter().map(|d| opcode(d)).collect::<Vec<_>>(), [Opcode::RcAtomicWrite, Opcode::RcWriteOnly]);
    deliver(&mut pair, 1, &requests);
    assert_eq!(&word(&pair, 0), b"overwrit");
    // The ATOMIC WRITE's answer is lost; the WRITE's ACK arrives and
    // shows it missing.
    let answers = burst(&mut pair, 1);
    assert_eq!(answers.iter().map(|d| opcode(d)).collect::<Vec<_>>(), [Opcode::RcReadResponseOnly, Opcode::RcAck]);
    deliver(&mut pair, 0, &answers[1..]);
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(&word(&pair, 0), b"overwrit", "the repeat was answered, not stored again");
    assert!(pair.world.device(1).counters().rx_duplicate_requests >= 1);
}

#[test]
fn under_selective_repeat_one_that_arrives_early_waits_its_turn_with_its_bytes() {
    let mut pair = Pair::new(PairOptions { selective_repeat: true, ..PairOptions::default() });
    pair.a.buffer.write(0, &[1; 2048]);
    pair.post(0, 1, SendOp::Write { remote: remote(&pair, 4096), imm: None }, pair.a.gather(0, 2048));
    atomic_write(&mut pair, 2, 40, *b"in order");
    let mut requests = burst(&mut pair, 0);
    assert_eq!(requests.len(), 3);
    requests.rotate_left(2);
    deliver(&mut pair, 1, &requests);
    let [a, _] = pair.settle();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(&word(&pair, 40), b"in order");
}

#[test]
fn it_needs_the_remote_write_right_and_an_aligned_word() {
    let read_only = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut pair = Pair::new(PairOptions { access: read_only, ..PairOptions::default() });
    atomic_write(&mut pair, 1, 0, [1; 8]);
    assert_eq!(pair.wait(0, 1)[0].status, WcStatus::RemAccessErr);

    let mut pair = Pair::new(PairOptions::default());
    atomic_write(&mut pair, 1, 4, [1; 8]);
    assert_eq!(pair.wait(0, 1)[0].status, WcStatus::RemInvReqErr, "misaligned");
    assert_eq!(word(&pair, 0), [0; 8]);
}

#[test]
fn it_is_posted_without_data_besides_its_word_on_an_rc_qp_only() {
    let mut pair = Pair::new(PairOptions::default());
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let op = SendOp::AtomicWrite { remote: remote(&pair, 0), value: [0; 8] };
    let with_data = SendWorkRequest::new(1, op, pair.a.gather(0, 8));
    assert!(pair.world.device(0).post_send(now, qpn, with_data).is_err());
    let mut pair = Pair::new(PairOptions { qp_type: QpType::Uc, ..PairOptions::default() });
    let (now, qpn) = (pair.world.now, pair.a.qpn);
    let alone = SendWorkRequest::new(1, op, Payload::Gather(Default::default()));
    assert!(pair.world.device(0).post_send(now, qpn, alone).is_err(), "UC carries no ATOMIC WRITE");
}
