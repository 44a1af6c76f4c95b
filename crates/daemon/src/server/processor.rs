//! The command processor: the part of a NIC that fetches work requests
//! from the rings programs write and writes completions back. Each of
//! the daemon's processors (`--processors`, [`Processors`]) is a thread
//! that serves every queue of its share of the devices: a device is one
//! processor's, so its queues are served in order, and the devices' work
//! (with inline progress, their engines' too) spreads over the cores.
//!
//! Per pass it moves each QP's new send and receive WQEs into the engine
//! (checked: see [`softrnic_daemon_protocol::wqe`]) and each CQ's new completions into its
//! ring, announcing them on the CQ's channel when the program armed it.
//! After [`IDLE_BEFORE_SLEEP`] without work it tells the programs it
//! sleeps ([`softrnic_daemon_protocol::doorbell`]), arms the engine's CQs, looks once more,
//! and blocks until a doorbell, a completion or a change of the queues
//! served.
//!
//! A tenant's fault stays the tenant's: a malformed WQE or a scribbled
//! ring index moves that QP to the error state (its requests flush) and the
//! processor goes on with everyone else.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use softrnic_engine::Nic;
use softrnic_event::{EventQueue, wait_readable};
use softrnic_ring::spsc::{Consumer, Producer};
use softrnic_ring::wakeup;
use softrnic_transport::memory::MemoryTable;
use softrnic_transport::{
    Completion, CompletionQueue, CqId, Payload, PostQueues, QpAttr, QpCaps, QpState, RecvWorkRequest, SendOp,
    SendWorkRequest, SgeList, SharedReceiveQueue, VerbsError, WcOpcode,
};

use super::device::Device;
use super::offload::{Moment, ReceiveStage, SendStage, Stages};
use softrnic_daemon_protocol::doorbell::{self, DoorbellPage};
use softrnic_daemon_protocol::protocol::RemoteError;
use softrnic_daemon_protocol::queue::{ARMED_NEXT, ARMED_SOLICITED, SharedQueue};
use softrnic_daemon_protocol::wqe::{self, CQE_LEN};

/// How long the processor polls without finding work before it sleeps.
pub const IDLE_BEFORE_SLEEP: Duration = Duration::from_millis(1);
/// And this many passes in a row: on a machine with more runnable threads
/// than cores, one empty pass and a time slice lost to others span the
/// millisecond, and a processor that slept then had to be woken by the
/// next program's doorbell, a system call, while it still had work.
const EMPTY_PASSES_BEFORE_SLEEP: u32 = 64;
/// The longest it sleeps without looking (a last resort: every event that
/// matters wakes it).
const LONGEST_SLEEP: Duration = Duration::from_millis(100);
/// Completions moved per CQ per pass, so one busy CQ cannot starve others.
const CQ_BATCH: usize = 64;
/// WQEs moved per queue per pass.
const WQE_BATCH: usize = 64;

/// A QP whose rings the processor serves.
pub struct ServedQp {
    pub tenant: u64,
    pub qpn: u32,
    pub device: Arc<Device>,
    pub posts: Arc<PostQueues>,
    pub caps: QpCaps,
    /// A copying receive design's stage ([`super::offload`]), shared with
    /// the engine's fetch on demand.
    rx: Option<Arc<Mutex<Box<dyn ReceiveStage>>>>,
    pub send: SharedQueue,
    /// Without an SRQ: its receive ring, which the engine may read too.
    recv: Option<Arc<ReceiveRing>>,
    cursors: Mutex<Cursors>,
    /// WQEs refused as malformed (the QP went to error with the first).
    pub refused: AtomicU64,
}

#[derive(Default)]
struct Cursors {
    send: Consumer,
    /// A copying transmit design's stage ([`super::offload`]).
    tx: Option<Box<dyn SendStage>>,
    /// A ring's index was scribbled: nothing more is read from it.
    broken: bool,
}

impl ServedQp {
    #[allow(clippy::too_many_arguments)] // a QP's parts, each of its own kind
    pub fn new(
        tenant: u64,
        device: Arc<Device>,
        posts: Arc<PostQueues>,
        caps: QpCaps,
        stages: Stages,
        send: SharedQueue,
        recv: Option<SharedQueue>,
    ) -> ServedQp {
        ServedQp {
            tenant,
            qpn: posts.qpn(),
            device,
            posts,
            caps,
            rx: stages.receive.map(|stage| Arc::new(Mutex::new(stage))),
            send,
            recv: recv.map(|ring| Arc::new(ReceiveRing::new(ring, caps.max_recv_sge))),
            cursors: Mutex::new(Cursors { tx: stages.send, ..Cursors::default() }),
            refused: AtomicU64::new(0),
        }
    }

