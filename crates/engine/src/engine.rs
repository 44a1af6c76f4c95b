//! `Nic`: a software RNIC at run time, sharded like a NIC's cores.
//!
//! ```text
//!   verbs on device-wide objects ──> Control (one lock; never on the data path)
//!                                      │ memory snapshots, QPs
//!                                      v
//!   post / poll ──────────────> shard 0 │ shard 1 │ ...   (one lock each)
//!                                 │           │
//!   kernel: SO_REUSEPORT group, cBPF on the BTH's destination QP
//!                                 │           │
//!                              socket 0    socket 1    (UDP 4791 of the device's address)
//! ```
//!
//! Each shard owns a set of QPs (QP `n` lives on shard `n % shards`), their
//! timers and a socket; the kernel steers every datagram to the socket of
//! the shard that owns its destination QP. A shard is driven by its engine
//! thread or by an application thread that posts or polls, one at a time
//! under the shard's own locks: no lock is shared by all QPs on the data
//! path, and each QP's packets stay in order by construction. Completion
//! queues and SRQs may be shared by QPs of several shards; each has its own
//! lock. How progress is made, inline or on dedicated engine cores, is
//! [`progress`](crate::progress).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use softrnic_transport::memory::{MemoryRegion, MemoryTable};
use softrnic_transport::qp::QpAttributes;
use softrnic_transport::{
    AsyncEvent, Choice, Completion, CompletionQueue, Control, CqId, Entropy, Instant, MrKeys, PdId, PostQueues, Posted,
    QpAttr, QpInitAttr, QpState, RecvWorkRequest, Registration, Result, SendPoster, SendWorkRequest, Shard,
    SharedReceiveQueue, SrqAttr, SrqId, TransportConfig, VerbsError, WindowType, shard_of,
};
use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::int::INT_UDP_PORT;

use crate::datapath::{Datapath, DatapathKind, SharedMemory, Udp};
use crate::environment;
use crate::faults::{FaultConfig, FaultStats};
use crate::lingering::Lingering;
use crate::peer_files::PeerFiles;
use crate::progress::{self, Pass, ProgressMode};
use crate::receive_sources::ReceiveSources;
use crate::shard::{EngineShard, PassContext};
use crate::shm::{Inbox, Scope};
use crate::socket::{BindError, RoceSocket};
use crate::trace::Tracer;
use softrnic_event::EventQueue;

/// What an engine thread does for its shard.
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
    /// Engine threads, one per shard; 0 gives one shard that only the
    /// application's threads drive.
    pub engine_threads: usize,
    /// Give each shard a receiving and a sending thread (the SwRDMA
    /// design) instead of one that does both.
    pub split_rx_tx: bool,
    pub faults: FaultConfig,
    /// Seed of the fault injectors, for repeatable runs.
    pub fault_seed: u64,
    pub transport: TransportConfig,
    /// How long an idle engine thread spins before it blocks.
    pub spin: Duration,
    /// The wire for peers on this host.
    pub datapath: DatapathKind,
    /// Which devices the shared-memory wire reaches; `None`: those of the
    /// network namespace of the thread that opens the device.
    pub shm_scope: Option<Scope>,
    /// Who drives the shards.
    pub progress: ProgressMode,
}

impl EngineConfig {
    /// One shard with one engine thread, no faults.
    pub fn new(addr: IpAddr) -> EngineConfig {
        EngineConfig {
            addr,
            engine_threads: 1,
            split_rx_tx: false,
            faults: FaultConfig::default(),
            fault_seed: 1,
            transport: TransportConfig::default(),
            spin: Duration::from_micros(50),
            datapath: DatapathKind::Auto,
            shm_scope: None,
            progress: ProgressMode::Auto,
        }
    }

    /// `n` shards, each with an engine thread (with `split`, two: one
    /// receiving, one sending).
    pub fn with_threads(mut self, n: usize, split: bool) -> EngineConfig {
        self.engine_threads = n;
        self.split_rx_tx = split;
        self
    }

