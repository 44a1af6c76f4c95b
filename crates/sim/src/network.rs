//! A switched network of point-to-point links with injected faults.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::time::Duration;

use softrnic_transport::{Instant, IntMark, IntRecords, RecvMeta};

use crate::fabric::NIC_QUEUE_BYTES;

/// Probabilities (0 to 1) of what happens to each packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    pub loss: f64,
    /// Delayed by up to `reorder_window`, so later packets overtake it.
    pub reorder: f64,
    pub duplicate: f64,
    /// One random bit flipped; the ICRC must catch it.
    pub corrupt: f64,
    pub reorder_window: Duration,
}

impl Faults {
    pub const NONE: Faults =
        Faults { loss: 0.0, reorder: 0.0, duplicate: 0.0, corrupt: 0.0, reorder_window: Duration::from_micros(50) };

    /// A random mix of faults, each at most `max`.
    pub fn random(rng: &mut fastrand::Rng, max: f64) -> Faults {
        let mut pick = || if rng.bool() { rng.f64() * max } else { 0.0 };
        let faults = Faults { loss: pick(), reorder: pick(), duplicate: pick(), corrupt: pick(), ..Faults::NONE };
        // Sometimes a packet only swaps places with its neighbour, as the
        // engine's injector does; sometimes it falls far behind.
        let window = if rng.bool() { Duration::from_nanos(rng.u64(100..=2000)) } else { Duration::from_micros(50) };
        Faults { reorder_window: window, ..faults }
    }
}

/// A packet on its way.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct InFlight {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub bytes: Vec<u8>,
    /// What the receiver hears beside the bytes: CE, and the INT records
    /// (switches fill them while `stamp` says the sender collects).
    pub meta: RecvMeta,
    pub stamp: bool,
}

impl InFlight {
    /// The datagram `transmit` describes, its bytes `bytes`.
    pub fn new(from: SocketAddr, to: SocketAddr, bytes: Vec<u8>, int: IntMark) -> InFlight {
        let (records, stamp) = match int {
            IntMark::None => (None, false),
            IntMark::Collect => (Some(IntRecords::default()), true),
            IntMark::Echo(records) => (Some(records), false),
        };
        InFlight { from, to, bytes, meta: RecvMeta { int: records, ..RecvMeta::default() }, stamp }
    }
}

/// All links: one-way latency, a serialisation rate per sender, faults.
#[derive(Debug)]
pub struct Network {
    pub faults: Faults,
    pub latency: Duration,
    /// Bytes per microsecond each sender can put on the wire.
    pub bytes_per_micro: u64,
    rng: fastrand::Rng,
    queue: BinaryHeap<Reverse<(Instant, u64, InFlight)>>,
    sequence: u64,
    /// When each sender's link is free again (indexed by the caller).
    busy_until: Vec<Instant>,
    /// Senders whose NIC queue was found full, waiting for room.
    throttled: Vec<bool>,
    /// Datagrams each sender has put on the wire.
    sent_by: Vec<u64>,
    /// Datagrams to lose on purpose: `(sender, n)` loses the `n`-th (from
    /// 0) that `sender` puts on the wire, for tests of one loss pattern.
    pub doomed: Vec<(usize, u64)>,
    /// Datagrams `(sender, n)` held back by the given time: overtaken,
    /// not lost.
    pub late: Vec<(usize, u64, Duration)>,
    pub stats: NetworkStats,
}

/// What the network did to the traffic.
#[derive(Debug, Default, Clone, Copy)]
pub struct NetworkStats {
    pub sent: u64,
    pub dropped: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

impl Network {
    pub fn new(faults: Faults, seed: u64, senders: usize) -> Network {
        Network {
            faults,
            latency: Duration::from_micros(5),
            bytes_per_micro: 12_500, // 100 Gb/s
            rng: fastrand::Rng::with_seed(seed),
            queue: BinaryHeap::new(),
            sequence: 0,
            busy_until: vec![Instant::ZERO; senders],
            throttled: vec![false; senders],
            sent_by: vec![0; senders],
            doomed: Vec::new(),
            late: Vec::new(),
            stats: NetworkStats::default(),
        }
    }

