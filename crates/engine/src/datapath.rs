//! The datapath: how a shard's datagrams leave and arrive, behind one
//! trait, so the engine above it (progress, faults, tracing, counters)
//! is the same whichever wire carries them.
//!
//! - [`Udp`]: the shard's socket in the device's `SO_REUSEPORT` group
//!   (batched, GSO/GRO), for any peer.
//! - [`SharedMemory`]: the same-host wire ([`crate::shm`]) for peers that
//!   are devices on this host and network namespace, falling back to UDP
//!   for the others; chosen per peer, automatically.
//!
//! Which one a device uses is [`DatapathKind`] (`SOFTRNIC_DATAPATH`).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use softrnic_transport::{Egress, MAX_DATAGRAM_LEN, RecvMeta};
use softrnic_wire::ROCEV2_UDP_PORT;

use crate::shm::{InboxRing, NO_ICRC_PORT, Peers, Sent};
use crate::socket::{BATCH, RecvBatch, RoceSocket};

/// The most datagrams a shared-memory wire holds for full rings before it
/// drops: about what a 4 MiB UDP receive buffer holds of small ones.
const MAX_HELD: usize = 8192;

/// Held beyond this many datagrams, the shared-memory wire pushes back:
/// its shard takes nothing more from its QPs until the rings drain, as a
/// link paused by PFC holds its sender's queues. Unsent, a request's
/// timer does not run, so a burst of any size waits without loss.
const BACKLOG: usize = 2 * BATCH;

/// A peer whose ring has taken nothing for this long is not slow but
/// stuck (stopped, or gone without closing its inbox): the wire stops
/// pushing back for it, and what it cannot hold beyond [`MAX_HELD`] is
/// lost, as to a dead link, rather than stalling every other peer.
const PATIENCE: Duration = Duration::from_millis(20);

/// How a shard moves datagrams. Called with the shard's wire lock held, so
/// one thread at a time.
pub trait Datapath: Send {
    /// Sends `packets` (at most [`BATCH`]), as many as the wire takes;
    /// returns how many it took. What it refuses is lost, as on a full
    /// link, and the transport retransmits it.
    fn send(&mut self, packets: &[(SocketAddr, &[u8])]) -> usize;

    /// Takes what has arrived, at most about a batch, handing each
    /// datagram to `deliver` with what the network said of it (its ECN
    /// mark); returns how many. `now` is the pass's time: the caller has
    /// read the clock already, and a read costs a VM about what an empty
    /// receive does.
    fn receive(&mut self, now: Instant, deliver: &mut dyn FnMut(SocketAddr, RecvMeta, &[u8])) -> usize;

    /// Before the shard's engine thread blocks in `poll(2)` on the UDP
    /// socket (and the [`Datapath::doorbell`]): arranges to be woken
    /// through them. False if work arrived meanwhile (do not block).
    fn prepare_to_sleep(&mut self) -> bool {
        true
    }

    /// What else the engine thread blocks on while it sleeps: the
    /// doorbell peers ring (shared memory).
    fn doorbell(&self) -> Option<RawFd> {
        None
    }

    /// After the engine thread wakes.
    fn awake(&mut self) {}

    /// Whether the wire holds datagrams it took but could not pass on yet
    /// (a full shared-memory ring): the next pass must call `send` again,
    /// even with nothing new.
    fn holds_back(&self) -> bool {
        false
    }

    /// Whether the wire holds so much that its shard must send nothing new
    /// until it drains (a lossless link's pause).
    fn pushes_back(&self) -> bool {
        false
    }

    /// Whether datagrams are known to wait, found without a system call
    /// (a shared-memory ring's head); `false` where only a receive can
    /// tell (a socket).
    fn has_arrivals(&self) -> bool {
        false
    }

    /// How datagrams to `dst` leave, which decides their ICRC: the
    /// transport seals each as this says, just before `send` takes it.
    fn egress(&mut self, _dst: IpAddr) -> Egress {
        Egress::ROCEV2_PORT
    }

    /// Datagrams dropped on arrival for want of buffer space.
    fn receive_drops(&self) -> u64;

    /// Datagrams that arrived with ECN CE: a switch on the way was
    /// congested.
    fn ce_marked(&self) -> u64 {
        0
    }

