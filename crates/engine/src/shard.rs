//! One shard of a running NIC: the transport [`Shard`] (a set of QPs, their
//! timers), its wire (the [`Datapath`] that carries those QPs' datagrams),
//! its fault injectors, and the wakers of the threads that drive it.
//!
//! A shard has two locks, taken in this order:
//!
//! - **the wire**: whoever drives the shard (its engine thread, or an
//!   application thread posting or polling) holds it for a whole receive or
//!   transmit pass, system call included. It keeps each QP's packets in
//!   order on the wire and into the transport: two threads can never split
//!   one batch between them.
//! - **the state** (the transport's QPs, the fault injectors): held only to
//!   handle a received batch or to build one to send, never across a system
//!   call, so a post does not wait for the engine's `sendmmsg`.
//!
//! Both are the shard's alone, so shards run in parallel.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use softrnic_account::{self as account, Cost};
use softrnic_transport::{AsyncEvent, CqId, Instant, MAX_DATAGRAM_LEN, ReceivesWanted, RecvMeta, Shard};

use crate::datapath::Datapath;
use crate::faults::{FaultConfig, FaultInjector, FaultStats, Passed};
use crate::socket::{BATCH, RoceSocket};
use crate::trace::Tracer;
use softrnic_event::EventFd;

/// What one pass over a shard leaves for after its lock is released:
/// notifications for completion channels, asynchronous events, receives
/// the shard's QPs asked for (with the shard's index), and datagrams the
/// kernel steered here for another shard's QPs.
#[derive(Default)]
pub(crate) struct Aftermath {
    pub fired_cqs: Vec<CqId>,
    pub events: Vec<AsyncEvent>,
    pub receives_wanted: Vec<(usize, ReceivesWanted)>,
    pub foreign: Vec<(usize, SocketAddr, RecvMeta, Vec<u8>)>,
}

impl Aftermath {
    pub fn is_empty(&self) -> bool {
        self.fired_cqs.is_empty()
            && self.events.is_empty()
            && self.receives_wanted.is_empty()
            && self.foreign.is_empty()
    }
}

/// Buffers a thread reuses for every pass, whichever shard it drives.
struct Scratch {
    tx: Vec<Box<[u8]>>,
    /// Each datagram's destination and where it lies in its buffer.
    tx_meta: Vec<(SocketAddr, std::ops::Range<usize>)>,
    /// What the transmit faults let through, in order.
    outgoing: Vec<(SocketAddr, Outgoing)>,
    /// Datagrams the transmit faults made (corrupted, or held back).
    made: Vec<Vec<u8>>,
    told: Vec<u32>,
}

/// A datagram the transmit faults let through.
enum Outgoing {
    /// The `i`th frame the transport built, as built.
    Frame(usize),
    /// The `k`th of [`Scratch::made`].
    Made(usize),
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        // Headroom for an INT header in front of the largest datagram.
        tx: (0..BATCH).map(|_| vec![0u8; crate::int::HEADROOM + MAX_DATAGRAM_LEN].into_boxed_slice()).collect(),
        tx_meta: Vec::with_capacity(BATCH),
        outgoing: Vec::with_capacity(BATCH),
        made: Vec::new(),
        told: Vec::new(),
    });
}

/// The most datagrams a pass handles or builds under one hold of the state
/// lock: a post waits for at most this many.
const HOLD_AT_MOST: usize = 8;

/// How many times a thread tries for a busy state lock before it sleeps.
/// Its holders make no system calls and let go within a few datagrams,
/// while a futex sleep and wake-up cost tens of microseconds on a VM.
const LOCK_SPINS: u32 = 64;

/// Loss, reordering, duplication and corruption, each way.
pub(crate) struct Faults {
    pub tx: FaultInjector,
    pub rx: FaultInjector,
}

/// What a shard's state lock guards.
pub(crate) struct ShardState {
    pub transport: Shard,
    pub faults: Option<Faults>,
}

/// What a shard's wire lock guards: the right to drive the shard.
pub(crate) type Wire = Box<dyn Datapath>;

/// How a pass reports on itself, and to whom.
pub(crate) struct PassContext<'a> {
    pub now: Instant,
    /// `now` on std's clock, for the datapath's own timers: one clock
    /// read serves the pass.
    pub std_now: std::time::Instant,
    pub shards: usize,
    pub tracer: Option<&'a Tracer>,
    pub tx_dropped_by_kernel: &'a AtomicU64,
}

