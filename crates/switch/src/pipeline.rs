//! The switch as a state machine: packets and pause signals in, packets,
//! pause signals and deadlines out, time passed in. It never reads a clock
//! or touches a socket; see the crate's documentation for a packet's way
//! through it.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

use softrnic_wire::int::{Hop, Stamp};

use crate::Time;
use crate::aggregation::{Aggregator, Verdict};
use crate::config::{LinkFaults, PortConfig, SwitchConfig};
use crate::counters::{PortCounters, QueueCounters, QueueSample};
use crate::frame::{Classified, Ecn, Frame};
use crate::routes::Routes;
use crate::token_bucket::TokenBucket;

/// A port's index in [`SwitchConfig::ports`].
pub type PortId = usize;

/// The strict-priority queue of every port: CNPs and acknowledgements.
pub const CONTROL_QUEUE: usize = 0;

/// A priority-flow-control signal for the link behind `port`: its sender
/// must stop (`pause`) or may resume sending into `queue`'s priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcSignal {
    pub port: PortId,
    pub queue: usize,
    pub pause: bool,
}

#[derive(Debug)]
struct Queued<F> {
    frame: F,
    len: usize,
    ecn: Ecn,
    int: bool,
    /// Where it came in: PFC counts buffer use per ingress port.
    ingress: PortId,
}

#[derive(Debug)]
struct Queue<F> {
    packets: VecDeque<Queued<F>>,
    bytes: u64,
    /// The link's far end paused this priority.
    paused: bool,
    counters: QueueCounters,
    peak_since_sample: u64,
}

#[derive(Debug)]
struct Port<F> {
    config: PortConfig,
    queues: Vec<Queue<F>>,
    bucket: TokenBucket,
    counters: PortCounters,
    /// Bytes buffered anywhere in the switch that came in by this port,
    /// per priority; and whether this port has paused its sender.
    ingress_bytes: Vec<u64>,
    pausing: Vec<bool>,
}

impl<F> Port<F> {
    /// The first queue, by priority, that holds a packet and may send:
    /// the control queue, then the data queues from the highest down.
    fn next_queue(&self) -> Option<usize> {
        let ready = |&i: &usize| !self.queues[i].paused && !self.queues[i].packets.is_empty();
        std::iter::once(CONTROL_QUEUE).chain((1..self.queues.len()).rev()).find(ready)
    }
}

/// A packet held on a link by a delay or a reordering fault.
#[derive(Debug)]
struct Delayed<F> {
    at: Time,
    sequence: u64,
    port: PortId,
    frame: F,
}

impl<F> PartialEq for Delayed<F> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}
impl<F> Eq for Delayed<F> {}
impl<F> PartialOrd for Delayed<F> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<F> Ord for Delayed<F> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

/// One switch.
#[derive(Debug)]
pub struct Switch<F> {
    ports: Vec<Port<F>>,
    routes: Routes,
    seed: u64,
    rng: fastrand::Rng,
    shared_limit: u64,
    shared_used: u64,
    on_link: BinaryHeap<Reverse<Delayed<F>>>,
    sequence: u64,
    signals: VecDeque<PfcSignal>,
    /// The port the next scan for something to send starts at, so ports
    /// take turns.
    next_port: usize,
    aggregation: Option<Aggregator>,
}

