//! One shard of a running NIC: the transport [`Shard`] (a set of QPs, their
//! timers), its wire (the [`Datapath`] that carries those QPs' datagrams),
//! its fault injectors, and the wakers of the threads that drive it.
//!
//! Whoever drives a shard (its engine thread, or an application thread
//! posting or polling) holds its lock for a whole receive or transmit pass,
//! system call included. That lock is the shard's alone, so shards run in
//! parallel, and it keeps each QP's packets in order on the wire and into
//! the transport: two threads can never split one batch between them.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use softrnic_transport::{AsyncEvent, CqId, Instant, MAX_DATAGRAM_LEN, Shard};
use softrnic_wire::ROCEV2_UDP_PORT;

use crate::datapath::Datapath;
use crate::eventfd::EventFd;
use crate::faults::{FaultConfig, FaultInjector, FaultStats};
use crate::socket::{BATCH, RoceSocket};
use crate::trace::Tracer;

/// What one pass over a shard leaves for after its lock is released:
/// notifications for completion channels, asynchronous events, and
/// datagrams the kernel steered here for another shard's QPs.
#[derive(Default)]
pub(crate) struct Aftermath {
    pub fired_cqs: Vec<CqId>,
    pub events: Vec<AsyncEvent>,
    pub foreign: Vec<(usize, SocketAddr, Vec<u8>)>,
}

impl Aftermath {
    pub fn is_empty(&self) -> bool {
        self.fired_cqs.is_empty() && self.events.is_empty() && self.foreign.is_empty()
    }
}

/// Buffers a thread reuses for every pass, whichever shard it drives.
struct Scratch {
    tx: Vec<Box<[u8]>>,
    tx_meta: Vec<(SocketAddr, usize)>,
    faulty: Vec<(SocketAddr, Vec<u8>)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        tx: (0..BATCH).map(|_| vec![0u8; MAX_DATAGRAM_LEN].into_boxed_slice()).collect(),
        tx_meta: Vec::with_capacity(BATCH),
        faulty: Vec::new(),
    });
}

/// Loss, reordering, duplication and corruption, each way.
pub(crate) struct Faults {
    pub tx: FaultInjector,
    pub rx: FaultInjector,
}

/// What a shard's lock guards.
pub(crate) struct ShardState {
    pub transport: Shard,
    pub faults: Option<Faults>,
    pub wire: Box<dyn Datapath>,
}

/// How a pass reports on itself, and to whom.
pub(crate) struct PassContext<'a> {
    pub now: Instant,
    pub shards: usize,
    pub tracer: Option<&'a Tracer>,
    pub tx_dropped_by_kernel: &'a AtomicU64,
}

/// One shard of a running NIC.
pub(crate) struct EngineShard {
    pub index: usize,
    state: Mutex<ShardState>,
    /// The shard's UDP socket, which its engine thread blocks on.
    socket: Arc<RoceSocket>,
    /// Wakes the thread that sends for this shard: a doorbell, a stop.
    pub tx_waker: EventFd,
    /// Wakes a receive-only thread: a stop.
    pub rx_waker: EventFd,
    /// Engine threads of this shard blocked in `poll(2)`.
    pub sleepers: AtomicUsize,
    /// Bumped by every application poll that drives this shard: while it
    /// moves, the engine thread stands by (see `progress`).
    pub app_polls: AtomicU64,
    /// When an idle poll last ran the transmit pass (ns of NIC time).
    pub idle_transmit_at: AtomicU64,
}

