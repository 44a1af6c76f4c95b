//! `Shard`: the queue pairs one engine core owns, with their timers and the
//! queue of those that have something to send, the way a NIC spreads its
//! QPs over its processing cores.
//!
//! A shard is single-threaded state (`&mut self`): whoever drives it holds
//! it alone. What its QPs share with other shards (completion queues, SRQs)
//! is reached through handles that carry their own locks; the memory table
//! is an immutable snapshot the device replaces when it changes. So nothing
//! on a shard's per-packet path takes a lock that every QP shares.
//!
//! ```text
//!   handle_datagram(now, from, bytes) ──> ICRC, parse, QP by number ──> QP
//!   post_send / post_recv / modify_qp ─────────────────────────────────> QP
//!   PostQueues (the program's end, no shard lock) ── absorb_posts ─────> QP
//!   poll_transmit(now, buf) <── round robin over QPs with output <───── QP
//!   poll_timeout() / handle_timeout(now) ── per-QP deadlines
//!   poll_cq_notification() / poll_async_event() <── what the QPs raised
//!   poll_receives_wanted() / receives_fetched(now, wanted) ── requests
//!       held while the driver fetches receives ([`crate::fetch_on_demand`])
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use smallvec::SmallVec;

use rustc_hash::FxHashMap;
use softrnic_wire::icrc::UdpFlow;
use softrnic_wire::packet::ICRC_LEN;
use softrnic_wire::packet::{PacketRepr, packet_len};
use softrnic_wire::{DEFAULT_PKEY, Opcode, ROCEV2_UDP_PORT, cnp};

use crate::by_reference::{self, Body, Packet};
use crate::completion::CqId;
use crate::config::TransportConfig;
use crate::congestion::{Choice, RecvMeta};
use crate::counters::Counters;
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::fetch_on_demand::{HOLD_FOR, HeldDatagram, HeldRequests, ReceivesWanted};
use crate::memory::{MemoryTable, PeerMemory};
use crate::multicast::{MULTICAST_QPN, MulticastGroups};
use crate::qp::{Ctx, QpAttr, QpType, QueuePair, Transmit};
use crate::time::Instant;
use crate::work_request::{RecvWorkRequest, SendWorkRequest};

/// How a datagram leaves the device for a peer, which decides its ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// Over UDP from this source port. RoCEv2 lets the source port be any
    /// (NICs draw it per flow, for ECMP), and the ICRC covers it.
    Udp { source_port: u16 },
    /// On a path within this host that no switch, fault or capture sees (a
    /// shared-memory ring): no ICRC is computed, as Linux computes no
    /// checksum on loopback, and its receiver checks none
    /// ([`RecvMeta::same_host`]). `references`: the receiver can reach
    /// this device's memory files (it sees this device's processes), so
    /// payloads may travel by reference ([`crate::by_reference`]).
    SameHost { references: bool },
}

impl Egress {
    /// UDP from port 4791, as a device with one socket sends.
    pub const ROCEV2_PORT: Egress = Egress::Udp { source_port: ROCEV2_UDP_PORT };
}

/// Bytes a datagram buffer passed to [`Shard::poll_transmit`] must hold:
/// a 4096-byte payload and the largest set of headers, pad and ICRC.
pub const MAX_DATAGRAM_LEN: usize = 4096 + 64 + crate::auth::MAC_LEN;

/// The shard that owns queue pair `qpn` among `shards`: the one fact the
/// QPN allocator, the kernel's steering program and the engine's fallback
/// router share. It must stay a remainder: classic BPF computes it from
/// the BTH with one `AND` and one `MOD`.
pub fn shard_of(qpn: u32, shards: usize) -> usize {
    (qpn % shards.max(1) as u32) as usize
}

/// The destination QP of a RoCEv2 datagram, read from its BTH without
/// parsing the rest, for routing it to its shard.
pub fn dest_qpn(datagram: &[u8]) -> Option<u32> {
    softrnic_wire::bth::Header::new_checked(datagram).ok().map(|bth| bth.dest_qpn())
}