    /// Lets the engine fetch this QP's receives when a message finds none
    /// (a NIC's fetch on demand, [`softrnic_transport::fetch_on_demand`]),
    /// so a receive the program posted just before the message is found
    /// rather than RNR NAKed until the processor's next pass. A receive
    /// stage, if the QP has one, pairs them with staging buffers as the
    /// processor would (in-cache, every message's receive is paired here).
    /// The engine runs this with none of its locks held; it waits for the
    /// ring's cursor or the stage if the processor holds them, and the
    /// processor calls into the engine under them only to post receives,
    /// which never waits for a shard's pass.
    pub fn fetch_on_demand(&self) {
        let Some(ring) = self.recv.clone() else { return };
        let (posts, stage) = (self.posts.clone(), self.rx.clone());
        self.device.nic.fetch_receives_with(&self.posts, move || {
            // Posted straight to the QP's queue, which the engine takes as
            // it answers: its shard needs no telling.
            let mut post = |wr| posts.post_recv(wr).map(drop);
            let Some(stage) = &stage else { return ring.fetch(post) };
            let mut stage = stage.lock().unwrap_or_else(|e| e.into_inner());
            // Entering the error state: every receive flushes.
            let moment = if posts.state() == QpState::Error { Moment::Flush } else { Moment::Arrival };
            if stage.wants_new_receives(moment) {
                ring.fetch(|wr| stage.take(wr, &mut post));
            }
            stage.settle(moment, &mut post);
        });
    }

    /// Moves what the program posted and no pass has taken yet into the
    /// engine now, before the QP is destroyed: a program that posts and
    /// destroys at once (mckey's sender) has its last requests sent, as
    /// the engine in the process sends what it was given first.
    pub fn take_posted(&self) {
        self.drain();
    }

    /// Moves new WQEs into the engine. Returns whether it moved any.
    fn drain(&self) -> bool {
        let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        if cursors.broken {
            return false;
        }
        let mut moved = false;
        if let Some(recv) = &self.recv {
            moved |= self.drain_recv(&mut cursors, recv);
        }
        moved |= self.drain_send(&mut cursors);
        moved
    }

    /// Moves new send WQEs into the engine, through the transmit stage if
    /// the QP has one.
    fn drain_send(&self, cursors: &mut Cursors) -> bool {
        let Cursors { send, tx, .. } = &mut *cursors;
        let mut sends = Sends { qp: self, cursor: send, fault: None };
        let moved = match tx {
            Some(stage) => stage.move_sends(&mut sends),
            None => sends.post_all(),
        };
        let fault = sends.fault;
        self.handle_fault(cursors, fault);
        moved
    }

    /// Moves new receive WQEs into the engine, through the receive stage
    /// if the QP has one.
    fn drain_recv(&self, cursors: &mut Cursors, recv: &ReceiveRing) -> bool {
        let nic = &self.device.nic;
        let mut stage = self.rx.as_ref().map(|rx| rx.lock().unwrap_or_else(|e| e.into_inner()));
        let mut post = |wr| nic.post_recv(&self.posts, wr);
        let mut cursor = recv.cursor.lock().unwrap_or_else(|e| e.into_inner());
        let (moved, fault) = drain_ring(&recv.ring, &mut cursor, false, |slot| {
            let wr = wqe::parse_recv(slot, recv.max_sge).map_err(|e| VerbsError::invalid(e.to_string()))?;
            match stage.as_mut() {
                Some(stage) => stage.take(wr, &mut post),
                None => post(wr),
            }
        });
        // Receives that waited for a staging buffer, in order; posted to a
        // QP in error, they flush.
        let moment = if self.posts.state() == QpState::Error { Moment::Flush } else { Moment::Pass };
        let settled = stage.as_mut().is_some_and(|stage| stage.settle(moment, &mut post));
        drop((cursor, stage));
        self.handle_fault(cursors, fault);
        moved > 0 || settled
    }

