//! Latency tests, one request outstanding.
//!
//! - send_lat and write_lat are ping-pongs: the client sends (or writes),
//!   the server answers in kind as soon as the message is there, and half
//!   the round trip is the latency, as perftest reports it.
//! - read_lat and atomic_lat time each operation from post to completion;
//!   the server's application does nothing (its engine answers).
//!
//! The run ends in band: a SEND with [`STOP_IMM`], or a WRITE whose last
//! byte is [`STOP_MARK`], so the server needs no count (timed runs too).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use softrnic::{Completion, InlineData, Payload, RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus};

use super::account::{Account, Meter};
use super::params::Test;
use super::report::new_histogram;
use super::session::{Session, pattern};

const STOP_IMM: u32 = u32::MAX;
const STOP_MARK: u8 = 255;
/// Largest message sent inline (copied at post time), as perftest does.
const MAX_INLINE: usize = 236;

/// The marker the last byte of write number `i` carries: 1..=254, never
/// the initial 0 nor the stop mark.
fn marker(i: u64) -> u8 {
    (i % 254) as u8 + 1
}

struct Slots {
    out: usize,
    inbound: usize,
}

fn slots(s: &Session, size: usize) -> Slots {
    Slots { out: s.offset(0, 0, size), inbound: s.offset(0, 1, size) }
}

/// Polls until a completion that `want` accepts arrives; others are
/// checked for errors and dropped.
fn wait_for(s: &Session, want: impl Fn(&Completion) -> bool) -> Result<Completion, String> {
    let mut out = Vec::with_capacity(8);
    let started = Instant::now();
    loop {
        out.clear();
        s.cq.poll(8, &mut out);
        let mut found = None;
        for c in &out {
            if c.status != WcStatus::Success {
                return Err(format!("work request on QP {:#x} failed: {}", c.qp_num, c.status.as_str()));
            }
            if found.is_none() && want(c) {
                found = Some(*c);
            }
        }
        if let Some(c) = found {
            return Ok(c);
        }
        if started.elapsed() > s.timeout {
            return Err(format!("no answer for {:?}: the peer stopped answering", s.timeout));
        }
    }
}

/// Drains whatever completions are there, checking their status.
fn drain(s: &Session) -> Result<(), String> {
    let mut out = Vec::new();
    s.cq.poll(64, &mut out);
    match out.iter().find(|c| c.status != WcStatus::Success) {
        Some(c) => Err(format!("work request on QP {:#x} failed: {}", c.qp_num, c.status.as_str())),
        None => Ok(()),
    }
}

fn send(s: &Session, offset: usize, size: usize, imm: u32) -> Result<(), String> {
    let payload = if size <= MAX_INLINE {
        let mut bytes = InlineData::from_elem(0, size);
        s.mr.read(offset, &mut bytes);
        Payload::Inline(bytes)
    } else {
        s.mr.gather(offset, size as u32)
    };
    s.qps[0]
        .post_send(SendWorkRequest::new(u64::from(imm), SendOp::Send { imm: Some(imm) }, payload))
        .map_err(|e| e.to_string())
}

fn post_recv(s: &Session, offset: usize, size: usize) -> Result<(), String> {
    s.qps[0]
        .post_recv(RecvWorkRequest { wr_id: 0, sges: softrnic_transport::smallvec![s.mr.sge(offset, size as u32)] })
        .map_err(|e| e.to_string())
}

fn write(s: &Session, from: usize, to: usize, size: usize) -> Result<(), String> {
    let remote = softrnic::RemoteAddr { addr: s.remote[0].addr + to as u64, rkey: s.remote[0].rkey };
    s.qps[0]
        .post_send(SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, s.mr.gather(from, size as u32)))
        .map_err(|e| e.to_string())
}

/// Spins (making progress) until the last byte of `offset..+size` is one
/// of `marks`; returns it.
fn wait_for_mark(s: &Session, offset: usize, size: usize, marks: &[u8]) -> Result<u8, String> {
    let started = Instant::now();
    let mut byte = [0u8; 1];
    loop {
        s.mr.read(offset + size - 1, &mut byte);
        if marks.contains(&byte[0]) {
            return Ok(byte[0]);
        }
        drain(s)?;
        if started.elapsed() > s.timeout {
            return Err(format!("no write arrived for {:?}: the peer stopped answering", s.timeout));
        }
    }
}

