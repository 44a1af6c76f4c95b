//! Progress: who moves a shard's packets, and when. The policy lives here
//! and nowhere else; the Rust API and the C library only call
//! [`Nic::poll_cq`](crate::Nic::poll_cq) and post.
//!
//! There are two policies ([`ProgressMode`]), for machines with cores to
//! spare and machines without.
//!
//! **Inline** (few cores: a core shared is a core lost):
//! - **Posting rings the doorbell**: the posting thread sends what the
//!   post produced, at once.
//! - **Polling a CQ that holds nothing drives the shards that feed it**:
//!   receive, handle, poll again. A thread that spins on its CQ never pays
//!   for waking another one (about 23 µs on a VM, against about 3 µs for a
//!   spin). ACKs the poll produced leave with the next post (one system
//!   call for both), or within [`IDLE_TRANSMIT`] if nothing is posted. A
//!   poll that finds completions still takes what the wire knows waits
//!   without a system call (a shared-memory ring): the ACKs a busy program
//!   needs must not wait for its CQ to run dry.
//! - **An engine thread per shard** covers what the application does not
//!   drive: one-sided operations at a target that never polls, a program
//!   spinning on memory (`ib_write_lat`), timers. While the application
//!   polls a shard, its engine thread stands by and looks again after an
//!   interval; when the application has not polled the shard for one
//!   interval, the thread drives it while there is work, then blocks in
//!   `poll(2)` on the socket and its doorbell (spinning a little first once
//!   the application has been away for [`APPLICATION_AWAY`]). An
//!   application thread that blocks on a completion channel says so first
//!   ([`Core::application_waits`]), and the thread takes over at once. The interval
//!   adapts. When the thread takes over and finds a packet or two waiting
//!   (a program spinning on memory, `ib_write_lat`), it halves, down to
//!   [`STANDBY_MIN`]. When it finds nothing, or a backlog (the application
//!   was merely descheduled), or the application keeps polling, it grows
//!   back to [`STANDBY_MAX`]: on a two-core VM a context switch costs about
//!   as much as a 64-byte message, and an engine thread that looked every
//!   50 µs halved the message rate (measured in BENCHMARKS.md). While the
//!   application spins on its CQ it grows on to [`STANDBY_SPINNING_MAX`]:
//!   every look takes a spinner's core, one round trip in a hundred.
//!
//! Inline progress cannot scale: one application thread posting to QPs
//! on eight shards does all eight shards' work itself.
//!
//! **Dedicated** (a core for each engine thread, as a NIC has its own):
//! - **Posting only queues the work request** and sets the shard's
//!   doorbell; it makes a system call only to wake an engine thread that
//!   went to sleep.
//! - **Polling a CQ only reads it.**
//! - **Each engine thread polls its shard**: receive, then transmit when
//!   the doorbell rang, something arrived or a timer is due. After
//!   [`DEDICATED_IDLE`] without work it sleeps in `poll(2)` until a
//!   datagram, a doorbell or its next timer (io_uring's `SQPOLL` thread
//!   does the same).
//!
//! `auto` picks dedicated progress when the machine has at least two cores
//! per engine thread and two more (room for a peer's engine and for the
//! applications), inline otherwise.

use std::cell::RefCell;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::Duration;

use softrnic_account::{self as account, Cost};
use softrnic_transport::{Completion, CompletionQueue, Instant};

use crate::engine::{Core, Role};
use crate::shard::{Aftermath, EngineShard, Wire};
use softrnic_event::wait_readable;

/// Who drives the shards: see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Dedicated when the machine has the cores for it, else inline.
    Auto,
    /// The application's posts and polls drive the shards; engine threads
    /// cover the rest.
    Inline,
    /// Engine threads poll their shards; the application only queues work
    /// and reads completions.
    Dedicated,
}