/// One shard of a running NIC.
pub(crate) struct EngineShard {
    pub index: usize,
    state: Mutex<ShardState>,
    wire: Mutex<Wire>,
    /// The shard's UDP socket, and its INT port's where the device carries
    /// INT: what its engine thread blocks on.
    socket: Arc<RoceSocket>,
    int_socket: Option<Arc<RoceSocket>>,
    /// Wakes the thread that sends for this shard: a doorbell, a stop.
    pub tx_waker: EventFd,
    /// Wakes a receive-only thread: a stop.
    pub rx_waker: EventFd,
    /// Engine threads of this shard blocked in `poll(2)`.
    pub sleepers: AtomicUsize,
    /// Set by a post that left its sending to the engine thread (dedicated
    /// progress): the shard has something to transmit.
    pub doorbell: AtomicBool,
    /// QPs with posts they have not taken (see `PostQueues`), for the next
    /// transmit pass.
    told: Mutex<Vec<u32>>,
    /// When the shard's next timer is due (ns of NIC time; `u64::MAX`:
    /// none), as of its last pass.
    pub next_timer: AtomicU64,
    /// The wire held datagrams back at the end of its last transmit pass
    /// (a full shared-memory ring): another pass must follow.
    pub holding: AtomicBool,
    /// Whether this shard's traffic passes through fault injectors.
    injects_faults: bool,
    /// Bumped by every application poll that drives this shard: while it
    /// moves, the engine thread stands by (see `progress`).
    pub app_polls: AtomicU64,
    /// Application threads blocked on a completion channel this shard
    /// feeds: while any wait, nobody polls, and the engine thread drives
    /// at once instead of standing by (see `progress`).
    pub app_waiting: AtomicUsize,
    /// When an idle poll last ran the transmit pass (ns of NIC time).
    pub idle_transmit_at: AtomicU64,
}

