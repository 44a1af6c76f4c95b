//! The account: where a message's time goes.
//!
//! Every cost the datapath pays that a profile would smear out (a system
//! call and its kind, a wake-up, a byte copied, a byte run through the
//! ICRC, a lock taken or waited for) is counted where it is paid, with
//! [`add`]. `softrnic bench --account` reads the sum ([`snapshot`]) before
//! and after its measured loop and divides by the operations in between:
//! the costs of one round trip, or of one message. Time spent in system
//! calls and in passes is counted too, while [`set_timing`] asks for it
//! (clock reads are not free on a VM).
//!
//! Counting must cost less than what it counts, on any number of cores:
//! each thread counts into its own cache line ([`add`] is a load and a
//! store, no atomic read-modify-write, nothing shared), as `perf` keeps
//! per-CPU counts, and [`snapshot`] sums every thread's line. A thread
//! that exits folds its counts into the retired total first, so nothing
//! counted is lost and the list of lines stays as long as the threads
//! alive.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// One kind of cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Cost {
    /// `sendmmsg` calls, and the datagrams they carried.
    SendCalls,
    DatagramsSent,
    /// `recvmmsg` calls, those that found nothing, and the datagrams they
    /// brought.
    ReceiveCalls,
    EmptyReceives,
    DatagramsReceived,
    /// Bytes handed to the kernel by send calls, and taken from it by
    /// receive calls (the kernel copies each once).
    BytesToKernel,
    BytesFromKernel,
    /// Threads that blocked in `poll(2)` (a sleep, and a wake-up after it).
    Sleeps,
    /// Wake-ups sent: an eventfd written, a peer's shared-memory doorbell
    /// rung.
    WakeSignals,
    Doorbells,
    /// eventfd reads.
    WakeReads,
    /// Payload bytes copied by softrnic's own code: out of or into a
    /// registered region, into or out of a shared-memory ring.
    BytesCopied,
    /// Bytes run through the ICRC, computed or checked.
    IcrcBytes,
    /// A shard's locks taken, and those of them found held by another
    /// thread (a wait, or a pass left to that thread).
    Locks,
    LocksContended,
    /// Time (ns), counted only while [`timing`] is on: in send calls, in
    /// receive calls that brought something and in those that found
    /// nothing; in receive passes and transmit passes that moved
    /// something (their system calls included: the rest is softrnic's own
    /// work on the packets).
    SendNanos,
    ReceiveNanos,
    EmptyReceiveNanos,
    ReceivePassNanos,
    TransmitPassNanos,
}

impl Cost {
    /// Every cost, in the order [`Tally`] keeps them.
    pub const ALL: [Cost; COSTS] = [
        Cost::SendCalls,
        Cost::DatagramsSent,
        Cost::ReceiveCalls,
        Cost::EmptyReceives,
        Cost::DatagramsReceived,
        Cost::BytesToKernel,
        Cost::BytesFromKernel,
        Cost::Sleeps,
        Cost::WakeSignals,
        Cost::Doorbells,
        Cost::WakeReads,
        Cost::BytesCopied,
        Cost::IcrcBytes,
        Cost::Locks,
        Cost::LocksContended,
        Cost::SendNanos,
        Cost::ReceiveNanos,
        Cost::EmptyReceiveNanos,
        Cost::ReceivePassNanos,
        Cost::TransmitPassNanos,
    ];

    /// The name the account prints (`softrnic bench --json`'s keys).
    pub fn name(self) -> &'static str {
        match self {
            Cost::SendCalls => "send_calls",
            Cost::DatagramsSent => "datagrams_sent",
            Cost::ReceiveCalls => "receive_calls",
            Cost::EmptyReceives => "empty_receives",
            Cost::DatagramsReceived => "datagrams_received",
            Cost::BytesToKernel => "bytes_to_kernel",
            Cost::BytesFromKernel => "bytes_from_kernel",
            Cost::Sleeps => "sleeps",
            Cost::WakeSignals => "wake_signals",
            Cost::Doorbells => "doorbells",
            Cost::WakeReads => "wake_reads",
            Cost::BytesCopied => "bytes_copied",
            Cost::IcrcBytes => "icrc_bytes",
            Cost::Locks => "locks",
            Cost::LocksContended => "locks_contended",
            Cost::SendNanos => "send_ns",
            Cost::ReceiveNanos => "receive_ns",
            Cost::EmptyReceiveNanos => "empty_receive_ns",
            Cost::ReceivePassNanos => "receive_pass_ns",
            Cost::TransmitPassNanos => "transmit_pass_ns",
        }
    }
}

/// How many kinds of cost there are.
pub const COSTS: usize = 20;

/// The counts of every cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally([u64; COSTS]);

impl Tally {
    pub fn get(&self, cost: Cost) -> u64 {
        self.0[cost as usize]
    }

    /// What was counted between `earlier` and this tally.
    pub fn since(&self, earlier: &Tally) -> Tally {
        Tally(std::array::from_fn(|i| self.0[i].wrapping_sub(earlier.0[i])))
    }

    /// Each cost with its name.
    pub fn iter(&self) -> impl Iterator<Item = (Cost, u64)> + '_ {
        Cost::ALL.iter().map(|&cost| (cost, self.get(cost)))
    }
}

/// One thread's counts, alone on its cache lines.
#[repr(align(128))]
#[derive(Default)]
struct Line([AtomicU64; COSTS]);