impl ProgressMode {
    /// `auto`, `inline` or `dedicated`.
    pub fn parse(text: &str) -> Result<ProgressMode, String> {
        match text {
            "auto" => Ok(ProgressMode::Auto),
            "inline" => Ok(ProgressMode::Inline),
            "dedicated" => Ok(ProgressMode::Dedicated),
            other => Err(format!("`{other}` is not a progress mode; give auto, inline or dedicated")),
        }
    }

    /// Whether a device with `threads` engine threads on a machine with
    /// `cores` cores gets dedicated progress. A device without engine
    /// threads has only the application to drive it.
    pub fn is_dedicated(self, threads: usize, cores: usize) -> bool {
        match self {
            _ if threads == 0 => false,
            ProgressMode::Inline => false,
            ProgressMode::Dedicated => true,
            ProgressMode::Auto => cores >= 2 * threads + 2,
        }
    }
}

impl std::fmt::Display for ProgressMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProgressMode::Auto => "auto",
            ProgressMode::Inline => "inline",
            ProgressMode::Dedicated => "dedicated",
        })
    }
}

/// How often a poll that found nothing runs the transmit pass (timers,
/// deferred ACKs).
pub const IDLE_TRANSMIT: Duration = Duration::from_micros(5);
/// The shortest and longest an engine thread stands by between looks.
pub const STANDBY_MIN: Duration = Duration::from_micros(10);
pub const STANDBY_MAX: Duration = Duration::from_millis(1);
/// The longest it stands by while the application spins on the shard
/// (polls at least every [`SPINNING_POLL_GAP`]). Each look preempts a
/// thread on a machine whose cores the spinners fill: at 1 ms, one 64 B
/// UDP round trip in a hundred waited for one, and the p99 was 4.6x
/// sockperf's. A spinning program is there while it spins, and says so
/// before it blocks ([`Core::application_waits`]); one that stops polling
/// without blocking leaves its shard undriven for up to this long.
pub const STANDBY_SPINNING_MAX: Duration = Duration::from_millis(8);
/// Polls at most this far apart, on average over a standby interval, mean
/// the application spins.
const SPINNING_POLL_GAP: Duration = Duration::from_micros(10);
/// At most this many datagrams found waiting when an engine thread takes
/// over mean a latency-bound program; more mean a descheduled one.
const LATENCY_WORK: usize = 4;
/// How long the application must have left a shard to its engine thread
/// before the thread spins between packets rather than blocking.
const APPLICATION_AWAY: Duration = Duration::from_millis(20);
/// The longest a blocked engine thread sleeps without looking around.
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// How long a dedicated engine thread polls an idle shard before it
/// sleeps: long enough to bridge the gaps of a busy application, short
/// enough that an idle device costs no core.
pub const DEDICATED_IDLE: Duration = Duration::from_millis(1);

/// What a pass over a shard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pass {
    pub receive: bool,
    pub transmit: bool,
}

impl Pass {
    pub const RECEIVE: Pass = Pass { receive: true, transmit: false };
    pub const TRANSMIT: Pass = Pass { receive: false, transmit: true };
    pub const BOTH: Pass = Pass { receive: true, transmit: true };
}

thread_local! {
    static AFTERMATH: RefCell<Aftermath> = RefCell::new(Aftermath::default());
}

impl Core {
    /// One pass over `shard` by the thread holding `guard`; returns how many
    /// datagrams moved. What the pass raised is delivered after the lock is
    /// released.
    pub(crate) fn drive(&self, shard: &EngineShard, wire: MutexGuard<'_, Wire>, pass: Pass) -> usize {
        self.drive_at(shard, wire, pass, self.now())
    }

