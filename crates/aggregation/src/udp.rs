//! The workers and servers on real sockets: a UDP socket that sends ECN
//! capable (ECT(0)) and reads the ECN field of what it receives
//! (`quinn-udp`), the loop that runs a [`Worker`] through one step
//! ([`Allreduce`]), and the loop that runs a [`ParameterServer`]
//! ([`serve`]). Time is a monotonic clock since the loop's start.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use quinn_udp::{EcnCodepoint, RecvMeta, Transmit, UdpSocketState};
use rustix::event::{PollFd, PollFlags, Timespec};
use softrnic_wire::aggregation::AGG_UDP_PORT;

use crate::fixed_point::{from_fixed, to_fixed};
use crate::server::{Destination, ParameterServer, ServerStats};
use crate::worker::{Worker, WorkerConfig};

/// Datagrams one receive call takes at most.
const BATCH: usize = 32;
const SLOT: usize = 2048;

/// A UDP socket that speaks ECN.
pub struct Socket {
    socket: UdpSocket,
    state: UdpSocketState,
    buffers: Vec<[u8; SLOT]>,
}

impl Socket {
    /// Binds `addr` (its port: [`AGG_UDP_PORT`] if 0).
    pub fn bind(mut addr: SocketAddr) -> io::Result<Socket> {
        if addr.port() == 0 {
            addr.set_port(AGG_UDP_PORT);
        }
        let socket = UdpSocket::bind(addr).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot bind {addr}: {e} (each endpoint needs its own address)"))
        })?;
        let _ = socket2::SockRef::from(&socket).set_recv_buffer_size(4 << 20);
        let state = UdpSocketState::new((&socket).into())?;
        Ok(Socket { socket, state, buffers: vec![[0; SLOT]; BATCH] })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// Sends one datagram, waiting while the socket's buffer is full (the
    /// socket is non-blocking, as `quinn-udp` makes it).
    pub fn send(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        let transmit = Transmit {
            destination: to,
            ecn: Some(EcnCodepoint::Ect0),
            contents: bytes,
            segment_size: None,
            src_ip: None,
        };
        loop {
            match self.state.try_send((&self.socket).into(), &transmit) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(PollFlags::OUT, Duration::from_millis(10))?
                }
                other => return other,
            }
        }
    }

    /// Until the socket is ready for `flags`, or `timeout`.
    fn wait(&self, flags: PollFlags, timeout: Duration) -> io::Result<()> {
        let mut fds = [PollFd::new(&self.socket, flags)];
        let timeout = Timespec::try_from(timeout).unwrap_or(Timespec { tv_sec: 0, tv_nsec: 10_000_000 });
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits up to `timeout` for datagrams and hands each to `f` with
    /// whether it arrived marked CE; how many there were.
    pub fn recv(&mut self, timeout: Duration, mut f: impl FnMut(SocketAddr, &[u8], bool)) -> io::Result<usize> {
        self.wait(PollFlags::IN, timeout)?;
        let mut meta = [RecvMeta::default(); BATCH];
        let mut slices: Vec<IoSliceMut<'_>> = self.buffers.iter_mut().map(|b| IoSliceMut::new(&mut b[..])).collect();
        let n = match self.state.recv((&self.socket).into(), &mut slices, &mut meta) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut count = 0;
        for (m, buf) in meta.iter().zip(slices.iter()).take(n) {
            let ce = m.ecn == Some(EcnCodepoint::Ce);
            // GRO may have joined datagrams of one sender: `stride` apart.
            for datagram in buf[..m.len].chunks(m.stride.max(1)) {
                f(m.addr, datagram, ce);
                count += 1;
            }
        }
        Ok(count)
    }
}

/// A worker's side of an allreduce over in-network aggregation.
pub struct Allreduce {
    socket: Socket,
    server: SocketAddr,
    worker: Worker,
    epoch: Instant,
    buf: Vec<u8>,
    /// A step fails when nothing is answered for this long.
    pub give_up_after: Duration,
}