    /// Puts a datagram from sender number `sender` on the wire at `now`.
    pub fn send(&mut self, now: Instant, sender: usize, packet: InFlight) {
        self.stats.sent += 1;
        let start = now.max(self.busy_until[sender]);
        let wire_time = self.wire_time(packet.bytes.len());
        self.busy_until[sender] = start + wire_time;
        let mut arrival = start + wire_time + self.latency;
        let nth = self.sent_by[sender];
        self.sent_by[sender] += 1;
        if self.doomed.contains(&(sender, nth)) {
            self.stats.dropped += 1;
            return;
        }
        if self.rng.f64() < self.faults.loss {
            self.stats.dropped += 1;
            return;
        }
        if let Some(&(_, _, by)) = self.late.iter().find(|(s, n, _)| (*s, *n) == (sender, nth)) {
            self.stats.reordered += 1;
            arrival = arrival + by;
        }
        let mut packet = packet;
        if self.rng.f64() < self.faults.corrupt && !packet.bytes.is_empty() {
            self.stats.corrupted += 1;
            let at = self.rng.usize(..packet.bytes.len());
            packet.bytes[at] ^= 1 << self.rng.u8(..8);
        }
        if self.rng.f64() < self.faults.reorder {
            self.stats.reordered += 1;
            arrival = arrival + self.random_delay();
        }
        if self.rng.f64() < self.faults.duplicate {
            self.stats.duplicated += 1;
            let copy = InFlight { bytes: packet.bytes.clone(), ..packet };
            let later = arrival + self.random_delay();
            self.enqueue(later, copy);
        }
        self.enqueue(arrival, packet);
    }

    /// Whether sender `sender`'s NIC takes another datagram at `now`: it
    /// holds what its link has yet to serialise, at most
    /// [`NIC_QUEUE_BYTES`], as a NIC pulls a QP's next packet only when the
    /// wire can take it. Without that the link queued whatever it was
    /// given, each timeout of a go-back-N QP without congestion control
    /// stacked another window in front of the wire, and the queue outgrew
    /// the timeout (seed 23047808: a SEND sent at 34.5 ms arrived at 40.7,
    /// after its QP had spent its retries; the switched network's NICs
    /// had the same fault, seed 8001058). If not, the sender is named by
    /// [`Network::take_room`] once it does.
    pub fn has_room(&mut self, sender: usize, now: Instant) -> bool {
        let room = self.busy_until[sender] < now + self.wire_time(NIC_QUEUE_BYTES);
        self.throttled[sender] = !room;
        room
    }

    /// The senders whose NIC has room again at `now`.
    pub fn take_room(&mut self, now: Instant) -> Vec<usize> {
        let mut room = Vec::new();
        for sender in 0..self.throttled.len() {
            if self.throttled[sender] && self.has_room(sender, now) {
                room.push(sender);
            }
        }
        room
    }

    /// When the first throttled sender's NIC has room again.
    pub fn next_room(&self) -> Option<Instant> {
        let drain = self.wire_time(NIC_QUEUE_BYTES).as_nanos() as u64;
        (0..self.throttled.len())
            .filter(|&sender| self.throttled[sender])
            .map(|sender| Instant::from_nanos(self.busy_until[sender].as_nanos().saturating_sub(drain) + 1))
            .min()
    }

    fn wire_time(&self, bytes: usize) -> Duration {
        Duration::from_nanos(bytes as u64 * 1000 / self.bytes_per_micro)
    }

    fn random_delay(&mut self) -> Duration {
        let window = self.faults.reorder_window.as_nanos() as u64;
        Duration::from_nanos(self.rng.u64(0..=window))
    }

    fn enqueue(&mut self, at: Instant, packet: InFlight) {
        self.sequence += 1;
        self.queue.push(Reverse((at, self.sequence, packet)));
    }

    /// When the next packet arrives.
    pub fn next_arrival(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next packet due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<InFlight> {
        match self.queue.peek() {
            Some(Reverse((at, _, _))) if *at <= now => self.queue.pop().map(|Reverse((_, _, p))| p),
            _ => None,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender's NIC takes datagrams while its link has less than
    /// `NIC_QUEUE_BYTES` left to serialise, and has room again, named by
    /// `take_room`, once enough has left the wire.
    #[test]
    fn a_full_nic_queue_takes_no_more_until_the_wire_drains() {
        let mut network = Network::new(Faults::NONE, 1, 2);
        let (a, b) = ("10.0.0.1:4791".parse().unwrap(), "10.0.0.2:4791".parse().unwrap());
        let datagram = || InFlight::new(a, b, vec![0; 4096], IntMark::None);
        let mut taken = 0;
        while network.has_room(0, Instant::ZERO) {
            network.send(Instant::ZERO, 0, datagram());
            taken += 1;
        }
        // The first went on the wire at once; 16 wait behind it.
        assert_eq!(taken, 1 + NIC_QUEUE_BYTES / 4096);
        assert!(network.has_room(1, Instant::ZERO), "the other sender's NIC is its own");
        assert!(network.take_room(Instant::ZERO).is_empty());
        // Room comes back within one datagram's wire time (4096 B at
        // 100 Gb/s, 327 ns), not before.
        let room = network.next_room().expect("a throttled sender");
        assert!(Instant::ZERO < room && room <= Instant::from_nanos(327), "{room:?}");
        assert!(network.take_room(Instant::from_nanos(room.as_nanos() - 1)).is_empty());
        assert_eq!(network.take_room(room), [0]);
        assert!(network.has_room(0, room));
    }
}