    /// [`Core::drive`] at NIC time `now`, for a caller that has read the
    /// clock already (a read costs as much as an empty pass on a VM).
    fn drive_at(&self, shard: &EngineShard, mut wire: MutexGuard<'_, Wire>, pass: Pass, now: Instant) -> usize {
        let (moved, answered) = AFTERMATH.with_borrow_mut(|after| {
            let context = self.pass_context(now);
            let mut moved = 0;
            if pass.receive {
                let timer = account::timing();
                let received = shard.receive(wire.as_mut(), &context, after);
                if received > 0 {
                    timer.stop(Cost::ReceivePassNanos);
                }
                moved += received;
            }
            if pass.transmit {
                let timer = account::timing();
                let sent = shard.transmit(wire.as_mut(), &context, after);
                if sent > 0 {
                    timer.stop(Cost::TransmitPassNanos);
                }
                moved += sent;
            }
            drop(wire);
            let answered = if after.is_empty() { 0 } else { self.settle(after) };
            (moved, answered)
        });
        // Shards that took receives fetched on demand send what they now
        // owe (the held messages' ACKs, or RNR NAKs): after the borrow,
        // since that drives them again.
        for shard in self.shards.iter().filter(|shard| answered & (1 << shard.index) != 0) {
            self.ring_doorbell(shard);
        }
        moved
    }

    /// Delivers what passes raised: datagrams the kernel steered to the
    /// wrong shard (UDP GRO on a real link can coalesce datagrams of
    /// several QPs), handed to their owners first; receives asked for;
    /// then completion channels and asynchronous events. Returns the
    /// shards that took receives (a bit each), for their doorbells.
    fn settle(&self, after: &mut Aftermath) -> u64 {
        if !after.foreign.is_empty() {
            self.missteered.fetch_add(after.foreign.len() as u64, Ordering::Relaxed);
            let now = self.now();
            let mut foreign = std::mem::take(&mut after.foreign);
            for shard in self.shards.iter() {
                if foreign.iter().any(|(owner, ..)| *owner == shard.index) {
                    let mine = foreign.extract_if(.., |(owner, ..)| *owner == shard.index);
                    let mine = mine.map(|(_, from, meta, bytes)| (from, meta, bytes));
                    shard.handle_foreign(&mut shard.lock(), now, mine, after);
                }
            }
            // What their owners handled was theirs: none is foreign again.
            debug_assert!(after.foreign.is_empty());
        }
        let answered = self.fetch_receives(after);
        for cq in after.fired_cqs.drain(..) {
            self.notify(cq);
        }
        for event in after.events.drain(..) {
            self.raise(event);
        }
        answered
    }

    /// Answers the shards' questions ([`softrnic_transport::fetch_on_demand`]):
    /// each source posts what its program wrote, with no lock of the
    /// engine's held, then the shard takes the posts and hands its held
    /// requests over again. What that raises is answered too. Returns the
    /// shards answered, a bit each.
    fn fetch_receives(&self, after: &mut Aftermath) -> u64 {
        let mut answered = 0u64;
        while !after.receives_wanted.is_empty() {
            let now = self.now();
            for (shard, wanted) in std::mem::take(&mut after.receives_wanted) {
                self.receive_sources.fetch(wanted);
                let shard = &self.shards[shard];
                let mut state = shard.lock();
                state.transport.receives_fetched(now, wanted);
                shard.collect(&mut state.transport, after);
                answered |= 1 << shard.index;
            }
        }
        answered
    }

    /// The doorbell, rung after a post (with the state lock released).
    /// Inline, the posting thread sends what the post produced; dedicated,
    /// the shard's engine thread will. Either way a sleeping engine thread
    /// wakes (timers may have moved).
    pub(crate) fn ring_doorbell(&self, shard: &EngineShard) {
        if self.dedicated {
            shard.doorbell.store(true, Ordering::SeqCst);
        } else {
            self.drive(shard, shard.lock_wire(), Pass::TRANSMIT);
        }
        shard.ring();
    }

