//! `Nic`: a software RNIC at run time. It owns a transport
//! [`Device`](softrnic_transport::Device) behind a lock, the UDP socket, and
//! the engine threads that move packets between them.
//!
//! Progress comes from two places:
//!
//! - **the application's own thread.** Posting rings the doorbell: the
//!   caller's thread sends what the post produced at once. Polling a CQ
//!   first receives and handles whatever has arrived. A thread that spins on
//!   its CQ therefore never pays for waking another one (about 23 µs on a
//!   VM, against about 3 µs for a spin).
//! - **engine threads**, so that a responder progresses when its application
//!   calls nothing (one-sided operations), and timers fire. An engine thread
//!   spins while there is work, backs off to `poll(2)` on the socket and a
//!   wake-up eventfd when idle, and steps aside while the application is
//!   driving progress itself.
//!
//! How many engine threads there are, and whether each does both directions
//! or only receives or only sends, is [`EngineConfig`].

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use softrnic_transport::{AsyncEvent, CqId, Device, Instant, MAX_DATAGRAM_LEN, TransportConfig};
use softrnic_wire::ROCEV2_UDP_PORT;

use crate::event_queue::EventQueue;
use crate::eventfd::{EventFd, wait_readable};
use crate::faults::{FaultConfig, FaultInjector, FaultStats};
use crate::socket::{BATCH, BindError, RecvBatch, RoceSocket};

/// What an engine thread does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Receives, runs timers and sends.
    Both,
    /// Only receives and handles datagrams.
    Rx,
    /// Only runs timers and sends.
    Tx,
}

/// How to run a NIC.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The device's address: its GID, and where it listens on UDP 4791.
    pub addr: IpAddr,
    /// The engine threads and what each does; empty means that only the
    /// application's threads make progress.
    pub threads: Vec<Role>,
    pub faults: FaultConfig,
    /// Seed of the fault injector, for repeatable runs.
    pub fault_seed: u64,
    pub transport: TransportConfig,
    /// How long an idle engine thread spins before it blocks.
    pub spin: Duration,
}

impl EngineConfig {
    /// One engine thread doing both directions, no faults.
    pub fn new(addr: IpAddr) -> EngineConfig {
        EngineConfig {
            addr,
            threads: vec![Role::Both],
            faults: FaultConfig::default(),
            fault_seed: 1,
            transport: TransportConfig::default(),
            spin: Duration::from_micros(50),
        }
    }

    /// `n` engine threads: with `split`, half receive and half send.
    pub fn with_threads(mut self, n: usize, split: bool) -> EngineConfig {
        self.threads = if split && n >= 2 {
            (0..n).map(|i| if i % 2 == 0 { Role::Rx } else { Role::Tx }).collect()
        } else {
            vec![Role::Both; n]
        };
        self
    }
}

/// Why a NIC could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("cannot start the engine: {0}")]
    Io(#[from] std::io::Error),
}

/// What a NIC counted, for `devinfo`.
#[derive(Debug, Clone, Default)]
pub struct NicCounters {
    pub transport: softrnic_transport::Counters,
    pub injected_tx: FaultStats,
    pub injected_rx: FaultStats,
    /// Datagrams the kernel would not take (send buffer full).
    pub tx_dropped_by_kernel: u64,
}

struct Faults {
    tx: FaultInjector,
    rx: FaultInjector,
}

struct Shared {
    device: Mutex<Device>,
    /// Held from building a batch until it is sent, so that batches of two
    /// threads never overtake each other on the wire.
    transmit_order: Mutex<()>,
    socket: RoceSocket,
    epoch: std::time::Instant,
    faults: Option<Mutex<Faults>>,
    waker: EventFd,
    sleepers: AtomicUsize,
    stop: AtomicBool,
    /// Until when (ns since `epoch`) the application drives progress.
    app_active_until: AtomicU64,
    /// The completion channel each CQ notifies, if any.
    channels: Mutex<HashMap<CqId, Arc<EventQueue<CqId>>>>,
    /// Asynchronous events the device raised, for `ibv_get_async_event`.
    async_events: Arc<EventQueue<AsyncEvent>>,
    tx_dropped_by_kernel: AtomicU64,
    /// Print every datagram (`SOFTRNIC_TRACE=1`).
    trace: bool,
    /// When the counters were last published (ns since `epoch`).
    published_at: AtomicU64,
    /// When an idle poll last ran the transmit pass (ns since `epoch`).
    idle_transmit_at: AtomicU64,
}

