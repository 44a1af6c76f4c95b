//! Every operation on a perfect network, checked byte for byte, and then
//! the recovery paths one at a time on purpose.

use softrnic_sim::harness::{Pair, PairOptions};
use softrnic_transport::{RemoteAddr, SendOp, WcOpcode, WcStatus};

fn fill(pair: &Pair, host: usize, offset: usize, bytes: &[u8]) {
    pair.side(host).buffer.write(offset, bytes);
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

#[test]
fn send_lands_in_the_posted_receive() {
    let mut pair = Pair::new(PairOptions::default());
    let data = pattern(3000, 7);
    fill(&pair, 0, 0, &data);
    pair.post_recv(1, 77, 8192, 4096);
    pair.post(
        0,
        1,
        SendOp::Send { imm: Some(0xabcd) },
        pair.a.gather(0, 3000),
    );
    let sent = pair.wait(0, 1);
    let received = pair.wait(1, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].wr_id, sent[0].status, sent[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(received[0].wr_id, 77);
    assert_eq!(received[0].status, WcStatus::Success);
    assert_eq!(received[0].byte_len, 3000);
    assert_eq!(received[0].imm_data, Some(0xabcd));
    assert_eq!(&pair.b.buffer.to_vec()[8192..8192 + 3000], &data[..]);
}