    /// [`EngineConfig::new`] with what the environment asks for
    /// ([`crate::environment`]): engine threads, datapath, progress,
    /// retransmission timer, congestion control and injected faults. Every
    /// variable the engine reads is checked here, so a bad value is
    /// refused before the device opens.
    pub fn from_env(addr: IpAddr) -> std::result::Result<EngineConfig, String> {
        let mut config = EngineConfig {
            datapath: environment::datapath()?,
            progress: environment::progress()?,
            faults: environment::faults()?,
            ..EngineConfig::new(addr)
        };
        environment::selective_repeat()?;
        environment::ecn()?;
        config.transport.auth_key = environment::auth_key()?;
        config.transport.retransmission = environment::retransmission()?;
        environment::congestion(&mut config.transport.congestion)?;
        // A UD message must fit one packet the link carries.
        config.transport.ud_mtu = crate::interface::active_mtu(addr);
        Ok(match environment::engine_threads(MAX_SHARDS)? {
            Some(n) => config.with_threads(n, false),
            None => config,
        })
    }

    fn shards(&self) -> usize {
        self.engine_threads.max(1)
    }

    /// Whether this device's engine threads get dedicated progress.
    fn dedicated(&self) -> bool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.progress.is_dedicated(self.roles().len(), cores)
    }

    fn roles(&self) -> Vec<(usize, Role)> {
        (0..self.engine_threads)
            .flat_map(|shard| {
                let roles: &[Role] = if self.split_rx_tx { &[Role::Rx, Role::Tx] } else { &[Role::Both] };
                roles.iter().map(move |&role| (shard, role))
            })
            .collect()
    }
}

/// The most shards a device may have: a completion queue records the
/// shards that feed it in a 64-bit set.
pub const MAX_SHARDS: usize = 64;

/// Why a NIC could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("{0}")]
    Config(String),
    #[error("cannot start the engine: {0}")]
    Io(#[from] std::io::Error),
}

/// What a NIC counted, for `devinfo` and for tests.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NicCounters {
    pub transport: softrnic_transport::Counters,
    pub injected_tx: FaultStats,
    pub injected_rx: FaultStats,
    /// Datagrams the wire would not take (a full send buffer or
    /// shared-memory ring).
    pub tx_dropped_by_kernel: u64,
    /// Datagrams a shard received for another shard's QP and handed on.
    pub rx_missteered: u64,
    /// Datagrams the kernel dropped because a receive buffer was full:
    /// losses of this host, not of the network.
    pub rx_dropped_by_kernel: u64,
    /// Shared-memory ring entries a peer left malformed or abandoned.
    pub rx_ring_malformed: u64,
    /// The longest an engine thread went between two looks at its shard
    /// beyond the waits it chose (its passes' own work included), in µs:
    /// the time it was descheduled, or blocked on a lock a descheduled
    /// thread held. A peer's retransmission timer that fires on a clean
    /// link follows a stall near its timeout.
    pub engine_stall_max_us: u64,
    /// RoCE packets that arrived marked ECN CE (the name mlx5 gives its
    /// notification point's counter).
    pub np_ecn_marked_roce_packets: u64,
    /// Datagrams that arrived on the INT port (UDP 4792), and those of
    /// them dropped for want of a valid INT header.
    pub rx_int_packets: u64,
    pub rx_int_malformed: u64,
}

/// The state every thread of a NIC shares.
pub(crate) struct Core {
    control: Mutex<Control>,
    pub(crate) shards: Box<[EngineShard]>,
    /// Whether peers on this host reach the device through shared memory.
    shared_memory: bool,
    /// Whether its regions go on memfds those peers copy from.
    one_copy: bool,
    /// Those of its deregistered regions that peers may still be copying.
    pub(crate) lingering: Lingering,
    /// Whether engine threads poll the shards (dedicated progress) rather
    /// than the application's posts and polls (inline).
    pub(crate) dedicated: bool,
    /// Where the next QP goes (round robin over shards).
    next_shard: AtomicUsize,
    epoch: std::time::Instant,
    stop: AtomicBool,
    /// The completion channel each CQ notifies, if any.
    channels: Mutex<HashMap<CqId, Arc<EventQueue<CqId>>>>,
    /// Asynchronous events the device raised, for `ibv_get_async_event`.
    async_events: Arc<EventQueue<AsyncEvent>>,
    /// Where events go instead, when a front end routes them.
    async_router: std::sync::RwLock<Option<AsyncRouter>>,
    tx_dropped_by_kernel: AtomicU64,
    pub(crate) missteered: AtomicU64,
    /// See [`NicCounters::engine_stall_max_us`] (here in ns).
    pub(crate) longest_stall: AtomicU64,
    /// Prints every datagram (`SOFTRNIC_TRACE=1`).
    tracer: Option<Tracer>,
    /// When the counters were last published (ns since `epoch`).
    published_at: AtomicU64,
    /// What posts the receives of queues fetched on demand.
    pub(crate) receive_sources: ReceiveSources,
}

