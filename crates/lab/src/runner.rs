//! The real switch: one thread, in the switch's namespace, that moves
//! frames between the hosts' veths and the topology's switch pipelines
//! (one `Switch` per switch; links between switches are handed over in
//! memory), passing the monotonic clock in as the pipelines' time.
//!
//! Each turn of the loop receives what every port's ring holds, lets every
//! pipeline send what its ports' rates allow, carries PFC signals to the
//! pipeline behind a link, and samples the queues when due. When nothing
//! moved it waits: spinning if a port's token bucket is due within
//! [`SPIN_WITHIN`], else in `ppoll` on the ports until the next deadline.
//!
//! PFC toward a host cannot pause the host's kernel (a veth ignores pause
//! frames), so the switch stops reading that port's ring instead: the ring
//! holds what it can and the kernel drops the rest, counted as ring drops.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use pcap_file::pcap::{PcapPacket, PcapWriter};
use softrnic_switch::{PortCounters, QueueCounters, Switch};

use crate::eth_frame::{EthFrame, arp_reply};
use crate::namespaces::{Namespaces, host_mac, port_interface, port_mac};
use crate::packet_socket::{PacketSocket, enter_namespace};
use crate::topology::{PortPeer, Topology};

/// A port due this soon is waited for by spinning: `ppoll` cannot wake
/// that precisely.
const SPIN_WITHIN: Duration = Duration::from_micros(100);
/// Frames taken from one port's ring per turn, so ports take turns.
const RX_BURST: usize = 64;

/// What to record while the lab runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Queue depths and counters, one row per queue per sample.
    pub stats: Option<PathBuf>,
    pub sample_every: Duration,
    /// One capture file per host port (both directions) in this folder.
    pub pcap: Option<PathBuf>,
    /// Bytes each host has had delivered from each other host, sampled
    /// with the queues: the flows' rates through the fabric.
    pub flows: Option<PathBuf>,
    /// Each aggregating switch's pool, per job, sampled with the queues.
    pub aggregation: Option<PathBuf>,
}

/// A port's totals at the end of a run.
#[derive(Debug, Clone)]
pub struct PortSummary {
    pub switch: String,
    pub port: usize,
    /// The host or switch at the other end.
    pub peer: String,
    pub counters: PortCounters,
    /// Summed over the port's queues.
    pub queues: QueueCounters,
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub ports: Vec<PortSummary>,
    /// Frames the kernel dropped because a port's ring was full, and
    /// frames too long for a ring slot.
    pub ring_drops: u64,
    pub truncated: u64,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<8} {:>4} {:<8} {:>10} {:>14} {:>10} {:>14} {:>8} {:>8} {:>12}",
            "switch", "port", "peer", "rx_pkts", "rx_bytes", "tx_pkts", "tx_bytes", "dropped", "marked", "max_queue_B"
        )?;
        for p in &self.ports {
            writeln!(
                f,
                "{:<8} {:>4} {:<8} {:>10} {:>14} {:>10} {:>14} {:>8} {:>8} {:>12}",
                p.switch,
                p.port,
                p.peer,
                p.counters.rx_packets,
                p.counters.rx_bytes,
                p.counters.tx_packets,
                p.counters.tx_bytes,
                p.queues.dropped,
                p.queues.marked,
                p.queues.max_bytes
            )?;
        }
        write!(f, "ring drops {}, truncated frames {}", self.ring_drops, self.truncated)
    }
}

/// The switch thread, running.
pub struct Runner {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Summary, String>>>,
}

