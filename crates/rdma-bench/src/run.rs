//! What each thread does with its QP: the client streams SENDs (or, with
//! one outstanding, pings and times the echo); the server receives,
//! verifies every byte against the pattern, and in latency mode echoes.
//!
//! Message `n` of thread `t` is a known pattern: its first eight bytes
//! are `n`, the rest a sequence seeded by `n` and `t`, so a lost,
//! repeated, reordered or corrupted message fails verification.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use softrnic_rdma_bench::report;

use crate::exchange::Workload;
use crate::snap::SnapWork;
use crate::verbs::{Buffer, Completion, Qp};

/// Fills `out` with message `n` of thread `thread`.
pub fn pattern(thread: u32, n: u64, out: &mut [u8]) {
    let header = n.to_le_bytes();
    let seed = (n as u32).wrapping_mul(31).wrapping_add(thread.wrapping_mul(17));
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = match header.get(i) {
            Some(&b) => b,
            None => seed.wrapping_add(i as u32) as u8,
        };
    }
}

/// Receives a server keeps posted per outstanding message, so that a
/// receiver a little behind never makes the sender wait for a receive.
pub const RECEIVES_PER_OUTSTANDING: u32 = 2;

/// Bytes of registered memory a thread's buffer needs on each side.
pub fn buffer_needed(w: &Workload, server: bool) -> usize {
    let slots = match (w.outstanding == 1, server) {
        (true, _) => 3,
        (false, true) => w.outstanding * RECEIVES_PER_OUTSTANDING,
        (false, false) => w.outstanding,
    };
    slots as usize * w.pack_size as usize
}

/// Empty polls a thread spins through before it starts yielding.
const SPINS: u32 = 256;

/// Waits for at least one completion, failing on an unsuccessful one. It
/// spins, then yields the core between empty polls: with more polling
/// threads than cores (8 QPs a side on 2 cores) spinning threads starved
/// the ones with work (64 B over 8 QPs ran 60 times slower); with a core
/// each, a yield returns at once.
fn poll(qp: &Qp, thread: u32, out: &mut Vec<Completion>) -> Result<(), String> {
    out.clear();
    let mut empty = 0;
    while qp.poll(out, 16)? == 0 {
        empty += 1;
        if empty >= SPINS {
            std::thread::yield_now();
        }
    }
    match out.iter().find(|c| c.status != 0) {
        Some(c) => {
            Err(format!("thread [{thread}]: work request {} completed with {}", c.wr_id, qp.status_str(c.status)))
        }
        None => Ok(()),
    }
}

/// The client's throughput loop: keeps `outstanding` SENDs in flight
/// until every message has gone. Returns how long it took.
pub fn send_stream(qp: &Qp, buf: &Buffer, thread: u32, w: &Workload) -> Result<Duration, String> {
    let (pack, depth) = (w.pack_size as usize, u64::from(w.outstanding));
    let mut message = vec![0u8; pack];
    let mut completions = Vec::with_capacity(16);
    let (mut posted, mut done) = (0u64, 0u64);
    if !w.verify {
        // Each slot filled once: the messages are what the slots hold.
        for slot in 0..depth.min(w.messages) {
            pattern(thread, slot, &mut message);
            buf.write(slot as usize * pack, &message);
        }
    }
    let start = Instant::now();
    while done < w.messages {
        while posted < w.messages && posted - done < depth {
            let offset = (posted % depth) as usize * pack;
            if w.verify {
                pattern(thread, posted, &mut message);
                buf.write(offset, &message);
            }
            qp.post_send(posted, buf.addr(offset), w.pack_size, buf.lkey())?;
            posted += 1;
        }
        poll(qp, thread, &mut completions)?;
        done += completions.len() as u64;
    }
    Ok(start.elapsed())
}

/// Posts the server's first receives; done before the client may send.
pub fn post_receives(qp: &Qp, buf: &Buffer, w: &Workload) -> Result<(), String> {
    let slots = if w.outstanding == 1 { 2 } else { u64::from(w.outstanding * RECEIVES_PER_OUTSTANDING) };
    for slot in 0..slots.min(w.messages) {
        let offset = slot as usize * w.pack_size as usize;
        qp.post_recv(slot, buf.addr(offset), w.pack_size, buf.lkey())?;
    }
    Ok(())
}

/// Checks message `n` in `got`.
fn verify(thread: u32, n: u64, got: &[u8], want: &mut [u8]) -> Result<(), String> {
    pattern(thread, n, want);
    match got.iter().zip(want.iter()).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!(
            "Data verification failed, thread [{thread}], message [{n}], byte [{i}]: expected {:#04x}, got {:#04x}",
            want[i], got[i]
        )),
    }
}