/// Spreads replicated packets over ECMP paths by their destination.
fn hash_ip(ip: std::net::IpAddr) -> u64 {
    match ip {
        std::net::IpAddr::V4(a) => u64::from(u32::from(a)).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        std::net::IpAddr::V6(a) => (u128::from(a) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
    }
}

impl<F: Frame> Switch<F> {
    pub fn new(config: SwitchConfig, routes: Routes) -> Switch<F> {
        assert!(config.queues_per_port >= 2, "a port needs the control queue and a data queue");
        let queues = config.queues_per_port;
        let ports = config
            .ports
            .into_iter()
            .map(|port| Port {
                bucket: TokenBucket::new(port.rate_bps, port.burst),
                queues: (0..queues)
                    .map(|_| Queue {
                        packets: VecDeque::new(),
                        bytes: 0,
                        paused: false,
                        counters: QueueCounters::default(),
                        peak_since_sample: 0,
                    })
                    .collect(),
                counters: PortCounters::default(),
                ingress_bytes: vec![0; queues],
                pausing: vec![false; queues],
                config: port,
            })
            .collect();
        Switch {
            ports,
            routes,
            seed: config.seed,
            rng: fastrand::Rng::with_seed(config.seed),
            shared_limit: config.shared_buffer,
            shared_used: 0,
            on_link: BinaryHeap::new(),
            sequence: 0,
            signals: VecDeque::new(),
            next_port: 0,
            aggregation: config.aggregation.map(Aggregator::new),
        }
    }

    /// A packet arrived on `in_port`.
    pub fn handle_packet(&mut self, now: Time, in_port: PortId, frame: F) {
        let len = frame.wire_len();
        let port = &mut self.ports[in_port].counters;
        port.rx_packets += 1;
        port.rx_bytes += len as u64;
        let Some(class) = frame.classify() else {
            self.ports[in_port].counters.no_route += 1;
            return;
        };
        let Some(out) = self.routes.lookup(class.dst, class.flow, self.seed) else {
            self.ports[in_port].counters.no_route += 1;
            return;
        };
        let mut frame = frame;
        if let Some(stage) = &mut self.aggregation
            && let Some(payload) = frame.aggregation_payload()
        {
            match stage.handle(now, class.src, class.dst, class.ecn == Ecn::Ce, payload) {
                Verdict::Forward { ce: false } => {}
                Verdict::Forward { ce: true } => frame.mark_ce(),
                Verdict::Consume => return,
                Verdict::Replicate(workers) => {
                    for worker in workers {
                        let copy = frame.copy_to(worker);
                        match self.routes.lookup(worker, class.flow ^ hash_ip(worker), self.seed) {
                            Some(out) => self.enqueue(out, in_port, copy, class),
                            None => self.ports[in_port].counters.no_route += 1,
                        }
                    }
                }
            }
        }
        self.enqueue(out, in_port, frame, class);
    }

    fn enqueue(&mut self, out: PortId, in_port: PortId, frame: F, class: Classified) {
        let len = frame.wire_len();
        let queue = if class.control { CONTROL_QUEUE } else { self.data_queue(class.dscp) };
        self.admit(out, queue, Queued { frame, len, ecn: class.ecn, int: class.int, ingress: in_port });
    }

    /// The aggregation stage, if this switch has one.
    pub fn aggregation(&self) -> Option<&Aggregator> {
        self.aggregation.as_ref()
    }

    /// Data queues by DSCP class selector (its upper three bits): class 0
    /// to queue 1, higher classes to the higher queues, the last shared.
    fn data_queue(&self, dscp: u8) -> usize {
        let data_queues = self.ports[0].queues.len() - 1;
        1 + usize::from(dscp >> 3).min(data_queues - 1)
    }

    /// Tail drop when the queue's limit or the shared pool would overflow.
    fn admit(&mut self, out: PortId, queue: usize, packet: Queued<F>) {
        let len = packet.len as u64;
        let port = &mut self.ports[out];
        let q = &mut port.queues[queue];
        if q.bytes + len > port.config.queue_limit || self.shared_used + len > self.shared_limit {
            q.counters.dropped += 1;
            q.counters.dropped_bytes += len;
            return;
        }
        q.bytes += len;
        q.counters.enqueued += 1;
        q.counters.max_bytes = q.counters.max_bytes.max(q.bytes);
        q.peak_since_sample = q.peak_since_sample.max(q.bytes);
        self.shared_used += len;
        let ingress = packet.ingress;
        q.packets.push_back(packet);
        self.account_ingress(ingress, queue, len as i64);
    }

    /// PFC: buffer held per ingress port and priority, against XOFF/XON.
    fn account_ingress(&mut self, port: PortId, queue: usize, delta: i64) {
        let p = &mut self.ports[port];
        p.ingress_bytes[queue] = p.ingress_bytes[queue].saturating_add_signed(delta);
        let Some(pfc) = p.config.pfc else { return };
        let held = p.ingress_bytes[queue];
        if !p.pausing[queue] && held > pfc.xoff {
            p.pausing[queue] = true;
            p.counters.pause_sent += 1;
            self.signals.push_back(PfcSignal { port, queue, pause: true });
        } else if p.pausing[queue] && held <= pfc.xon {
            p.pausing[queue] = false;
            p.counters.resume_sent += 1;
            self.signals.push_back(PfcSignal { port, queue, pause: false });
        }
    }

    /// The far end of `port`'s link paused (or resumed) `queue`.
    pub fn handle_pfc(&mut self, _now: Time, port: PortId, queue: usize, pause: bool) {
        if let Some(q) = self.ports.get_mut(port).and_then(|p| p.queues.get_mut(queue)) {
            q.paused = pause;
        }
    }

    /// The next pause or resume to deliver to the sender behind its port.
    pub fn poll_pfc(&mut self) -> Option<PfcSignal> {
        self.signals.pop_front()
    }

    /// The next packet to put on a port's link at `now`, if any.
    pub fn poll_transmit(&mut self, now: Time) -> Option<(PortId, F)> {
        loop {
            if let Some(Reverse(head)) = self.on_link.peek()
                && head.at <= now
            {
                let Reverse(d) = self.on_link.pop().expect("peeked");
                return Some((d.port, d.frame));
            }
            let (out, frame) = self.dequeue(now)?;
            let faults = self.ports[out].config.faults;
            if faults.loss > 0.0 && self.rng.f64() < faults.loss {
                self.ports[out].counters.link_lost += 1;
                continue;
            }
            let mut delay = faults.delay;
            if faults.reorder > 0.0 && self.rng.f64() < faults.reorder {
                delay += Time::from_nanos(self.rng.u64(0..=faults.reorder_by.as_nanos() as u64));
            }
            if delay.is_zero() {
                return Some((out, frame));
            }
            self.sequence += 1;
            self.on_link.push(Reverse(Delayed { at: now + delay, sequence: self.sequence, port: out, frame }));
        }
    }

    /// Takes a packet from the first port (in turn) whose rate allows one,
    /// by strict priority among its queues; marks and stamps it.
    fn dequeue(&mut self, now: Time) -> Option<(PortId, F)> {
        let n = self.ports.len();
        for i in 0..n {
            let out = (self.next_port + i) % n;
            let port = &mut self.ports[out];
            let Some(queue) = port.next_queue() else { continue };
            let len = port.queues[queue].packets.front().expect("non-empty").len;
            if !port.bucket.try_send(now, len) {
                continue;
            }
            self.next_port = (out + 1) % n;
            let q = &mut port.queues[queue];
            let queued_before = q.bytes;
            let mut packet = q.packets.pop_front().expect("non-empty");
            q.bytes -= len as u64;
            if let Some(red) = port.config.red
                && packet.ecn.capable()
                && packet.ecn != Ecn::Ce
                && self.rng.f64() < red.probability(queued_before)
            {
                packet.frame.mark_ce();
                q.counters.marked += 1;
            }
            port.counters.tx_packets += 1;
            port.counters.tx_bytes += len as u64;
            if packet.int {
                let hop = Hop {
                    rate_mbps: (port.config.rate_bps / 1_000_000) as u32,
                    timestamp_ns: now.as_nanos() as u32,
                    tx_bytes: port.counters.tx_bytes as u32,
                    queue_bytes: q.bytes as u32,
                };
                if packet.frame.stamp_int(hop) == Some(Stamp::Full) {
                    port.counters.int_full += 1;
                }
            }
            self.shared_used -= len as u64;
            self.account_ingress(packet.ingress, queue, -(len as i64));
            return Some((out, packet.frame));
        }
        None
    }

    /// When [`poll_transmit`](Self::poll_transmit) will next have
    /// something, if anything is waiting.
    pub fn poll_timeout(&self) -> Option<Time> {
        let link = self.on_link.peek().map(|Reverse(d)| d.at);
        let ports = self.ports.iter().filter(|p| p.next_queue().is_some()).map(|p| p.bucket.ready_at()).min();
        match (link, ports) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// Egress queues per port.
    pub fn queues(&self) -> usize {
        self.ports.first().map_or(0, |p| p.queues.len())
    }

    pub fn port_config(&self, port: PortId) -> &PortConfig {
        &self.ports[port].config
    }

    /// Gives the link out of `port` new faults from now on: a network that
    /// heals (the simulator's liveness phase), or one that turns hostile.
    pub fn set_link_faults(&mut self, port: PortId, faults: LinkFaults) {
        self.ports[port].config.faults = faults;
    }

    pub fn port_counters(&self, port: PortId) -> PortCounters {
        self.ports[port].counters
    }

    pub fn queue_counters(&self, port: PortId, queue: usize) -> QueueCounters {
        self.ports[port].queues[queue].counters
    }

    /// Bytes waiting in one egress queue now.
    pub fn queue_bytes(&self, port: PortId, queue: usize) -> u64 {
        self.ports[port].queues[queue].bytes
    }

    /// Bytes of the shared buffer in use.
    pub fn buffer_used(&self) -> u64 {
        self.shared_used
    }

    /// Every queue's depth at `now` and its peak since the last call.
    pub fn take_samples(&mut self, now: Time) -> Vec<QueueSample> {
        let mut samples = Vec::new();
        for (port, p) in self.ports.iter_mut().enumerate() {
            for (queue, q) in p.queues.iter_mut().enumerate() {
                samples.push(QueueSample {
                    time: now,
                    port,
                    queue,
                    bytes: q.bytes,
                    peak_bytes: q.peak_since_sample,
                    counters: q.counters,
                });
                q.peak_since_sample = q.bytes;
            }
        }
        samples
    }
}