impl EngineShard {
    pub fn new(
        index: usize,
        transport: Shard,
        (socket, int_socket): (Arc<RoceSocket>, Option<Arc<RoceSocket>>),
        wire: Box<dyn Datapath>,
        faults: FaultConfig,
        fault_seed: u64,
    ) -> std::io::Result<EngineShard> {
        let faults = (!faults.is_none()).then(|| {
            // Each shard and direction draws its own sequence from the seed.
            let seed = fault_seed.wrapping_add(index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            Faults {
                tx: FaultInjector::new(faults, seed),
                rx: FaultInjector::new(faults, seed ^ 0x5851_f42d_4c95_7f2d),
            }
        });
        Ok(EngineShard {
            index,
            injects_faults: faults.is_some(),
            state: Mutex::new(ShardState { transport, faults }),
            wire: Mutex::new(wire),
            socket,
            int_socket,
            tx_waker: EventFd::new()?,
            rx_waker: EventFd::new()?,
            sleepers: AtomicUsize::new(0),
            doorbell: AtomicBool::new(false),
            told: Mutex::new(Vec::new()),
            next_timer: AtomicU64::new(u64::MAX),
            holding: AtomicBool::new(false),
            app_polls: AtomicU64::new(0),
            app_waiting: AtomicUsize::new(0),
            idle_transmit_at: AtomicU64::new(0),
        })
    }

    pub fn socket(&self) -> &RoceSocket {
        &self.socket
    }

    /// The descriptors its engine thread blocks on: the sockets', the
    /// wire's doorbell if it has one, then `waker`; and how many of them
    /// there are. (The wire's multicast groups' sockets come on top:
    /// [`crate::datapath::Datapath::group_fds`].)
    pub fn wait_fds(&self, doorbell: Option<RawFd>, waker: RawFd) -> ([RawFd; 4], usize) {
        let mut fds = [self.socket.fd(); 4];
        let mut n = 1;
        for fd in [self.int_socket.as_ref().map(|int| int.fd()), doorbell, Some(waker)].into_iter().flatten() {
            fds[n] = fd;
            n += 1;
        }
        (fds, n)
    }

    /// The state lock.
    pub fn lock(&self) -> MutexGuard<'_, ShardState> {
        account::one(Cost::Locks);
        for spin in 0..LOCK_SPINS {
            match self.state.try_lock() {
                Ok(guard) => return guard,
                // A panic elsewhere must not wedge the NIC: the shard's
                // state is consistent between calls.
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    if spin == 0 {
                        account::one(Cost::LocksContended);
                    }
                    (0..4).for_each(|_| std::hint::spin_loop())
                }
            }
        }
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The wire lock: the right to drive the shard. Never taken while
    /// holding the state lock.
    pub fn lock_wire(&self) -> MutexGuard<'_, Wire> {
        account::one(Cost::Locks);
        match self.wire.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                account::one(Cost::LocksContended);
                self.wire.lock().unwrap_or_else(|e| e.into_inner())
            }
        }
    }

    /// The wire lock, unless another thread is driving the shard right now
    /// (and so making the progress the caller wanted).
    pub fn try_lock_wire(&self) -> Option<MutexGuard<'_, Wire>> {
        account::one(Cost::Locks);
        match self.wire.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => {
                account::one(Cost::LocksContended);
                None
            }
        }
    }

    /// Tells the shard that `qpn` has posts to take.
    pub fn tell(&self, qpn: u32) {
        self.told.lock().unwrap_or_else(|e| e.into_inner()).push(qpn);
    }

    /// Whether the shard's next timer is due at `now`.
    pub fn timer_due(&self, now: Instant) -> bool {
        now.as_nanos() >= self.next_timer.load(Ordering::Relaxed)
    }

    /// Wakes a thread blocked on this shard's doorbell.
    pub fn ring(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.tx_waker.signal();
        }
    }

    /// Wakes every thread blocked on this shard, so that each blocks again
    /// on the descriptors as they are now (a multicast group's socket
    /// joined meanwhile).
    pub fn wake_sleepers(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.tx_waker.signal();
            self.rx_waker.signal();
        }
    }

    pub fn fault_stats(&self) -> (FaultStats, FaultStats) {
        self.lock().faults.as_ref().map(|f| (f.tx.stats, f.rx.stats)).unwrap_or_default()
    }

    /// Receives one batch from the shard's wire and hands it to its QPs,
    /// taking the state lock only once something has arrived. Returns how
    /// many datagrams arrived.
    pub fn receive(&self, wire: &mut dyn Datapath, pass: &PassContext, after: &mut Aftermath) -> usize {
        let mut state: Option<MutexGuard<'_, ShardState>> = None;
        let mut handle = |transport: &mut Shard, from: SocketAddr, meta: RecvMeta, bytes: &[u8]| {
            if let Some(tracer) = pass.tracer {
                tracer.datagram("<-", from, bytes);
            }
            match crate::socket::steered_shard(bytes, pass.shards) {
                Some(owner) if owner != self.index => after.foreign.push((owner, from, meta, bytes.to_vec())),
                _ => transport.handle_datagram(pass.now, from, meta, bytes),
            }
        };
        let mut released = 0;
        let n = if !self.injects_faults {
            let mut handled = 0;
            wire.receive(pass.std_now, &mut |from, meta, bytes| {
                handle(&mut state.get_or_insert_with(|| self.lock()).transport, from, meta, bytes);
                handled += 1;
                if handled % HOLD_AT_MOST == 0 {
                    // Let a waiting post in.
                    state = None;
                }
            })
        } else {
            let ShardState { transport, faults } = &mut **state.get_or_insert_with(|| self.lock());
            let faults = faults.as_mut().expect("a shard that injects faults has injectors");
            // Injected faults (a test tool) keep no ECN mark: what they
            // deliver arrives unmarked.
            let n = wire.receive(pass.std_now, &mut |from, meta, bytes| {
                let meta = RecvMeta { same_host: meta.same_host, ..RecvMeta::default() };
                faults.rx.apply(from, meta, bytes, &mut |from, meta, passed| {
                    let bytes = match passed {
                        Passed::AsGiven => bytes,
                        Passed::Made(made) => made,
                    };
                    handle(transport, from, meta, bytes);
                });
            });
            // A datagram held back for reordering is delivered once
            // traffic pauses, or it would never arrive.
            if n == 0
                && let Some((from, meta, bytes)) = faults.rx.release()
            {
                handle(transport, from, meta, &bytes);
                released = 1;
            }
            n
        };
        // Collected even when the last hold ended with the batch: what
        // the datagrams raised (a completion channel to wake) must not
        // wait for the next pass.
        if n + released > 0 || state.is_some() {
            let mut state = state.unwrap_or_else(|| self.lock());
            self.collect(&mut state.transport, after);
        }
        n + released
    }

    /// Handles datagrams another shard's socket received for this shard.
    pub fn handle_foreign(
        &self,
        state: &mut ShardState,
        now: Instant,
        datagrams: impl Iterator<Item = (SocketAddr, RecvMeta, Vec<u8>)>,
        after: &mut Aftermath,
    ) {
        for (from, meta, bytes) in datagrams {
            state.transport.handle_datagram(now, from, meta, &bytes);
        }
        self.collect(&mut state.transport, after);
    }

    /// Runs due timers and sends everything the shard's QPs have to send,
    /// a batch at a time: built under the state lock, sent after it.
    /// Returns how many datagrams left.
    pub fn transmit(&self, wire: &mut dyn Datapath, pass: &PassContext, after: &mut Aftermath) -> usize {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut total = 0;
            loop {
                if wire.pushes_back() {
                    // What the wire holds goes first; nothing new joins it
                    // until it has drained (posts wait in their queues).
                    wire.send(&[]);
                    if wire.pushes_back() {
                        break;
                    }
                }
                std::mem::swap(&mut *self.told.lock().unwrap_or_else(|e| e.into_inner()), &mut scratch.told);
                let mut state = self.lock();
                for qpn in scratch.told.drain(..) {
                    state.transport.absorb_posts(pass.now, qpn);
                }
                scratch.tx_meta.clear();
                state.transport.handle_timeout(pass.now);
                while scratch.tx_meta.len() < BATCH {
                    let slot = scratch.tx_meta.len();
                    if slot > 0 && slot % HOLD_AT_MOST == 0 {
                        // Let a waiting post in.
                        drop(state);
                        state = self.lock();
                    }
                    let frame = &mut scratch.tx[slot];
                    let frame_at = &mut frame[crate::int::HEADROOM..];
                    match state.transport.poll_transmit_from(pass.now, frame_at, &mut |dst| wire.egress(dst)) {
                        Some(t) => {
                            let (port, at) = crate::int::wrap(t.int, frame, t.len);
                            scratch.tx_meta.push((SocketAddr::new(t.dst, port), at));
                        }
                        None => break,
                    }
                }
                let count = scratch.tx_meta.len();
                let ShardState { transport, faults } = &mut *state;
                if let Some(faults) = faults {
                    let Scratch { tx, tx_meta, outgoing, made, .. } = scratch;
                    outgoing.clear();
                    made.clear();
                    for (i, (dst, at)) in tx_meta.iter().enumerate() {
                        faults.tx.apply(*dst, RecvMeta::default(), &tx[i][at.clone()], &mut |dst, _, passed| {
                            let out = match passed {
                                Passed::AsGiven => Outgoing::Frame(i),
                                Passed::Made(bytes) => {
                                    made.push(bytes.to_vec());
                                    Outgoing::Made(made.len() - 1)
                                }
                            };
                            outgoing.push((dst, out));
                        });
                    }
                    // A datagram held back for reordering goes out once
                    // traffic pauses.
                    if count == 0
                        && let Some((dst, _, bytes)) = faults.tx.release()
                    {
                        made.push(bytes);
                        outgoing.push((dst, Outgoing::Made(made.len() - 1)));
                    }
                }
                self.collect(transport, after);
                drop(state);
                if self.injects_faults {
                    let mut packets: Vec<(SocketAddr, &[u8])> = scratch
                        .outgoing
                        .iter()
                        .map(|(dst, out)| match *out {
                            Outgoing::Frame(i) => (*dst, &scratch.tx[i][scratch.tx_meta[i].1.clone()]),
                            Outgoing::Made(k) => (*dst, &scratch.made[k][..]),
                        })
                        .collect();
                    send_all(wire, &mut packets, pass);
                } else {
                    let mut packets = [(SocketAddr::new(self.socket.local_addr().ip(), 0), &[][..]); BATCH];
                    for (i, (dst, at)) in scratch.tx_meta.iter().enumerate() {
                        packets[i] = (*dst, &scratch.tx[i][at.clone()]);
                    }
                    send_all(wire, &mut packets[..count], pass);
                }
                total += count;
                if count < BATCH {
                    break;
                }
            }
            self.holding.store(wire.holds_back(), Ordering::Relaxed);
            total
        })
    }

    /// Takes what the shard's QPs raised, to be delivered once its locks
    /// are released (the rxe driver likewise signals completion channels
    /// only after dropping the CQ's lock), and notes the next timer.
    pub fn collect(&self, transport: &mut Shard, after: &mut Aftermath) {
        while let Some(cq) = transport.poll_cq_notification() {
            after.fired_cqs.push(cq);
        }
        while let Some(event) = transport.poll_async_event() {
            after.events.push(event);
        }
        while let Some(wanted) = transport.poll_receives_wanted() {
            after.receives_wanted.push((self.index, wanted));
        }
        let next = transport.poll_timeout().map_or(u64::MAX, |at| at.as_nanos());
        self.next_timer.store(next, Ordering::Relaxed);
    }
}

/// Sends a batch; what the wire refuses is dropped, as a full link would
/// drop it, and retransmitted by the transport.
fn send_all(wire: &mut dyn Datapath, packets: &mut [(SocketAddr, &[u8])], pass: &PassContext) {
    if packets.is_empty() {
        // Nothing new, but what the wire held back must still go.
        if wire.holds_back() {
            wire.send(&[]);
        }
        return;
    }
    crate::socket::group_runs(packets);
    if let Some(tracer) = pass.tracer {
        for (dst, bytes) in packets.iter() {
            tracer.datagram("->", *dst, crate::int::roce_packet(*dst, bytes));
        }
    }
    let sent: usize = packets.chunks(BATCH).map(|chunk| wire.send(chunk)).sum();
    let refused = (packets.len() - sent) as u64;
    if refused > 0 {
        pass.tx_dropped_by_kernel.fetch_add(refused, Ordering::Relaxed);
    }
}