/// How many timed iterations a client runs, after a warm-up.
struct Schedule {
    warmup: u64,
    iters: u64,
    duration: Option<Duration>,
}

impl Schedule {
    fn new(s: &Session) -> Schedule {
        let p = &s.params;
        Schedule { warmup: (p.iters / 10).clamp(1, 200), iters: p.iters, duration: p.duration }
    }

    /// Whether iteration `i` (counting the warm-up) runs.
    fn more(&self, i: u64, timed_start: Option<Instant>) -> bool {
        match (self.duration, timed_start) {
            (Some(d), Some(start)) => start.elapsed() < d,
            (Some(_), None) => true,
            (None, _) => i < self.warmup + self.iters,
        }
    }
}

/// The client's side; returns the latencies and a verification verdict.
pub fn client(s: &mut Session, size: usize) -> Result<(Histogram<u64>, Option<String>, Account), String> {
    let test = s.params.test;
    let verify = s.params.verify;
    let slot = slots(s, size);
    let schedule = Schedule::new(s);
    let mut histogram = new_histogram();
    let mut failure = None;
    let mut out_bytes = vec![0u8; size];
    let mut in_bytes = vec![0u8; size];
    if test == Test::SendLat {
        post_recv(s, slot.inbound, size)?;
    }
    s.exchange.barrier().map_err(|e| e.to_string())?;
    let mut i = 0u64;
    let mut timed_start = None;
    let mut meter = Meter::start();
    while schedule.more(i, timed_start) {
        if i == schedule.warmup {
            timed_start = Some(Instant::now());
            meter = Meter::start();
        }
        if verify {
            pattern(&mut out_bytes, i);
        }
        let t0;
        let round_trip;
        match test {
            Test::SendLat => {
                s.mr.write(slot.out, &out_bytes);
                t0 = Instant::now();
                send(s, slot.out, size, i as u32)?;
                wait_for(s, |c| c.opcode == WcOpcode::Recv)?;
                round_trip = true;
                if verify && failure.is_none() {
                    s.mr.read(slot.inbound, &mut in_bytes);
                    if in_bytes != out_bytes {
                        failure = Some(format!("the echo of message {i} differs"));
                    }
                }
                post_recv(s, slot.inbound, size)?;
            }
            Test::WriteLat => {
                out_bytes[size - 1] = marker(i);
                s.mr.write(slot.out, &out_bytes);
                t0 = Instant::now();
                write(s, slot.out, slot.inbound, size)?;
                wait_for_mark(s, slot.inbound, size, &[marker(i)])?;
                round_trip = true;
            }
            Test::ReadLat => {
                t0 = Instant::now();
                let remote = softrnic::RemoteAddr { addr: s.remote[0].addr + slot.out as u64, rkey: s.remote[0].rkey };
                s.qps[0]
                    .post_send(SendWorkRequest::new(i, SendOp::Read { remote }, s.mr.gather(slot.inbound, size as u32)))
                    .map_err(|e| e.to_string())?;
                wait_for(s, |c| c.opcode == WcOpcode::RdmaRead)?;
                round_trip = false;
                if verify && failure.is_none() {
                    s.mr.read(slot.inbound, &mut in_bytes);
                    pattern(&mut out_bytes, READ_SEED);
                    if in_bytes != out_bytes {
                        failure = Some(format!("READ {i} brought the wrong bytes"));
                    }
                }
            }
            Test::AtomicLat => {
                t0 = Instant::now();
                let remote = softrnic::RemoteAddr { addr: s.remote[0].addr + slot.out as u64, rkey: s.remote[0].rkey };
                s.qps[0]
                    .post_send(SendWorkRequest::new(
                        i,
                        SendOp::FetchAdd { remote, add: 1 },
                        s.mr.gather(slot.inbound, 8),
                    ))
                    .map_err(|e| e.to_string())?;
                wait_for(s, |c| c.opcode == WcOpcode::FetchAdd)?;
                round_trip = false;
                let mut word = [0u8; 8];
                s.mr.read(slot.inbound, &mut word);
                if verify && failure.is_none() && u64::from_ne_bytes(word) != i {
                    failure = Some(format!("fetch-and-add {i} returned {}", u64::from_ne_bytes(word)));
                }
            }
            _ => unreachable!("bandwidth tests have their own loop"),
        }
        let elapsed = t0.elapsed().as_nanos() as u64;
        if i >= schedule.warmup {
            let latency = if round_trip { elapsed / 2 } else { elapsed };
            histogram.record(latency.max(1)).map_err(|e| e.to_string())?;
        }
        i += 1;
    }
    let account = meter.per_op(histogram.len(), "round trip");
    // Tell the server to stop, in band where it is listening in band, and
    // wait until it has the message. (READ and ATOMIC servers listen on
    // the exchange only: nothing is in flight to wait for.)
    let stop_sent = match test {
        Test::SendLat => send(s, slot.out, size, STOP_IMM).map(|()| true)?,
        Test::WriteLat => {
            s.mr.write(slot.out + size - 1, &[STOP_MARK]);
            write(s, slot.out, slot.inbound, size).map(|()| true)?
        }
        _ => false,
    };
    if stop_sent {
        wait_for(s, |c| !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)).ok();
    }
    s.exchange.send_text("done").map_err(|e| e.to_string())?;
    let verdict = s.exchange.read_line().map_err(|e| e.to_string())?;
    if let Some(reason) = verdict.strip_prefix("failed ") {
        failure.get_or_insert_with(|| reason.to_string());
    }
    Ok((histogram, failure, account))
}

