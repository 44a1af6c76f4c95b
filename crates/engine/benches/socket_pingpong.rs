//! The UDP socket layer alone, against the kernel's plainest UDP in the
//! same run: a 64-byte ping-pong between two threads spinning on
//! non-blocking receives, through the engine's `RoceSocket`
//! (`sendmmsg`/`recvmmsg`, GSO/GRO, ECN, the `SO_REUSEPORT` group) and
//! through `std::net::UdpSocket` (`sendto`/`recvfrom`, as sockperf
//! measures). What the engine adds above its socket is the rest of
//! `softrnic bench send_lat`'s round trip.
//!
//!     cargo bench -p softrnic-engine --bench socket_pingpong

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use softrnic_engine::socket::{RecvBatch, RoceSocket};

const TRIPS: usize = 100_000;
const ROUNDS: usize = 5;

/// One-way latency (half the round trip) p50 in µs, over `TRIPS`.
fn p50(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6 / 2.0
}

fn roce(here: IpAddr, there: IpAddr) -> f64 {
    let (a, b) = (Arc::new(RoceSocket::bind(here).unwrap()), Arc::new(RoceSocket::bind(there).unwrap()));
    let (to_a, to_b) = (a.local_addr(), b.local_addr());
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut batch = Box::<RecvBatch>::default();
            let reply = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                if b.recv_batch(&mut batch).unwrap() > 0 {
                    b.send_batch(&[(to_a, &reply[..])]).unwrap();
                }
            }
        })
    };
    let mut batch = Box::<RecvBatch>::default();
    let ping = [0u8; 64];
    let mut samples = Vec::with_capacity(TRIPS);
    for _ in 0..TRIPS {
        let t = Instant::now();
        a.send_batch(&[(to_b, &ping[..])]).unwrap();
        while a.recv_batch(&mut batch).unwrap() == 0 {}
        samples.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    p50(samples)
}

/// std's sockets, unconnected (a route looked up per send, as softrnic's
/// shared socket must) or connected to their peer.
fn plain(here: IpAddr, there: IpAddr, connected: bool) -> f64 {
    let a = UdpSocket::bind(SocketAddr::new(here, 0)).unwrap();
    let b = UdpSocket::bind(SocketAddr::new(there, 0)).unwrap();
    if connected {
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
    }
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let (to_a, to_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if b.recv_from(&mut buf).is_ok() {
                    if connected {
                        b.send(&buf[..64]).unwrap()
                    } else {
                        b.send_to(&buf[..64], to_a).unwrap()
                    };
                }
            }
        })
    };
    let mut buf = [0u8; 2048];
    let mut samples = Vec::with_capacity(TRIPS);
    for _ in 0..TRIPS {
        let t = Instant::now();
        if connected {
            a.send(&[0u8; 64]).unwrap()
        } else {
            a.send_to(&[0u8; 64], to_b).unwrap()
        };
        while a.recv_from(&mut buf).is_err() {}
        samples.push(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    p50(samples)
}

fn main() {
    let (here, there): (IpAddr, IpAddr) = ("127.0.8.40".parse().unwrap(), "127.0.8.41".parse().unwrap());
    let (mut ours, mut std, mut connected) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.push(roce(here, there));
        std.push(plain(here, there, false));
        connected.push(plain(here, there, true));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratios: Vec<f64> = ours.iter().zip(&std).map(|(o, s)| o / s).collect();
    println!("64 B one-way p50, medians of {ROUNDS} rounds of {TRIPS} round trips:");
    println!("  RoceSocket (sendmmsg/recvmmsg, GSO/GRO, ECN): {:.2} us", median(&mut ours.clone()));
    println!("  std UdpSocket (sendto/recvfrom):               {:.2} us", median(&mut std.clone()));
    println!("  std UdpSocket, connected (send/recvfrom):      {:.2} us", median(&mut connected.clone()));
    println!("  ratio: {:.2}x (per round: {:?})", median(&mut ratios.clone()), ratios);
}