impl EngineShard {
    pub fn new(
        index: usize,
        transport: Shard,
        socket: Arc<RoceSocket>,
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
            state: Mutex::new(ShardState { transport, faults, wire }),
            socket,
            tx_waker: EventFd::new()?,
            rx_waker: EventFd::new()?,
            sleepers: AtomicUsize::new(0),
            app_polls: AtomicU64::new(0),
            idle_transmit_at: AtomicU64::new(0),
        })
    }

    pub fn socket(&self) -> &RoceSocket {
        &self.socket
    }

    pub fn lock(&self) -> MutexGuard<'_, ShardState> {
        // A panic elsewhere must not wedge the NIC: the shard's state is
        // consistent between calls.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, unless another thread is driving the shard right now (and
    /// so making the progress the caller wanted).
    pub fn try_lock(&self) -> Option<MutexGuard<'_, ShardState>> {
        match self.state.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Wakes a thread blocked on this shard's doorbell.
    pub fn ring(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.tx_waker.signal();
        }
    }

    pub fn fault_stats(&self) -> (FaultStats, FaultStats) {
        self.lock().faults.as_ref().map(|f| (f.tx.stats, f.rx.stats)).unwrap_or_default()
    }

    /// Receives one batch from the shard's wire and hands it to its QPs.
    /// Returns how many datagrams arrived.
    pub fn receive(&self, state: &mut ShardState, pass: &PassContext, after: &mut Aftermath) -> usize {
        SCRATCH.with_borrow_mut(|scratch| {
            let ShardState { transport, faults, wire } = state;
            let mut handle = |from: SocketAddr, bytes: &[u8]| {
                if let Some(tracer) = pass.tracer {
                    tracer.datagram("<-", from, bytes);
                }
                match crate::socket::steered_shard(bytes, pass.shards) {
                    Some(owner) if owner != self.index => after.foreign.push((owner, from, bytes.to_vec())),
                    _ => transport.handle_datagram(pass.now, from, bytes),
                }
            };
            let mut released = 0;
            let n = match faults {
                None => wire.receive(&mut handle),
                Some(faults) => {
                    scratch.faulty.clear();
                    let n = wire.receive(&mut |from, bytes| faults.rx.apply(from, bytes, &mut scratch.faulty));
                    if n == 0 {
                        // A datagram held back for reordering is delivered
                        // once traffic pauses, or it would never arrive.
                        faults.rx.release(&mut scratch.faulty);
                        released = scratch.faulty.len();
                    }
                    for (from, bytes) in &scratch.faulty {
                        handle(*from, bytes);
                    }
                    n
                }
            };
            collect(transport, after);
            n + released
        })
    }

    /// Handles datagrams another shard's socket received for this shard.
    pub fn handle_foreign(
        &self,
        state: &mut ShardState,
        now: Instant,
        datagrams: impl Iterator<Item = (SocketAddr, Vec<u8>)>,
        after: &mut Aftermath,
    ) {
        for (from, bytes) in datagrams {
            state.transport.handle_datagram(now, from, &bytes);
        }
        collect(&mut state.transport, after);
    }

    /// Runs due timers and sends everything the shard's QPs have to send.
    /// Returns how many datagrams left.
    pub fn transmit(&self, state: &mut ShardState, pass: &PassContext, after: &mut Aftermath) -> usize {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut total = 0;
            let ShardState { transport, faults, wire } = state;
            loop {
                scratch.tx_meta.clear();
                transport.handle_timeout(pass.now);
                while scratch.tx_meta.len() < BATCH {
                    let slot = scratch.tx_meta.len();
                    match transport.poll_transmit(pass.now, &mut scratch.tx[slot]) {
                        Some(t) => scratch.tx_meta.push((SocketAddr::new(t.dst, ROCEV2_UDP_PORT), t.len)),
                        None => break,
                    }
                }
                let count = scratch.tx_meta.len();
                match faults {
                    None => {
                        let mut packets = [(SocketAddr::new(self.socket.local_addr().ip(), 0), &[][..]); BATCH];
                        for (i, &(dst, len)) in scratch.tx_meta.iter().enumerate() {
                            packets[i] = (dst, &scratch.tx[i][..len]);
                        }
                        send_all(wire.as_mut(), &mut packets[..count], pass);
                    }
                    Some(faults) => {
                        scratch.faulty.clear();
                        for (i, &(dst, len)) in scratch.tx_meta.iter().enumerate() {
                            faults.tx.apply(dst, &scratch.tx[i][..len], &mut scratch.faulty);
                        }
                        if count == 0 {
                            // A datagram held back for reordering goes out
                            // once traffic pauses.
                            faults.tx.release(&mut scratch.faulty);
                        }
                        let mut packets: Vec<(SocketAddr, &[u8])> =
                            scratch.faulty.iter().map(|(a, b)| (*a, &b[..])).collect();
                        send_all(wire.as_mut(), &mut packets, pass);
                    }
                }
                total += count;
                if count < BATCH {
                    break;
                }
            }
            collect(transport, after);
            total
        })
    }
}

/// Sends a batch; what the wire refuses is dropped, as a full link would
/// drop it, and retransmitted by the transport.
fn send_all(wire: &mut dyn Datapath, packets: &mut [(SocketAddr, &[u8])], pass: &PassContext) {
    crate::socket::group_runs(packets);
    if let Some(tracer) = pass.tracer {
        for (dst, bytes) in packets.iter() {
            tracer.datagram("->", *dst, bytes);
        }
    }
    let sent: usize = packets.chunks(BATCH).map(|chunk| wire.send(chunk)).sum();
    let refused = (packets.len() - sent) as u64;
    if refused > 0 {
        pass.tx_dropped_by_kernel.fetch_add(refused, Ordering::Relaxed);
    }
}

/// Takes what the shard's QPs raised, to be delivered once its lock is
/// released (the rxe driver likewise signals completion channels only
/// after dropping the CQ's lock).
fn collect(transport: &mut Shard, after: &mut Aftermath) {
    while let Some(cq) = transport.poll_cq_notification() {
        after.fired_cqs.push(cq);
    }
    while let Some(event) = transport.poll_async_event() {
        after.events.push(event);
    }
}
