//! `softrnic careful`: E9, throughput the careful way. The client sends N
//! bytes in messages of size s; the server answers "done" once all N have
//! arrived. The round trip is measured first and half of it is taken off
//! each timing (the "done" still had to travel back); warm-up rounds are
//! thrown away, and rounds repeat until the last few vary by under 1 %.
//!
//! ```text
//! softrnic careful --server --addr 127.0.0.2 &
//! softrnic careful --client --addr 127.0.0.3 --server-addr 127.0.0.2 --transport send
//! # size  Mbps
//! 1  7.91
//! ...
//! ```
//!
//! The same method runs over softrnic (SEND/RECV or RDMA WRITE) and over a
//! plain TCP socket (`--transport tcp`), as the seed compares them. The
//! server serves whichever transport the client names, round by round,
//! through a control connection (`link.rs` has the transports).

mod link;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use softrnic::exchange::{DEFAULT_PORT, Exchange};

use crate::addr::End;
use link::Link;

/// What carries the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// A plain kernel TCP socket.
    Tcp,
    /// softrnic, SEND into posted receives.
    Send,
    /// softrnic, RDMA WRITE (the last with immediate data, which the
    /// server sees).
    Write,
}

#[derive(Args, Debug, Clone)]
pub struct CarefulArgs {
    #[command(flatten)]
    pub ends: crate::addr::Ends,
    /// The server's control port; the TCP transport uses the next one.
    #[arg(long, default_value_t = DEFAULT_PORT + 100)]
    pub port: u16,
    /// What carries the data (client).
    #[arg(long, value_enum, default_value_t = Transport::Send)]
    pub transport: Transport,
    /// Largest message size; sizes go 1, 2, 4, ... up to it.
    #[arg(long, default_value_t = 256 * 1024)]
    pub max_size: usize,
    /// Fewer sizes and shorter rounds (for CI and a first look).
    #[arg(long)]
    pub quick: bool,
    /// Give up on a peer silent for this many seconds.
    #[arg(long, default_value_t = 20)]
    pub timeout: u64,
}

/// The variation the rounds must come under, and how many recent rounds
/// it is taken over.
const TARGET_VARIATION: f64 = 0.01;
const WINDOW: usize = 5;

/// The method's knobs: full, or `--quick`.
#[derive(Debug, Clone, Copy)]
struct Plan {
    warm_up: usize,
    max_rounds: usize,
    /// Bytes a round carries at least, and messages at least and at most.
    bytes: u64,
    min_messages: u64,
    max_messages: u64,
    pings: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        match quick {
            false => Plan {
                warm_up: 2,
                max_rounds: 40,
                bytes: 16 << 20,
                min_messages: 2_000,
                max_messages: 200_000,
                pings: 200,
            },
            // One window of rounds: --quick checks the method and its
            // output, and settling is for the full run to seek.
            true => Plan {
                warm_up: 1,
                max_rounds: WINDOW,
                bytes: 1 << 20,
                min_messages: 200,
                max_messages: 20_000,
                pings: 50,
            },
        }
    }

    fn messages(&self, size: usize) -> u64 {
        (self.bytes / size as u64).clamp(self.min_messages, self.max_messages)
    }

    fn sizes(&self, max: usize, quick: bool) -> Vec<usize> {
        let all = (0..).map(|i| 1usize << i).take_while(|&s| s <= max);
        if quick { all.filter(|s| [1, 64, 1024, 16384, 65536].contains(s)).collect() } else { all.collect() }
    }
}

/// One size's result.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub size: usize,
    pub mbps: f64,
    /// Rounds measured after the warm-up, and their variation (stdev / mean).
    pub rounds: usize,
    pub variation: f64,
}

pub fn run(args: &CarefulArgs) -> Result<(), String> {
    let timeout = Duration::from_secs(args.timeout);
    match args.ends.end()? {
        End::Server(addr) => serve(addr, args.port, timeout),
        End::Client { addr, server } => measure(addr, SocketAddr::new(server, args.port), args, timeout),
    }
}