    /// Entries of a peer that were not well-formed (shared memory only).
    fn malformed(&self) -> u64 {
        0
    }

    /// Datagrams that arrived on the INT port, and how many of them were
    /// dropped for want of a valid INT header.
    fn int_datagrams(&self) -> (u64, u64) {
        (0, 0)
    }

    /// Joins multicast `group`: what is sent to it arrives through
    /// `receive`, its [`RecvMeta::multicast_group`] naming the group.
    fn join(&mut self, group: IpAddr) -> std::io::Result<()>;

    /// Leaves a group joined.
    fn leave(&mut self, group: IpAddr);

    /// The sockets of the groups joined, which the engine thread blocks on
    /// too.
    fn group_fds(&self, out: &mut Vec<RawFd>);
}

/// Which wire a device uses for peers on the same host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatapathKind {
    /// Shared memory for peers that are devices on this host (and network
    /// namespace), UDP for the rest; UDP alone if `/dev/shm` is unusable.
    Auto,
    /// UDP for every peer.
    Udp,
    /// As `Auto`, but failing to open if `/dev/shm` is unusable.
    Shm,
}

impl DatapathKind {
    /// `auto`, `udp` or `shm`.
    pub fn parse(text: &str) -> Result<DatapathKind, String> {
        match text {
            "auto" => Ok(DatapathKind::Auto),
            "udp" => Ok(DatapathKind::Udp),
            "shm" => Ok(DatapathKind::Shm),
            other => Err(format!("`{other}` is not a datapath; give auto, udp or shm")),
        }
    }
}

/// The most peers a shard sends to from sockets connected to them; those
/// beyond share the shard's own socket. Each costs a descriptor, and a
/// program may have many shards and few descriptors to spare.
const MAX_CONNECTED: usize = 16;
/// The most peers whose socket a shard remembers; beyond them, peers not
/// yet met are sent to from the shard's own socket, for good.
const MAX_SENDERS: usize = 4096;

/// The shard's UDP socket, its socket on the INT port if the device
/// carries in-band telemetry ([`crate::int`]), and the sockets it sends
/// from, connected to its first few peers.
pub struct Udp {
    socket: Arc<RoceSocket>,
    int: Option<Arc<RoceSocket>>,
    /// Which socket each peer's datagrams leave from: the one connected to
    /// it, or `None` for the shard's own. Chosen at the first datagram to
    /// the peer and never changed, because the ICRC of every datagram the
    /// transport has sealed for the peer covers that socket's port.
    senders: FxHashMap<IpAddr, Option<RoceSocket>>,
    connected: usize,
    rx: Box<RecvBatch>,
    /// The kernel's drop counts of the two sockets.
    drops: [u64; 2],
    /// Datagrams that arrived on the INT port, and those of them without
    /// a valid INT header (dropped).
    int_received: u64,
    int_malformed: u64,
    /// A socket for each multicast group a QP of the shard joined, bound
    /// to the group's address: the kernel gives every such socket on the
    /// host (every device's) a copy of what is sent to the group.
    groups: Vec<(IpAddr, RoceSocket)>,
}

impl Udp {
    pub fn new(socket: Arc<RoceSocket>, int: Option<Arc<RoceSocket>>) -> Udp {
        Udp {
            socket,
            int,
            senders: FxHashMap::default(),
            connected: 0,
            rx: Box::default(),
            drops: [0; 2],
            int_received: 0,
            int_malformed: 0,
            groups: Vec::new(),
        }
    }

    /// The socket datagrams to `dst` leave from.
    fn socket_to(&self, dst: IpAddr) -> &RoceSocket {
        match self.senders.get(&dst) {
            Some(Some(socket)) => socket,
            _ => &self.socket,
        }
    }

    /// The port datagrams to `dst` leave from, choosing their socket at
    /// the first: one connected to `dst` while descriptors allow, else the
    /// shard's own.
    fn sender_port(&mut self, dst: IpAddr) -> u16 {
        if !self.senders.contains_key(&dst) && self.senders.len() < MAX_SENDERS {
            let socket = if self.connected < MAX_CONNECTED {
                self.socket.connect(SocketAddr::new(dst, ROCEV2_UDP_PORT)).ok()
            } else {
                None
            };
            self.connected += usize::from(socket.is_some());
            self.senders.insert(dst, socket);
        }
        self.socket_to(dst).local_addr().port()
    }
}