/// Takes a device's asynchronous events ([`Nic::route_async_events`]).
pub type AsyncRouter = Box<dyn Fn(AsyncEvent) + Send + Sync>;

/// A running software RNIC.
pub struct Nic {
    pub(crate) core: Arc<Core>,
    threads: Vec<JoinHandle<()>>,
}

/// Asynchronous events kept for a program that does not read them.
pub const MAX_QUEUED_ASYNC_EVENTS: usize = 4096;

impl Nic {
    /// Binds the device's sockets and starts its engine threads.
    pub fn open(config: EngineConfig) -> std::result::Result<Nic, OpenError> {
        let shards = config.shards();
        if shards > MAX_SHARDS {
            return Err(OpenError::Config(format!(
                "{} engine threads asked for; a device has at most {MAX_SHARDS}",
                config.engine_threads
            )));
        }
        let mut transport = TransportConfig { local_addr: config.addr, ..config.transport.clone() };
        // A device whose algorithm steers by INT carries it.
        transport.congestion.int |= transport.congestion.algorithm.as_ref().is_some_and(|a| a.wants_int());
        let mut sockets = RoceSocket::bind_group(config.addr, ROCEV2_UDP_PORT, shards)?;
        for socket in &mut sockets {
            socket.set_cnp_dscp(transport.congestion.cnp_dscp);
        }
        let int_sockets = match transport.congestion.int {
            true => RoceSocket::bind_group(config.addr, INT_UDP_PORT, shards)?,
            false => Vec::new(),
        };
        let scope = || config.shm_scope.map_or_else(Scope::this_netns, Ok);
        let inbox = match config.datapath {
            DatapathKind::Udp => None,
            DatapathKind::Auto => {
                scope().and_then(|scope| Inbox::create(config.addr, shards, scope)).ok().map(Arc::new)
            }
            DatapathKind::Shm => Some(Arc::new(Inbox::create(config.addr, shards, scope()?)?)),
        };
        let one_copy = inbox.is_some() && environment::one_copy();
        let control = Control::new(transport.clone(), shards, Entropy::from_seed(os_seed()?));
        let shards = sockets
            .into_iter()
            .zip(int_sockets.into_iter().map(Some).chain(std::iter::repeat_with(|| None)))
            .enumerate()
            .map(|(i, (socket, int_socket))| {
                let mut shard = Shard::new(i, transport.clone(), control.memory().clone());
                if inbox.is_some() {
                    // Peers on this host send references to their memory
                    // in place of payloads: one copy, from there.
                    shard.set_peer_memory(Box::new(PeerFiles::new()));
                    shard.send_references(one_copy);
                }
                let socket = Arc::new(socket);
                let int_socket = int_socket.map(Arc::new);
                let udp = Udp::new(socket.clone(), int_socket.clone());
                let wire: Box<dyn Datapath> = match &inbox {
                    // Only corruption needs the ICRC: lost, duplicated
                    // and reordered datagrams keep their bytes.
                    Some(inbox) => Box::new(SharedMemory::new(udp, inbox.ring(i)).sealing(config.faults.corrupt > 0.0)),
                    None => Box::new(udp),
                };
                EngineShard::new(i, shard, (socket, int_socket), wire, config.faults, config.fault_seed)
            })
            .collect::<std::io::Result<Box<[_]>>>()?;
        let epoch = std::time::Instant::now();
        let core = Arc::new(Core {
            control: Mutex::new(control),
            shards,
            shared_memory: inbox.is_some(),
            one_copy,
            lingering: Lingering::default(),
            dedicated: config.dedicated(),
            next_shard: AtomicUsize::new(0),
            epoch,
            stop: AtomicBool::new(false),
            channels: Mutex::new(HashMap::new()),
            async_events: Arc::new(EventQueue::new()?),
            async_router: std::sync::RwLock::new(None),
            tx_dropped_by_kernel: AtomicU64::new(0),
            missteered: AtomicU64::new(0),
            longest_stall: AtomicU64::new(0),
            tracer: environment::trace().then_some(Tracer { local: config.addr, epoch }),
            published_at: AtomicU64::new(0),
            receive_sources: ReceiveSources::default(),
        });
        let mut nic = Nic { core, threads: Vec::new() };
        for (shard, role) in config.roles() {
            let core = nic.core.clone();
            let spin = config.spin;
            let thread = std::thread::Builder::new()
                .name(format!("softrnic-{shard}-{role:?}").to_lowercase())
                .spawn(move || progress::run(&core, shard, role, spin))?;
            nic.threads.push(thread);
        }
        Ok(nic)
    }

