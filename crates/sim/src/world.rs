//! Hosts on a simulated network, and virtual time.
//!
//! The network is either [`Network`], point-to-point links with injected
//! faults, or a [`Fabric`] of switches running softrnic's switch pipeline.
//!
//! A step looks only at the hosts something happened to since the last
//! one (a packet, a timer, or a caller reaching a device through
//! [`World::device`]): a fabric of hundreds of mostly idle hosts then
//! costs per event, not per host.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softrnic_transport::memory::{PeerMemory, SharedFile, SharedPart};
use softrnic_transport::{Device, DmaBuffer, Egress, Entropy, Instant, MAX_DATAGRAM_LEN, SrqId, TransportConfig};
use softrnic_wire::ROCEV2_UDP_PORT;

use crate::fabric::{Fabric, FabricSpec};
use crate::network::{Faults, InFlight, Network};

/// A host: one device with its address.
#[derive(Debug)]
pub struct Host {
    pub device: Device,
    pub addr: SocketAddr,
    /// A host that is down neither sends nor receives.
    pub up: bool,
    /// Where its programs write receives the device fetches on demand.
    pub receive_sources: ReceiveSources,
    /// How far its clock runs ahead of the world's: a monotonic clock
    /// jumps forward when the host was frozen and resumes (a VM paused or
    /// migrated, a process stopped), and never back ([`World::jump_clock`]).
    pub clock_ahead: Duration,
}

/// The simulator's stand-in for softrnicd's receive rings: for a QP (or an
/// SRQ) marked as fetched on demand, what posts the receives its program
/// wrote when the device asks ([`softrnic_transport::fetch_on_demand`]).
#[derive(Default)]
pub struct ReceiveSources {
    sources: HashMap<Source, Box<dyn FnMut()>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Qp(u32),
    Srq(SrqId),
}

impl ReceiveSources {
    /// `fetch` posts the receives the program of QP `qpn` wrote.
    pub fn for_qp(&mut self, qpn: u32, fetch: impl FnMut() + 'static) {
        self.sources.insert(Source::Qp(qpn), Box::new(fetch));
    }

    /// `fetch` posts the receives the program wrote to SRQ `srq`.
    pub fn for_srq(&mut self, srq: SrqId, fetch: impl FnMut() + 'static) {
        self.sources.insert(Source::Srq(srq), Box::new(fetch));
    }

    /// Answers every question the device has asked.
    fn answer(&mut self, device: &mut Device, now: Instant) {
        while let Some(wanted) = device.poll_receives_wanted() {
            let source = wanted.srq.map_or(Source::Qp(wanted.qpn), Source::Srq);
            if let Some(fetch) = self.sources.get_mut(&source) {
                fetch();
            }
            device.receives_fetched(now, wanted);
        }
    }
}

impl std::fmt::Debug for ReceiveSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.sources.keys()).finish()
    }
}

/// A fault of the network as a whole, for a while: what no per-packet
/// draw makes. The simulator's liveness phase ends every outage
/// ([`World::heal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outage {
    pub kind: OutageKind,
    /// The hosts it stands between: a clog holds what `between.0` sends
    /// to `between.1`; a partition cuts both ways.
    pub between: (usize, usize),
    pub from: Instant,
    pub until: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageKind {
    /// The path holds everything sent on it and lets it all go, in
    /// order, when the clog ends: a stalled link or a paused port.
    Clog,
    /// Nothing crosses, either way: whatever is sent is lost.
    Partition,
}

impl Outage {
    /// Does it stand between `sender` and `receiver` at `now`?
    fn covers(&self, sender: usize, receiver: usize, now: Instant) -> bool {
        let (a, b) = self.between;
        let on_path = match self.kind {
            OutageKind::Clog => (sender, receiver) == (a, b),
            OutageKind::Partition => (sender, receiver) == (a, b) || (sender, receiver) == (b, a),
        };
        on_path && self.from <= now && now < self.until
    }
}

