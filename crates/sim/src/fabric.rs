//! A switched network for the simulator: hosts on links to switches that
//! run softrnic's switch pipeline (`softrnic-switch`), the very code the
//! lab's real switch runs, driven here by virtual time.
//!
//! A host's link is its NIC's transmit queue and wire: datagrams leave one
//! after another at the link's rate and arrive at the switch after the
//! propagation delay; a PFC pause from the switch holds the queue, and a
//! full queue takes nothing more from the host's QPs until a packet has
//! left (`NIC_QUEUE_BYTES`). A
//! switch's departures arrive at the next hop after their wire time and
//! the link's delay. Every arrival and every time a switch's port becomes
//! free is an event in one queue, ordered by time and then by insertion,
//! so a run is deterministic.

use std::cmp::Ordering;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use softrnic_switch::frame::is_control_opcode;
use softrnic_switch::{
    AggregationConfig, Classified, Ecn, Frame, Graph, LinkFaults, PortConfig, PortPeer, QUEUES, Switch, SwitchConfig,
};
use softrnic_transport::{Instant, IntRecords};
use softrnic_wire::aggregation::AGG_UDP_PORT;
use softrnic_wire::int::{Hop, Stamp};

use crate::network::{InFlight, NetworkStats};

/// Ethernet, IPv4 and UDP headers around every datagram: what a link
/// carries beyond the RoCE bytes the transport sees.
pub const HEADERS: usize = 14 + 20 + 8;

/// A datagram crossing the fabric, with the ECN field its IP header has.
#[derive(Debug)]
pub struct SimPacket {
    pub packet: InFlight,
    pub ecn: Ecn,
}

impl Frame for SimPacket {
    fn wire_len(&self) -> usize {
        self.packet.bytes.len() + HEADERS
    }

    fn classify(&self) -> Option<Classified> {
        let bytes = &self.packet.bytes;
        // Flows are QPs: the destination QP and the two addresses.
        let qpn = bytes.get(5..8).map_or(0, |b| u64::from(b[0]) << 16 | u64::from(b[1]) << 8 | u64::from(b[2]));
        let flow = hash_addr(self.packet.from.ip()).rotate_left(21) ^ hash_addr(self.packet.to.ip()) ^ qpn << 40;
        Some(Classified {
            src: self.packet.from.ip(),
            dst: self.packet.to.ip(),
            flow,
            ecn: self.ecn,
            dscp: 0,
            control: bytes.first().is_some_and(|&b| is_control_opcode(b)),
            int: self.packet.stamp,
        })
    }

    fn mark_ce(&mut self) {
        self.ecn = Ecn::Ce;
    }

    /// A datagram whose sender collects INT keeps the records beside its
    /// bytes, in the transport's units.
    fn stamp_int(&mut self, hop: Hop) -> Option<Stamp> {
        let records = self.packet.meta.int.as_mut().filter(|_| self.packet.stamp)?;
        let fresh = IntRecords::from_wire([hop]);
        Some(if records.push(fresh.hops()[0]) { Stamp::Recorded } else { Stamp::Full })
    }

    fn aggregation_payload(&mut self) -> Option<&mut [u8]> {
        (self.packet.to.port() == AGG_UDP_PORT).then_some(&mut self.packet.bytes[..])
    }

    fn copy_to(&self, dst: IpAddr) -> SimPacket {
        let p = &self.packet;
        let to = std::net::SocketAddr::new(dst, p.to.port());
        SimPacket {
            packet: InFlight { from: p.from, to, bytes: p.bytes.clone(), meta: p.meta, stamp: p.stamp },
            ecn: self.ecn,
        }
    }
}

