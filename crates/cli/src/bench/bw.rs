//! Bandwidth tests: keep `tx_depth` requests outstanding on every QP
//! (posted one at a time, or in lists of up to `post_list`), count
//! completions, and (for SEND) keep receives posted on the other end. One
//! loop does both duties, so a bidirectional run is the same code on both
//! ends.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use softrnic::{Completion, Payload, RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus};

use super::params::Test;
use super::report::BwResult;
use super::session::{Session, pattern};

/// What one end does in a bandwidth run.
#[derive(Debug, Clone, Copy)]
pub struct Duties {
    pub send: bool,
    /// Receive the peer's SENDs (send_bw only).
    pub receive: bool,
}

/// What one end saw.
#[derive(Debug, Clone, Default)]
pub struct BwOutcome {
    pub sent: u64,
    pub received: u64,
    /// How many requests the peer completed, as it reported.
    pub peer_sent: u64,
    pub elapsed: Duration,
    /// (time since start, messages completed) samples, for the peak.
    pub timeline: Vec<(Duration, u64)>,
    /// Why a check of the received data failed, if one did.
    pub verify_failure: Option<String>,
}

/// Receives kept posted per QP at most (each needs a slot of its own).
const RX_DEPTH: usize = 512;
/// How often a receiver of a timed run looks for the peer's count.
const LOOK_FOR_DONE: Duration = Duration::from_millis(1);

pub fn run(s: &mut Session, size: usize, duties: Duties) -> Result<BwOutcome, String> {
    let p = s.params.clone();
    let qps = s.qps.len();
    let slots = p.slots();
    let depth = p.tx_depth as u64;
    // Signal every n-th request (every one in a timed run, whose last is
    // not known in advance).
    let signal_every = if p.duration.is_some() { 1 } else { (depth / 4).clamp(1, 64) };
    let iters = p.iters;
    let timed = p.duration;

    let mut posted = vec![0u64; qps];
    let mut completed = vec![0u64; qps];
    let mut signalled: Vec<VecDeque<u64>> = vec![VecDeque::new(); qps];
    let mut recv_posted = vec![0u64; qps];
    let mut recv_done = vec![0u64; qps];
    // In a timed run the receiver learns how many to expect at the end,
    // from the peer's "done" line.
    let mut peer_done: Option<u64> = None;
    let counted = (timed.is_none()).then_some(iters * qps as u64);
    let qp_index: std::collections::HashMap<u32, usize> = s.qps.iter().enumerate().map(|(i, q)| (q.qpn(), i)).collect();
    let mut out = BwOutcome::default();
    let mut scratch = vec![0u8; size];

    if duties.receive {
        for (q, posted) in recv_posted.iter_mut().enumerate() {
            while (*posted as usize) < RX_DEPTH.min(slots) && (timed.is_some() || *posted < iters) {
                post_recv(s, q, *posted, size, slots)?;
                *posted += 1;
            }
        }
    }
    s.exchange.barrier().map_err(|e| e.to_string())?;

    let start = Instant::now();
    let mut last_progress = start;
    let mut told_peer = false;
    let mut next_look = start;
    let mut completions: Vec<Completion> = Vec::with_capacity(64);
    let mut list: Vec<SendWorkRequest> = Vec::with_capacity(p.post_list);
    loop {
        let now = Instant::now();
        let stop_posting = timed.is_some_and(|d| now - start >= d);
        if duties.send {
            for q in 0..qps {
                let may_post =
                    |posted: u64| !stop_posting && posted - completed[q] < depth && (timed.is_some() || posted < iters);
                while may_post(posted[q]) {
                    // A list of up to `-l` requests, as many as the depth
                    // and the iterations leave room for.
                    while list.len() < p.post_list && may_post(posted[q]) {
                        let i = posted[q];
                        let signal = timed.is_some() || (i + 1).is_multiple_of(signal_every) || i + 1 == iters;
                        list.push(send_request(s, q, i, size, slots, signal, &mut scratch));
                        if signal {
                            signalled[q].push_back(i);
                        }
                        posted[q] += 1;
                    }
                    s.qps[q].post_send_list(list.drain(..)).map_err(|e| e.to_string())?;
                }
            }
        }
        completions.clear();
        s.cq.poll(64, &mut completions);
        for c in &completions {
            if c.status != WcStatus::Success {
                return Err(format!("work request {:#x} on QP {:#x} failed: {}", c.wr_id, c.qp_num, c.status.as_str()));
            }
            let q = *qp_index.get(&c.qp_num).ok_or("completion for an unknown QP")?;
            if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                if p.verify && out.verify_failure.is_none() {
                    let i = recv_done[q];
                    s.mr.read(s.recv_offset(q, (i as usize) % slots, size), &mut scratch);
                    let mut expected = vec![0u8; size];
                    pattern(&mut expected, message_seed(q, i));
                    if scratch != expected {
                        out.verify_failure = Some(format!("message {i} on QP {q} differs from what was sent"));
                    }
                }
                recv_done[q] += 1;
                out.received += 1;
                if timed.is_some() || recv_posted[q] < iters {
                    post_recv(s, q, recv_posted[q], size, slots)?;
                    recv_posted[q] += 1;
                }
            } else {
                let i = signalled[q].pop_front().ok_or("a completion nobody asked for")?;
                completed[q] = i + 1;
            }
        }
        if !completions.is_empty() {
            last_progress = now;
        }
        if duties.send && !completions.is_empty() {
            let done: u64 = completed.iter().sum();
            out.timeline.push((start.elapsed(), done));
        }
        let sending_done = !duties.send
            || (posted == completed && (stop_posting || (timed.is_none() && posted.iter().all(|&n| n == iters))));
        if sending_done && !told_peer {
            out.elapsed = start.elapsed();
            out.sent = completed.iter().sum();
            s.exchange.send_text(&format!("done {}", out.sent)).map_err(|e| e.to_string())?;
            told_peer = true;
        }
        // The peer's "done" line is looked for once a millisecond: a look
        // is three system calls, which per loop would halve the rate.
        if duties.receive
            && counted.is_none()
            && peer_done.is_none()
            && now >= next_look
            && let Some(line) = s.exchange.try_read_line().map_err(|e| e.to_string())?
        {
            peer_done = Some(parse_done(&line)?);
        }
        if now >= next_look {
            next_look = now + LOOK_FOR_DONE;
        }
        let receiving_done = !duties.receive || counted.or(peer_done).is_some_and(|n| out.received >= n);
        if sending_done && receiving_done {
            break;
        }
        if now.saturating_duration_since(last_progress) > s.timeout {
            return Err(format!(
                "no completion for {:?}: the peer stopped answering (sent {}, received {})",
                s.timeout,
                completed.iter().sum::<u64>(),
                out.received
            ));
        }
    }
    out.peer_sent = match peer_done {
        Some(n) => n,
        None => parse_done(&s.wait_for_line()?)?,
    };
    Ok(out)
}