/// A running software RNIC.
pub struct Nic {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// Buffers an engine or application thread reuses for every batch.
struct Scratch {
    rx: RecvBatch,
    tx: Vec<Box<[u8]>>,
    tx_meta: Vec<(SocketAddr, usize)>,
    faulty: Vec<(SocketAddr, Vec<u8>)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        rx: RecvBatch::default(),
        tx: (0..BATCH).map(|_| vec![0u8; MAX_DATAGRAM_LEN].into_boxed_slice()).collect(),
        tx_meta: Vec::with_capacity(BATCH),
        faulty: Vec::new(),
    });
}

/// How long an application counts as driving progress after it polled.
const APP_ACTIVE: Duration = Duration::from_millis(2);
/// Asynchronous events kept for a program that does not read them.
const MAX_QUEUED_ASYNC_EVENTS: usize = 4096;
/// How often a poll that finds nothing runs the transmit pass.
const IDLE_TRANSMIT_NS: u64 = 5_000;
/// The longest an idle engine thread sleeps without looking around.
const MAX_SLEEP_MS: i32 = 20;

impl Nic {
    /// Binds the device's socket and starts its engine threads.
    pub fn open(config: EngineConfig) -> Result<Nic, OpenError> {
        let socket = RoceSocket::bind(config.addr)?;
        let transport = TransportConfig { local_addr: config.addr, ..config.transport.clone() };
        let faults = (!config.faults.is_none()).then(|| {
            Mutex::new(Faults {
                tx: FaultInjector::new(config.faults, config.fault_seed),
                rx: FaultInjector::new(config.faults, config.fault_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            })
        });
        let shared = Arc::new(Shared {
            device: Mutex::new(Device::new(transport)),
            transmit_order: Mutex::new(()),
            socket,
            epoch: std::time::Instant::now(),
            faults,
            waker: EventFd::new()?,
            sleepers: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            app_active_until: AtomicU64::new(0),
            channels: Mutex::new(HashMap::new()),
            async_events: Arc::new(EventQueue::new()?),
            tx_dropped_by_kernel: AtomicU64::new(0),
            trace: std::env::var_os("SOFTRNIC_TRACE").is_some(),
            published_at: AtomicU64::new(0),
            idle_transmit_at: AtomicU64::new(0),
        });
        let threads = config
            .threads
            .iter()
            .enumerate()
            .map(|(i, &role)| {
                let shared = shared.clone();
                let spin = config.spin;
                std::thread::Builder::new()
                    .name(format!("softrnic-{role:?}-{i}").to_lowercase())
                    .spawn(move || shared.run(role, spin))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Nic { shared, threads })
    }

    pub fn addr(&self) -> IpAddr {
        self.shared.socket.local_addr().ip()
    }

    /// The transport's clock: time since the NIC opened.
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    /// Runs `f` on the device (verbs that produce no packets: queries,
    /// registration, polling).
    pub fn with<T>(&self, f: impl FnOnce(&mut Device, Instant) -> T) -> T {
        let mut device = self.shared.lock();
        f(&mut device, self.shared.now())
    }

    /// Runs `f` on the device and rings the doorbell: whatever it made the
    /// device want to send leaves from the caller's thread right away.
    pub fn with_doorbell<T>(&self, f: impl FnOnce(&mut Device, Instant) -> T) -> T {
        let out = self.with(f);
        self.shared.transmit();
        self.shared.wake();
        out
    }

    /// One round of progress from the caller's thread: receive and handle
    /// what has arrived, run timers, send. Returns whether anything moved.
    pub fn progress(&self) -> bool {
        let received = self.receive();
        let sent = self.transmit();
        received + sent > 0
    }

    /// Receives and handles what has arrived, from the caller's thread;
    /// returns how many datagrams. Answers it produced (ACKs) wait for
    /// [`Nic::transmit`] or the next doorbell, so that an application that
    /// replies at once sends both in one system call.
    pub fn receive(&self) -> usize {
        let until = self.shared.now().as_nanos() + APP_ACTIVE.as_nanos() as u64;
        self.shared.app_active_until.store(until, Ordering::Relaxed);
        self.shared.receive()
    }

    /// Destroys a QP after sending what it still owes the wire (the ACK of
    /// a message the application just polled), so its peer never retries
    /// into a QP that is gone.
    pub fn destroy_qp(&self, qpn: u32) -> softrnic_transport::Result<()> {
        self.shared.transmit();
        self.with(|d, _| d.destroy_qp(qpn))
    }

    /// Runs due timers and sends what is pending, from the caller's thread.
    pub fn transmit(&self) -> usize {
        self.shared.transmit()
    }

    /// [`Nic::transmit`] for a poll that found nothing: at most every few
    /// microseconds, so a spinning poll loop spends its time watching the
    /// socket. Timers and deferred ACKs lose no more than that.
    pub fn transmit_when_idle(&self) -> usize {
        let now = self.shared.now().as_nanos();
        let last = self.shared.idle_transmit_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) < IDLE_TRANSMIT_NS {
            return 0;
        }
        self.shared.idle_transmit_at.store(now, Ordering::Relaxed);
        self.shared.transmit()
    }

    /// The completion channel of `cq`, made on first use: it receives `cq`
    /// each time a notification requested with `request_notify_cq` fires.
    pub fn channel(&self, cq: CqId) -> std::io::Result<Arc<EventQueue<CqId>>> {
        let mut channels = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(&cq) {
            return Ok(channel.clone());
        }
        let channel = Arc::new(EventQueue::new()?);
        channels.insert(cq, channel.clone());
        Ok(channel)
    }

    /// Makes `cq`'s notifications go to `channel`, which several CQs may
    /// share (`ibv_create_cq` with a `ibv_comp_channel`); `None` detaches.
    pub fn set_channel(&self, cq: CqId, channel: Option<Arc<EventQueue<CqId>>>) {
        let mut channels = self.shared.channels.lock().unwrap_or_else(|e| e.into_inner());
        match channel {
            Some(channel) => channels.insert(cq, channel),
            None => channels.remove(&cq),
        };
    }

    /// The device's asynchronous events, in the order they happened.
    pub fn async_events(&self) -> &Arc<EventQueue<AsyncEvent>> {
        &self.shared.async_events
    }

    pub fn counters(&self) -> NicCounters {
        self.shared.counters()
    }

    pub fn engine_threads(&self) -> usize {
        self.threads.len()
    }
}

impl Shared {
    fn counters(&self) -> NicCounters {
        let transport = self.lock().counters().clone();
        let (injected_tx, injected_rx) = match &self.faults {
            Some(f) => {
                let f = f.lock().unwrap_or_else(|e| e.into_inner());
                (f.tx.stats, f.rx.stats)
            }
            None => Default::default(),
        };
        NicCounters {
            transport,
            injected_tx,
            injected_rx,
            tx_dropped_by_kernel: self.tx_dropped_by_kernel.load(Ordering::Relaxed),
        }
    }