/// Devices, the network between them, and the clock.
#[derive(Debug)]
pub struct World {
    pub now: Instant,
    pub hosts: Vec<Host>,
    pub network: Network,
    /// When set, datagrams cross these switches instead of `network`.
    pub fabric: Option<Fabric>,
    by_ip: HashMap<IpAddr, usize>,
    /// Hosts to look at in the next step, and each host's next timer as
    /// of its last look.
    touched: Vec<bool>,
    touched_list: Vec<usize>,
    timers: Vec<Option<Instant>>,
    /// The same timers, soonest first; an entry that no longer matches
    /// `timers` is stale and skipped.
    timer_queue: BinaryHeap<Reverse<(Instant, usize)>>,
    buf: Vec<u8>,
    /// Print every packet (`SOFTRNIC_SIM_TRACE=1`).
    trace: bool,
    /// Outages of the network, in any order.
    pub outages: Vec<Outage>,
    /// Datagrams a clog holds: when they go, and which host sent them.
    held: Vec<(Instant, usize, InFlight)>,
    /// Datagrams partitions lost.
    pub partitioned: u64,
    /// The seed the devices' keys and QP numbers are drawn from, and how
    /// many hosts have restarted (each restart draws afresh).
    seed: u64,
    restarts: u64,
    /// Set when the hosts are devices of one machine
    /// ([`World::on_one_host`]): the files their registered memory lies
    /// in, which their references name.
    one_host: Option<HostFiles>,
}

/// The files of one simulated machine: where the devices' registered
/// memory lies, for the references they send each other to resolve to
/// ([`softrnic_transport::by_reference`]), as the engine maps a peer
/// process's memfds.
#[derive(Debug, Clone, Default)]
pub struct HostFiles(Arc<Mutex<HashMap<SharedFile, Arc<DmaBuffer>>>>);

impl HostFiles {
    /// `bytes` as a buffer that lies whole in a file of its own, which
    /// peers can map.
    fn share(&self, bytes: &[u8]) -> Arc<DmaBuffer> {
        let mut files = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = files.len() as u64 + 1;
        let file = SharedFile { pid: 1, fd: n as i32, inode: n };
        let part = SharedPart { at: 0, len: bytes.len(), file, file_offset: 0 };
        let buffer = Arc::new(DmaBuffer::from_bytes(bytes).shared_in(vec![part]));
        files.insert(file, buffer.clone());
        buffer
    }
}

impl PeerMemory for HostFiles {
    fn map(&mut self, file: &SharedFile) -> Option<Arc<DmaBuffer>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(file).cloned()
    }
}

/// Keys and QP numbers for host `host`'s device, drawn from the run's seed
/// (a run replays), afresh after each restart.
fn entropy(seed: u64, host: usize, restart: u64) -> Entropy {
    Entropy::from_u64(seed ^ (host as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ restart.wrapping_mul(0x9e37_79b9))
}

/// The address of simulated host `i`: 127.0.0.2, 127.0.0.3, ... and on to
/// 127.0.1.2 after 250 hosts.
pub fn host_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, (i / 250) as u8, 2 + (i % 250) as u8))
}

impl World {
    /// `hosts` devices at [`host_ip`] addresses (simulated: no socket is
    /// opened), joined by a network with `faults`, randomised by `seed`.
    pub fn new(hosts: usize, faults: Faults, seed: u64) -> World {
        Self::with_config(hosts, faults, seed, TransportConfig::default())
    }