    pub fn addr(&self) -> IpAddr {
        self.core.shards[0].socket().local_addr().ip()
    }

    /// The transport's clock: time since the NIC opened.
    pub fn now(&self) -> Instant {
        self.core.now()
    }

    pub fn shards(&self) -> usize {
        self.core.shards.len()
    }

    pub fn engine_threads(&self) -> usize {
        self.threads.len()
    }

    /// How the shards make progress: [`ProgressMode::Dedicated`] or
    /// [`ProgressMode::Inline`].
    pub fn progress_mode(&self) -> ProgressMode {
        if self.core.dedicated { ProgressMode::Dedicated } else { ProgressMode::Inline }
    }

    /// Whether peers on this host reach the device through shared memory
    /// (and it reaches theirs).
    pub fn shared_memory(&self) -> bool {
        self.core.shared_memory
    }

    /// Whether its regions are registered where peers on this host copy
    /// payloads straight out of them ([`softrnic_transport::by_reference`]).
    pub fn one_copy(&self) -> bool {
        self.core.one_copy
    }

    /// Whether the sockets use UDP segmentation offloads (GSO, GRO).
    pub fn offloads(&self) -> (bool, bool) {
        self.core.shards[0].socket().offloads()
    }

    // ----- protection domains and memory -----

    pub fn alloc_pd(&self) -> PdId {
        self.core.control(|c| c.alloc_pd())
    }

    pub fn dealloc_pd(&self, pd: PdId) -> Result<()> {
        self.core.control(|c| c.dealloc_pd(pd))
    }

    pub fn register_memory(&self, r: Registration) -> Result<MrKeys> {
        self.core.lingering.forget_old();
        self.core.control(|c| c.register_memory(r))
    }

    /// Gives the region `lkey` names a new translation, PD or access under
    /// the same keys (`ibv_rereg_mr`). When it returns, no shard can reach
    /// the old memory any more (peers on this host may, a moment longer,
    /// as after a deregistration).
    pub fn reregister_memory(&self, lkey: u32, r: Registration) -> Result<MrKeys> {
        let new = r.buffer.clone();
        let (keys, old) = self.core.control(|c| c.reregister_memory(lkey, r))?;
        if !Arc::ptr_eq(&old, &new) {
            self.core.lingering.keep(old);
        }
        Ok(keys)
    }

    /// Deregisters a region. When it returns, no shard can reach the
    /// region's memory any more: the program may free it. (Memory peers
    /// on this host copy from stays open to them a moment longer,
    /// [`Lingering`].)
    pub fn deregister_memory(&self, lkey: u32) -> Result<()> {
        let buffer = self.core.control(|c| c.deregister_memory(lkey))?;
        self.core.lingering.keep(buffer);
        Ok(())
    }

    /// Allocates a memory window (`ibv_alloc_mw`); returns its rkey.
    pub fn alloc_window(&self, pd: PdId, kind: WindowType) -> Result<u32> {
        self.core.control(|c| c.alloc_window(pd, kind))
    }

    /// Frees the memory window `rkey` names (`ibv_dealloc_mw`).
    pub fn dealloc_window(&self, rkey: u32) -> Result<()> {
        self.core.control(|c| c.dealloc_window(rkey))
    }

    /// The region `lkey` names, if any (an rkey names none here).
    pub fn memory_region(&self, lkey: u32) -> Option<MemoryRegion> {
        self.core.control(|c| c.memory().lookup(lkey).cloned())
    }