    /// `ibv_poll_cq`: completions ready, or else (inline) progress on the
    /// shards whose QPs feed `cq`, then a second look.
    pub(crate) fn poll_cq(&self, cq: &CompletionQueue, max: usize, out: &mut Vec<Completion>) -> usize {
        if self.dedicated {
            return cq.poll(max, out);
        }
        let feeders = cq.shards();
        for shard in self.shards_in(feeders) {
            shard.app_polls.fetch_add(1, Ordering::Relaxed);
        }
        let n = cq.poll(max, out);
        if n > 0 {
            // A program busy with completions must not leave what has
            // arrived waiting: the ACKs that free its queues (256 QPs of
            // WRITEs over shared memory timed out thousands of times a run
            // while their program's CQ always held something, and its
            // engine thread stood by for it). Only where the wire can tell
            // without a system call.
            for shard in self.shards_in(feeders) {
                if let Some(wire) = shard.try_lock_wire()
                    && wire.has_arrivals()
                {
                    self.drive(shard, wire, Pass::BOTH);
                }
            }
            return n;
        }
        // One clock read for the whole poll: on a VM it costs as much as
        // the rest of an empty pass.
        let now = self.now();
        let mut received = 0;
        for shard in self.shards_in(feeders) {
            // A shard another thread drives is making progress already.
            if let Some(guard) = shard.try_lock_wire() {
                received += self.drive_at(shard, guard, Pass::RECEIVE, now);
            }
        }
        if received > 0 {
            let n = cq.poll(max, out);
            if n > 0 {
                return n;
            }
        }
        for shard in self.shards_in(feeders) {
            self.transmit_when_idle(shard, now);
        }
        0
    }

    /// The transmit pass for a poll that found nothing (at `now`): at most
    /// every [`IDLE_TRANSMIT`], so a spinning poll loop spends its time
    /// watching the socket. Timers and deferred ACKs lose no more than
    /// that.
    fn transmit_when_idle(&self, shard: &EngineShard, now: Instant) {
        let now = now.as_nanos();
        let last = shard.idle_transmit_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) < IDLE_TRANSMIT.as_nanos() as u64 {
            return;
        }
        shard.idle_transmit_at.store(now, Ordering::Relaxed);
        if let Some(guard) = shard.try_lock_wire() {
            self.drive(shard, guard, Pass::TRANSMIT);
        }
    }

    /// An application thread is about to block until a completion channel
    /// fed by the shards in `mask` fires: nothing will poll them, so their
    /// engine threads take over now rather than after standing by (an
    /// event-driven ping-pong otherwise waits out the standby interval,
    /// up to [`STANDBY_MAX`], every round). Undone when the guard drops.
    pub(crate) fn application_waits(&self, mask: u64) -> ApplicationWait<'_> {
        let shards: Vec<&EngineShard> = match self.dedicated {
            // Dedicated engine threads poll anyway.
            true => Vec::new(),
            false => self.shards_in(mask).collect(),
        };
        for shard in &shards {
            shard.app_waiting.fetch_add(1, Ordering::SeqCst);
            // Out of its standby wait at once.
            shard.tx_waker.signal();
        }
        ApplicationWait { shards }
    }

    /// Receives, handles and sends on every shard from the caller's thread.
    pub(crate) fn progress_all(&self) -> usize {
        self.shards.iter().map(|shard| self.drive(shard, shard.lock_wire(), Pass::BOTH)).sum()
    }

    fn shards_in(&self, mask: u64) -> impl Iterator<Item = &EngineShard> {
        // A CQ no QP feeds yet: every shard (there is nothing to find).
        let mask = if mask == 0 { u64::MAX } else { mask };
        self.shards.iter().filter(move |s| mask & (1 << (s.index % 64)) != 0)
    }
}

/// An application thread blocked on a completion channel; see
/// [`Core::application_waits`].
pub struct ApplicationWait<'a> {
    shards: Vec<&'a EngineShard>,
}