impl Datapath for Udp {
    /// Sends each run of datagrams that leave from one socket with one
    /// call (a run is usually the whole batch: a shard talks to few peers
    /// at a time).
    fn send(&mut self, packets: &[(SocketAddr, &[u8])]) -> usize {
        let mut sent = 0;
        while sent < packets.len() {
            let socket = self.socket_to(packets[sent].0.ip());
            let run =
                packets[sent..].iter().take_while(|(dst, _)| std::ptr::eq(self.socket_to(dst.ip()), socket)).count();
            let end = sent + run;
            while sent < end {
                match socket.send_batch(&packets[sent..end]) {
                    Ok(0) | Err(_) => return sent,
                    Ok(n) => sent += n,
                }
            }
        }
        sent
    }

    /// From a socket connected to `dst` (its port is the peer's for good:
    /// every ICRC sealed for the peer covers it).
    fn egress(&mut self, dst: IpAddr) -> Egress {
        Egress::Udp { source_port: self.sender_port(dst) }
    }

    fn receive(&mut self, _now: Instant, deliver: &mut dyn FnMut(SocketAddr, RecvMeta, &[u8])) -> usize {
        let n = self.socket.recv_batch(&mut self.rx).unwrap_or(0);
        if n > 0 {
            self.drops[0] = u64::from(self.rx.kernel_drops());
        }
        let mut delivered = 0;
        for i in 0..n {
            if let Some((from, tos, bytes)) = self.rx.get(i) {
                deliver(from, RecvMeta { ce: tos.ce(), ..RecvMeta::default() }, bytes);
                delivered += 1;
            }
        }
        if let Some(int) = &self.int {
            let n = int.recv_batch(&mut self.rx).unwrap_or(0);
            if n > 0 {
                self.drops[1] = u64::from(self.rx.kernel_drops());
            }
            for i in 0..n {
                let Some((from, tos, datagram)) = self.rx.get(i) else { continue };
                self.int_received += 1;
                match crate::int::unwrap(datagram) {
                    Some((records, bytes)) => {
                        deliver(from, RecvMeta { ce: tos.ce(), int: Some(records), ..RecvMeta::default() }, bytes);
                        delivered += 1;
                    }
                    None => self.int_malformed += 1,
                }
            }
        }
        for (group, socket) in &self.groups {
            let n = socket.recv_batch(&mut self.rx).unwrap_or(0);
            for i in 0..n {
                if let Some((from, tos, bytes)) = self.rx.get(i) {
                    let meta = RecvMeta { ce: tos.ce(), multicast_group: Some(*group), ..RecvMeta::default() };
                    deliver(from, meta, bytes);
                    delivered += 1;
                }
            }
        }
        delivered
    }

    fn join(&mut self, group: IpAddr) -> std::io::Result<()> {
        if !self.groups.iter().any(|(g, _)| *g == group) {
            let socket = RoceSocket::join(group, self.socket.local_addr().ip())?;
            self.groups.push((group, socket));
        }
        Ok(())
    }

    fn leave(&mut self, group: IpAddr) {
        // Closing the socket leaves the group.
        self.groups.retain(|(g, _)| *g != group);
    }

    fn group_fds(&self, out: &mut Vec<RawFd>) {
        out.extend(self.groups.iter().map(|(_, socket)| socket.fd()));
    }

    fn receive_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    fn ce_marked(&self) -> u64 {
        self.rx.ce_marked()
    }

    fn int_datagrams(&self) -> (u64, u64) {
        (self.int_received, self.int_malformed)
    }
}

/// While UDP carries traffic (it did within this long), every receive also
/// looks at the socket.
const UDP_BUSY: Duration = Duration::from_secs(1);
/// Otherwise the socket is looked at this often: an empty `recvmmsg` per
/// poll is a system call, and it cost a ping-pong over shared memory half
/// its speed (4.6 against 2.2 µs).
const UDP_IDLE_POLL: Duration = Duration::from_micros(20);
/// And this often while the ring keeps delivering: the first datagram
/// after a quiet second waits a little longer, and a softrnicd streaming
/// 64 KiB WRITEs between two tenants spent 2.7 % of its time on its two
/// devices' empty looks.
const UDP_POLL_RING_BUSY: Duration = Duration::from_micros(200);