impl Allreduce {
    /// A worker at `local` (port 0: the aggregation port) whose job's
    /// server is at `server`.
    pub fn new(local: SocketAddr, mut server: SocketAddr, config: WorkerConfig) -> Result<Allreduce, String> {
        config.check()?;
        if server.port() == 0 {
            server.set_port(AGG_UDP_PORT);
        }
        let socket = Socket::bind(local).map_err(|e| e.to_string())?;
        Ok(Allreduce {
            socket,
            server,
            worker: Worker::new(config),
            epoch: Instant::now(),
            buf: Vec::new(),
            give_up_after: Duration::from_secs(10),
        })
    }

    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Replaces `values` with their sum over every worker of the job;
    /// true if a sum saturated.
    pub fn sum_i32(&mut self, values: &mut [i32]) -> Result<bool, String> {
        self.worker.start(values)?;
        let mut last_progress = Instant::now();
        let mut answered = self.worker.stats().acked;
        loop {
            let now = self.epoch.elapsed();
            self.worker.handle_timeout(now);
            while self.worker.poll_transmit(now, &mut self.buf) {
                self.socket.send(self.server, &self.buf).map_err(|e| format!("cannot send to {}: {e}", self.server))?;
            }
            if let Some((sum, overflow)) = self.worker.take_result() {
                values.copy_from_slice(&sum);
                return Ok(overflow);
            }
            let wait = self.worker.poll_timeout().map_or(Duration::from_millis(10), |t| t.saturating_sub(now));
            let (worker, epoch) = (&mut self.worker, self.epoch);
            self.socket
                .recv(wait.min(Duration::from_millis(10)), |_, bytes, ce| {
                    worker.handle_packet(epoch.elapsed(), bytes, ce)
                })
                .map_err(|e| format!("cannot receive: {e}"))?;
            if self.worker.stats().acked != answered {
                answered = self.worker.stats().acked;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.give_up_after {
                return Err(format!(
                    "no answer from the parameter server at {} for {:?}: is it running, for this job and worker count?",
                    self.server, self.give_up_after
                ));
            }
        }
    }

    /// The same for floats, summed in fixed point with `frac_bits`
    /// fractional bits (`fixed_point`).
    pub fn sum_f32(&mut self, values: &mut [f32], frac_bits: u32) -> Result<bool, String> {
        let mut fixed: Vec<i32> = values.iter().map(|&x| to_fixed(x, frac_bits)).collect();
        let overflow = self.sum_i32(&mut fixed)?;
        for (x, v) in values.iter_mut().zip(fixed) {
            *x = from_fixed(v, frac_bits);
        }
        Ok(overflow)
    }
}

/// Runs a parameter server on `socket` until `stop` is set; `workers`
/// are the job's workers' addresses, by index: a datagram counts only from
/// one of them. `report` is called about
/// once a second with the server's counters.
pub fn serve(
    socket: &mut Socket,
    mut server: ParameterServer,
    workers: &[SocketAddr],
    stop: &AtomicBool,
    mut report: impl FnMut(&ServerStats),
) -> Result<ServerStats, String> {
    let mut last_report = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        socket
            .recv(Duration::from_millis(50), |from, bytes, ce| {
                // Which worker sent it, by its address: no one else's counts.
                let sender = workers.iter().position(|&w| w == from).and_then(|w| u8::try_from(w).ok());
                server.handle_packet(sender, bytes, ce)
            })
            .map_err(|e| format!("cannot receive: {e}"))?;
        while let Some((to, bytes)) = server.poll_transmit() {
            let index = match to {
                Destination::All => 0,
                Destination::Worker(w) => usize::from(w),
            };
            let Some(&addr) = workers.get(index) else { continue };
            // A full send buffer drops the answer; the worker resends.
            let _ = socket.send(addr, &bytes);
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            report(&server.stats());
            last_report = Instant::now();
        }
    }
    Ok(server.stats())
}