    /// RESET, which `reset_engine` applies to the engine's QP: what the
    /// program posted and the engine was not given is discarded too, as
    /// RESET discards the engine's own queues. Otherwise it would reach the
    /// QP once it is connected again, requests the program saw vanish.
    /// The entries left in the QP's rings go first (one the processor took
    /// after the engine's RESET would be refused there and move the QP to
    /// error); the receives the stage keeps go after, once the engine can
    /// no longer write into their staging buffers, which are free again.
    pub fn reset<T>(&self, reset_engine: impl FnOnce() -> T) -> T {
        let discard = |_: &[u8]| Ok(());
        {
            let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            while drain_ring(&self.send, &mut cursors.send, true, discard).0 == WQE_BATCH {}
        }
        if let Some(recv) = &self.recv {
            let mut cursor = recv.cursor.lock().unwrap_or_else(|e| e.into_inner());
            while drain_ring(&recv.ring, &mut cursor, false, discard).0 == WQE_BATCH {}
        }
        let out = reset_engine();
        if let Some(rx) = &self.rx {
            rx.lock().unwrap_or_else(|e| e.into_inner()).reset();
        }
        out
    }

    /// Frees what the offload stages hold (the QP is destroyed).
    pub fn release(&self) {
        let nic = &self.device.nic;
        let tx = self.cursors.lock().unwrap_or_else(|e| e.into_inner()).tx.take();
        if let Some(tx) = tx {
            tx.release(nic);
        }
        if let Some(rx) = &self.rx {
            let undo = rx.lock().unwrap_or_else(|e| e.into_inner()).release();
            undo(nic);
        }
    }

    /// Where the served QPs with a receive stage are found by their
    /// completions: the device, and the QP number.
    fn staged_key(&self) -> (usize, u32) {
        (Arc::as_ptr(&self.device) as usize, self.qpn)
    }

    /// A bad entry moves the QP to error, so it and everything after it
    /// flush (the bad one too: the program gets a completion for each
    /// request, as from a NIC); a scribbled ring index leaves the ring
    /// unread for good.
    fn handle_fault(&self, cursors: &mut Cursors, fault: Option<Fault>) {
        let Some(fault) = fault else { return };
        let why = match &fault {
            Fault::Entry { why, .. } => why,
            Fault::Ring(why) => why,
        };
        eprintln!("softrnicd: tenant {}: QP {:#x}: {why}; the QP moves to the error state", self.tenant, self.qpn);
        let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
        let _ = self.device.nic.modify_qp(self.qpn, &error);
        match fault {
            Fault::Entry { wr_id, send, .. } => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                let nic = &self.device.nic;
                let _ = if send {
                    nic.post_send(
                        &self.posts,
                        SendWorkRequest::new(wr_id, SendOp::Send { imm: None }, Payload::Gather(SgeList::new())),
                    )
                } else {
                    nic.post_recv(&self.posts, RecvWorkRequest { wr_id, sges: SgeList::new() })
                };
            }
            Fault::Ring(_) => cursors.broken = true,
        }
    }
}

/// Moves up to [`WQE_BATCH`] entries of a ring through `post`, which
/// parses one slot's bytes and posts the request. Stops early when the
/// engine's queue is full (the entry waits in the ring) or at a fault.
/// Returns how many entries it took, and the fault.
fn drain_ring(
    ring: &SharedQueue,
    cursor: &mut Consumer,
    send: bool,
    mut post: impl FnMut(&[u8]) -> Result<(), VerbsError>,
) -> (usize, Option<Fault>) {
    let queue = if send { "send" } else { "receive" };
    // A slot of a receive ring, or of a send ring without much inline
    // data, fits on the stack: no allocation per pass or per fetch.
    let mut slot: SmallVec<[u8; 256]> = SmallVec::new();
    let mut moved = 0;
    while moved < WQE_BATCH {
        let index = match cursor.slot(ring) {
            Ok(Some(index)) => index,
            Ok(None) => break,
            Err(broken) => return (moved, Some(Fault::Ring(format!("{queue} queue: {broken}")))),
        };
        slot.resize(ring.slot_size() as usize, 0);
        ring.read_slot(index, &mut slot);
        let fault = match post(&slot) {
            Err(VerbsError::OutOfResources(_)) => break,
            Err(e) => Some(Fault::Entry { wr_id: wqe::wr_id(&slot), send, why: format!("{queue} WQE refused: {e}") }),
            Ok(()) => None,
        };
        cursor.release(ring);
        moved += 1;
        if fault.is_some() {
            return (moved, fault);
        }
    }
    (moved, None)
}

