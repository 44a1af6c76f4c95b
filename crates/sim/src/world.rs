//! Hosts on a simulated network, and virtual time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use softrnic_transport::{Device, Instant, MAX_DATAGRAM_LEN, TransportConfig};
use softrnic_wire::ROCEV2_UDP_PORT;

use crate::network::{Faults, InFlight, Network};

/// A host: one device with its address.
#[derive(Debug)]
pub struct Host {
    pub device: Device,
    pub addr: SocketAddr,
    /// A host that is down neither sends nor receives.
    pub up: bool,
}

/// Devices, the network between them, and the clock.
#[derive(Debug)]
pub struct World {
    pub now: Instant,
    pub hosts: Vec<Host>,
    pub network: Network,
    buf: Vec<u8>,
    /// Print every packet (`SOFTRNIC_SIM_TRACE=1`).
    trace: bool,
}

impl World {
    /// `hosts` devices at 127.0.0.2, 127.0.0.3, ... (simulated: no socket
    /// is opened), joined by a network with `faults`, randomised by `seed`.
    pub fn new(hosts: usize, faults: Faults, seed: u64) -> World {
        Self::with_config(hosts, faults, seed, TransportConfig::default())
    }

    pub fn with_config(hosts: usize, faults: Faults, seed: u64, config: TransportConfig) -> World {
        let hosts = (0..hosts)
            .map(|i| {
                let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i as u8));
                let device = Device::new(TransportConfig { local_addr: ip, ..config.clone() });
                Host { device, addr: SocketAddr::new(ip, ROCEV2_UDP_PORT), up: true }
            })
            .collect::<Vec<_>>();
        let network = Network::new(faults, seed ^ 0x9e37_79b9_7f4a_7c15, hosts.len());
        let trace = std::env::var_os("SOFTRNIC_SIM_TRACE").is_some();
        World { now: Instant::ZERO, hosts, network, buf: vec![0; MAX_DATAGRAM_LEN], trace }
    }

    pub fn device(&mut self, host: usize) -> &mut Device {
        &mut self.hosts[host].device
    }

    pub fn ip(&self, host: usize) -> IpAddr {
        self.hosts[host].addr.ip()
    }

    /// Sends everything the devices want to send, then advances the clock
    /// to the next arrival or deadline and handles it. Returns false when
    /// nothing is left to happen: no packet in flight, no timer armed.
    pub fn step(&mut self) -> bool {
        self.flush();
        let next_timer = self.hosts.iter_mut().filter(|h| h.up).filter_map(|h| h.device.poll_timeout()).min();
        let next = match (self.network.next_arrival(), next_timer) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return false,
            },
        };
        self.now = self.now.max(next);
        while let Some(packet) = self.network.pop_due(self.now) {
            if self.trace {
                println!("{:>12?} deliver {}", self.now - Instant::ZERO, describe(&packet));
            }
            if let Some(host) = self.hosts.iter_mut().find(|h| h.addr.ip() == packet.to.ip() && h.up) {
                host.device.handle_datagram(self.now, packet.from, &packet.bytes);
            }
        }
        for host in self.hosts.iter_mut().filter(|h| h.up) {
            host.device.handle_timeout(self.now);
        }
        true
    }

    /// Hands every datagram the devices have ready to the network.
    pub fn flush(&mut self) {
        for (index, host) in self.hosts.iter_mut().enumerate() {
            if !host.up {
                continue;
            }
            while let Some(t) = host.device.poll_transmit(self.now, &mut self.buf) {
                let packet = InFlight {
                    from: host.addr,
                    to: SocketAddr::new(t.dst, ROCEV2_UDP_PORT),
                    bytes: self.buf[..t.len].to_vec(),
                };
                if self.trace {
                    println!("{:>12?} send    {}", self.now - Instant::ZERO, describe(&packet));
                }
                self.network.send(self.now, index, packet);
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
fn describe(packet: &InFlight) -> String {
    format!("{} -> {} {}", packet.from.ip(), packet.to.ip(), softrnic_wire::packet::summary(&packet.bytes))
}