    /// Writes the counters where `softrnic devinfo` finds them, at most
    /// every 250 ms unless `force`.
    fn publish_counters(&self, force: bool) {
        let now = self.now().as_nanos();
        let last = self.published_at.load(Ordering::Relaxed);
        if !force && now.saturating_sub(last) < 250_000_000 {
            return;
        }
        self.published_at.store(now, Ordering::Relaxed);
        let path = crate::counters_file::path(self.socket.local_addr().ip());
        let _ = crate::counters_file::write(&path, &self.counters());
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        // ACKs that a last poll owed leave now: the peer must not retry
        // into a device that is gone.
        self.shared.transmit();
        self.shared.stop.store(true, Ordering::SeqCst);
        for _ in 0..self.threads.len() {
            self.shared.waker.signal();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.shared.publish_counters(true);
    }
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, Device> {
        // A panic elsewhere must not wedge the NIC: the device's state is
        // consistent between calls.
        self.device.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.waker.signal();
        }
    }

    /// Tells completion channels whose notification fired, and queues the
    /// asynchronous events the device raised.
    fn signal_channels(&self, device: &mut Device) {
        while let Some(cq) = device.poll_cq_notification() {
            if let Some(channel) = self.channels.lock().unwrap_or_else(|e| e.into_inner()).get(&cq) {
                channel.push(cq);
            }
        }
        while let Some(event) = device.poll_async_event() {
            self.async_events.push_bounded(event, MAX_QUEUED_ASYNC_EVENTS);
        }
    }