impl Drop for ApplicationWait<'_> {
    fn drop(&mut self) {
        for shard in &self.shards {
            shard.app_waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// An engine thread's life, by the device's progress mode.
pub(crate) fn run(core: &Core, index: usize, role: Role, spin: Duration) {
    set_timer_slack(Duration::from_micros(1));
    if core.dedicated { run_dedicated(core, index, role) } else { run_inline(core, index, role, spin) }
}

/// Inline progress: stand by while the application drives the shard,
/// drive it when the application does not.
fn run_inline(core: &Core, index: usize, role: Role, spin: Duration) {
    let shard = &core.shards[index];
    let pass = match role {
        Role::Both => Pass::BOTH,
        Role::Rx => Pass::RECEIVE,
        Role::Tx => Pass::TRANSMIT,
    };
    let own_waker = match role {
        Role::Rx => &shard.rx_waker,
        Role::Both | Role::Tx => &shard.tx_waker,
    };
    let waker = std::os::fd::AsRawFd::as_raw_fd(own_waker);
    let mut seen_polls = shard.app_polls.load(Ordering::Relaxed);
    let mut standby = STANDBY_MAX;
    // Since when this thread has driven the shard, the application absent.
    let mut driving_since: Option<Instant> = None;
    let mut idle_since: Option<Instant> = None;
    let mut watch = StallWatch::new(core);
    while !core.stopping() {
        // A clock read costs a VM about what the rest of an empty round
        // does: this one serves the round's own judgements. The pass reads
        // its own once it holds the shard: a time read before waiting for
        // the lock would make timers and deferred ACKs look not yet due
        // (64 B send_lat 1.90 against 2.19 us when this one served both).
        let now = watch.look(core);
        let polls = shard.app_polls.load(Ordering::Relaxed);
        if polls != seen_polls && shard.app_waiting.load(Ordering::SeqCst) == 0 {
            // The application polls this shard: stay out of its way (a
            // rest, in which lingering memory may go).
            let polled = polls.wrapping_sub(seen_polls);
            seen_polls = polls;
            if driving_since.take().is_none() {
                standby = (standby + standby / 8).min(standby_ceiling(polled, standby));
            }
            watch.chose_to_wait(standby);
            core.lingering.forget_old();
            let _ = wait_readable(&[waker], standby);
            own_waker.drain();
            continue;
        }
        let took_over = driving_since.is_none();
        let driving = *driving_since.get_or_insert(now);
        let moved = core.drive(shard, shard.lock_wire(), pass);
        if took_over {
            standby = if (1..=LATENCY_WORK).contains(&moved) {
                // A packet or two the application left while it did not
                // poll: it waits on memory (`ib_write_lat`). Look sooner.
                (standby / 2).max(STANDBY_MIN)
            } else {
                // Nothing, or a backlog: the application was only
                // descheduled. Looking often would cost it the core.
                (standby * 2).min(STANDBY_MAX)
            };
        }
        if role == Role::Rx && moved > 0 {
            // Handling may have produced answers for the sender thread.
            shard.tx_waker.signal();
        }
        if moved > 0 {
            idle_since = None;
            continue;
        }
        // Spin for more only once the application has been away a while
        // (a target of one-sided operations): on two cores, an engine
        // thread that spins whenever the application is descheduled takes
        // the core it needs.
        let since = *idle_since.get_or_insert(now);
        if now.saturating_duration_since(driving) > APPLICATION_AWAY && now.saturating_duration_since(since) < spin {
            std::hint::spin_loop();
            continue;
        }
        watch.chose_to_wait(sleep(core, shard, role));
        idle_since = None;
    }
}

/// How long an engine thread may stand by after the application polled
/// `polled` times in the last `standby`: longer for one that spins.
fn standby_ceiling(polled: u64, standby: Duration) -> Duration {
    let spins = u128::from(polled) * SPINNING_POLL_GAP.as_nanos() >= standby.as_nanos();
    if spins { STANDBY_SPINNING_MAX } else { STANDBY_MAX }
}

/// Dedicated progress: poll the shard; sleep only after
/// [`DEDICATED_IDLE`] without work.
fn run_dedicated(core: &Core, index: usize, role: Role) {
    let shard = &core.shards[index];
    let mut idle_since: Option<Instant> = None;
    let mut watch = StallWatch::new(core);
    while !core.stopping() {
        let now = watch.look(core);
        let mut moved = 0;
        if role != Role::Tx {
            let received = core.drive_at(shard, shard.lock_wire(), Pass::RECEIVE, now);
            if received > 0 && role == Role::Rx {
                // Handling may have produced answers for the sender thread.
                shard.doorbell.store(true, Ordering::SeqCst);
                shard.ring();
            }
            moved += received;
        }
        if role != Role::Rx {
            let rang = shard.doorbell.swap(false, Ordering::SeqCst);
            let holding = shard.holding.load(Ordering::Relaxed);
            if rang || moved > 0 || holding || shard.timer_due(now) {
                moved += core.drive_at(shard, shard.lock_wire(), Pass::TRANSMIT, now);
            }
        }
        if moved > 0 {
            idle_since = None;
            continue;
        }
        let idle = now.as_nanos() - idle_since.get_or_insert(now).as_nanos();
        if idle < DEDICATED_IDLE.as_nanos() as u64 {
            std::hint::spin_loop();
            continue;
        }
        watch.chose_to_wait(sleep(core, shard, role));
        idle_since = None;
    }
}

/// How long an engine thread goes between looks at its shard beyond the
/// waits it chose: the time the kernel (or a hypervisor) kept it off a
/// core, or a lock held it. The longest goes into the device's counters
/// ([`crate::NicCounters::engine_stall_max_us`]), which tell a peer's
/// spurious retransmission on a stalled machine from an engine that
/// forgot to answer.
struct StallWatch {
    last_look: Instant,
    chosen: Duration,
}

impl StallWatch {
    fn new(core: &Core) -> StallWatch {
        StallWatch { last_look: core.now(), chosen: Duration::ZERO }
    }

    /// The thread looks at its shard now: accounts for the time since its
    /// last look. Returns the time (one clock read serves both).
    fn look(&mut self, core: &Core) -> Instant {
        let now = core.now();
        let gap = now.as_nanos().saturating_sub(self.last_look.as_nanos());
        let stall = gap.saturating_sub(self.chosen.as_nanos().min(u128::from(u64::MAX)) as u64);
        core.longest_stall.fetch_max(stall, Ordering::Relaxed);
        self.last_look = now;
        self.chosen = Duration::ZERO;
        now
    }

    /// The thread is about to wait up to `limit` of its own choosing.
    fn chose_to_wait(&mut self, limit: Duration) {
        self.chosen = self.chosen.saturating_add(limit);
    }
}

/// Publishes the counters and lets go of memory that has lingered long
/// enough ([`crate::lingering`]), then blocks an engine thread until a
/// datagram arrives (unless it only sends), its doorbell rings, or its
/// shard's next timer is due (the sender's; a receiver looks around every
/// [`MAX_SLEEP`]). A wire holding datagrams for a full ring cuts the sleep
/// to [`STANDBY_MIN`]: the ring may drain without a word to this thread.
/// Returns the longest it would sleep.
fn sleep(core: &Core, shard: &EngineShard, role: Role) -> Duration {
    core.publish_counters(false);
    core.lingering.forget_old();
    let mut timeout = match role {
        Role::Rx => MAX_SLEEP,
        Role::Both | Role::Tx => core.until_deadline(shard).min(MAX_SLEEP),
    };
    if shard.holding.load(Ordering::Relaxed) {
        timeout = timeout.min(STANDBY_MIN);
    }
    let own_waker = match role {
        Role::Rx => &shard.rx_waker,
        Role::Both | Role::Tx => &shard.tx_waker,
    };
    let waker = std::os::fd::AsRawFd::as_raw_fd(own_waker);
    // Counted before the doorbell is read, and a post sets the doorbell
    // before it reads the count (both sequentially consistent): either the
    // post sees a sleeper and signals, or this thread sees the doorbell.
    shard.sleepers.fetch_add(1, Ordering::SeqCst);
    if role == Role::Rx || !shard.doorbell.load(Ordering::SeqCst) {
        match role {
            Role::Tx => {
                let _ = wait_readable(&[waker], timeout);
            }
            Role::Both | Role::Rx => {
                // Shared-memory peers must know to ring the doorbell.
                let mut groups = Vec::new();
                let doorbell = {
                    let mut wire = shard.lock_wire();
                    wire.group_fds(&mut groups);
                    wire.prepare_to_sleep().then(|| wire.doorbell())
                };
                if let Some(doorbell) = doorbell {
                    let (fds, n) = shard.wait_fds(doorbell, waker);
                    // Nothing allocated to sleep unless the shard joined a
                    // multicast group.
                    if groups.is_empty() {
                        let _ = wait_readable(&fds[..n], timeout);
                    } else {
                        groups.extend_from_slice(&fds[..n]);
                        let _ = wait_readable(&groups, timeout);
                    }
                }
                shard.lock_wire().awake();
            }
        }
    }
    shard.sleepers.fetch_sub(1, Ordering::SeqCst);
    own_waker.drain();
    timeout
}

/// Asks the kernel to wake this thread within `slack` of the time it asked
/// for (the default slack, 50 µs, would swallow the standby interval).
fn set_timer_slack(slack: Duration) {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only the
    // calling thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack.as_nanos() as libc::c_ulong, 0, 0, 0) };
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::ProgressMode::{Auto, Dedicated, Inline};
    use crate::{EngineConfig, Nic};

    /// An engine thread kept from its shard (here by its wire lock, as a
    /// descheduled application thread in the middle of a pass would keep
    /// it) reports the stall in the device's counters.
    #[test]
    fn a_stalled_engine_thread_says_so() {
        for progress in [Inline, Dedicated] {
            let nic =
                Nic::open(EngineConfig { progress, ..EngineConfig::new("127.0.9.30".parse().unwrap()) }).expect("open");
            // Held well past the longest sleep the thread may have chosen
            // (MAX_SLEEP), which the stall does not count.
            let wire = nic.core.shards[0].lock_wire();
            std::thread::sleep(Duration::from_millis(150));
            drop(wire);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while nic.counters().engine_stall_max_us < 100_000 {
                assert!(std::time::Instant::now() < deadline, "{progress}: {:?}", nic.counters());
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// An application that polls its shard at least every 10 µs lets its
    /// engine thread stand by up to 8 ms; one that polls less often, 1 ms.
    #[test]
    fn a_spinning_application_lets_its_engine_thread_stand_by_longer() {
        use super::{STANDBY_MAX, STANDBY_SPINNING_MAX, standby_ceiling};
        let ms = Duration::from_millis(1);
        assert_eq!(standby_ceiling(100, ms), STANDBY_SPINNING_MAX, "a poll every 10 µs");
        assert_eq!(standby_ceiling(800, 8 * ms), STANDBY_SPINNING_MAX);
        assert_eq!(standby_ceiling(99, ms), STANDBY_MAX, "a little less often: it may go at any time");
        assert_eq!(standby_ceiling(799, 8 * ms), STANDBY_MAX);
        assert_eq!(standby_ceiling(1, ms), STANDBY_MAX, "one poll in a whole interval");
    }

    #[test]
    fn auto_dedicates_cores_only_where_there_are_enough() {
        assert!(!Auto.is_dedicated(1, 2), "two cores: the applications need them");
        assert!(Auto.is_dedicated(1, 4));
        assert!(Auto.is_dedicated(7, 16));
        assert!(!Auto.is_dedicated(8, 16), "8 + 8 engine threads and the applications would not fit");
        assert!(Dedicated.is_dedicated(8, 2), "asked for, given");
        assert!(!Inline.is_dedicated(1, 64));
        assert!(!Dedicated.is_dedicated(0, 64), "without engine threads only the application drives");
    }
}