    pub fn with_config(hosts: usize, faults: Faults, seed: u64, config: TransportConfig) -> World {
        let hosts = (0..hosts)
            .map(|i| {
                let ip = host_ip(i);
                let device = Device::new(TransportConfig { local_addr: ip, ..config.clone() }, entropy(seed, i, 0));
                Host {
                    device,
                    addr: SocketAddr::new(ip, ROCEV2_UDP_PORT),
                    up: true,
                    receive_sources: ReceiveSources::default(),
                    clock_ahead: Duration::ZERO,
                }
            })
            .collect::<Vec<_>>();
        let network = Network::new(faults, seed ^ 0x9e37_79b9_7f4a_7c15, hosts.len());
        let trace = std::env::var_os("SOFTRNIC_SIM_TRACE").is_some();
        let n = hosts.len();
        World {
            now: Instant::ZERO,
            by_ip: hosts.iter().enumerate().map(|(i, h)| (h.addr.ip(), i)).collect(),
            hosts,
            network,
            fabric: None,
            touched: vec![true; n],
            touched_list: (0..n).collect(),
            timers: vec![None; n],
            timer_queue: BinaryHeap::new(),
            buf: vec![0; MAX_DATAGRAM_LEN],
            trace,
            outages: Vec::new(),
            held: Vec::new(),
            partitioned: 0,
            seed,
            restarts: 0,
            one_host: None,
        }
    }

    /// Makes the hosts devices of one machine, as the shared-memory wire
    /// joins them: their packets carry references to registered memory
    /// in place of payloads, spanning several MTUs where they may, with
    /// no ICRC (so the network must not corrupt them). The network still
    /// drops, reorders and duplicates them, which the rings never do:
    /// the transport's recovery must hold on this path too.
    pub fn on_one_host(&mut self) {
        self.one_host = Some(HostFiles::default());
        for host in 0..self.hosts.len() {
            self.join_host(host);
        }
    }

    fn join_host(&mut self, host: usize) {
        if let Some(files) = &self.one_host {
            let device = &mut self.hosts[host].device;
            device.set_peer_memory(Box::new(files.clone()));
            device.send_references(true);
        }
    }

    /// A buffer holding `bytes` for a host to register: in a file its
    /// peers can map when the world is one machine.
    pub fn buffer(&self, bytes: &[u8]) -> Arc<DmaBuffer> {
        match &self.one_host {
            Some(files) => files.share(bytes),
            None => Arc::new(DmaBuffer::from_bytes(bytes)),
        }
    }

    /// Hosts joined by the switches `spec` describes.
    pub fn with_fabric(spec: &FabricSpec, config: TransportConfig) -> World {
        let mut world = Self::with_config(spec.graph.host_switch.len(), Faults::NONE, spec.seed, config);
        let addrs: Vec<IpAddr> = world.hosts.iter().map(|h| h.addr.ip()).collect();
        world.fabric = Some(Fabric::new(spec, &addrs));
        world
    }

    /// The network heals: from now on no link loses, reorders, duplicates
    /// or corrupts anything, and every host is up. What was already on
    /// its way still arrives as it was sent.
    pub fn heal(&mut self) {
        self.outages.clear();
        self.release_held(Instant::from_nanos(u64::MAX));
        self.network.faults = Faults::NONE;
        if let Some(fabric) = &mut self.fabric {
            fabric.heal();
        }
        for host in 0..self.hosts.len() {
            if !self.hosts[host].up {
                self.hosts[host].up = true;
                self.touch(host);
            }
        }
    }

    /// Host `host` crashes and comes back: a fresh device at the same
    /// address, with the same configuration and none of its QPs, regions
    /// or keys; what it had to send and its timers are gone with it.
    pub fn restart(&mut self, host: usize) {
        self.restarts += 1;
        let config = self.hosts[host].device.config().clone();
        self.hosts[host].device = Device::new(config, entropy(self.seed, host, self.restarts));
        self.join_host(host);
        self.hosts[host].receive_sources = ReceiveSources::default();
        self.hosts[host].up = true;
        self.timers[host] = None;
        self.touch(host);
    }

    /// The time on host `host`'s clock: the device's `now`.
    pub fn clock(&self, host: usize) -> Instant {
        self.now + self.hosts[host].clock_ahead
    }