/// A QP's send ring as a transmit stage sees it: the new WQEs, parsed
/// and checked, and the engine's queue to post them to. The first bad
/// entry (or a send the engine refused outright) is kept as the fault
/// that moves the QP to error once the stage is done.
pub struct Sends<'a> {
    qp: &'a ServedQp,
    cursor: &'a mut Consumer,
    fault: Option<Fault>,
}

impl<'a> Sends<'a> {
    pub fn nic(&self) -> &'a Nic {
        &self.qp.device.nic
    }

    /// The QP's queues in the engine.
    pub fn posts(&self) -> &'a PostQueues {
        &self.qp.posts
    }

    /// Whether the ring holds no new WQE (told without a lock).
    pub fn is_empty(&mut self) -> bool {
        self.cursor.slot(&self.qp.send) == Ok(None)
    }

    /// Takes up to a batch of new WQEs through `take`, in order, stopping
    /// at the first fault or at `OutOfResources`, which leaves that WQE in
    /// the ring for the next pass. Returns how many it took.
    pub fn take(&mut self, mut take: impl FnMut(SendWorkRequest) -> Result<(), VerbsError>) -> usize {
        if self.fault.is_some() {
            return 0;
        }
        let (max_sge, max_inline) = (self.qp.caps.max_send_sge as usize, self.qp.caps.max_inline_data as usize);
        let (moved, fault) = drain_ring(&self.qp.send, self.cursor, true, |slot| {
            take(wqe::parse_send(slot, max_sge, max_inline).map_err(|e| VerbsError::invalid(e.to_string()))?)
        });
        self.fault = fault;
        moved
    }

    /// Takes up to a batch of new WQEs through `stage`, which rewrites
    /// each (reading the program's memory as registered now) and posts it
    /// with `post`, in order: one lock and one doorbell for the batch, as
    /// without a stage. Returns whether it took any.
    pub fn stage_each(
        &mut self,
        mut stage: impl FnMut(
            SendWorkRequest,
            &MemoryTable,
            &mut dyn FnMut(SendWorkRequest) -> Result<(), VerbsError>,
        ) -> Result<(), VerbsError>,
    ) -> bool {
        if self.is_empty() {
            return false;
        }
        let nic = self.nic();
        let memory = nic.memory();
        let mut queue = nic.send_queue(self.posts());
        let mut post = |wr| queue.post(wr);
        self.take(|wr| stage(wr, &memory, &mut post)) > 0
    }

    /// The engine refused send `wr_id` outright (not for want of room).
    pub fn refuse(&mut self, wr_id: u64, e: VerbsError) {
        self.fault.get_or_insert(Fault::Entry { wr_id, send: true, why: format!("send WQE refused: {e}") });
    }

    /// Without a stage: every new WQE straight to the engine, with one
    /// lock and one doorbell for the batch (released before a fault moves
    /// the QP to error).
    fn post_all(&mut self) -> bool {
        if self.is_empty() {
            return false; // the common case: no lock taken
        }
        let (nic, posts) = (self.nic(), self.posts());
        let mut queue = nic.send_queue(posts);
        self.take(|wr| queue.post(wr)) > 0
    }
}

/// A ring of receive WQEs (a QP's or an SRQ's) and the reader's place in
/// it. Two read it: the processor on its passes, and the engine's fetch
/// hook when a message finds no receive; the cursor's lock keeps the
/// receives in the order the program wrote them.
struct ReceiveRing {
    ring: SharedQueue,
    cursor: Mutex<Consumer>,
    max_sge: usize,
}

/// What the fetch on demand answers for an entry it leaves in the ring: the
/// processor takes it on its pass, and refuses it there if it is bad.
fn left_for_the_processor() -> VerbsError {
    VerbsError::OutOfResources("left for the command processor".into())
}

impl ReceiveRing {
    fn new(ring: SharedQueue, max_sge: u32) -> ReceiveRing {
        ReceiveRing { ring, cursor: Mutex::new(Consumer::default()), max_sge: max_sge as usize }
    }