/// The server: one client at a time, any transport, until it says quit.
fn serve(addr: IpAddr, port: u16, timeout: Duration) -> Result<(), String> {
    let listener = TcpListener::bind((addr, port)).map_err(|e| {
        format!("cannot listen on {addr}:{port} ({e}): is --addr an address of this host and --port free?")
    })?;
    let mut control = Exchange::accept(&listener, Duration::from_secs(3600)).map_err(|e| e.to_string())?;
    let transport = control.read_line().map_err(|e| e.to_string())?;
    let transport = Transport::from_str(transport.trim_start_matches("transport "), true)
        .map_err(|_| format!("not a careful client: it said {transport:?}"))?;
    let mut link = Link::serve(transport, addr, port, &mut control, timeout)?;
    loop {
        let line = control.read_line().map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ping", n] => {
                let n = n.parse().map_err(|_| format!("bad ping line {line:?}"))?;
                link.arm_pings(n)?;
                control.send_text("ready").map_err(|e| e.to_string())?;
                link.answer_pings(n)?;
            }
            ["round", size, count] => {
                let (size, count) = (size.parse().map_err(|_| "bad size")?, count.parse().map_err(|_| "bad count")?);
                link.arm_round(size, count)?;
                control.send_text("ready").map_err(|e| e.to_string())?;
                link.take_round(size, count)?;
            }
            ["quit"] => return Ok(()),
            _ => return Err(format!("unexpected line from the client: {line:?}")),
        }
    }
}

/// What the method needs of a connection: a timed ping, and a timed round
/// of `count` messages of `size` bytes up to the server's "done".
pub trait Rounds {
    fn ping(&mut self) -> Result<Duration, String>;
    fn round(&mut self, size: usize, count: u64) -> Result<Duration, String>;
}

/// The client's side of a real run: each ping and round announced on the
/// control connection (untimed), then timed on the link.
struct Client {
    control: Exchange,
    link: Link,
}

impl Client {
    fn announce(&mut self, line: String) -> Result<(), String> {
        self.control.send_text(&line).map_err(|e| e.to_string())?;
        match self.control.read_line().map_err(|e| e.to_string())?.as_str() {
            "ready" => Ok(()),
            other => Err(format!("the server said {other:?} instead of ready")),
        }
    }
}

impl Rounds for Client {
    fn ping(&mut self) -> Result<Duration, String> {
        self.announce("ping 1".to_string())?;
        self.link.ping()
    }

    fn round(&mut self, size: usize, count: u64) -> Result<Duration, String> {
        self.announce(format!("round {size} {count}"))?;
        let start = Instant::now();
        self.link.send_round(size, count)?;
        Ok(start.elapsed())
    }
}

/// The method: the median of `plan.pings` round trips, then for each size
/// warm-up rounds and measured rounds (half the round trip taken off
/// each) until the last `WINDOW` vary by under 1 % or the rounds run out.
fn method(
    link: &mut impl Rounds,
    plan: &Plan,
    sizes: &[usize],
    mut each: impl FnMut(Point),
) -> Result<Duration, String> {
    let rtts: Vec<Duration> = (0..plan.pings).map(|_| link.ping()).collect::<Result<_, _>>()?;
    let rtt = crate::exp::median_by(rtts, Duration::as_secs_f64).ok_or("no pings to time the round trip")?;
    for &size in sizes {
        let count = plan.messages(size);
        let mut rates = Vec::new();
        for round in 0..plan.warm_up + plan.max_rounds {
            let elapsed = link.round(size, count)?.saturating_sub(rtt / 2).max(Duration::from_nanos(1));
            if round >= plan.warm_up {
                rates.push((size as u64 * count) as f64 * 8.0 / elapsed.as_secs_f64() / 1e6);
            }
            if rates.len() >= WINDOW && variation(&rates[rates.len() - WINDOW..]) < TARGET_VARIATION {
                break;
            }
        }
        let recent = &rates[rates.len().saturating_sub(WINDOW)..];
        each(Point { size, mbps: mean(recent), rounds: rates.len(), variation: variation(recent) });
    }
    Ok(rtt)
}