    /// Host `host`'s clock jumps `by` forward: every timer that falls due
    /// in the skipped time fires at once, as after a freeze.
    pub fn jump_clock(&mut self, host: usize, by: Duration) {
        self.hosts[host].clock_ahead += by;
        self.touch(host);
    }

    fn touch(&mut self, host: usize) {
        if !self.touched[host] {
            self.touched[host] = true;
            self.touched_list.push(host);
        }
    }

    pub fn device(&mut self, host: usize) -> &mut Device {
        self.touch(host);
        &mut self.hosts[host].device
    }

    pub fn ip(&self, host: usize) -> IpAddr {
        self.hosts[host].addr.ip()
    }

    /// Sends what the devices have ready; then when the next arrival,
    /// timer or end of a clog is, if anything is left to happen.
    fn next_event(&mut self) -> Option<Instant> {
        self.flush();
        let clog_ends = self.held.iter().map(|&(at, _, _)| at).min();
        let room = self.fabric.is_none().then(|| self.network.next_room()).flatten();
        [self.next_arrival(), self.next_timer(), clog_ends, room].into_iter().flatten().min()
    }

    /// Puts on the network, in the order they were sent, the datagrams
    /// whose clog ended by `by` (now, however late the clog's end).
    fn release_held(&mut self, by: Instant) {
        if self.held.is_empty() {
            return;
        }
        let (due, kept) = std::mem::take(&mut self.held).into_iter().partition(|&(at, _, _)| at <= by);
        self.held = kept;
        for (_, sender, packet) in due {
            put_on_network(&mut self.fabric, &mut self.network, self.now, sender, packet);
        }
    }