/// Shared memory for local peers, UDP for the rest.
pub struct SharedMemory {
    udp: Udp,
    /// This shard's ring of the device's inbox.
    inbox: InboxRing,
    peers: Peers,
    /// Where a datagram is copied out of the ring (the peer may still be
    /// writing the slot, so it is never handled in place).
    buf: Box<[u8]>,
    malformed: u64,
    /// Datagrams for a peer whose ring was full, oldest first: held, as a
    /// lossless link holds them, rather than dropped (a UD datagram dropped
    /// between two processes on one host would be lost for good).
    held: VecDeque<(SocketAddr, Box<[u8]>)>,
    /// When a held datagram last went into a ring (or the first was held).
    held_moved_at: Instant,
    /// Until when UDP counts as carrying traffic.
    udp_busy_until: Instant,
    /// When an idle socket was last looked at (`None`: look at once).
    udp_last_look: Option<Instant>,
    /// Datagrams to rings carry an ICRC too: set where faults corrupt
    /// datagrams (a corrupted one must fail a check somewhere).
    seals: bool,
}

impl SharedMemory {
    pub fn new(udp: Udp, inbox: InboxRing) -> SharedMemory {
        SharedMemory {
            udp,
            peers: Peers::new(inbox.scope()),
            inbox,
            buf: vec![0u8; MAX_DATAGRAM_LEN].into_boxed_slice(),
            malformed: 0,
            held: VecDeque::new(),
            held_moved_at: Instant::now(),
            udp_busy_until: Instant::now(),
            udp_last_look: None,
            seals: false,
        }
    }

    /// Seals datagrams to rings with an ICRC (`true` where faults corrupt
    /// datagrams), as over UDP.
    pub fn sealing(self, seals: bool) -> SharedMemory {
        SharedMemory { seals, ..self }
    }

    /// What ring entries name as their source: the shard's socket, or the
    /// port that says no ICRC was computed.
    fn ring_source(&self) -> SocketAddr {
        let port = if self.seals { ROCEV2_UDP_PORT } else { NO_ICRC_PORT };
        SocketAddr::new(self.udp.socket.local_addr().ip(), port)
    }
}

impl Datapath for SharedMemory {
    fn send(&mut self, packets: &[(SocketAddr, &[u8])]) -> usize {
        // Filled only for peers off this host: no array of a batch's
        // entries set up for every call.
        let mut remote: SmallVec<[(SocketAddr, &[u8]); BATCH]> = SmallVec::new();
        let mut taken = 0;
        // What was held goes first, in order, as far as the rings take it.
        let was_held = self.held.len();
        let source = self.ring_source();
        while let Some((dst, bytes)) = self.held.front() {
            // Delivered, or the peer is gone (its datagrams are lost, as
            // to a host that went away): either way, no longer held.
            if self.peers.send(source, dst.ip(), bytes) == Some(Sent::Full) {
                break;
            }
            self.held.pop_front();
        }
        if self.held.len() < was_held {
            self.held_moved_at = Instant::now();
        }
        for &(dst, datagram) in packets.iter().take(BATCH) {
            // The ring crosses no switch: INT has no path to record on it.
            let bytes = crate::int::roce_packet(dst, datagram);
            let sent = if self.held.is_empty() { self.peers.send(source, dst.ip(), bytes) } else { Some(Sent::Full) };
            match sent {
                None => remote.push((dst, datagram)),
                Some(Sent::Delivered | Sent::DeliveredRang) => taken += 1,
                // Held behind what is held already; past the bound, lost
                // as on a full link (and counted by the caller).
                Some(Sent::Full) if self.held.len() < MAX_HELD => {
                    if self.held.is_empty() {
                        self.held_moved_at = Instant::now();
                    }
                    self.held.push_back((dst, bytes.into()));
                    taken += 1;
                }
                Some(Sent::Full) => {}
            }
        }
        if !remote.is_empty() {
            self.udp_busy_until = Instant::now() + UDP_BUSY;
            taken += self.udp.send(&remote);
        }
        taken
    }