fn parse_done(line: &str) -> Result<u64, String> {
    line.strip_prefix("done ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("the peer said {line:?} instead of reporting its count"))
}

/// The seed of message `i` on QP `q`, for verified runs.
pub fn message_seed(q: usize, i: u64) -> u64 {
    ((q as u64) << 40) ^ i
}

fn post_recv(s: &Session, q: usize, i: u64, size: usize, slots: usize) -> Result<(), String> {
    let sge = s.mr.sge(s.recv_offset(q, (i as usize) % slots, size), size as u32);
    s.qps[q]
        .post_recv(RecvWorkRequest { wr_id: i, sges: softrnic_transport::smallvec![sge] })
        .map_err(|e| e.to_string())
}

/// The `i`-th request of QP `q`.
fn send_request(
    s: &Session,
    q: usize,
    i: u64,
    size: usize,
    slots: usize,
    signal: bool,
    scratch: &mut [u8],
) -> SendWorkRequest {
    let p = &s.params;
    let slot = (i as usize) % slots;
    let local = s.offset(q, slot, size);
    let remote_addr = s.remote[q].addr + local as u64;
    let remote = softrnic::RemoteAddr { addr: remote_addr, rkey: s.remote[q].rkey };
    if p.verify && matches!(p.test, Test::SendBw | Test::WriteBw) {
        pattern(scratch, message_seed(q, i));
        s.mr.write(local, scratch);
    }
    let (op, payload) = match p.test {
        Test::SendBw => (SendOp::Send { imm: None }, s.mr.gather(local, size as u32)),
        Test::WriteBw => (SendOp::Write { remote, imm: None }, s.mr.gather(local, size as u32)),
        Test::ReadBw => (SendOp::Read { remote }, s.mr.gather(local, size as u32)),
        Test::AtomicBw => {
            // Every QP adds to the first word of its part of the peer's buffer.
            let word =
                softrnic::RemoteAddr { addr: s.remote[q].addr + s.offset(q, 0, 0) as u64, rkey: s.remote[q].rkey };
            let result = s.recv_offset(q, slot, 8);
            (
                SendOp::FetchAdd { remote: word, add: 1 },
                Payload::Gather(softrnic_transport::smallvec![s.mr.sge(result, 8)]),
            )
        }
        _ => unreachable!("latency tests have their own loop"),
    };
    let mut wr = SendWorkRequest::new(i | ((q as u64) << 40), op, payload);
    wr.signaled = signal;
    wr
}

/// Checks, after a run, what only the end of it can show: the last WRITE of
/// each slot, the READ data, the atomic counters.
pub fn verify_after(s: &Session, size: usize, sent_by_peer: u64, i_am_target: bool) -> Option<String> {
    let p = &s.params;
    let slots = p.slots();
    let per_qp = if s.qps.is_empty() { 0 } else { sent_by_peer / s.qps.len() as u64 };
    let mut actual = vec![0u8; size];
    let mut expected = vec![0u8; size];
    for q in 0..s.qps.len() {
        match p.test {
            Test::WriteBw if i_am_target => {
                for slot in 0..slots.min(per_qp as usize) {
                    // The last message that went to this slot.
                    let last = (per_qp - 1) - ((per_qp - 1 - slot as u64) % slots as u64);
                    s.mr.read(s.offset(q, slot, size), &mut actual);
                    pattern(&mut expected, message_seed(q, last));
                    if actual != expected {
                        return Some(format!("slot {slot} of QP {q} does not hold write {last}"));
                    }
                }
            }
            Test::ReadBw if !i_am_target => {
                for slot in 0..slots.min(p.iters as usize) {
                    s.mr.read(s.offset(q, slot, size), &mut actual);
                    pattern(&mut expected, read_seed(q, slot));
                    if actual != expected {
                        return Some(format!("READ into slot {slot} of QP {q} brought the wrong bytes"));
                    }
                }
            }
            Test::AtomicBw if i_am_target => {
                let mut word = [0u8; 8];
                s.mr.read(s.offset(q, 0, 0), &mut word);
                if u64::from_ne_bytes(word) != per_qp {
                    return Some(format!(
                        "QP {q}'s counter is {} after {per_qp} fetch-and-adds",
                        u64::from_ne_bytes(word)
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// The seed of the bytes a READ finds in slot `slot` of QP `q`.
pub fn read_seed(q: usize, slot: usize) -> u64 {
    0x5eed_0000_0000 ^ ((q as u64) << 20) ^ slot as u64
}

/// Fills the slots a READ test reads from, and zeroes atomic counters.
pub fn prepare_target(s: &Session, size: usize) {
    let p = &s.params;
    let mut bytes = vec![0u8; size];
    for q in 0..s.qps.len() {
        match p.test {
            Test::ReadBw => {
                for slot in 0..p.slots() {
                    pattern(&mut bytes, read_seed(q, slot));
                    s.mr.write(s.offset(q, slot, size), &bytes);
                }
            }
            Test::AtomicBw => s.mr.write(s.offset(q, 0, 0), &0u64.to_ne_bytes()),
            _ => {}
        }
    }
}

/// The best rate over tenths of the run, in messages per second.
pub fn peak_rate(timeline: &[(Duration, u64)], total: u64) -> f64 {
    let step = (total / 10).max(1);
    let mut best = 0.0f64;
    let mut from = (Duration::ZERO, 0u64);
    for &(t, done) in timeline {
        if done >= from.1 + step && t > from.0 {
            best = best.max((done - from.1) as f64 / (t - from.0).as_secs_f64());
            from = (t, done);
        }
    }
    best
}

pub fn result(test: Test, s: &Session, size: usize, o: &BwOutcome, verified: Option<bool>) -> BwResult {
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let rate = o.sent as f64 / secs;
    let peak = peak_rate(&o.timeline, o.sent).max(rate);
    let gbps = |msgs_per_sec: f64| msgs_per_sec * size as f64 * 8.0 / 1e9;
    let counters = s.ctx.counters().transport;
    BwResult {
        test: test.name(),
        size,
        iters: o.sent,
        qps: s.qps.len(),
        tx_depth: s.params.tx_depth,
        post_list: s.params.post_list,
        mtu: s.params.mtu.bytes(),
        bw_peak_gbps: gbps(peak),
        bw_avg_gbps: gbps(rate),
        msg_rate_mpps: rate / 1e6,
        seconds: secs,
        verified,
        retransmitted: counters.retransmitted_packets,
        timeouts: counters.timeouts,
        by_reference: counters.tx_by_reference + counters.rx_by_reference,
        registered_bytes: s.mr.len(),
        resident_peak_bytes: super::report::resident_peak_bytes(),
        account: None,
    }
}