    /// The engine's fetch: posts the receives the program has written
    /// through `post`. It waits for the cursor if the processor holds it,
    /// which is safe because nothing that holds a cursor calls into the
    /// engine beyond posting receives (a fault is handled after the cursor
    /// is let go), and it means that every receive the program wrote
    /// before the message is found. An entry it cannot take (malformed,
    /// or refused) stays for the processor, which moves the QP to error.
    fn fetch(&self, mut post: impl FnMut(RecvWorkRequest) -> Result<(), VerbsError>) {
        let mut cursor = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        drain_ring(&self.ring, &mut cursor, false, |slot| {
            let wr = wqe::parse_recv(slot, self.max_sge).map_err(|_| left_for_the_processor())?;
            post(wr).map_err(|_| left_for_the_processor())
        });
    }
}

/// An SRQ whose ring of receive WQEs the processor moves into the
/// engine's SRQ (and the engine fetches from when it runs dry).
pub struct ServedSrq {
    tenant: u64,
    pub queue: Arc<SharedReceiveQueue>,
    ring: Arc<ReceiveRing>,
    broken: AtomicBool,
}

impl ServedSrq {
    pub fn new(tenant: u64, nic: &Nic, queue: Arc<SharedReceiveQueue>, ring: SharedQueue, max_sge: u32) -> ServedSrq {
        let ring = Arc::new(ReceiveRing::new(ring, max_sge));
        let (fetching, srq) = (ring.clone(), queue.clone());
        nic.fetch_srq_receives_with(&queue, move || fetching.fetch(|wr| srq.post(wr)));
        ServedSrq { tenant, queue, ring, broken: AtomicBool::new(false) }
    }

    /// Moves new receives into the engine's SRQ; a full SRQ leaves them in
    /// the ring. A malformed entry or a scribbled index stops the SRQ
    /// being served (it has no error state to move to): its QPs then find
    /// no receives, as with an SRQ the program stopped filling.
    fn drain(&self) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let ReceiveRing { ring, cursor, max_sge } = &*self.ring;
        let mut cursor = cursor.lock().unwrap_or_else(|e| e.into_inner());
        let (moved, fault) = drain_ring(ring, &mut cursor, false, |slot| {
            let wr = wqe::parse_recv(slot, *max_sge).map_err(|e| VerbsError::invalid(e.to_string()))?;
            self.queue.post(wr)
        });
        if let Some(fault) = fault {
            let why = match fault {
                Fault::Entry { why, .. } | Fault::Ring(why) => why,
            };
            eprintln!(
                "softrnicd: tenant {}: SRQ {}: {why}; the SRQ is no longer served",
                self.tenant,
                self.queue.id().0
            );
            self.broken.store(true, Ordering::Relaxed);
        }
        moved > 0
    }
}

/// What a tenant got wrong in a QP's rings.
enum Fault {
    /// One entry: refused, and flushed like the rest.
    Entry { wr_id: u64, send: bool, why: String },
    /// An index: the ring cannot be read any more.
    Ring(String),
}

/// A CQ whose ring the processor fills.
pub struct ServedCq {
    pub tenant: u64,
    pub device: Arc<Device>,
    pub queue: Arc<CompletionQueue>,
    /// The completion channel's socket, when the CQ has one.
    pub channel: Mutex<Option<Arc<OwnedFd>>>,
    /// The ring, replaced whole when the program resizes the CQ.
    ring: Mutex<RingEnd>,
    broken: AtomicBool,
}

/// A CQ's ring and the processor's side of it.
struct RingEnd {
    ring: SharedQueue,
    producer: Producer,
}

impl ServedCq {
    pub fn new(
        tenant: u64,
        device: Arc<Device>,
        queue: Arc<CompletionQueue>,
        ring: SharedQueue,
        channel: Option<Arc<OwnedFd>>,
    ) -> ServedCq {
        ServedCq {
            tenant,
            device,
            queue,
            channel: Mutex::new(channel),
            ring: Mutex::new(RingEnd { ring, producer: Producer::default() }),
            broken: AtomicBool::new(false),
        }
    }