    /// The memory table as it is now: a snapshot that later registrations
    /// do not change. softrnicd's offload designs copy payloads through it,
    /// with the same checks a work request gets.
    pub fn memory(&self) -> Arc<MemoryTable> {
        self.core.control(|c| c.memory().clone())
    }

    // ----- completion queues and SRQs -----

    pub fn create_cq(&self, capacity: usize) -> Arc<CompletionQueue> {
        self.core.control(|c| c.create_cq(capacity))
    }

    pub fn destroy_cq(&self, cq: CqId) -> Result<()> {
        self.core.control(|c| c.destroy_cq(cq))?;
        self.set_channel(cq, None);
        Ok(())
    }

    /// `ibv_poll_cq`: moves up to `max` completions into `out`. With none
    /// ready, the calling thread drives the shards that feed the queue.
    pub fn poll_cq(&self, cq: &CompletionQueue, max: usize, out: &mut Vec<Completion>) -> usize {
        self.core.poll_cq(cq, max, out)
    }

    /// Call before blocking until a completion channel fed by the shards
    /// in `mask` (a CQ's [`CompletionQueue::shards`], or several OR'ed)
    /// fires, and hold the guard while blocked: the engine threads then
    /// drive those shards at once instead of waiting for polls that will
    /// not come.
    pub fn application_waits(&self, mask: u64) -> crate::progress::ApplicationWait<'_> {
        self.core.application_waits(mask)
    }

    /// The completion channel of `cq`, made on first use: it receives `cq`
    /// each time a notification requested with `request_notify` fires.
    pub fn channel(&self, cq: CqId) -> std::io::Result<Arc<EventQueue<CqId>>> {
        let mut channels = self.core.channels.lock().unwrap_or_else(|e| e.into_inner());
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
        let mut channels = self.core.channels.lock().unwrap_or_else(|e| e.into_inner());
        match channel {
            Some(channel) => channels.insert(cq, channel),
            None => channels.remove(&cq),
        };
    }

    pub fn create_srq(&self, pd: PdId, attr: SrqAttr) -> Result<Arc<SharedReceiveQueue>> {
        self.core.control(|c| c.create_srq(pd, attr))
    }

    pub fn destroy_srq(&self, srq: SrqId) -> Result<()> {
        self.core.control(|c| c.destroy_srq(srq))?;
        self.core.receive_sources.forget_srq(srq);
        Ok(())
    }

    /// The receives of `qp` are written where the engine cannot see them
    /// (softrnicd's shared ring): a message that finds none waits while
    /// `fetch` posts them ([`softrnic_transport::fetch_on_demand`]). It
    /// runs in whichever thread drives the QP's shard, with no lock of the
    /// engine's held, as the pass settles: it posts to the QP's (or the
    /// SRQ's) own queue and calls nothing else of the engine's, which
    /// would drive a shard from inside that pass.
    pub fn fetch_receives_with(&self, qp: &PostQueues, fetch: impl Fn() + Send + Sync + 'static) {
        self.core.receive_sources.add_qp(qp.qpn(), Arc::new(fetch));
        qp.fetch_on_demand();
    }

    /// [`Nic::fetch_receives_with`] for an SRQ.
    pub fn fetch_srq_receives_with(&self, srq: &SharedReceiveQueue, fetch: impl Fn() + Send + Sync + 'static) {
        self.core.receive_sources.add_srq(srq.id(), Arc::new(fetch));
        srq.fetch_on_demand();
    }

    // ----- queue pairs -----

    /// Creates a QP on the next shard, round robin. Returns the program's
    /// end of its queues, which posts go through.
    pub fn create_qp(&self, init: QpInitAttr) -> Result<Arc<PostQueues>> {
        let shard = self.core.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards();
        self.core.control(|c| c.create_qp(init, shard)).map(|qp| {
            let posts = qp.post_queues().clone();
            self.core.shards[shard].lock().transport.insert_qp(qp);
            posts
        })
    }

    /// Creates the device's GSI QP (QP1), where CM MADs arrive: see
    /// [`softrnic_transport::Control::create_gsi_qp`].
    pub fn create_gsi_qp(&self, init: QpInitAttr) -> Result<Arc<PostQueues>> {
        self.core.control(|c| c.create_gsi_qp(init)).map(|(shard, qp)| {
            let posts = qp.post_queues().clone();
            self.core.shards[shard].lock().transport.insert_qp(qp);
            posts
        })
    }

    /// Destroys a QP after sending what it still owes the wire (the ACK of
    /// a message the application just polled), so its peer never retries
    /// into a QP that is gone. Its outstanding requests vanish.
    pub fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let shard = self.core.shard(qpn);
        self.core.drive(shard, shard.lock_wire(), Pass::TRANSMIT);
        let (qp, emptied) = shard.lock().transport.remove_qp(qpn)?;
        for group in emptied {
            shard.lock_wire().leave(group);
        }
        self.core.receive_sources.forget_qp(qpn);
        self.core.control(|c| c.destroy_qp(qp))
    }

    /// The QP's state and attributes (`ibv_query_qp`).
    pub fn query_qp(&self, qpn: u32) -> Option<(QpState, QpAttributes)> {
        let guard = self.core.shard(qpn).lock();
        guard.transport.qp(qpn).map(|qp| (qp.state(), *qp.attributes()))
    }

    /// The rate congestion control sets the QP, in bits per second, if it
    /// runs an algorithm.
    pub fn qp_congestion_rate(&self, qpn: u32) -> Option<u64> {
        self.core.shard(qpn).lock().transport.qp(qpn)?.congestion_rate()
    }

    /// Attaches UD QP `qpn` to multicast `group` (`ibv_attach_mcast`): the
    /// QP's shard joins the group over IP multicast if it is the first of
    /// its QPs there, and every datagram sent to the group reaches the QP.
    pub fn attach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        let group = group.to_canonical();
        let shard = self.core.shard(qpn);
        let first = shard.lock().transport.attach_multicast(qpn, group)?;
        // The wire lock is never taken under the state lock.
        if first {
            if let Err(e) = shard.lock_wire().join(group) {
                let _ = shard.lock().transport.detach_multicast(qpn, group);
                return Err(VerbsError::Device(format!("joining multicast group {group}: {e}")));
            }
            // An engine thread asleep waits on the sockets it had.
            shard.wake_sleepers();
        }
        Ok(())
    }

    /// Detaches UD QP `qpn` from `group` (`ibv_detach_mcast`); the shard
    /// leaves the group with its last QP there.
    pub fn detach_multicast(&self, qpn: u32, group: IpAddr) -> Result<()> {
        let group = group.to_canonical();
        let shard = self.core.shard(qpn);
        if shard.lock().transport.detach_multicast(qpn, group)? {
            shard.lock_wire().leave(group);
        }
        Ok(())
    }

    /// `ibv_modify_qp`; returns the state the QP is in afterwards. A QP
    /// the program moves to the error state (or back to reset) first sends
    /// what it owes the wire, as a destroyed one does: the ACK of a message
    /// just polled would otherwise never leave, and the peer would retry
    /// into a QP that drops everything (rdma_disconnect does this).
    pub fn modify_qp(&self, qpn: u32, attr: &QpAttr) -> Result<QpState> {
        if matches!(attr.state, Some(QpState::Error | QpState::Reset)) {
            let shard = self.core.shard(qpn);
            self.core.drive(shard, shard.lock_wire(), Pass::TRANSMIT);
        }
        self.with_qp(qpn, |shard, now| {
            shard.modify_qp(now, qpn, attr)?;
            Ok(shard.qp(qpn).map_or(QpState::Error, |qp| qp.state()))
        })
    }

    /// Limits the rate of a QP's requests (bits per second), or lifts it.
    pub fn set_qp_rate_limit(&self, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        self.with_qp(qpn, |shard, now| shard.set_qp_rate_limit(now, qpn, bits_per_second))
    }

    /// Chooses the congestion control of one QP in place of the device's.
    pub fn set_qp_congestion_control(&self, qpn: u32, algorithm: Option<Choice>) -> Result<()> {
        self.with_qp(qpn, |shard, now| shard.set_qp_congestion_control(now, qpn, algorithm))
    }

    /// Posts one send request and rings the doorbell.
    pub fn post_send(&self, qp: &PostQueues, wr: SendWorkRequest) -> Result<()> {
        self.send_queue(qp).post(wr)
    }

    /// The send queue of `qp`, for posting a chain of requests under its
    /// lock (the QP's own, not its shard's); dropping it rings the doorbell
    /// once for them all.
    pub fn send_queue<'a>(&'a self, qp: &'a PostQueues) -> SendQueue<'a> {
        let shard = self.core.shard(qp.qpn());
        SendQueue { core: &self.core, shard, poster: Some(qp.send_poster()), qpn: qp.qpn() }
    }

    /// Posts a receive request. The QP takes it with the shard's next pass,
    /// or with the packet that needs it if that comes first. Inline, it
    /// sends nothing, so it drives nothing: an ACK the last poll owes waits
    /// for the next send and leaves in the same system call (a ping-pong
    /// posts its receive, then its send). Dedicated, it sets the doorbell,
    /// so that the engine thread's next pass takes it.
    pub fn post_recv(&self, qp: &PostQueues, wr: RecvWorkRequest) -> Result<()> {
        if qp.post_recv(wr)? == Posted::Tell {
            let shard = self.core.shard(qp.qpn());
            shard.tell(qp.qpn());
            if self.core.dedicated {
                // The engine thread takes it with its next pass (a flush,
                // if the QP is in error, must not wait for traffic).
                shard.doorbell.store(true, Ordering::SeqCst);
                shard.ring();
            }
        }
        Ok(())
    }

    /// Runs `f` on the shard that owns `qpn`, then rings the doorbell.
    fn with_qp<T>(&self, qpn: u32, f: impl FnOnce(&mut Shard, Instant) -> Result<T>) -> Result<T> {
        let shard = self.core.shard(qpn);
        let out = f(&mut shard.lock().transport, self.now());
        self.core.ring_doorbell(shard);
        out
    }

    // ----- progress, events, counters -----

    /// One round of progress on every shard from the caller's thread:
    /// receive, run timers, send. Returns whether anything moved.
    pub fn progress(&self) -> bool {
        self.core.progress_all() > 0
    }

    /// The device's asynchronous events, in the order they happened
    /// (unless a router takes them).
    pub fn async_events(&self) -> &Arc<EventQueue<AsyncEvent>> {
        &self.core.async_events
    }

    /// Hands every asynchronous event from now on to `router` instead of
    /// [`Nic::async_events`]: a front end that serves several users of
    /// the device (the C library's contexts) delivers each to the one that
    /// owns its object. The router runs on the thread that raised the
    /// event, with no lock of the device held.
    pub fn route_async_events(&self, router: AsyncRouter) {
        *self.core.async_router.write().unwrap_or_else(|e| e.into_inner()) = Some(router);
    }

    pub fn counters(&self) -> NicCounters {
        self.core.counters()
    }
}