fn hash_addr(addr: IpAddr) -> u64 {
    match addr {
        IpAddr::V4(a) => u64::from(u32::from(a)).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        IpAddr::V6(a) => (u128::from(a) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

/// A link's rate and one-way propagation delay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub rate_bps: u64,
    pub delay: Duration,
}

impl Link {
    fn wire_time(&self, bytes: usize) -> Duration {
        Duration::from_nanos((bytes as u64 * 8 * 1_000_000_000).div_ceil(self.rate_bps))
    }
}

/// How to build a fabric: the graph, each host's link, each switch link,
/// and the port configuration a link's ends get.
#[derive(Debug, Clone)]
pub struct FabricSpec {
    pub graph: Graph,
    pub host_links: Vec<Link>,
    pub switch_links: Vec<Link>,
    /// The egress queues, ECN and PFC of a port on a link of this rate.
    pub port: fn(&Link) -> PortConfig,
    pub shared_buffer: u64,
    pub seed: u64,
    /// What every switch port's link does to packets.
    pub faults: LinkFaults,
    /// Every switch's aggregation pool, if they aggregate.
    pub aggregation: Option<AggregationConfig>,
}

#[derive(Debug)]
enum Event {
    AtSwitch {
        switch: usize,
        port: usize,
        packet: SimPacket,
    },
    AtHost {
        packet: SimPacket,
    },
    /// A switch may have something to send.
    Wake {
        switch: usize,
    },
    /// A host's link is free again.
    HostFree {
        host: usize,
    },
    Pfc {
        switch: usize,
        port: usize,
        queue: usize,
        pause: bool,
    },
}

/// An event and when it happens; ordered by time, then by when it was
/// scheduled.
#[derive(Debug)]
struct Scheduled {
    at: Duration,
    sequence: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

/// What a host's NIC holds for its wire before it takes no more from the
/// QPs: 16 packets of 4 KiB, 5 µs of a 100 Gb/s link. A NIC's transmit
/// scheduler pulls a QP's next packet when the port can take it, so a QP
/// that goes back (or a link that PFC pauses) does not stack copies of a
/// window in front of the wire: with an unbounded queue, a paused link
/// let go-back-N heap 17 ms of timed-out windows there (seed 8001058).
pub const NIC_QUEUE_BYTES: usize = 64 * 1024;

/// A host's NIC queue and wire.
#[derive(Debug)]
struct Uplink {
    link: Link,
    switch: usize,
    port: usize,
    queue: VecDeque<SimPacket>,
    /// The bytes in `queue`.
    queued_bytes: usize,
    /// The host stopped handing datagrams over at a full queue, and is to
    /// be told when there is room again.
    throttled: bool,
    busy_until: Duration,
    paused: bool,
    /// A `HostFree` event is on its way.
    wake_scheduled: bool,
}

/// The switched network.
#[derive(Debug)]
pub struct Fabric {
    switches: Vec<Switch<SimPacket>>,
    peers: Vec<Vec<PortPeer>>,
    /// The link behind each switch port.
    port_links: Vec<Vec<Link>>,
    uplinks: Vec<Uplink>,
    hosts_by_ip: HashMap<IpAddr, usize>,
    events: BinaryHeap<Reverse<Scheduled>>,
    sequence: u64,
    /// When each switch's wake-up is already scheduled.
    wake_at: Vec<Option<Duration>>,
    delivered: VecDeque<SimPacket>,
    /// Throttled hosts whose NIC queue has room again.
    room: Vec<usize>,
    pub stats: NetworkStats,
    /// Packets delivered marked CE.
    pub ce_delivered: u64,
}

fn since_zero(t: Instant) -> Duration {
    t - Instant::ZERO
}

impl Fabric {
    /// A fabric for hosts with addresses `addrs` (in host order).
    pub fn new(spec: &FabricSpec, addrs: &[IpAddr]) -> Fabric {
        let graph = &spec.graph;
        let mut switches = Vec::new();
        let mut peers = Vec::new();
        let mut port_links = Vec::new();
        let host_addrs: Vec<Vec<IpAddr>> = addrs.iter().map(|&a| vec![a]).collect();
        for s in 0..graph.switches {
            let ports = graph.ports(s);
            let links: Vec<Link> = ports
                .iter()
                .map(|peer| match *peer {
                    PortPeer::Host(h) => spec.host_links[h],
                    PortPeer::Switch { switch, .. } => {
                        let i = graph.links.iter().position(|&l| l == (s, switch) || l == (switch, s)).expect("link");
                        spec.switch_links[i]
                    }
                })
                .collect();
            let config = SwitchConfig {
                ports: links.iter().map(|l| PortConfig { faults: spec.faults, ..(spec.port)(l) }).collect(),
                queues_per_port: QUEUES,
                shared_buffer: spec.shared_buffer,
                seed: spec.seed ^ (s as u64).wrapping_mul(0x2545_f491_4f6c_dd1d),
                aggregation: spec.aggregation,
            };
            switches.push(Switch::new(config, graph.routes(s, &host_addrs, true)));
            peers.push(ports);
            port_links.push(links);
        }
        let uplinks = (0..addrs.len())
            .map(|h| {
                let switch = graph.host_switch[h];
                let port = peers[switch].iter().position(|p| *p == PortPeer::Host(h)).expect("host port");
                Uplink {
                    link: spec.host_links[h],
                    switch,
                    port,
                    queue: VecDeque::new(),
                    queued_bytes: 0,
                    throttled: false,
                    busy_until: Duration::ZERO,
                    paused: false,
                    wake_scheduled: false,
                }
            })
            .collect();
        let switch_count = switches.len();
        Fabric {
            switches,
            peers,
            port_links,
            uplinks,
            hosts_by_ip: addrs.iter().enumerate().map(|(i, &a)| (a, i)).collect(),
            events: BinaryHeap::new(),
            sequence: 0,
            wake_at: vec![None; switch_count],
            delivered: VecDeque::new(),
            room: Vec::new(),
            stats: NetworkStats::default(),
            ce_delivered: 0,
        }
    }

    fn schedule(&mut self, at: Duration, event: Event) {
        self.sequence += 1;
        self.events.push(Reverse(Scheduled { at, sequence: self.sequence, event }));
    }

    /// Host `sender` hands a datagram to its NIC at `now`.
    pub fn send(&mut self, now: Instant, sender: usize, packet: InFlight) {
        self.stats.sent += 1;
        let up = &mut self.uplinks[sender];
        up.queued_bytes += packet.bytes.len();
        up.queue.push_back(SimPacket { packet, ecn: Ecn::Ect0 });
        self.pump_host(since_zero(now), sender);
    }

    /// Whether host `sender`'s NIC takes another datagram now. If not, the
    /// host is named by [`Fabric::take_room`] once it does.
    pub fn has_room(&mut self, sender: usize) -> bool {
        let up = &mut self.uplinks[sender];
        up.throttled = up.queued_bytes >= NIC_QUEUE_BYTES;
        !up.throttled
    }

    /// The hosts whose NIC queue has room again since the last call.
    pub fn take_room(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.room)
    }

    /// Puts the host's next queued datagram on its wire if the wire is
    /// free, else makes sure it is looked at again when it is.
    fn pump_host(&mut self, now: Duration, host: usize) {
        let up = &mut self.uplinks[host];
        if up.paused || up.queue.is_empty() {
            return;
        }
        if up.busy_until > now {
            if !up.wake_scheduled {
                up.wake_scheduled = true;
                let at = up.busy_until;
                self.schedule(at, Event::HostFree { host });
            }
            return;
        }
        let packet = up.queue.pop_front().expect("not empty");
        up.queued_bytes -= packet.packet.bytes.len();
        // Room again as soon as a packet has left, as a NIC pulls the next
        // one (woken only at half the queue, the hosts sent in bursts, and
        // DCQCN's late joiner got less than its share).
        if up.throttled && up.queued_bytes < NIC_QUEUE_BYTES {
            up.throttled = false;
            self.room.push(host);
        }
        let up = &mut self.uplinks[host];
        let done = now + up.link.wire_time(packet.wire_len());
        up.busy_until = done;
        let (arrival, switch, port) = (done + up.link.delay, up.switch, up.port);
        self.schedule(arrival, Event::AtSwitch { switch, port, packet });
        self.pump_host(now, host);
    }

    /// When the next event happens.
    pub fn next_arrival(&self) -> Option<Instant> {
        if !self.delivered.is_empty() {
            return Some(Instant::ZERO);
        }
        self.events.peek().map(|Reverse(e)| Instant::ZERO + e.at)
    }

    /// Runs every event due by `now`, then hands out the next datagram
    /// that has reached its host.
    pub fn pop_due(&mut self, now: Instant) -> Option<InFlight> {
        let now = since_zero(now);
        while self.events.peek().is_some_and(|Reverse(e)| e.at <= now) {
            let Reverse(due) = self.events.pop().expect("peeked");
            self.handle(due.at, due.event);
        }
        let packet = self.delivered.pop_front()?;
        self.ce_delivered += u64::from(packet.ecn == Ecn::Ce);
        let mut delivered = packet.packet;
        delivered.meta.ce = packet.ecn == Ecn::Ce;
        Some(delivered)
    }

    fn handle(&mut self, now: Duration, event: Event) {
        match event {
            Event::AtSwitch { switch, port, packet } => {
                self.switches[switch].handle_packet(now, port, packet);
                self.pump_switch(now, switch);
            }
            Event::AtHost { packet } => self.delivered.push_back(packet),
            Event::Wake { switch } => {
                if self.wake_at[switch] == Some(now) {
                    self.wake_at[switch] = None;
                }
                self.pump_switch(now, switch);
            }
            Event::HostFree { host } => {
                self.uplinks[host].wake_scheduled = false;
                self.pump_host(now, host);
            }
            Event::Pfc { switch, port, queue, pause } => {
                self.switches[switch].handle_pfc(now, port, queue, pause);
                self.pump_switch(now, switch);
            }
        }
    }

    /// Sends what switch `s` may send now, carries its PFC signals, and
    /// schedules its next wake-up.
    fn pump_switch(&mut self, now: Duration, s: usize) {
        while let Some((port, packet)) = self.switches[s].poll_transmit(now) {
            let link = self.port_links[s][port];
            let arrival = now + link.wire_time(packet.wire_len()) + link.delay;
            match self.peers[s][port] {
                PortPeer::Host(_) => self.schedule(arrival, Event::AtHost { packet }),
                PortPeer::Switch { switch, port } => self.schedule(arrival, Event::AtSwitch { switch, port, packet }),
            }
        }
        while let Some(signal) = self.switches[s].poll_pfc() {
            let delay = self.port_links[s][signal.port].delay;
            match self.peers[s][signal.port] {
                PortPeer::Host(host) => {
                    self.uplinks[host].paused = signal.pause;
                    self.pump_host(now, host);
                }
                PortPeer::Switch { switch, port } => {
                    let event = Event::Pfc { switch, port, queue: signal.queue, pause: signal.pause };
                    self.schedule(now + delay, event);
                }
            }
        }
        if let Some(at) = self.switches[s].poll_timeout()
            && self.wake_at[s].is_none_or(|w| at < w)
        {
            self.wake_at[s] = Some(at.max(now));
            self.schedule(at.max(now), Event::Wake { switch: s });
        }
    }

    pub fn switch(&self, s: usize) -> &Switch<SimPacket> {
        &self.switches[s]
    }

    pub fn switch_mut(&mut self, s: usize) -> &mut Switch<SimPacket> {
        &mut self.switches[s]
    }

    pub fn switch_count(&self) -> usize {
        self.switches.len()
    }

    /// Every link loses, delays and reorders nothing from now on.
    pub fn heal(&mut self) {
        for switch in &mut self.switches {
            for port in 0..switch.ports() {
                switch.set_link_faults(port, LinkFaults::NONE);
            }
        }
    }

    /// The host with address `ip`.
    pub fn host(&self, ip: IpAddr) -> Option<usize> {
        self.hosts_by_ip.get(&ip).copied()
    }

    /// Datagrams the switches dropped (full queues, lost links, no route).
    pub fn dropped(&self) -> u64 {
        let mut dropped = 0;
        for switch in &self.switches {
            for port in 0..switch.ports() {
                let c = switch.port_counters(port);
                dropped += c.link_lost + c.no_route;
                dropped += (0..switch.queues()).map(|q| switch.queue_counters(port, q).dropped).sum::<u64>();
            }
        }
        dropped
    }

    pub fn in_flight(&self) -> usize {
        self.events.len() + self.delivered.len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    /// Two hosts on one switch; 10 Gb/s links of 1 µs.
    fn star() -> (Fabric, [SocketAddr; 2]) {
        let link = Link { rate_bps: 10_000_000_000, delay: Duration::from_micros(1) };
        fn port(link: &Link) -> PortConfig {
            PortConfig::new(link.rate_bps, 1 << 20)
        }
        let spec = FabricSpec {
            graph: Graph { switches: 1, host_switch: vec![0, 0], links: vec![] },
            host_links: vec![link; 2],
            switch_links: vec![],
            port,
            shared_buffer: 1 << 22,
            seed: 1,
            faults: LinkFaults::NONE,
            aggregation: None,
        };
        let addrs = ["127.0.0.2:4791".parse().unwrap(), "127.0.0.3:4791".parse().unwrap()];
        (Fabric::new(&spec, &addrs.map(|a: SocketAddr| a.ip())), addrs)
    }

    /// A burst from one host leaves at its link's rate, crosses the
    /// switch in order and arrives whole: the last of ten 1000-byte
    /// datagrams after ten wire times, a second wire time at the switch,
    /// and two links' delay.
    #[test]
    fn a_burst_arrives_in_order_at_the_line_rate() {
        let (mut fabric, [a, b]) = star();
        for i in 0..10u8 {
            fabric.send(
                Instant::ZERO,
                0,
                InFlight::new(a, b, vec![i; 1000 - HEADERS], softrnic_transport::IntMark::None),
            );
        }
        let mut arrived = Vec::new();
        while let Some(at) = fabric.next_arrival() {
            while let Some(packet) = fabric.pop_due(at) {
                arrived.push((since_zero(at), packet.bytes[0]));
            }
        }
        assert_eq!(arrived.iter().map(|a| a.1).collect::<Vec<_>>(), (0..10).collect::<Vec<u8>>());
        let wire = Duration::from_nanos(800);
        assert_eq!(arrived[9].0, wire * 11 + Duration::from_micros(2));
        assert_eq!(fabric.dropped(), 0);
    }

    /// A NIC takes datagrams until its queue holds `NIC_QUEUE_BYTES`, and
    /// names its host when the wire has taken one and there is room again.
    #[test]
    fn a_full_nic_queue_takes_no_more_until_a_packet_leaves() {
        let (mut fabric, [a, b]) = star();
        let datagram = || InFlight::new(a, b, vec![0; 4096], softrnic_transport::IntMark::None);
        let mut taken = 0;
        while fabric.has_room(0) {
            fabric.send(Instant::ZERO, 0, datagram());
            taken += 1;
        }
        // The first went on the wire at once; 16 wait behind it.
        assert_eq!(taken, 1 + NIC_QUEUE_BYTES / 4096);
        assert!(fabric.take_room().is_empty());
        assert!(fabric.has_room(1), "the other host's NIC is its own");
        // The first leaves the wire; the second takes it, and frees room.
        let next = fabric.next_arrival().expect("a departure");
        assert!(fabric.pop_due(next).is_none());
        assert_eq!(fabric.take_room(), [0]);
        assert!(fabric.has_room(0));
    }
}