    /// `ibv_resize_cq`: a ring of `entries` (rounded up to a power of two)
    /// takes the old one's place, holding the completions the program has
    /// not polled yet, in order; the engine's CQ takes the new size too.
    /// Verbs forbid polling the CQ meanwhile, so the program switches to
    /// the new ring when the answer comes. Returns its slots and memfd.
    pub fn resize(&self, entries: u32) -> Result<(u32, OwnedFd), RemoteError> {
        let mut end = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let RingEnd { ring, producer } = &mut *end;
        let unpolled = producer.free(ring).map(|free| u64::from(ring.slot_count()) - free);
        let unpolled = unpolled.map_err(|broken| RemoteError::invalid(format!("the CQ's ring is broken: {broken}")))?;
        let new = SharedQueue::create("softrnic-cq", entries, CQE_LEN as u32)
            .map_err(|e| RemoteError::exhausted(e.to_string()))?;
        let waiting = unpolled + self.queue.len() as u64;
        if waiting > u64::from(new.slot_count()) {
            return Err(RemoteError::invalid(format!(
                "cannot resize the CQ to {} entries while {waiting} completions wait to be polled",
                new.slot_count()
            )));
        }
        self.queue.resize(new.slot_count() as usize).map_err(RemoteError::from)?;
        let consumed = <SharedQueue as softrnic_ring::spsc::Queue>::consumed(ring).load(Ordering::Acquire);
        let mut moved = Producer::default();
        let mut entry = [0u8; CQE_LEN];
        for i in 0..unpolled {
            ring.read_slot(consumed.wrapping_add(i) % u64::from(ring.slot_count()), &mut entry);
            let Ok(Some(slot)) = moved.slot(&new) else { unreachable!("the new ring holds them all") };
            new.write_slot(slot, &entry);
            moved.publish(&new);
        }
        new.armed().store(ring.armed().load(Ordering::Acquire), Ordering::Release);
        let fd = new.fd().try_clone_to_owned().map_err(|e| RemoteError::exhausted(e.to_string()))?;
        let slots = new.slot_count();
        *end = RingEnd { ring: new, producer: moved };
        Ok((slots, fd))
    }

    /// Moves every completion the engine holds for this CQ into its ring
    /// now, as many as fit, turning those of `qps`' staged receives into
    /// the program's: a tenant torn down while its program still runs (the
    /// daemon stopping under it) delivers its QPs' flushes before the CQ
    /// goes, rather than leaving them to a pass that will not come.
    pub fn deliver_now(&self, qps: &[Arc<ServedQp>]) {
        let staged: StagedReceivers =
            qps.iter().filter(|qp| qp.rx.is_some()).map(|qp| (qp.staged_key(), qp.clone())).collect();
        let mut scratch = Vec::new();
        while self.fill(&mut scratch, &staged) {}
    }

    /// Moves completions from the engine's CQ into the ring, as many as
    /// fit. Returns whether it moved any.
    fn fill(&self, scratch: &mut Vec<Completion>, staged: &StagedReceivers) -> bool {
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        let mut end = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let RingEnd { ring, producer } = &mut *end;
        let free = match producer.room(ring) {
            Ok(free) => free as usize,
            Err(broken) => {
                // The program scribbled its consumer index. Its completions
                // stay in the engine's CQ; nothing else is affected.
                self.give_up(&broken.to_string());
                return false;
            }
        };
        scratch.clear();
        if free == 0 || self.device.nic.poll_cq(&self.queue, free.min(CQ_BATCH), scratch) == 0 {
            return false;
        }
        self.unstage(scratch, staged);
        let mut entry = [0u8; CQE_LEN];
        let mut solicited = false;
        for c in scratch.iter() {
            // The program may scribble its index between the count and
            // now; then the rest of its completions are lost to it.
            let Ok(Some(index)) = producer.slot(ring) else {
                self.give_up("its consumer index moved back");
                return true;
            };
            wqe::emit_completion(c, &mut entry);
            ring.write_slot(index, &entry);
            producer.publish(ring);
            solicited |= c.raises_solicited_only();
        }
        self.notify(ring, solicited);
        true
    }

    /// Turns the engine's completions of staged receives into the
    /// program's: payload copied into its buffers, its own `wr_id`.
    fn unstage(&self, completions: &mut [Completion], staged: &StagedReceivers) {
        if staged.is_empty() {
            return;
        }
        let device = Arc::as_ptr(&self.device) as usize;
        let mut memory = None;
        let receive = |c: &&mut Completion| matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        for c in completions.iter_mut().filter(receive) {
            let Some(rx) = staged.get(&(device, c.qp_num)).and_then(|qp| qp.rx.as_ref()) else { continue };
            let memory = memory.get_or_insert_with(|| self.device.nic.memory());
            if !rx.lock().unwrap_or_else(|e| e.into_inner()).complete(c, memory) {
                let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
                let _ = self.device.nic.modify_qp(c.qp_num, &error);
            }
        }
    }