/// A QP's send queue, locked for posting; dropping it rings the doorbell.
pub struct SendQueue<'a> {
    core: &'a Core,
    shard: &'a EngineShard,
    poster: Option<SendPoster<'a>>,
    qpn: u32,
}

impl SendQueue<'_> {
    /// Posts one send request (`ibv_post_send`).
    pub fn post(&mut self, wr: SendWorkRequest) -> Result<()> {
        self.poster.as_mut().expect("held until drop").post(wr).map(|_| ())
    }
}

impl Drop for SendQueue<'_> {
    fn drop(&mut self) {
        let Some(poster) = self.poster.take() else {
            return;
        };
        let tell = poster.needs_telling();
        // The QP's lock goes first: the shard may be taking its posts.
        drop(poster);
        if tell {
            self.shard.tell(self.qpn);
        }
        self.core.ring_doorbell(self.shard);
    }
}

impl Drop for Nic {
    fn drop(&mut self) {
        // ACKs that a last poll owed leave now: the peer must not retry
        // into a device that is gone.
        for shard in self.core.shards.iter() {
            self.core.drive(shard, shard.lock_wire(), Pass::TRANSMIT);
        }
        // Datagrams a full shared-memory ring made the wire hold go too,
        // while the peer drains its ring (for at most a second).
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while self.core.shards.iter().any(|s| s.holding.load(Ordering::Relaxed)) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(50));
            for shard in self.core.shards.iter() {
                self.core.drive(shard, shard.lock_wire(), Pass::TRANSMIT);
            }
        }
        self.core.stop.store(true, Ordering::SeqCst);
        for shard in self.core.shards.iter() {
            shard.tx_waker.signal();
            shard.rx_waker.signal();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.core.publish_counters(true);
    }
}