#[derive(Debug)]
struct QpSlot {
    qp: QueuePair,
    /// In the ready queue already.
    ready: bool,
    /// The earliest deadline the timer heap holds for this QP. The QP's own
    /// deadline may since have moved later (every ACK moves the
    /// retransmission timer); `poll_timeout` then moves the entry, so an
    /// ACK costs no heap push.
    scheduled: Option<Instant>,
}

/// The queue pairs of one engine core.
#[derive(Debug)]
pub struct Shard {
    index: usize,
    config: TransportConfig,
    memory: Arc<MemoryTable>,
    qps: FxHashMap<u32, QpSlot>,
    /// QPs that may have something to send, served round robin.
    ready: VecDeque<u32>,
    /// Timer deadlines; an entry whose QP has since rescheduled is stale.
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    counters: Counters,
    /// Asynchronous events not yet taken by `poll_async_event`.
    events: VecDeque<AsyncEvent>,
    /// Completion queues whose notification fired, not yet taken.
    fired_cqs: VecDeque<CqId>,
    /// CNPs to send, to a peer QP at an address: they leave ahead of
    /// everything, outside any QP's PSN-ordered answers.
    cnps: VecDeque<(IpAddr, u32)>,
    /// Receives asked of the driver, not yet taken by
    /// `poll_receives_wanted`.
    wanted: VecDeque<ReceivesWanted>,
    /// The requests held until the driver answers.
    held: HeldRequests,
    /// The UD QPs attached to each multicast group.
    multicast: MulticastGroups,
    /// How the files that peers' references name are reached.
    peer_memory: PeerMaps,
    /// Whether packets to devices on this host carry references to
    /// shared memory in place of payloads ([`crate::by_reference`]).
    sends_references: bool,
}

/// A shard's [`PeerMemory`], if its driver gave it one.
#[derive(Default)]
struct PeerMaps(Option<Box<dyn PeerMemory>>);

impl std::fmt::Debug for PeerMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "PeerMaps(mapped)" } else { "PeerMaps(none)" })
    }
}

macro_rules! ctx {
    ($self:ident, $now:expr) => {
        Ctx {
            now: $now,
            memory: &$self.memory,
            events: &mut $self.events,
            fired_cqs: &mut $self.fired_cqs,
            counters: &mut $self.counters,
            config: &$self.config,
            wanted: &mut $self.wanted,
            may_ask: true,
            held: false,
            by_reference: false,
            referenced: None,
        }
    };
}