/// The client: the method over `--transport`, printed as the seed's
/// `size  Mbps` lines.
fn measure(addr: IpAddr, server: SocketAddr, args: &CarefulArgs, timeout: Duration) -> Result<(), String> {
    let plan = Plan::new(args.quick);
    let mut control = Exchange::connect(server, timeout).map_err(|_| {
        format!(
            "no careful server answered at {server} within {timeout:?}: start `softrnic careful --server --addr {}` there first",
            server.ip()
        )
    })?;
    control.send_text(&format!("transport {}", name(args.transport))).map_err(|e| e.to_string())?;
    let link = Link::connect(args.transport, addr, server, &mut control, timeout)?;
    let mut client = Client { control, link };
    // Standard output holds the seed's lines alone, so that its readers'
    // scripts parse ours; what else the method says goes to stderr.
    eprintln!("# careful throughput over {}", name(args.transport));
    let rtt = method(&mut client, &plan, &plan.sizes(args.max_size, args.quick), |p| {
        println!("{}", seed_line(p.size, p.mbps));
        if p.variation >= TARGET_VARIATION {
            eprintln!("# {} B never settled: variation {:.1} % after {} rounds", p.size, p.variation * 100.0, p.rounds);
        }
    })?;
    eprintln!("# rtt {:.2} us (median of {} pings), half taken off each round", rtt.as_secs_f64() * 1e6, plan.pings);
    client.control.send_text("quit").map_err(|e| e.to_string())
}

/// One size's line as the seed prints it: `1024\t890.618743  Mbps`.
fn seed_line(size: usize, mbps: f64) -> String {
    format!("{size}\t{mbps:.6}  Mbps")
}

pub fn name(t: Transport) -> &'static str {
    match t {
        Transport::Tcp => "tcp",
        Transport::Send => "send",
        Transport::Write => "write",
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// Standard deviation over mean.
fn variation(xs: &[f64]) -> f64 {
    let m = mean(xs);
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len().max(1) as f64;
    if m > 0.0 { var.sqrt() / m } else { f64::INFINITY }
}

/// Parses the client's `size  Mbps` lines (comments skipped, as an older
/// client printed them there).
pub fn parse_lines(text: &str) -> Vec<(usize, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_long_enough_and_sizes_double() {
        let plan = Plan::new(false);
        assert_eq!(plan.sizes(256 * 1024, false).len(), 19);
        assert_eq!(plan.messages(1), 200_000);
        assert_eq!(plan.messages(256 * 1024), 2_000);
        assert_eq!(Plan::new(true).sizes(256 * 1024, true), [1, 64, 1024, 16384, 65536]);
    }

    #[test]
    fn lines_are_the_seeds_and_parse_back() {
        // The seed's line for 1024 B: `1024    890.618743  Mbps` (a tab).
        assert_eq!(seed_line(1024, 890.618743), "1024\t890.618743  Mbps");
        assert_eq!(parse_lines(&format!("{}\n{}\n", seed_line(1, 4.5), seed_line(2, 9.0))), [(1, 4.5), (2, 9.0)]);
    }

    #[test]
    fn variation_is_relative() {
        assert!(variation(&[100.0, 100.5, 99.5, 100.0, 100.0]) < TARGET_VARIATION);
        assert!(variation(&[100.0, 110.0, 90.0, 100.0, 100.0]) > TARGET_VARIATION);
    }

    /// A link of known rate and one-way delay, timed on paper: a round
    /// takes its bytes at the rate, plus the one-way trip of the done.
    struct Paper {
        bits_per_second: f64,
        one_way: Duration,
    }

    impl Rounds for Paper {
        fn ping(&mut self) -> Result<Duration, String> {
            Ok(self.one_way * 2)
        }
        fn round(&mut self, size: usize, count: u64) -> Result<Duration, String> {
            let transfer = Duration::from_secs_f64((size as u64 * count) as f64 * 8.0 / self.bits_per_second);
            Ok(transfer + self.one_way)
        }
    }

    #[test]
    fn half_the_round_trip_comes_off_each_round() {
        // 1 Gb/s behind a 5 ms one-way delay: without the subtraction a
        // 64-byte round would read far slower than the link.
        let mut link = Paper { bits_per_second: 1e9, one_way: Duration::from_millis(5) };
        let plan = Plan::new(true);
        let mut points = Vec::new();
        let rtt = method(&mut link, &plan, &[64, 65536], |p| points.push(p)).unwrap();
        assert_eq!(rtt, Duration::from_millis(10));
        for p in &points {
            assert!((p.mbps - 1000.0).abs() < 1.0, "{p:?}");
            assert_eq!(p.rounds, WINDOW, "steady rounds stop as soon as the window settles");
        }
    }

    #[test]
    fn output_lines_read_back() {
        let text =
            "# careful throughput over tcp\n# size  Mbps\n1  7.91\n2  15.50  # variation 1.2 % after 40 rounds\n";
        assert_eq!(parse_lines(text), [(1, 7.91), (2, 15.5)]);
    }
}