impl Core {
    pub(crate) fn now(&self) -> Instant {
        Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub(crate) fn shard(&self, qpn: u32) -> &EngineShard {
        &self.shards[shard_of(qpn, self.shards.len())]
    }

    /// Runs a control verb. A change to the memory table reaches every
    /// shard before the verb returns: once a region is deregistered, no
    /// shard can touch its memory.
    fn control<T>(&self, f: impl FnOnce(&mut Control) -> T) -> T {
        let mut control = self.control.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut control);
        if let Some(memory) = control.take_memory_update() {
            for shard in self.shards.iter() {
                shard.lock().transport.set_memory(memory.clone());
            }
        }
        out
    }

    pub(crate) fn pass_context(&self, now: Instant) -> PassContext<'_> {
        PassContext {
            now,
            std_now: self.epoch + Duration::from_nanos(now.as_nanos()),
            shards: self.shards.len(),
            tracer: self.tracer.as_ref(),
            tx_dropped_by_kernel: &self.tx_dropped_by_kernel,
        }
    }

    /// Tells the completion channel of `cq` that its notification fired.
    pub(crate) fn notify(&self, cq: CqId) {
        let channel = self.channels.lock().unwrap_or_else(|e| e.into_inner()).get(&cq).cloned();
        if let Some(channel) = channel {
            channel.push(cq);
        }
    }

    pub(crate) fn raise(&self, event: AsyncEvent) {
        match self.async_router.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(route) => route(event),
            None => self.async_events.push_bounded(event, MAX_QUEUED_ASYNC_EVENTS),
        }
    }

    /// How long until the shard's next timer.
    pub(crate) fn until_deadline(&self, shard: &EngineShard) -> Duration {
        match shard.lock().transport.poll_timeout() {
            None => Duration::MAX,
            Some(at) => Duration::from_nanos(at.as_nanos().saturating_sub(self.now().as_nanos())),
        }
    }

    fn counters(&self) -> NicCounters {
        let mut out = NicCounters {
            tx_dropped_by_kernel: self.tx_dropped_by_kernel.load(Ordering::Relaxed),
            rx_missteered: self.missteered.load(Ordering::Relaxed),
            engine_stall_max_us: self.longest_stall.load(Ordering::Relaxed) / 1000,
            ..NicCounters::default()
        };
        for shard in self.shards.iter() {
            out.transport += shard.lock().transport.counters();
            {
                let wire = shard.lock_wire();
                out.rx_dropped_by_kernel += wire.receive_drops();
                out.np_ecn_marked_roce_packets += wire.ce_marked();
                out.rx_ring_malformed += wire.malformed();
                let (int, int_malformed) = wire.int_datagrams();
                out.rx_int_packets += int;
                out.rx_int_malformed += int_malformed;
            }
            let (tx, rx) = shard.fault_stats();
            out.injected_tx += tx;
            out.injected_rx += rx;
        }
        out
    }

    /// Writes the counters where `softrnic devinfo` finds them, at most
    /// every [`crate::counters_file::EVERY`] unless `force`.
    pub(crate) fn publish_counters(&self, force: bool) {
        let now = self.now().as_nanos();
        let last = self.published_at.load(Ordering::Relaxed);
        if !force && now.saturating_sub(last) < crate::counters_file::EVERY.as_nanos() as u64 {
            return;
        }
        self.published_at.store(now, Ordering::Relaxed);
        let path = crate::counters_file::path(self.shards[0].socket().local_addr().ip());
        let _ = crate::counters_file::write(&path, &self.counters());
    }
}

/// 32 bytes from the operating system, the seed of a device's keys, QP
/// numbers and PSNs ([`softrnic_transport::entropy`]).
fn os_seed() -> std::io::Result<[u8; 32]> {
    let mut seed = [0; 32];
    getrandom::fill(&mut seed).map_err(|e| std::io::Error::other(format!("no seed from the operating system: {e}")))?;
    Ok(seed)
}