    fn receive(&mut self, now: Instant, deliver: &mut dyn FnMut(SocketAddr, RecvMeta, &[u8])) -> usize {
        // The ring crosses no switch: nothing marks it.
        let from_ring = self.inbox.receive(BATCH, &mut self.buf, &mut self.malformed, &mut |from, bytes| {
            deliver(from, RecvMeta { same_host: from.port() == NO_ICRC_PORT, ..RecvMeta::default() }, bytes)
        });
        self.peers.at(now);
        let interval = if from_ring > 0 { UDP_POLL_RING_BUSY } else { UDP_IDLE_POLL };
        if now >= self.udp_busy_until && self.udp_last_look.is_some_and(|at| now < at + interval) {
            return from_ring;
        }
        self.udp_last_look = Some(now);
        let from_socket = self.udp.receive(now, deliver);
        if from_socket > 0 {
            self.udp_busy_until = now + UDP_BUSY;
        }
        from_ring + from_socket
    }

    /// Devices on this host are reached through their ring, with no ICRC
    /// (unless faults corrupt datagrams), and payloads by reference where
    /// they see this process's memory files; the rest over UDP.
    fn egress(&mut self, dst: IpAddr) -> Egress {
        match self.peers.on_this_host(dst) {
            None => self.udp.egress(dst),
            Some(_) if self.seals => Egress::ROCEV2_PORT,
            Some(references) => Egress::SameHost { references },
        }
    }

    fn prepare_to_sleep(&mut self) -> bool {
        self.held.is_empty() && self.inbox.prepare_to_sleep()
    }

    fn doorbell(&self) -> Option<RawFd> {
        Some(self.inbox.doorbell())
    }

    fn holds_back(&self) -> bool {
        !self.held.is_empty()
    }

    fn pushes_back(&self) -> bool {
        self.held.len() >= BACKLOG && self.held_moved_at.elapsed() < PATIENCE
    }

    fn has_arrivals(&self) -> bool {
        self.inbox.has_arrivals()
    }

    fn awake(&mut self) {
        self.inbox.awake();
        // Whatever woke the thread is to be read now.
        self.udp_last_look = None;
    }

    fn receive_drops(&self) -> u64 {
        self.udp.receive_drops()
    }

    fn ce_marked(&self) -> u64 {
        self.udp.ce_marked()
    }

    fn malformed(&self) -> u64 {
        self.malformed
    }

    fn int_datagrams(&self) -> (u64, u64) {
        self.udp.int_datagrams()
    }

    // Multicast goes over UDP: the kernel fans a datagram out to every
    // device whose socket joined the group, on this host or another.

    fn join(&mut self, group: IpAddr) -> std::io::Result<()> {
        self.udp.join(group)
    }

    fn leave(&mut self, group: IpAddr) {
        self.udp.leave(group)
    }