    /// Stops serving a CQ whose program broke its ring.
    fn give_up(&self, why: &str) {
        eprintln!("softrnicd: tenant {}: CQ {:?}: {why}; the CQ is no longer served", self.tenant, self.queue.id());
        self.broken.store(true, Ordering::Relaxed);
    }

    /// Announces new completions on the channel if the program armed the
    /// CQ for them (`ibv_req_notify_cq`): once per arming.
    fn notify(&self, ring: &SharedQueue, solicited: bool) {
        let armed = ring.armed();
        let wanted = match wakeup::requested(armed) {
            ARMED_NEXT => true,
            ARMED_SOLICITED => solicited,
            _ => false,
        };
        if !wanted {
            return;
        }
        let seen = wakeup::take(armed);
        let channel = self.channel.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(channel), ARMED_NEXT | ARMED_SOLICITED) = (channel, seen) {
            // A message naming the CQ; a channel whose program stopped
            // reading drops it rather than stall the processor.
            let _ = rustix::net::send(
                channel.as_fd(),
                &self.queue.id().0.to_le_bytes(),
                rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
            );
        }
    }
}

/// What the processor serves: replaced whole when tenants change it, so
/// the processor reads it without a lock on its hot path.
#[derive(Default, Clone)]
pub struct Served {
    pub qps: Vec<Arc<ServedQp>>,
    pub cqs: Vec<Arc<ServedCq>>,
    pub srqs: Vec<Arc<ServedSrq>>,
    pub doorbells: Vec<Arc<DoorbellPage>>,
    /// The QPs with a receive stage, for their completions to find.
    staged: StagedReceivers,
}

/// QPs with a receive stage, by [`ServedQp::staged_key`].
type StagedReceivers = HashMap<(usize, u32), Arc<ServedQp>>;

/// The processor's inputs, shared with the tenants' threads.
pub struct Registry {
    served: Mutex<Arc<Served>>,
    generation: AtomicU64,
    /// The eventfd that wakes the processor (a copy goes to every tenant).
    pub wake: OwnedFd,
    /// Where every device announces completions on the CQs the processor
    /// armed before sleeping: one channel for all of them.
    pub completions: Arc<EventQueue<CqId>>,
    stop: AtomicBool,
    /// Times the processor panicked and started again (a bug each time).
    pub restarts: AtomicU64,
    /// The processor's thread id, once it runs (0 before): the daemon's
    /// priority makes these threads real-time ([`super::priority`]).
    thread: AtomicI32,
}

impl Registry {
    pub fn new() -> std::io::Result<Registry> {
        Ok(Registry {
            served: Mutex::new(Arc::new(Served::default())),
            generation: AtomicU64::new(0),
            wake: doorbell::wake_eventfd()?,
            completions: Arc::new(EventQueue::new()?),
            stop: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            thread: AtomicI32::new(0),
        })
    }

    /// Changes what is served. The processor picks the change up on its
    /// next pass; it holds the previous set (and the mappings in it) until
    /// then, so a removed queue's memory outlives its last use.
    pub fn update(&self, change: impl FnOnce(&mut Served)) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = Served::clone(&served);
        change(&mut next);
        next.staged = next.qps.iter().filter(|q| q.rx.is_some()).map(|q| (q.staged_key(), q.clone())).collect();
        *served = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
        doorbell::signal(&self.wake);
    }

    /// How many QPs and CQs are served.
    pub fn served(&self) -> (usize, usize) {
        let served = self.snapshot();
        (served.qps.len(), served.cqs.len())
    }

    fn snapshot(&self) -> Arc<Served> {
        self.served.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        doorbell::signal(&self.wake);
    }
}

/// The daemon's command processors, each with the [`Registry`] of what it
/// serves.
pub struct Processors {
    registries: Vec<Arc<Registry>>,
}