/// The server's throughput loop: every message verified in order, its
/// receive posted again while more are due. Returns the time from the
/// first message to the last.
/// With `snap`, each message also gets the Snap-like baseline's work.
pub fn receive_stream(
    qp: &Qp,
    buf: &Buffer,
    thread: u32,
    w: &Workload,
    mut snap: Option<&mut SnapWork>,
) -> Result<Duration, String> {
    let pack = w.pack_size as usize;
    let slots = u64::from(w.outstanding * RECEIVES_PER_OUTSTANDING);
    let (mut got, mut want) = (vec![0u8; pack], vec![0u8; pack]);
    let mut completions = Vec::with_capacity(16);
    let mut posted = slots.min(w.messages);
    let mut start = None;
    let mut n = 0;
    while n < w.messages {
        poll(qp, thread, &mut completions)?;
        for c in &completions {
            start.get_or_insert_with(Instant::now);
            // Receives complete in the order they were posted, one message
            // each: the n-th completion holds message n.
            let offset = c.wr_id as usize * pack;
            if w.verify || snap.is_some() {
                buf.read(offset, &mut got);
            }
            if let Some(snap) = snap.as_deref_mut() {
                snap.per_message(&got, c);
            }
            if w.verify {
                verify(thread, n, &got, &mut want)?;
            }
            n += 1;
            if posted < w.messages {
                qp.post_recv(c.wr_id, buf.addr(offset), w.pack_size, buf.lkey())?;
                posted += 1;
            }
        }
    }
    Ok(start.map_or(Duration::ZERO, |s| s.elapsed()))
}

/// The client's latency loop: one message at a time, each timed from its
/// post to the arrival of the server's echo, which is verified too.
pub fn ping(qp: &Qp, buf: &Buffer, thread: u32, w: &Workload) -> Result<Histogram<u64>, String> {
    let pack = w.pack_size as usize;
    let (mut message, mut echo) = (vec![0u8; pack], vec![0u8; pack]);
    let mut completions = Vec::with_capacity(16);
    let mut histogram = report::histogram();
    for n in 0..w.messages {
        qp.post_recv(n, buf.addr(pack), w.pack_size, buf.lkey())?;
        pattern(thread, n, &mut message);
        buf.write(0, &message);
        let start = Instant::now();
        qp.post_send(n, buf.addr(0), w.pack_size, buf.lkey())?;
        let (mut sent, mut answered) = (false, false);
        while !(sent && answered) {
            poll(qp, thread, &mut completions)?;
            for c in &completions {
                if c.is_recv { answered = true } else { sent = true }
            }
        }
        histogram.record(start.elapsed().as_nanos() as u64).map_err(|e| format!("recording a latency: {e}"))?;
        buf.read(pack, &mut echo);
        verify(thread, n, &echo, &mut message)?;
    }
    Ok(histogram)
}

/// The server's latency loop: verifies each message and sends it back.
pub fn echo(qp: &Qp, buf: &Buffer, thread: u32, w: &Workload) -> Result<Duration, String> {
    let pack = w.pack_size as usize;
    let send_offset = 2 * pack;
    let (mut got, mut want) = (vec![0u8; pack], vec![0u8; pack]);
    let (mut completions, mut sends) = (Vec::with_capacity(16), Vec::with_capacity(16));
    let mut posted = 2.min(w.messages);
    let mut echo_in_flight = false;
    let mut start = None;
    let mut n = 0;
    while n < w.messages || echo_in_flight {
        poll(qp, thread, &mut completions)?;
        // The echo in flight may complete in the same batch as the next
        // message, after it: sends first.
        if completions.iter().any(|c| !c.is_recv) {
            echo_in_flight = false;
        }
        for c in completions.iter().filter(|c| c.is_recv) {
            start.get_or_insert_with(Instant::now);
            let offset = c.wr_id as usize * pack;
            buf.read(offset, &mut got);
            verify(thread, n, &got, &mut want)?;
            n += 1;
            // The previous echo's slot is free once its send completes;
            // no other message can arrive meanwhile (the client waits for
            // this one's echo).
            while echo_in_flight {
                poll(qp, thread, &mut sends)?;
                echo_in_flight = !sends.iter().any(|c| !c.is_recv);
            }
            buf.write(send_offset, &got);
            qp.post_send(n - 1, buf.addr(send_offset), w.pack_size, buf.lkey())?;
            echo_in_flight = true;
            if posted < w.messages {
                qp.post_recv(c.wr_id, buf.addr(offset), w.pack_size, buf.lkey())?;
                posted += 1;
            }
        }
    }
    Ok(start.map_or(Duration::ZERO, |s| s.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_tells_messages_and_threads_apart() {
        let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
        pattern(0, 7, &mut a);
        pattern(0, 7, &mut b);
        assert_eq!(a, b);
        pattern(0, 8, &mut b);
        assert_ne!(a, b);
        pattern(1, 7, &mut b);
        assert_ne!(a, b);
        assert_eq!(&a[..8], &7u64.to_le_bytes());
        let mut want = vec![0u8; 64];
        assert!(verify(0, 7, &a, &mut want).is_ok());
        a[40] ^= 1;
        let error = verify(0, 7, &a, &mut want).unwrap_err();
        assert!(error.starts_with("Data verification failed, thread [0], message [7], byte [40]"), "{error}");
    }
}
