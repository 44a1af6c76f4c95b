//! End-to-end credits (IBTA 9.7.7.2): a requester holds the SENDs its
//! responder has no receives for, rather than meeting RNR NAKs, so that a
//! program that sets `rnr_retry` 0 keeps its connection through a burst
//! longer than the peer's receive queue.

use softrnic_sim::Faults;
use softrnic_sim::harness::{Pair, PairOptions};
use softrnic_transport::{Completion, Payload, RecvWorkRequest, SendOp, WcStatus};

/// Receives the receiver keeps posted.
const DEPTH: u64 = 4;
/// SENDs in the burst: four times the receive queue.
const BURST: u64 = 16;
/// Bytes each receive takes.
const SLOT: u64 = 64;

fn message(i: u64) -> Vec<u8> {
    format!("message {i:02} of the burst").into_bytes()
}

/// Posts the burst at once on host 0 while host 1 keeps `DEPTH` receives
/// posted, reposting one as each completes (the next message's slot), and
/// runs until every message has landed, nothing moves, or 100,000 steps
/// (RNR retries for ever keep a stalled pair stepping). Returns both
/// sides' completions.
fn burst(pair: &mut Pair, repost: bool) -> [Vec<Completion>; 2] {
    for r in 0..DEPTH {
        pair.post_recv(1, 100 + r, r * SLOT, SLOT as u32);
    }
    for i in 0..BURST {
        pair.post(0, i, SendOp::Send { imm: None }, Payload::Inline(message(i)[..].into()));
    }
    let (mut sent, mut received) = (Vec::new(), Vec::new());
    let mut posted = DEPTH;
    for _ in 0..100_000 {
        if !pair.world.step() {
            break;
        }
        let (a_cq, b_cq) = (pair.a.cq, pair.b.cq);
        pair.world.device(0).poll_cq(a_cq, usize::MAX, &mut sent);
        let before = received.len();
        pair.world.device(1).poll_cq(b_cq, usize::MAX, &mut received);
        for _ in before..received.len() {
            if repost && posted < BURST {
                pair.post_recv(1, 100 + posted, posted * SLOT, SLOT as u32);
                posted += 1;
            }
        }
        if sent.len() as u64 == BURST && received.len() as u64 == BURST {
            break;
        }
    }
    [sent, received]
}

#[test]
fn a_burst_beyond_the_receive_queue_waits_for_credits_and_meets_no_rnr_nak() {
    for selective_repeat in [false, true] {
        for faults in [Faults::NONE, Faults { loss: 0.05, ..Faults::NONE }] {
            let what = format!("selective repeat {selective_repeat}, loss {}", faults.loss);
            let mut pair = Pair::new(PairOptions { rnr_retry: 0, selective_repeat, faults, ..PairOptions::default() });
            let [sent, received] = burst(&mut pair, true);
            let statuses: Vec<_> = sent.iter().map(|c| (c.wr_id, c.status)).collect();
            assert_eq!(statuses, (0..BURST).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>(), "{what}");
            let landed: Vec<_> = received.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
            let planned: Vec<_> = (0..BURST).map(|i| (100 + i, WcStatus::Success, message(i).len() as u32)).collect();
            assert_eq!(landed, planned, "{what}");
            let memory = pair.b.buffer.to_vec();
            for i in 0..BURST {
                let at = (i * SLOT) as usize;
                assert_eq!(memory[at..at + message(i).len()], message(i)[..], "{what}: message {i}");
            }
            let (sender, receiver) = (pair.world.device(0).counters().clone(), pair.world.device(1).counters().clone());
            assert_eq!(receiver.rnr_naks_sent, 0, "{what}");
            assert!(sender.credit_waits > 0, "{what}: the burst waited for credits");
            let credits = pair.world.device(0).qp(pair.a.qpn).unwrap().credits_available();
            assert!(credits.is_some_and(|c| c >= 0), "{what}: {credits:?}");
        }
    }
}

/// The same burst to a responder that counts no credits (a QP on a shared
/// receive queue advertises "unlimited") meets an empty queue, and with no
/// RNR retry fails: what every burst did before credits were honoured.
#[test]
fn without_credits_the_same_burst_fails_on_an_rnr_nak() {
    let mut pair = Pair::new(PairOptions { rnr_retry: 0, srq: true, ..PairOptions::default() });
    let srq = pair.b.srq.expect("an SRQ");
    for r in 0..DEPTH {
        let sges = softrnic_transport::smallvec![pair.b.sge(r * SLOT, SLOT as u32)];
        pair.world.device(1).post_srq_recv(srq, RecvWorkRequest { wr_id: 100 + r, sges }).unwrap();
    }
    for i in 0..BURST {
        pair.post(0, i, SendOp::Send { imm: None }, Payload::Inline(message(i)[..].into()));
    }
    let [sent, _] = pair.settle();
    assert!(sent.iter().any(|c| c.status == WcStatus::RnrRetryExcErr), "{sent:?}");
    assert!(pair.world.device(1).counters().rnr_naks_sent > 0);
    assert_eq!(pair.world.device(0).qp(pair.a.qpn).unwrap().credits_available(), None);
}

/// A receiver that stops reposting: the requester spends its credits, then
/// probes with one message at a time while nothing else is in flight; the
/// probes meet RNR NAKs (retried, `rnr_retry` 7) until receives are posted
/// again, and every message lands in order.
#[test]
fn at_zero_credits_one_probe_at_a_time_finds_the_receives_posted_later() {
    let mut pair = Pair::new(PairOptions { rnr_retry: 7, min_rnr_timer: 1, ..PairOptions::default() });
    let [sent, received] = burst(&mut pair, false);
    assert_eq!(sent.len() as u64, DEPTH, "only the messages with receives completed: {sent:?}");
    assert_eq!(received.len() as u64, DEPTH);
    let credits = pair.world.device(0).qp(pair.a.qpn).unwrap().credits_available();
    assert_eq!(credits, Some(-1), "the probe is out, and nothing else");
    assert!(pair.world.device(1).counters().rnr_naks_sent > 0, "the probe met an empty queue");
    for r in DEPTH..BURST {
        pair.post_recv(1, 100 + r, r * SLOT, SLOT as u32);
    }
    let [more_sent, more_received] = pair.settle();
    let all: Vec<_> = sent.iter().chain(&more_sent).map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(all, (0..BURST).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>());
    let landed: Vec<_> = received.iter().chain(&more_received).map(|c| c.wr_id).collect();
    assert_eq!(landed, (100..100 + BURST).collect::<Vec<_>>());
    assert!(pair.world.device(0).counters().credit_probes >= 2, "the first message and the one at zero credits");
}