impl Runner {
    /// Opens every host port in the switch's namespace and starts moving
    /// frames; returns once the ports are open.
    pub fn start(topology: &Topology, namespaces: &Namespaces, options: RunOptions) -> Result<Runner, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (topology, switch_ns, flag) = (topology.clone(), namespaces.switch_ns.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("softrnic-switch".into())
            .spawn(move || {
                let fabric = match Fabric::open(&topology, &switch_ns, &options) {
                    Ok(fabric) => {
                        let _ = ready_tx.send(Ok(()));
                        fabric
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                fabric.run(&flag)
            })
            .map_err(|e| format!("cannot start the switch thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Runner { stop, thread: Some(thread) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the switch thread ended while opening its ports".into()),
        }
    }

    /// Stops the switch; its totals.
    pub fn stop(mut self) -> Result<Summary, String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().expect("joined once").join().map_err(|_| "the switch thread panicked".to_string())?
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Everything the switch thread owns.
struct Fabric {
    topology: Topology,
    switches: Vec<Switch<EthFrame>>,
    /// Each switch's ports' peers.
    peers: Vec<Vec<PortPeer>>,
    /// Each host's socket, and the (switch, port) it is attached to.
    sockets: Vec<PacketSocket>,
    host_port: Vec<(usize, usize)>,
    /// A host port PFC paused: its ring is not read.
    paused: Vec<bool>,
    /// Frames leaving for each host this turn, sent in one batch.
    outbox: Vec<Vec<EthFrame>>,
    /// Frame buffers to reuse, so a frame costs no allocation.
    pool: Vec<Vec<u8>>,
    pcaps: Vec<PcapWriter<BufWriter<File>>>,
    stats: Option<csv_writer::Stats>,
    flows: Option<BufWriter<File>>,
    aggregation: Option<BufWriter<File>>,
    /// Bytes delivered to host `dst` from host `src`: `[src][dst]`.
    delivered: Vec<Vec<u64>>,
    sample_every: Duration,
    epoch: SystemTime,
}

impl Fabric {
    fn open(topology: &Topology, switch_ns: &str, options: &RunOptions) -> Result<Fabric, String> {
        enter_namespace(switch_ns).map_err(|e| format!("cannot enter the switch's namespace {switch_ns}: {e}"))?;
        // SAFETY: prctl with an integer argument; ppoll then wakes within
        // a microsecond of its deadline rather than 50.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        let mut switches = Vec::new();
        let mut peers = Vec::new();
        for s in 0..topology.switches.len() {
            let (config, routes) = topology.switch_config(s);
            switches.push(Switch::new(config, routes));
            peers.push(topology.ports(s));
        }
        let mut host_port = vec![(0, 0); topology.hosts.len()];
        for (s, ports) in peers.iter().enumerate() {
            for (p, peer) in ports.iter().enumerate() {
                if let PortPeer::Host(h) = peer {
                    host_port[*h] = (s, p);
                }
            }
        }
        let sockets = (0..topology.hosts.len())
            .map(|h| {
                PacketSocket::open(&port_interface(h))
                    .map_err(|e| format!("cannot open a packet socket on {}: {e}", port_interface(h)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut pcaps = Vec::new();
        if let Some(dir) = &options.pcap {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            for host in &topology.hosts {
                let path = dir.join(format!("{}.pcap", host.name));
                let file = File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                pcaps.push(PcapWriter::new(BufWriter::new(file)).map_err(|e| e.to_string())?);
            }
        }
        let stats = match &options.stats {
            Some(path) => Some(csv_writer::Stats::create(path)?),
            None => None,
        };
        let flows = options.flows.as_deref().map(|p| csv_writer::create(p, FLOWS_HEADER)).transpose()?;
        let aggregation =
            options.aggregation.as_deref().map(|p| csv_writer::create(p, AGGREGATION_HEADER)).transpose()?;
        let hosts = topology.hosts.len();
        Ok(Fabric {
            flows,
            aggregation,
            delivered: vec![vec![0; hosts]; hosts],
            topology: topology.clone(),
            switches,
            peers,
            sockets,
            host_port,
            paused: vec![false; topology.hosts.len()],
            outbox: vec![Vec::new(); topology.hosts.len()],
            pool: Vec::new(),
            pcaps,
            stats,
            sample_every: options.sample_every,
            epoch: SystemTime::now(),
        })
    }

    fn capture(&mut self, host: usize, elapsed: Duration, bytes: &[u8]) {
        if let Some(pcap) = self.pcaps.get_mut(host) {
            let at = self.epoch.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default() + elapsed;
            let _ = pcap.write_packet(&PcapPacket::new(at, bytes.len() as u32, bytes));
        }
    }

    fn run(mut self, stop: &AtomicBool) -> Result<Summary, String> {
        let start = Instant::now();
        let mut next_sample = Duration::ZERO;
        let mut internal: Vec<(usize, usize, EthFrame)> = Vec::new();
        let mut received: Vec<(usize, Vec<u8>)> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let now = start.elapsed();
            let mut moved = 0;
            for h in 0..self.sockets.len() {
                if self.paused[h] {
                    continue;
                }
                let pool = &mut self.pool;
                moved += self.sockets[h].receive(RX_BURST, |bytes| {
                    let mut buf = pool.pop().unwrap_or_default();
                    buf.clear();
                    buf.extend_from_slice(bytes);
                    received.push((h, buf));
                });
            }
            for (h, bytes) in received.drain(..) {
                self.capture_and_switch(h, now, bytes);
            }
            for s in 0..self.switches.len() {
                while let Some((port, mut frame)) = self.switches[s].poll_transmit(now) {
                    moved += 1;
                    match self.peers[s][port] {
                        PortPeer::Host(h) => {
                            if self.flows.is_some()
                                && let Some(src) = self.source_host(&frame)
                            {
                                self.delivered[src][h] += frame.bytes.len() as u64;
                            }
                            frame.set_macs(host_mac(h), port_mac(h));
                            self.capture(h, now, &frame.bytes);
                            self.outbox[h].push(frame);
                        }
                        PortPeer::Switch { switch, port } => internal.push((switch, port, frame)),
                    }
                }
                while let Some(signal) = self.switches[s].poll_pfc() {
                    match self.peers[s][signal.port] {
                        PortPeer::Host(h) => self.paused[h] = signal.pause,
                        PortPeer::Switch { switch, port } => {
                            self.switches[switch].handle_pfc(now, port, signal.queue, signal.pause)
                        }
                    }
                }
            }
            for (switch, port, frame) in internal.drain(..) {
                self.switches[switch].handle_packet(now, port, frame);
            }
            for (h, frames) in self.outbox.iter_mut().enumerate() {
                if frames.is_empty() {
                    continue;
                }
                self.sockets[h].send_batch(frames);
                self.pool.extend(frames.drain(..).map(|f| f.bytes));
            }
            if now >= next_sample {
                self.sample(now)?;
                next_sample = now + self.sample_every;
            }
            if moved == 0 {
                self.wait(start, next_sample);
            }
        }
        let now = start.elapsed();
        self.sample(now)?;
        if let Some(stats) = &mut self.stats {
            stats.flush()?;
        }
        for out in [&mut self.flows, &mut self.aggregation].into_iter().flatten() {
            out.flush().map_err(|e| e.to_string())?;
        }
        for pcap in self.pcaps.drain(..) {
            let _ = pcap.into_writer().flush();
        }
        Ok(self.summary())
    }

    /// A frame from host `h`: ARP is answered at once; the rest enters the
    /// host's switch.
    fn capture_and_switch(&mut self, h: usize, now: Duration, bytes: Vec<u8>) {
        self.capture(h, now, &bytes);
        let hosts = &self.topology.hosts;
        if let Some(reply) = arp_reply(&bytes, port_mac(h), |ip| hosts.iter().any(|x| x.addrs().any(|a| a == ip))) {
            self.capture(h, now, &reply);
            self.sockets[h].send(&reply);
            return;
        }
        let (s, port) = self.host_port[h];
        self.switches[s].handle_packet(now, port, EthFrame { bytes });
    }

    /// Until the next port is due, a frame arrives, or the next sample.
    fn wait(&self, start: Instant, next_sample: Duration) {
        let now = start.elapsed();
        let due = self.switches.iter().filter_map(|s| s.poll_timeout()).min().unwrap_or(next_sample).min(next_sample);
        let wait = due.saturating_sub(now).min(Duration::from_millis(10));
        if wait <= SPIN_WITHIN {
            std::hint::spin_loop();
            return;
        }
        let mut fds: Vec<libc::pollfd> = self
            .sockets
            .iter()
            .zip(&self.paused)
            .filter(|(_, paused)| !**paused)
            .map(|(s, _)| libc::pollfd { fd: s.fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        let timeout = wait - SPIN_WITHIN / 2;
        let spec = libc::timespec { tv_sec: timeout.as_secs() as _, tv_nsec: timeout.subsec_nanos() as _ };
        // SAFETY: `fds` is a live array of as many pollfds as passed.
        unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &spec, std::ptr::null()) };
    }

    /// The host a frame came from, by its source address.
    fn source_host(&self, frame: &EthFrame) -> Option<usize> {
        let src = frame.source_ipv4()?;
        // Hosts are numbered by their address (10.77.0.i+1).
        let i = usize::from(src.octets()[3]).checked_sub(1)?;
        (self.topology.hosts.get(i)?.addr == src).then_some(i)
    }

    fn sample(&mut self, now: Duration) -> Result<(), String> {
        if let Some(out) = &mut self.flows {
            for (src, row) in self.delivered.iter().enumerate() {
                for (dst, &bytes) in row.iter().enumerate().filter(|(_, b)| **b > 0) {
                    let (src, dst) = (&self.topology.hosts[src].name, &self.topology.hosts[dst].name);
                    writeln!(out, "{:.6},{src},{dst},{bytes}", now.as_secs_f64()).map_err(|e| e.to_string())?;
                }
            }
        }
        if let Some(out) = &mut self.aggregation {
            for (s, switch) in self.switches.iter().enumerate() {
                let Some(stage) = switch.aggregation() else { continue };
                let (name, slots) = (&self.topology.switches[s].name, stage.config().slots);
                for (job, c) in stage.jobs() {
                    writeln!(
                        out,
                        "{:.6},{name},{job},{},{:.6},{slots},{},{},{},{},{},{}",
                        now.as_secs_f64(),
                        c.held,
                        c.held_seconds(now),
                        c.aggregated,
                        c.collisions,
                        c.completed,
                        c.flushed,
                        c.acked_chunks,
                        c.acked_values
                    )
                    .map_err(|e| e.to_string())?;
                }
            }
        }
        let Some(stats) = &mut self.stats else { return Ok(()) };
        for (s, switch) in self.switches.iter_mut().enumerate() {
            let name = &self.topology.switches[s].name;
            let counters: Vec<PortCounters> = (0..switch.ports()).map(|p| switch.port_counters(p)).collect();
            for sample in switch.take_samples(now) {
                let peer = peer_name(&self.topology, self.peers[s][sample.port]);
                stats.row(name, &peer, &sample, &counters[sample.port])?;
            }
        }
        Ok(())
    }

    fn summary(&self) -> Summary {
        let mut summary = Summary::default();
        for (s, switch) in self.switches.iter().enumerate() {
            for port in 0..switch.ports() {
                let mut queues = QueueCounters::default();
                for q in 0..switch.queues() {
                    let c = switch.queue_counters(port, q);
                    queues.enqueued += c.enqueued;
                    queues.dropped += c.dropped;
                    queues.dropped_bytes += c.dropped_bytes;
                    queues.marked += c.marked;
                    queues.max_bytes = queues.max_bytes.max(c.max_bytes);
                }
                summary.ports.push(PortSummary {
                    switch: self.topology.switches[s].name.clone(),
                    port,
                    peer: peer_name(&self.topology, self.peers[s][port]),
                    counters: switch.port_counters(port),
                    queues,
                });
            }
        }
        summary.ring_drops = self.sockets.iter().map(|s| s.ring_drops()).sum();
        summary.truncated = self.sockets.iter().map(|s| s.truncated).sum();
        summary
    }
}

fn peer_name(topology: &Topology, peer: PortPeer) -> String {
    match peer {
        PortPeer::Host(h) => topology.hosts[h].name.clone(),
        PortPeer::Switch { switch, .. } => topology.switches[switch].name.clone(),
    }
}

/// The queue-depth CSV: one row per queue per sample.
mod csv_writer {
    use super::*;
    use softrnic_switch::QueueSample;

    pub const HEADER: &str =
        "time_s,switch,port,peer,queue,depth_bytes,peak_bytes,enqueued,dropped,marked,port_rx_bytes,port_tx_bytes";

    pub struct Stats {
        out: BufWriter<File>,
    }

    /// A CSV file at `path`, its header line written.
    pub fn create(path: &std::path::Path, header: &str) -> Result<BufWriter<File>, String> {
        let file = File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let mut out = BufWriter::new(file);
        writeln!(out, "{header}").map_err(|e| e.to_string())?;
        Ok(out)
    }

    impl Stats {
        pub fn create(path: &std::path::Path) -> Result<Stats, String> {
            Ok(Stats { out: create(path, HEADER)? })
        }

        pub fn row(&mut self, switch: &str, peer: &str, s: &QueueSample, port: &PortCounters) -> Result<(), String> {
            writeln!(
                self.out,
                "{:.6},{switch},{},{peer},{},{},{},{},{},{},{},{}",
                s.time.as_secs_f64(),
                s.port,
                s.queue,
                s.bytes,
                s.peak_bytes,
                s.counters.enqueued,
                s.counters.dropped,
                s.counters.marked,
                port.rx_bytes,
                port.tx_bytes
            )
            .map_err(|e| e.to_string())
        }

        pub fn flush(&mut self) -> Result<(), String> {
            self.out.flush().map_err(|e| e.to_string())
        }
    }
}

pub use csv_writer::HEADER as STATS_HEADER;
/// The aggregation CSV: per switch and job, the aggregators held now,
/// aggregator-seconds held so far, and cumulative counts
/// (`softrnic_switch::JobCounters`).
pub const AGGREGATION_HEADER: &str =
    "time_s,switch,job,held,held_seconds,slots,aggregated,collisions,completed,flushed,acked_chunks,acked_values";
/// The flows CSV: cumulative bytes delivered from `src` to `dst`.
pub const FLOWS_HEADER: &str = "time_s,src,dst,bytes";