impl Shard {
    /// Shard `index` of a device, seeing `memory`.
    pub fn new(index: usize, config: TransportConfig, memory: Arc<MemoryTable>) -> Shard {
        Shard {
            index,
            config,
            memory,
            qps: FxHashMap::default(),
            ready: VecDeque::new(),
            timers: BinaryHeap::new(),
            counters: Counters::default(),
            events: VecDeque::new(),
            fired_cqs: VecDeque::new(),
            cnps: VecDeque::new(),
            wanted: VecDeque::new(),
            held: HeldRequests::default(),
            multicast: MulticastGroups::default(),
            peer_memory: PeerMaps::default(),
            sends_references: false,
        }
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Replaces the memory table this shard checks accesses against. Once
    /// it returns, the shard no longer sees the old one: a region
    /// deregistered there is beyond reach.
    pub fn set_memory(&mut self, memory: Arc<MemoryTable>) {
        self.memory = memory;
    }

    /// Lets the shard resolve the references that devices on this host
    /// send in place of payloads ([`crate::by_reference`]): without it,
    /// each such packet is dropped.
    pub fn set_peer_memory(&mut self, peers: Box<dyn PeerMemory>) {
        self.peer_memory = PeerMaps(Some(peers));
    }

    /// Lets packets to devices on this host ([`Egress::SameHost`]) carry
    /// references to shared memory in place of their payloads, where the
    /// payload lies in memory registered as shared.
    pub fn send_references(&mut self, sends: bool) {
        self.sends_references = sends;
    }

    // ----- queue pairs -----

    /// Takes ownership of a QP the device created for this shard.
    pub fn insert_qp(&mut self, mut qp: QueuePair) {
        qp.default_congestion_control(self.config.congestion.algorithm.clone());
        let qpn = qp.qpn();
        self.qps.insert(qpn, QpSlot { qp, ready: false, scheduled: None });
    }

    /// Gives a QP back to the device to destroy; its outstanding work
    /// requests vanish without completions. It leaves its multicast
    /// groups: returned with it are those it left with no QP of the shard
    /// (the datapath may leave them).
    pub fn remove_qp(&mut self, qpn: u32) -> Result<(QueuePair, Vec<IpAddr>)> {
        self.held.release(qpn);
        let slot = self.qps.remove(&qpn).ok_or(VerbsError::NotFound("queue pair"))?;
        Ok((slot.qp, self.multicast.detach_everywhere(qpn)))
    }

    // ----- multicast -----

    /// Attaches UD QP `qpn` to multicast `group` (`ibv_attach_mcast`).
    /// Returns whether it is the group's first QP on this shard: the
    /// caller's datapath must then join the group.
    pub fn attach_multicast(&mut self, qpn: u32, group: IpAddr) -> Result<bool> {
        let slot = self.qps.get(&qpn).ok_or(VerbsError::NotFound("queue pair"))?;
        if slot.qp.init_attr().qp_type != QpType::Ud {
            return Err(VerbsError::invalid("only UD QPs join multicast groups"));
        }
        self.multicast.attach(qpn, group)
    }

    /// Detaches QP `qpn` from `group`. Returns whether no QP of this shard
    /// is left in it: the caller's datapath may leave the group.
    pub fn detach_multicast(&mut self, qpn: u32, group: IpAddr) -> Result<bool> {
        self.multicast.detach(qpn, group)
    }

    pub fn qp(&self, qpn: u32) -> Option<&QueuePair> {
        self.qps.get(&qpn).map(|s| &s.qp)
    }

    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    pub fn modify_qp(&mut self, now: Instant, qpn: u32, attr: &QpAttr) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.modify(ctx, attr))
    }

    /// Limits the rate of a QP's requests (bits per second), or lifts the
    /// limit: the hook congestion control drives.
    pub fn set_qp_rate_limit(&mut self, now: Instant, qpn: u32, bits_per_second: Option<u64>) -> Result<()> {
        if bits_per_second == Some(0) {
            return Err(VerbsError::invalid("a rate limit of 0 would stop the QP; give None to lift the limit"));
        }
        self.with_qp(now, qpn, |qp, _| {
            qp.set_rate_limit(bits_per_second);
            Ok(())
        })
    }

    /// Chooses a QP's congestion control (`None`: none), in place of the
    /// device's default. One that steers by INT needs a device that
    /// carries it (`CongestionConfig::int`).
    pub fn set_qp_congestion_control(&mut self, now: Instant, qpn: u32, algorithm: Option<Choice>) -> Result<()> {
        if let Some(choice) = &algorithm
            && choice.wants_int()
            && !self.config.congestion.int
        {
            return Err(VerbsError::NotSupported(format!(
                "{} steers by in-band telemetry (INT), which this device does not carry: \
                 enable INT on the device (SOFTRNIC_INT=on) or make {0} its default",
                choice.name()
            )));
        }
        self.with_qp(now, qpn, |qp, ctx| {
            qp.choose_congestion_control(ctx, algorithm);
            Ok(())
        })
    }

    pub fn post_send(&mut self, now: Instant, qpn: u32, wr: SendWorkRequest) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_send(ctx, wr))
    }

    pub fn post_recv(&mut self, now: Instant, qpn: u32, wr: RecvWorkRequest) -> Result<()> {
        self.with_qp(now, qpn, |qp, ctx| qp.post_recv(ctx, wr))
    }

    /// Takes what the program posted to `qpn` without the shard (through
    /// its [`PostQueues`](crate::qp::PostQueues)), once its post said
    /// [`Posted::Tell`](crate::qp::Posted). A QP destroyed meanwhile is
    /// skipped.
    pub fn absorb_posts(&mut self, now: Instant, qpn: u32) {
        let _ = self.with_qp(now, qpn, |qp, ctx| {
            qp.absorb_posts(ctx);
            Ok(())
        });
    }

    /// Runs `f` on a QP, then brings its place in the ready queue and the
    /// timer heap up to date.
    fn with_qp(
        &mut self,
        now: Instant,
        qpn: u32,
        f: impl FnOnce(&mut QueuePair, &mut Ctx) -> Result<()>,
    ) -> Result<()> {
        let slot = self.qps.get_mut(&qpn).ok_or(VerbsError::NotFound("queue pair"))?;
        let mut ctx = ctx!(self, now);
        let out = f(&mut slot.qp, &mut ctx);
        self.reschedule(qpn);
        out
    }

    /// After an event on a QP: queue it for transmission if it may have
    /// something to send, and make sure the timer heap wakes it in time.
    fn reschedule(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !slot.ready && slot.qp.wants_to_transmit() {
            slot.ready = true;
            self.ready.push_back(qpn);
        }
        self.reschedule_timer(qpn);
    }

    fn reschedule_timer(&mut self, qpn: u32) {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return;
        };
        let Some(at) = slot.qp.poll_timeout() else {
            return;
        };
        if slot.scheduled.is_none_or(|scheduled| at < scheduled) {
            slot.scheduled = Some(at);
            self.timers.push(Reverse((at, qpn)));
        }
    }

    // ----- the wire -----

    /// Consumes a datagram that arrived on UDP port 4791 from `from` (or
    /// with INT, its RoCEv2 part), with what the network said of it.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, meta: RecvMeta, datagram: &[u8]) {
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += datagram.len() as u64;
        let dst = meta.multicast_group.unwrap_or(self.config.local_addr);
        let flow = UdpFlow { src: from.ip(), dst, src_port: from.port(), dst_port: ROCEV2_UDP_PORT };
        if !meta.same_host && flow.verify(datagram).is_err() {
            self.counters.rx_icrc_errors += 1;
            return;
        }
        let Some(qpn) = dest_qpn(datagram) else {
            self.counters.rx_malformed += 1;
            return;
        };
        if let Some(group) = meta.multicast_group {
            self.handle_multicast(now, from, meta, group, qpn, datagram);
            return;
        }
        let Some(slot) = self.qps.get_mut(&qpn) else {
            self.counters.rx_unknown_qp += 1;
            return;
        };
        if is_looped_back(&slot.qp, self.config.local_addr) {
            // Its peer is itself, whose packets never reach the wire: this
            // one is a forgery from the device's own address.
            self.counters.rx_dropped_foreign += 1;
            return;
        }
        // An authenticating QP takes only what its connection's key
        // sealed, and the packet without its MAC. (CNPs carry none: they
        // come from the network's notification point, and may only slow
        // the QP, which their own check below keeps to the peer.)
        let is_cnp = || Opcode::try_from(datagram[0]) == Ok(Opcode::Cnp);
        let datagram = match slot.qp.authenticator().filter(|_| !is_cnp()) {
            None => datagram,
            Some(auth) => match auth.open(datagram) {
                Some(opened) => opened,
                None => {
                    self.counters.rx_auth_failures += 1;
                    return;
                }
            },
        };
        let Ok(repr) = PacketRepr::parse(datagram) else {
            self.counters.rx_malformed += 1;
            return;
        };
        let mapped;
        let packet = if meta.same_host && datagram.ends_with(&by_reference::MARK) {
            let resolved = by_reference::parse(repr.payload)
                .and_then(|ranges| by_reference::resolve(&ranges, self.peer_memory.0.as_deref_mut()?));
            let Some(resolved) = resolved else {
                self.counters.rx_unresolved_references += 1;
                return;
            };
            mapped = resolved;
            self.counters.rx_by_reference += 1;
            Packet { headers: repr.headers, body: Body::Mapped(&mapped) }
        } else {
            Packet::inline(&repr)
        };
        // Looked up again: resolving the references needed the shard.
        let Some(slot) = self.qps.get_mut(&qpn) else { return };
        if packet.headers.bth.opcode == Opcode::Cnp {
            let ctx = ctx!(self, now);
            // Only the connected peer may slow a QP down: a CNP from
            // anyone else (who need only guess the QP's number) is dropped.
            if slot.qp.attributes().remote_addr != Some(from.ip()) {
                ctx.counters.rx_dropped_foreign += 1;
                return;
            }
            ctx.counters.rx_cnps += 1;
            slot.qp.on_cnp(&ctx);
            self.reschedule(qpn);
            return;
        }
        let ctx = ctx!(self, now);
        let meta = if ctx.config.congestion.int { meta } else { RecvMeta { int: None, ..meta } };
        if meta.ce
            && ctx.config.congestion.notification_point
            && slot.qp.init_attr().qp_type == QpType::Rc
            && let Some(peer_qpn) = slot.qp.attributes().remote_addr.map(|_| slot.qp.attributes().dest_qpn)
            && slot.qp.on_congestion_experienced(&ctx)
        {
            self.cnps.push_back((from.ip(), peer_qpn));
        }
        self.take(now, qpn, from, meta, &packet, datagram);
    }

    /// A datagram sent to multicast `group`: a UD SEND for QP 0xFFFFFF,
    /// which every QP of this shard attached to the group takes a copy of.
    fn handle_multicast(
        &mut self,
        now: Instant,
        from: SocketAddr,
        meta: RecvMeta,
        group: IpAddr,
        qpn: u32,
        datagram: &[u8],
    ) {
        let packet = match PacketRepr::parse(datagram) {
            Ok(repr) if qpn == MULTICAST_QPN && repr.headers.bth.opcode.is_ud() => Packet::inline(&repr),
            _ => {
                self.counters.rx_malformed += 1;
                return;
            }
        };
        let members: SmallVec<[u32; 4]> = self.multicast.members(group).iter().copied().collect();
        if members.is_empty() {
            self.counters.rx_unknown_qp += 1;
        }
        for member in members {
            self.take(now, member, from, meta, &packet, datagram);
        }
    }

    /// Hands a packet to its QP, or holds it behind the requests the QP
    /// holds for receives: requests wait their turn there; answers to the
    /// QP's own requests do not.
    fn take(&mut self, now: Instant, qpn: u32, from: SocketAddr, meta: RecvMeta, packet: &Packet, datagram: &[u8]) {
        if self.held.holds(qpn) && self.qps.get(&qpn).is_some_and(|slot| waits_behind_held(&slot.qp, packet)) {
            if !self.held.push(qpn, held(from, meta, packet, datagram)) {
                self.counters.rx_held_overflow += 1;
            }
            return;
        }
        if self.deliver(now, qpn, from, &meta, packet, true) {
            let first = held(from, meta, packet, datagram);
            self.held.start(qpn, now + HOLD_FOR, VecDeque::from([first]));
        }
    }

    /// Hands a packet to its QP (whose posts it takes first: a SEND needs
    /// the receives posted before it arrived). True if the QP asked for
    /// receives and did not consume it: the caller holds it.
    fn deliver(
        &mut self,
        now: Instant,
        qpn: u32,
        from: SocketAddr,
        meta: &RecvMeta,
        packet: &Packet,
        may_ask: bool,
    ) -> bool {
        let Some(slot) = self.qps.get_mut(&qpn) else {
            return false;
        };
        let mut ctx = Ctx { may_ask, ..ctx!(self, now) };
        slot.qp.absorb_posts(&mut ctx);
        slot.qp.handle_packet(&mut ctx, from.ip(), packet, meta);
        let held = ctx.held;
        self.reschedule(qpn);
        held
    }

    // ----- receives fetched on demand -----

    /// The next question for the driver: a QP that needs the receives its
    /// program wrote ([`crate::fetch_on_demand`]).
    pub fn poll_receives_wanted(&mut self) -> Option<ReceivesWanted> {
        let wanted = self.wanted.pop_front()?;
        self.held.question_taken(wanted.qpn);
        Some(wanted)
    }

    /// The driver's answer: it posted what the program had written (or
    /// found nothing). The QP takes the posts; an SRQ below its limit says
    /// so now; the requests the QP held are handled again, in order. The
    /// one that asked is not let ask again: finding no receive now, it is
    /// answered "receiver not ready".
    pub fn receives_fetched(&mut self, now: Instant, wanted: ReceivesWanted) {
        if let Some(srq) = wanted.srq
            && let Some(slot) = self.qps.get(&wanted.qpn)
            && let Some(queue) = slot.qp.srq().filter(|queue| queue.id() == srq)
        {
            queue.check_limit(&mut self.events);
        }
        self.absorb_posts(now, wanted.qpn);
        self.release_held(now, wanted.qpn);
    }

    /// Hands what `qpn` held to it again, until a request asks anew: that
    /// one and those behind it are held again.
    fn release_held(&mut self, now: Instant, qpn: u32) {
        let mut datagrams = self.held.release(qpn);
        let mut first = true;
        while let Some(datagram) = datagrams.pop_front() {
            // Parsed and checked when it arrived.
            let Ok(repr) = PacketRepr::parse(&datagram.bytes) else { continue };
            let packet = match datagram.by_reference {
                true => Packet { headers: repr.headers, body: Body::Held(repr.payload) },
                false => Packet::inline(&repr),
            };
            if self.deliver(now, qpn, datagram.from, &datagram.meta, &packet, !first) {
                datagrams.push_front(datagram);
                self.held.start(qpn, now + HOLD_FOR, datagrams);
                return;
            }
            first = false;
        }
    }

    /// Writes the next datagram to send into `buf` (at least
    /// [`MAX_DATAGRAM_LEN`] bytes), ICRC included, to leave from UDP port
    /// 4791.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        self.poll_transmit_from(now, buf, &mut |_| Egress::ROCEV2_PORT)
    }

    /// As [`Shard::poll_transmit`], for a datagram that leaves the way
    /// `egress(destination)` says: the datapath that owns the sockets and
    /// rings knows, and the ICRC depends on it.
    pub fn poll_transmit_from(
        &mut self,
        now: Instant,
        buf: &mut [u8],
        egress: &mut dyn FnMut(IpAddr) -> Egress,
    ) -> Option<Transmit> {
        assert!(buf.len() >= MAX_DATAGRAM_LEN, "datagram buffer too small");
        if let Some(cnp) = self.poll_cnp(buf, egress) {
            return Some(cnp);
        }
        while let Some(qpn) = self.ready.pop_front() {
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.ready = false;
            let looped_back = is_looped_back(&slot.qp, self.config.local_addr);
            // Where a connected QP's packets go, asked once: a peer on this
            // host may be sent references in place of payloads, unless the
            // QP seals what it sends (its MAC would cover the references).
            let route = slot.qp.attributes().remote_addr.filter(|_| !looped_back).map(|peer| (peer, egress(peer)));
            let mut ctx = ctx!(self, now);
            ctx.by_reference = self.sends_references
                && matches!(route, Some((_, Egress::SameHost { references: true })))
                && slot.qp.init_attr().qp_type != QpType::Ud
                && slot.qp.authenticator().is_none();
            let transmit = slot.qp.poll_transmit(&mut ctx, buf);
            let referenced = ctx.referenced.is_some();
            let Some(t) = transmit else {
                // Nothing to send after all (its window, a fence or the
                // READ limit holds it back): it leaves the ready queue
                // until a packet, a timer or a post gives it a reason to
                // come back.
                self.reschedule_timer(qpn);
                continue;
            };
            // Sealed while the QP is at hand (a looped-back QP has nothing
            // to authenticate: it never meets the wire).
            let t = match slot.qp.authenticator().filter(|_| !looped_back) {
                Some(auth) => Transmit { len: auth.seal(buf, t.len), ..t },
                None => t,
            };
            self.reschedule(qpn);
            if looped_back {
                self.loop_back(now, qpn, &buf[..t.len]);
                continue;
            }
            let how = match route {
                Some((peer, how)) if peer == t.dst => how,
                _ => egress(t.dst),
            };
            debug_assert!(!referenced || how == Egress::SameHost { references: true }, "references only to this host");
            if self.seal(&mut buf[..t.len], t.dst, how, referenced).is_err() {
                // Address families differ: nothing can carry it.
                self.counters.rx_dropped_foreign += 1;
                continue;
            }
            self.counters.tx_by_reference += u64::from(referenced);
            self.counters.tx_packets += 1;
            self.counters.tx_bytes += t.len as u64;
            return Some(t);
        }
        None
    }

    /// Hands a looped-back QP's packet straight to itself, as a NIC's
    /// loopback does, without the wire (nor its ICRC, nor its counters).
    fn loop_back(&mut self, now: Instant, qpn: u32, datagram: &[u8]) {
        let Ok(repr) = PacketRepr::parse(datagram) else { return };
        let from = SocketAddr::new(self.config.local_addr, ROCEV2_UDP_PORT);
        self.take(now, qpn, from, RecvMeta::default(), &Packet::inline(&repr), datagram);
    }

    /// Builds the next CNP the notification point owes.
    fn poll_cnp(&mut self, buf: &mut [u8], egress: &mut dyn FnMut(IpAddr) -> Egress) -> Option<Transmit> {
        while let Some((dst, dest_qpn)) = self.cnps.pop_front() {
            let Ok(len) = cnp::headers(dest_qpn, DEFAULT_PKEY).emit_packet(buf, &[]) else {
                continue;
            };
            if self.seal(&mut buf[..len], dst, egress(dst), false).is_err() {
                continue;
            }
            self.counters.cnps_sent += 1;
            self.counters.tx_packets += 1;
            self.counters.tx_bytes += len as u64;
            return Some(Transmit { dscp: self.config.congestion.cnp_dscp, ..Transmit::new(dst, len) });
        }
        None
    }

    /// Writes the ICRC of a datagram to `dst` as it leaves (`how`): over
    /// UDP, covering its ports; on a same-host path, none, and in its place
    /// zeros or, for a payload by reference, [`by_reference::MARK`].
    fn seal(
        &self,
        datagram: &mut [u8],
        dst: IpAddr,
        how: Egress,
        by_reference: bool,
    ) -> std::result::Result<(), softrnic_wire::Error> {
        match how {
            Egress::Udp { source_port } => {
                UdpFlow { src: self.config.local_addr, dst, src_port: source_port, dst_port: ROCEV2_UDP_PORT }
                    .seal(datagram)
            }
            Egress::SameHost { .. } => {
                let body = datagram.len().checked_sub(ICRC_LEN).ok_or(softrnic_wire::Error::Truncated)?;
                datagram[body..].copy_from_slice(if by_reference { &by_reference::MARK } else { &[0; ICRC_LEN] });
                Ok(())
            }
        }
    }

    /// Whether any QP may have something to send.
    pub fn wants_to_transmit(&self) -> bool {
        !self.ready.is_empty() || !self.cnps.is_empty()
    }

    /// When [`Shard::handle_timeout`] should next run: the earliest
    /// deadline of any QP. Heap entries that deadlines have since left
    /// behind are put right here, where it costs one push per sleep rather
    /// than one per ACK.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        let held = self.held.next_deadline();
        crate::time::earliest([self.next_qp_timer(), held])
    }

    fn next_qp_timer(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, qpn))) = self.timers.peek() {
            let Some(slot) = self.qps.get_mut(&qpn).filter(|slot| slot.scheduled == Some(at)) else {
                // The QP is gone, or an earlier entry superseded this one.
                self.timers.pop();
                continue;
            };
            match slot.qp.poll_timeout() {
                Some(due) if due <= at => return Some(due),
                moved => {
                    self.timers.pop();
                    slot.scheduled = moved;
                    if let Some(due) = moved {
                        self.timers.push(Reverse((due, qpn)));
                    }
                }
            }
        }
        None
    }

    /// Runs every QP timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // A driver that has not taken the question in time: the requests
        // go on as if it had found nothing.
        for qpn in self.held.expired(now) {
            self.absorb_posts(now, qpn);
            self.release_held(now, qpn);
        }
        while let Some(at) = self.next_qp_timer() {
            if at > now {
                break;
            }
            let Reverse((_, qpn)) = self.timers.pop().expect("peeked");
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.scheduled = None;
            let mut ctx = ctx!(self, now);
            slot.qp.handle_timeout(&mut ctx);
            self.reschedule(qpn);
        }
    }

    // ----- what the QPs raised -----

    /// A completion queue whose requested notification has fired.
    pub fn poll_cq_notification(&mut self) -> Option<CqId> {
        self.fired_cqs.pop_front()
    }

    /// The next asynchronous event (`ibv_get_async_event`).
    pub fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }
}