    /// Receives one batch and hands it to the device. Returns how many
    /// datagrams arrived.
    fn receive(&self) -> usize {
        SCRATCH.with_borrow_mut(|scratch| {
            let n = self.socket.recv_batch(&mut scratch.rx).unwrap_or(0);
            if n == 0 {
                // A datagram held back for reordering is delivered once
                // traffic pauses, or it would never arrive.
                if let Some(faults) = &self.faults {
                    scratch.faulty.clear();
                    faults.lock().unwrap_or_else(|e| e.into_inner()).rx.release(&mut scratch.faulty);
                    if let Some((from, bytes)) = scratch.faulty.pop() {
                        let now = self.now();
                        let mut device = self.lock();
                        device.handle_datagram(now, from, &bytes);
                        self.signal_channels(&mut device);
                        return 1;
                    }
                }
                return 0;
            }
            let now = self.now();
            if let Some(faults) = &self.faults {
                let mut faults = faults.lock().unwrap_or_else(|e| e.into_inner());
                scratch.faulty.clear();
                for i in 0..n {
                    if let Some((from, bytes)) = scratch.rx.get(i) {
                        faults.rx.apply(from, bytes, &mut scratch.faulty);
                    }
                }
                drop(faults);
                let mut device = self.lock();
                for (from, bytes) in &scratch.faulty {
                    if self.trace {
                        self.trace("<-", *from, bytes);
                    }
                    device.handle_datagram(now, *from, bytes);
                }
                self.signal_channels(&mut device);
            } else {
                let mut device = self.lock();
                for i in 0..n {
                    if let Some((from, bytes)) = scratch.rx.get(i) {
                        if self.trace {
                            self.trace("<-", from, bytes);
                        }
                        device.handle_datagram(now, from, bytes);
                    }
                }
                self.signal_channels(&mut device);
            }
            n
        })
    }