    fn group_fds(&self, out: &mut Vec<RawFd>) {
        self.udp.group_fds(out)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::shm::tests::readable;
    use crate::shm::{Inbox, SLOTS, Scope};

    /// A shared-memory wire of a device on `here` with one shard, and its
    /// inbox.
    fn wire_on(here: &str) -> (Arc<Inbox>, SharedMemory) {
        let here: IpAddr = here.parse().unwrap();
        let inbox = Arc::new(Inbox::create(here, 1, Scope::this_netns().unwrap()).unwrap());
        let wire = SharedMemory::new(Udp::new(Arc::new(RoceSocket::bind(here).unwrap()), None), inbox.ring(0));
        (inbox, wire)
    }

    /// A burst larger than the peer's ring while the peer does not drain
    /// it: the wire takes all of it, holds what the ring refuses, and
    /// passes it on, in order, as the ring drains. Nothing is lost.
    #[test]
    fn a_full_ring_holds_datagrams_in_order_until_it_drains() {
        let (_own, mut wire) = wire_on("127.0.9.20");
        let there: IpAddr = "127.0.9.21".parse().unwrap();
        let scope = Scope::this_netns().unwrap();
        let peer = Arc::new(Inbox::create(there, 1, scope).unwrap());
        let mut ring = peer.ring(0);
        let to = SocketAddr::new(there, softrnic_wire::ROCEV2_UDP_PORT);
        let datagrams: Vec<Vec<u8>> = (0..SLOTS as usize + 100)
            .map(|i| {
                let mut d = vec![0u8; 64];
                d[5..8].copy_from_slice(&[0, 0, 0x11]);
                d[12..16].copy_from_slice(&(i as u32).to_be_bytes());
                d
            })
            .collect();
        let started = Instant::now();
        for chunk in datagrams.chunks(BATCH) {
            let packets: Vec<(SocketAddr, &[u8])> = chunk.iter().map(|d| (to, &d[..])).collect();
            assert_eq!(wire.send(&packets), chunk.len(), "taken, not dropped");
        }
        assert!(wire.holds_back(), "the ring holds {SLOTS}; the rest waits");
        // Unless this thread was kept off its core past the patience.
        assert!(
            wire.pushes_back() || started.elapsed() >= PATIENCE,
            "{} held: the shard must send nothing new",
            datagrams.len() - SLOTS as usize
        );
        assert!(!wire.prepare_to_sleep(), "a wire holding datagrams must not sleep");
        let (mut got, mut buf, mut malformed) = (Vec::new(), vec![0u8; MAX_DATAGRAM_LEN], 0);
        for _ in 0..100 {
            ring.receive(BATCH, &mut buf, &mut malformed, &mut |_, bytes| got.push(bytes.to_vec()));
            wire.send(&[]);
            if got.len() == datagrams.len() {
                break;
            }
        }
        assert_eq!((got.len(), malformed), (datagrams.len(), 0));
        assert!(got == datagrams, "in order, byte for byte");
        assert!(!wire.holds_back());
        assert!(!wire.pushes_back(), "drained: the shard sends again");
    }

    /// A peer's engine thread asleep on its socket and its doorbell is
    /// woken by the doorbell: nothing but RoCEv2 ever goes to its UDP
    /// port 4791 (an 8-byte wake-up datagram once did, which any capture
    /// of loopback showed as a malformed RoCEv2 packet).
    #[test]
    fn a_sleeping_peer_is_woken_by_its_doorbell_not_a_datagram() {
        let (_own, mut wire) = wire_on("127.0.9.24");
        let there: IpAddr = "127.0.9.25".parse().unwrap();
        let peer_socket = Arc::new(RoceSocket::bind(there).unwrap());
        let peer_inbox = Arc::new(Inbox::create(there, 1, Scope::this_netns().unwrap()).unwrap());
        let mut peer = SharedMemory::new(Udp::new(peer_socket.clone(), None), peer_inbox.ring(0));
        assert!(peer.prepare_to_sleep());
        let doorbell = peer.doorbell().expect("a shared-memory wire has a doorbell");
        let mut request = vec![0u8; 64];
        request[5..8].copy_from_slice(&[0, 0, 0x11]);
        let to = SocketAddr::new(there, softrnic_wire::ROCEV2_UDP_PORT);
        assert_eq!(wire.send(&[(to, &request[..])]), 1);
        assert!(readable(doorbell), "the sleeper's doorbell rang");
        assert!(!readable(peer_socket.fd()), "and nothing reached its UDP socket");
        peer.awake();
        let mut got = Vec::new();
        peer.receive(Instant::now(), &mut |_, _, bytes| got.push(bytes.to_vec()));
        assert_eq!(got, vec![request]);
        assert!(!readable(doorbell), "silenced on waking");
    }

    /// A peer whose ring takes nothing for [`PATIENCE`] is stuck, not
    /// slow: its wire stops pushing back, so that the shard's other peers
    /// are not stalled behind it for ever.
    #[test]
    fn a_stuck_peer_is_pushed_back_for_only_so_long() {
        let (_own, mut wire) = wire_on("127.0.9.22");
        let there: IpAddr = "127.0.9.23".parse().unwrap();
        let scope = Scope::this_netns().unwrap();
        let _peer = Arc::new(Inbox::create(there, 1, scope).unwrap());
        let to = SocketAddr::new(there, softrnic_wire::ROCEV2_UDP_PORT);
        let datagram = [0u8; 64];
        let started = Instant::now();
        for _ in 0..(SLOTS as usize + BACKLOG).div_ceil(BATCH) {
            wire.send(&[(to, &datagram[..]); BATCH]);
        }
        assert!(wire.pushes_back() || started.elapsed() >= PATIENCE);
        std::thread::sleep(PATIENCE + Duration::from_millis(5));
        wire.send(&[]);
        assert!(wire.holds_back(), "still held: the ring may yet drain");
        assert!(!wire.pushes_back(), "but the shard may send to others again");
    }

    /// Datagrams to a peer leave from a socket connected to it, on a port
    /// of its own that stays the peer's (every ICRC sealed for it covers
    /// that port), and arrive from that port.
    #[test]
    fn a_peer_is_sent_to_from_one_socket_connected_to_it() {
        let here: IpAddr = "127.0.9.31".parse().unwrap();
        let there: IpAddr = "127.0.9.32".parse().unwrap();
        let peer = RoceSocket::bind(there).unwrap();
        let mut wire = Udp::new(Arc::new(RoceSocket::bind(here).unwrap()), None);
        let Egress::Udp { source_port: port } = wire.egress(there) else { panic!("over UDP") };
        assert_ne!(port, ROCEV2_UDP_PORT, "a socket of its own");
        assert_eq!(wire.egress(there), Egress::Udp { source_port: port }, "the same for every datagram");
        let to = SocketAddr::new(there, ROCEV2_UDP_PORT);
        assert_eq!(wire.send(&[(to, &b"first"[..]), (to, &b"second"[..])]), 2);
        let mut batch = RecvBatch::default();
        let mut from = Vec::new();
        for _ in 0..1000 {
            let n = peer.recv_batch(&mut batch).unwrap();
            from.extend((0..n).map(|i| batch.get(i).map(|(from, _, bytes)| (from, bytes.to_vec())).unwrap()));
            if from.len() == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let source = SocketAddr::new(here, port);
        assert_eq!(from, [(source, b"first".to_vec()), (source, b"second".to_vec())]);
    }

    /// Descriptors are spent on the first few peers only; the rest share
    /// the shard's own socket, and keep it.
    #[test]
    fn only_the_first_peers_get_sockets_of_their_own() {
        let mut wire = Udp::new(Arc::new(RoceSocket::bind("127.0.9.33".parse().unwrap()).unwrap()), None);
        let peers: Vec<IpAddr> = (1..=MAX_CONNECTED as u8 + 2).map(|i| IpAddr::from([127, 0, 10, i])).collect();
        let ports: Vec<u16> = peers.iter().map(|&peer| wire.sender_port(peer)).collect();
        assert!(ports[..MAX_CONNECTED].iter().all(|&port| port != ROCEV2_UDP_PORT));
        assert!(ports[MAX_CONNECTED..].iter().all(|&port| port == ROCEV2_UDP_PORT));
        let again: Vec<u16> = peers.iter().map(|&peer| wire.sender_port(peer)).collect();
        assert_eq!(again, ports);
    }

    /// Over shared memory a device on this host is reached through its
    /// ring with no ICRC, and its datagrams arrive saying so; where faults
    /// corrupt datagrams the ring's are sealed as UDP's are. A peer met
    /// over UDP is sent to from a connected socket.
    #[test]
    fn devices_on_this_host_are_reached_without_an_icrc() {
        let (_here, mut wire) = wire_on("127.0.9.34");
        let (_there_inbox, mut there) = wire_on("127.0.9.35");
        let peer: IpAddr = "127.0.9.35".parse().unwrap();
        assert_eq!(wire.egress(peer), Egress::SameHost { references: true }, "a peer of this process");
        assert!(
            matches!(wire.egress("127.0.9.36".parse().unwrap()), Egress::Udp { source_port } if source_port != ROCEV2_UDP_PORT)
        );
        let to = SocketAddr::new(peer, ROCEV2_UDP_PORT);
        assert_eq!(wire.send(&[(to, &b"unsealed"[..])]), 1);
        let mut wire = wire.sealing(true);
        assert_eq!(wire.egress(peer), Egress::ROCEV2_PORT);
        assert_eq!(wire.send(&[(to, &b"sealed"[..])]), 1);
        let mut got = Vec::new();
        there.receive(Instant::now(), &mut |from, meta, bytes| got.push((from.port(), meta.same_host, bytes.to_vec())));
        assert_eq!(got, [(NO_ICRC_PORT, true, b"unsealed".to_vec()), (ROCEV2_UDP_PORT, false, b"sealed".to_vec())]);
    }
}