    /// The soonest timer of a host that is up.
    fn next_timer(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, h))) = self.timer_queue.peek() {
            if self.timers[h] != Some(at) {
                self.timer_queue.pop();
                continue;
            }
            if !self.hosts[h].up {
                // Rare (tests take hosts down): look at every host.
                return (0..self.hosts.len()).filter(|&h| self.hosts[h].up).filter_map(|h| self.timers[h]).min();
            }
            return Some(at);
        }
        None
    }

    fn next_arrival(&self) -> Option<Instant> {
        match &self.fabric {
            Some(fabric) => fabric.next_arrival(),
            None => self.network.next_arrival(),
        }
    }

    /// Sends everything the devices want to send, then advances the clock
    /// to the next arrival or deadline and handles it. Returns false when
    /// nothing is left to happen: no packet in flight, no timer armed.
    pub fn step(&mut self) -> bool {
        let Some(next) = self.next_event() else { return false };
        self.now = self.now.max(next);
        self.release_held(self.now);
        loop {
            let packet = match &mut self.fabric {
                Some(fabric) => fabric.pop_due(self.now),
                None => self.network.pop_due(self.now),
            };
            let Some(packet) = packet else { break };
            if self.trace {
                println!("{:>12?} deliver {}", self.now - Instant::ZERO, describe(&packet));
            }
            if let Some(&h) = self.by_ip.get(&packet.to.ip())
                && self.hosts[h].up
            {
                let now = self.clock(h);
                self.hosts[h].device.handle_datagram(now, packet.from, packet.meta, &packet.bytes);
                self.touch(h);
            }
        }
        let room = match &mut self.fabric {
            Some(fabric) => fabric.take_room(),
            None => self.network.take_room(self.now),
        };
        for h in room {
            self.touch(h);
        }
        let mut down = Vec::new();
        while let Some(&Reverse((at, h))) = self.timer_queue.peek()
            && at <= self.now
        {
            self.timer_queue.pop();
            if self.timers[h] != Some(at) {
                continue;
            }
            if self.hosts[h].up {
                let now = self.clock(h);
                self.hosts[h].device.handle_timeout(now);
                // Looked at again in the next flush, whatever it says.
                self.timers[h] = None;
                self.touch(h);
            } else {
                down.push((at, h));
            }
        }
        // A host that is down keeps its timers for when it is up.
        self.timer_queue.extend(down.into_iter().map(Reverse));
        true
    }

    /// Hands every datagram the touched devices have ready to the network,
    /// and notes their next timers.
    pub fn flush(&mut self) {
        let touched = std::mem::take(&mut self.touched_list);
        for &index in &touched {
            self.touched[index] = false;
            let clock = self.clock(index);
            let host = &mut self.hosts[index];
            if !host.up {
                continue;
            }
            host.receive_sources.answer(&mut host.device, clock);
            // A NIC takes packets from its QPs only while its queue has
            // room (the fabric tells when it has again).
            let now = self.now;
            let room = |fabric: &mut Option<Fabric>, network: &mut Network| match fabric {
                Some(fabric) => fabric.has_room(index),
                None => network.has_room(index, now),
            };
            let same_host = self.one_host.is_some();
            let mut egress = |_| if same_host { Egress::SameHost { references: true } } else { Egress::ROCEV2_PORT };
            while room(&mut self.fabric, &mut self.network)
                && let Some(t) = host.device.poll_transmit_from(clock, &mut self.buf, &mut egress)
            {
                let to = SocketAddr::new(t.dst, ROCEV2_UDP_PORT);
                let mut packet = InFlight::new(host.addr, to, self.buf[..t.len].to_vec(), t.int);
                packet.meta.same_host = same_host;
                if self.trace {
                    println!("{:>12?} send    {}", self.now - Instant::ZERO, describe(&packet));
                }
                // Most runs have no outage: no lookup per datagram then.
                let outage = match self.outages.is_empty() {
                    true => None,
                    false => {
                        self.by_ip.get(&t.dst).and_then(|&r| self.outages.iter().find(|o| o.covers(index, r, self.now)))
                    }
                };
                match outage.map(|o| (o.kind, o.until)) {
                    Some((OutageKind::Partition, _)) => self.partitioned += 1,
                    Some((OutageKind::Clog, until)) => self.held.push((until, index, packet)),
                    None => put_on_network(&mut self.fabric, &mut self.network, self.now, index, packet),
                }
            }
        }
        for &index in &touched {
            // The world keeps time by its own clock.
            let ahead = self.hosts[index].clock_ahead;
            let timer = self.hosts[index]
                .device
                .poll_timeout()
                .map(|at| Instant::from_nanos(at.as_nanos().saturating_sub(ahead.as_nanos() as u64)).max(self.now));
            if timer != self.timers[index]
                && let Some(at) = timer
            {
                self.timer_queue.push(Reverse((at, index)));
            }
            self.timers[index] = timer;
        }
        // A host that is down keeps what it has to send for when it is up.
        for index in touched {
            if !self.hosts[index].up {
                self.touch(index);
            }
        }
    }

    /// Runs every event due by `until`, then sets the clock to `until`.
    /// Returns false if nothing was left to happen by then.
    pub fn run_until_time(&mut self, until: Instant) -> bool {
        loop {
            match self.next_event() {
                Some(t) if t <= until => {
                    self.step();
                }
                other => {
                    self.now = self.now.max(until);
                    return other.is_some();
                }
            }
        }
    }

    /// Steps until `done` holds or nothing is left to happen; returns
    /// whether `done` held.
    pub fn run_until(&mut self, mut done: impl FnMut(&mut World) -> bool, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }
}

/// One line about a packet, for traces.
/// Hands `sender`'s datagram to whichever network joins the hosts.
fn put_on_network(fabric: &mut Option<Fabric>, network: &mut Network, now: Instant, sender: usize, packet: InFlight) {
    match fabric {
        Some(fabric) => fabric.send(now, sender, packet),
        None => network.send(now, sender, packet),
    }
}

fn describe(packet: &InFlight) -> String {
    format!("{} -> {} {}", packet.from.ip(), packet.to.ip(), softrnic_wire::packet::summary(&packet.bytes))
}