    /// Runs due timers and sends everything the device has to send.
    /// Returns how many datagrams left.
    fn transmit(&self) -> usize {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut total = 0;
            let _in_order = self.transmit_order.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                scratch.tx_meta.clear();
                {
                    let mut device = self.lock();
                    let now = self.now();
                    device.handle_timeout(now);
                    while scratch.tx_meta.len() < BATCH {
                        let slot = scratch.tx_meta.len();
                        match device.poll_transmit(now, &mut scratch.tx[slot]) {
                            Some(t) => scratch.tx_meta.push((SocketAddr::new(t.dst, ROCEV2_UDP_PORT), t.len)),
                            None => break,
                        }
                    }
                    self.signal_channels(&mut device);
                }
                let count = scratch.tx_meta.len();
                if count == 0 {
                    if let Some(faults) = &self.faults {
                        // A datagram held back for reordering goes out once
                        // traffic pauses.
                        scratch.faulty.clear();
                        faults.lock().unwrap_or_else(|e| e.into_inner()).tx.release(&mut scratch.faulty);
                        let held: Vec<(SocketAddr, &[u8])> = scratch.faulty.iter().map(|(a, b)| (*a, &b[..])).collect();
                        self.send_all(&held);
                    }
                    break;
                }
                if let Some(faults) = &self.faults {
                    let mut faults = faults.lock().unwrap_or_else(|e| e.into_inner());
                    scratch.faulty.clear();
                    for (i, &(dst, len)) in scratch.tx_meta.iter().enumerate() {
                        faults.tx.apply(dst, &scratch.tx[i][..len], &mut scratch.faulty);
                    }
                    drop(faults);
                    let packets: Vec<(SocketAddr, &[u8])> = scratch.faulty.iter().map(|(a, b)| (*a, &b[..])).collect();
                    self.send_all(&packets);
                } else {
                    let mut packets = [(SocketAddr::new(self.socket.local_addr().ip(), 0), &[][..]); BATCH];
                    for (i, &(dst, len)) in scratch.tx_meta.iter().enumerate() {
                        packets[i] = (dst, &scratch.tx[i][..len]);
                    }
                    self.send_all(&packets[..count]);
                }
                total += count;
                if count < BATCH {
                    break;
                }
            }
            total
        })
    }

    fn trace(&self, direction: &str, peer: SocketAddr, bytes: &[u8]) {
        let t = self.now().as_nanos();
        eprintln!(
            "{:>10}.{:06} {} {direction} {} {}",
            t / 1_000_000_000,
            t / 1000 % 1_000_000,
            self.socket.local_addr().ip(),
            peer.ip(),
            softrnic_wire::packet::summary(bytes)
        );
    }

    /// Sends a batch; what the kernel refuses is dropped, as a full link
    /// would drop it, and retransmitted by the transport.
    fn send_all(&self, packets: &[(SocketAddr, &[u8])]) {
        if self.trace {
            for (dst, bytes) in packets {
                self.trace("->", *dst, bytes);
            }
        }
        let mut sent = 0;
        while sent < packets.len() {
            match self.socket.send_batch(&packets[sent..]) {
                Ok(0) | Err(_) => break,
                Ok(n) => sent += n,
            }
        }
        let refused = (packets.len() - sent) as u64;
        if refused > 0 {
            self.tx_dropped_by_kernel.fetch_add(refused, Ordering::Relaxed);
        }
    }

    fn app_active(&self) -> bool {
        self.now().as_nanos() < self.app_active_until.load(Ordering::Relaxed)
    }

    /// Milliseconds until the device's next deadline, at most `cap`.
    fn sleep_ms(&self, cap: i32) -> i32 {
        let deadline = self.lock().poll_timeout();
        match deadline {
            None => cap,
            Some(at) => {
                let ns = at.as_nanos().saturating_sub(self.now().as_nanos());
                (ns.div_ceil(1_000_000) as i32).min(cap)
            }
        }
    }

    /// An engine thread's life.
    fn run(self: Arc<Self>, role: Role, spin: Duration) {
        let mut idle_since: Option<std::time::Instant> = None;
        let socket: RawFd = self.socket.fd();
        let waker: RawFd = self.waker.as_raw_fd();
        while !self.stop.load(Ordering::Relaxed) {
            if self.app_active() {
                // The application polls: stay out of its way, but keep the
                // timers honest in case it stops.
                let _ = wait_readable(&[waker], 1);
                self.waker.drain();
                continue;
            }
            let mut worked = 0;
            if role != Role::Tx {
                worked += self.receive();
            }
            if role != Role::Rx {
                worked += self.transmit();
            } else if worked > 0 {
                // Handling may have produced answers for the sender threads.
                self.waker.signal();
            }
            if worked > 0 {
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            self.publish_counters(false);
            let timeout = if role == Role::Rx { MAX_SLEEP_MS } else { self.sleep_ms(MAX_SLEEP_MS) };
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let _ = match role {
                Role::Tx => wait_readable(&[waker], timeout),
                _ => wait_readable(&[socket, waker], timeout),
            };
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
            self.waker.drain();
            idle_since = None;
        }
    }
}