impl Line {
    fn read(&self) -> Tally {
        Tally(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// Every living thread's line, and what exited threads counted.
struct Ledger {
    living: Vec<Arc<Line>>,
    retired: Tally,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger { living: Vec::new(), retired: Tally([0; COSTS]) });

fn ledger() -> MutexGuard<'static, Ledger> {
    // Counts stay consistent whatever panicked while holding the lock.
    LEDGER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This thread's line, registered in the ledger while the thread lives.
struct Own(Arc<Line>);

impl Own {
    fn register() -> Own {
        let line = Arc::new(Line::default());
        ledger().living.push(line.clone());
        Own(line)
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        let mut ledger = ledger();
        ledger.living.retain(|line| !Arc::ptr_eq(line, &self.0));
        let counted = self.0.read();
        for (i, total) in ledger.retired.0.iter_mut().enumerate() {
            *total = total.wrapping_add(counted.0[i]);
        }
    }
}

thread_local! {
    static OWN: Own = Own::register();
}

/// Counts `n` of `cost` against this thread.
#[inline]
pub fn add(cost: Cost, n: u64) {
    // A thread being torn down counts nothing more (its line is folded).
    let _ = OWN.try_with(|own| {
        let slot = &own.0.0[cost as usize];
        // Only this thread writes its line: no read-modify-write needed.
        slot.store(slot.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    });
}

/// Counts one of `cost`.
#[inline]
pub fn one(cost: Cost) {
    add(cost, 1)
}

/// Whether time is counted: two clock reads per system call and pass,
/// which the datapath pays only while someone asks (`softrnic bench
/// --account`).
static TIMING: AtomicBool = AtomicBool::new(false);

/// Turns the counting of time on or off for the whole process.
pub fn set_timing(on: bool) {
    TIMING.store(on, Ordering::Relaxed);
}

/// A stretch of time to count, started only while timing is on.
#[must_use = "a timer counts when it stops"]
pub struct Timer(Option<Instant>);

/// Starts timing a stretch (nothing, unless [`set_timing`] turned timing
/// on).
#[inline]
pub fn timing() -> Timer {
    Timer(TIMING.load(Ordering::Relaxed).then(Instant::now))
}

impl Timer {
    /// Counts the time since the timer started as `cost`.
    #[inline]
    pub fn stop(self, cost: Cost) {
        if let Some(start) = self.0 {
            add(cost, start.elapsed().as_nanos() as u64);
        }
    }
}

/// Everything counted in this process so far, by every thread.
pub fn snapshot() -> Tally {
    let ledger = ledger();
    let mut sum = ledger.retired;
    for line in &ledger.living {
        let counted = line.read();
        for (i, total) in sum.0.iter_mut().enumerate() {
            *total = total.wrapping_add(counted.0[i]);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_in_order() {
        let names: std::collections::HashSet<_> = Cost::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), COSTS);
        for (i, cost) in Cost::ALL.iter().enumerate() {
            assert_eq!(*cost as usize, i);
        }
    }

    /// Threads count at once, some exit while others still count and a
    /// reader sums: the reader's sums never go down, and once every
    /// thread is done the sum is exactly what they counted (the exited
    /// threads' counts folded, none lost). Other tests of this binary
    /// count too, so only this test's own cost is compared, and only
    /// this test counts `LocksContended`.
    #[test]
    fn every_count_survives_its_thread_and_sums_exactly() {
        const THREADS: u64 = 8;
        const EACH: u64 = 100_000;
        let before = snapshot().get(Cost::LocksContended);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    let now = snapshot().get(Cost::LocksContended);
                    assert!(now >= last, "a sum went down: {last} then {now}");
                    last = now;
                }
            })
        };
        let counters: Vec<_> = (0..THREADS)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        // Threads of different lengths: some exit early.
                        if t % 2 == 0 && i == EACH / 2 {
                            add(Cost::LocksContended, EACH - i);
                            return;
                        }
                        one(Cost::LocksContended);
                    }
                })
            })
            .collect();
        for thread in counters {
            thread.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(snapshot().get(Cost::LocksContended) - before, THREADS * EACH);
        assert!(ledger().living.len() < 4, "exited threads' lines are dropped");
    }

    /// Time is counted only while timing is on.
    #[test]
    fn time_counts_only_while_timing_is_on() {
        let before = snapshot().get(Cost::TransmitPassNanos);
        let timer = timing();
        std::thread::sleep(std::time::Duration::from_millis(2));
        timer.stop(Cost::TransmitPassNanos);
        assert_eq!(snapshot().get(Cost::TransmitPassNanos), before, "off by default");
        set_timing(true);
        let timer = timing();
        std::thread::sleep(std::time::Duration::from_millis(2));
        timer.stop(Cost::TransmitPassNanos);
        set_timing(false);
        assert!(snapshot().get(Cost::TransmitPassNanos) - before >= 2_000_000);
    }

    #[test]
    fn since_subtracts_cost_by_cost() {
        let mut a = Tally::default();
        let mut b = Tally::default();
        a.0[Cost::IcrcBytes as usize] = 10;
        b.0[Cost::IcrcBytes as usize] = 25;
        b.0[Cost::Locks as usize] = 3;
        let d = b.since(&a);
        assert_eq!((d.get(Cost::IcrcBytes), d.get(Cost::Locks), d.get(Cost::Sleeps)), (15, 3, 0));
    }
}