/// Whether `qp` is connected to itself on this device (`local_addr`): a
/// loopback QP, such as softrnicd's copy engine, whose packets go from
/// its requester to its own responder inside the shard. None from the
/// wire reaches it: anyone on the host can send from the device's
/// address, and only its number (which they might guess) would be left
/// to tell them apart.
fn is_looped_back(qp: &QueuePair, local_addr: IpAddr) -> bool {
    let attrs = qp.attributes();
    qp.init_attr().qp_type == QpType::Rc && attrs.remote_addr == Some(local_addr) && attrs.dest_qpn == qp.qpn()
}

/// A packet as it is held: its datagram, or one rebuilt with the payload
/// its references name (read now: the held packet outlives the moment the
/// references were sent for), as the same host sends inline.
fn held(from: SocketAddr, meta: RecvMeta, packet: &Packet, datagram: &[u8]) -> HeldDatagram {
    let bytes = match packet.body {
        Body::Bytes(_) | Body::Held(_) => datagram.into(),
        Body::Mapped(_) => {
            let (start, len) = (packet.headers.len(), packet.body.len());
            let mut bytes = vec![0u8; packet_len(start, len)];
            packet.body.read(0, &mut bytes[start..start + len]);
            // Headers that parsed emit again.
            let _ = packet.headers.emit_around_payload(&mut bytes, len);
            bytes.into()
        }
    };
    HeldDatagram { from, meta, bytes, by_reference: packet.body.by_reference() }
}

/// Whether a packet for a QP that holds requests waits behind them: every
/// request does (and every datagram of a UD QP), or it would overtake.
fn waits_behind_held(qp: &QueuePair, packet: &Packet) -> bool {
    qp.init_attr().qp_type == QpType::Ud || packet.headers.bth.opcode.is_request()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_of_is_the_remainder_the_steering_program_computes() {
        assert_eq!(shard_of(0x11, 1), 0);
        assert_eq!(shard_of(0x11, 4), 1);
        assert_eq!(shard_of(0x12, 4), 2);
        assert_eq!(shard_of(0xff_ffff, 8), 7);
        assert_eq!(shard_of(5, 0), 0, "no shards counts as one");
    }

    #[test]
    fn dest_qpn_reads_the_bth() {
        let mut bth = [0u8; 12];
        bth[5..8].copy_from_slice(&[0x12, 0x34, 0x56]);
        assert_eq!(dest_qpn(&bth), Some(0x12_3456));
        assert_eq!(dest_qpn(&bth[..7]), None, "too short for a BTH");
    }
}