/// The bytes read_lat reads.
const READ_SEED: u64 = 0xfeed;

/// The server's side: answers until told to stop, then reports whether its
/// own checks passed.
pub fn server(s: &mut Session, size: usize) -> Result<(), String> {
    let test = s.params.test;
    let slot = slots(s, size);
    let verify = s.params.verify;
    let mut failure: Option<String> = None;
    match test {
        Test::SendLat => post_recv(s, slot.inbound, size)?,
        Test::ReadLat => {
            let mut bytes = vec![0u8; size];
            pattern(&mut bytes, READ_SEED);
            s.mr.write(slot.out, &bytes);
        }
        Test::AtomicLat => s.mr.write(slot.out, &0u64.to_ne_bytes()),
        _ => {}
    }
    s.exchange.barrier().map_err(|e| e.to_string())?;
    match test {
        Test::SendLat => loop {
            let c = wait_for(s, |c| c.opcode == WcOpcode::Recv)?;
            if c.imm_data == Some(STOP_IMM) {
                break;
            }
            post_recv(s, slot.inbound, size)?;
            send(s, slot.inbound, c.byte_len as usize, c.imm_data.unwrap_or(0))?;
        },
        Test::WriteLat => {
            let mut i = 0u64;
            let mut expected = vec![0u8; size];
            let mut actual = vec![0u8; size];
            loop {
                let mark = wait_for_mark(s, slot.inbound, size, &[marker(i), STOP_MARK])?;
                if mark == STOP_MARK {
                    break;
                }
                if verify && failure.is_none() && size > 1 {
                    pattern(&mut expected, i);
                    s.mr.read(slot.inbound, &mut actual);
                    if actual[..size - 1] != expected[..size - 1] {
                        failure = Some(format!("write {i} arrived with the wrong bytes"));
                    }
                }
                s.mr.write(slot.out + size - 1, &[marker(i)]);
                write(s, slot.out, slot.inbound, size)?;
                i += 1;
            }
        }
        _ => {}
    }
    let line = s.wait_for_line()?;
    if line != "done" {
        return Err(format!("the client said {line:?} instead of done"));
    }
    let verdict = match failure {
        Some(reason) => format!("failed {reason}"),
        None => "ok".to_string(),
    };
    s.exchange.send_text(&verdict).map_err(|e| e.to_string())
}