impl Processors {
    /// `count` processors (at least one), not yet running.
    pub fn new(count: usize) -> std::io::Result<Processors> {
        let registries = (0..count.max(1)).map(|_| Registry::new().map(Arc::new)).collect::<Result<_, _>>()?;
        Ok(Processors { registries })
    }

    pub fn count(&self) -> usize {
        self.registries.len()
    }

    /// Starts a thread per processor.
    pub fn spawn(&self) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
        (self.registries.iter().enumerate())
            .map(|(i, registry)| {
                let registry = registry.clone();
                std::thread::Builder::new().name(format!("softrnicd-processor-{i}")).spawn(move || {
                    registry.thread.store(rustix::thread::gettid().as_raw_nonzero().get(), Ordering::Release);
                    run(&registry)
                })
            })
            .collect()
    }

    /// The processors' thread ids (those running yet).
    pub fn threads(&self) -> Vec<rustix::process::Pid> {
        let ids = self.registries.iter().map(|r| r.thread.load(Ordering::Acquire));
        ids.filter_map(rustix::process::Pid::from_raw).collect()
    }

    /// What serves the queues of `device`.
    pub fn of(&self, device: &Device) -> Arc<Registry> {
        self.registries[device.processor].clone()
    }

    /// How many QPs and CQs are served, by all of them.
    pub fn served(&self) -> (usize, usize) {
        (self.registries.iter().map(|r| r.served())).fold((0, 0), |(q, c), (dq, dc)| (q + dq, c + dc))
    }

    /// How often a processor panicked and started again.
    pub fn restarts(&self) -> u64 {
        self.registries.iter().map(|r| r.restarts.load(Ordering::Relaxed)).sum()
    }

    pub fn stop(&self) {
        for registry in &self.registries {
            registry.stop();
        }
    }
}

/// Runs the processor until [`Registry::stop`]. A bug that panics it
/// must not leave every tenant without service: it says so and goes on.
pub fn run(registry: &Registry) {
    while std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(registry))).is_err() {
        registry.restarts.fetch_add(1, Ordering::Relaxed);
        eprintln!("softrnicd: the command processor panicked (a bug); it starts again");
    }
}

fn serve(registry: &Registry) {
    let mut generation = registry.generation.load(Ordering::Acquire);
    let mut served = registry.snapshot();
    let mut scratch = Vec::with_capacity(CQ_BATCH);
    let mut idle_since = Instant::now();
    let mut empty_passes = 0u32;
    while !registry.stop.load(Ordering::Acquire) {
        let now_generation = registry.generation.load(Ordering::Acquire);
        if now_generation != generation {
            generation = now_generation;
            served = registry.snapshot();
        }
        if pass(&served, &mut scratch) {
            idle_since = Instant::now();
            empty_passes = 0;
            continue;
        }
        empty_passes += 1;
        if idle_since.elapsed() < IDLE_BEFORE_SLEEP || empty_passes < EMPTY_PASSES_BEFORE_SLEEP {
            // The programs it serves spin too: on a machine with fewer
            // cores than spinners, a pass that found nothing hands the core
            // to one of them rather than burn its time slice.
            std::thread::yield_now();
            continue;
        }
        sleep(registry, &served, &mut scratch);
        idle_since = Instant::now();
        empty_passes = 0;
    }
}

/// One look at every queue. Returns whether anything moved.
fn pass(served: &Served, scratch: &mut Vec<Completion>) -> bool {
    let mut worked = false;
    for srq in &served.srqs {
        worked |= srq.drain();
    }
    for qp in &served.qps {
        worked |= qp.drain();
    }
    for cq in &served.cqs {
        worked |= cq.fill(scratch, &served.staged);
    }
    worked
}

fn sleep(registry: &Registry, served: &Served, scratch: &mut Vec<Completion>) {
    for page in &served.doorbells {
        page.set_sleeping(true);
    }
    for cq in &served.cqs {
        cq.queue.request_notify(false);
    }
    // A WQE published, or a completion queued, before the programs saw the
    // flag or the CQs were armed is found here.
    if !pass(served, scratch) {
        let _ = wait_readable(&[registry.wake.as_raw_fd(), registry.completions.as_raw_fd()], LONGEST_SLEEP);
    }
    doorbell::drain(&registry.wake);
    while registry.completions.try_pop().is_some() {}
    for page in &served.doorbells {
        page.set_sleeping(false);
    }
}
