//! What a benchmark run does, as flags (perftest's where they apply) and as
//! the one line the client sends the server, so that the server needs no
//! flags of its own.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use softrnic::{DatapathKind, Mtu, ProgressMode, Retransmission};
use softrnic_engine::faults::parse_probability;

/// The tests, named as perftest's programs are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Test {
    #[value(name = "send_bw")]
    SendBw,
    #[value(name = "write_bw")]
    WriteBw,
    #[value(name = "read_bw")]
    ReadBw,
    #[value(name = "atomic_bw")]
    AtomicBw,
    #[value(name = "send_lat")]
    SendLat,
    #[value(name = "write_lat")]
    WriteLat,
    #[value(name = "read_lat")]
    ReadLat,
    #[value(name = "atomic_lat")]
    AtomicLat,
}

impl Test {
    pub fn is_latency(self) -> bool {
        matches!(self, Test::SendLat | Test::WriteLat | Test::ReadLat | Test::AtomicLat)
    }

    pub fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicBw | Test::AtomicLat)
    }

    /// The title perftest prints.
    pub fn title(self) -> &'static str {
        match self {
            Test::SendBw => "Send BW Test",
            Test::WriteBw => "RDMA_Write BW Test",
            Test::ReadBw => "RDMA_Read BW Test",
            Test::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Test::SendLat => "Send Latency Test",
            Test::WriteLat => "RDMA_Write Latency Test",
            Test::ReadLat => "RDMA_Read Latency Test",
            Test::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    /// The name on the command line (and perftest's program name after `ib_`).
    pub fn name(self) -> &'static str {
        match self {
            Test::SendBw => "send_bw",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::AtomicBw => "atomic_bw",
            Test::SendLat => "send_lat",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::AtomicLat => "atomic_lat",
        }
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn probability(text: &str) -> Result<f64, String> {
    parse_probability(text)
}

fn mtu(text: &str) -> Result<Mtu, String> {
    let bytes: u32 = text.parse().map_err(|_| format!("`{text}` is not a number; use 256, 512, 1024, 2048 or 4096"))?;
    Mtu::from_bytes(bytes).ok_or_else(|| format!("{bytes} is not an IB MTU; use 256, 512, 1024, 2048 or 4096"))
}

fn size(text: &str) -> Result<usize, String> {
    let (number, unit) = match text.trim_end_matches(['b', 'B']).char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_uppercase()),
        _ => (text.trim_end_matches(['b', 'B']), ' '),
    };
    let n: usize = number.parse().map_err(|_| format!("`{text}` is not a size; give bytes such as 65536 or 64K"))?;
    let scale = match unit {
        ' ' => 1,
        'K' => 1 << 10,
        'M' => 1 << 20,
        'G' => 1 << 30,
        _ => return Err(format!("`{text}`: unknown unit; use K, M or G")),
    };
    let bytes = n.checked_mul(scale).ok_or("size too large")?;
    if bytes > MAX_SIZE {
        return Err(format!("{bytes} bytes is larger than the largest message, {MAX_SIZE} bytes (8 MiB)"));
    }
    Ok(bytes)
}

/// The largest message `-s` and `-a` go to, as in perftest.
pub const MAX_SIZE: usize = 8 << 20;

/// `softrnic bench` flags.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The test to run.
    #[arg(value_enum)]
    pub test: Test,
    /// The server to connect to; without it (and without --server) both
    /// ends run here, each on its own loopback address.
    pub peer: Option<IpAddr>,
    /// Wait for a client instead of connecting to a server.
    #[arg(long)]
    pub server: bool,
    /// Message size in bytes (K, M suffixes accepted).
    #[arg(short = 's', long, value_parser = size)]
    pub size: Option<usize>,
    /// Run every size from 2 B to 8 MiB.
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Iterations per QP (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long)]
    pub iters: Option<u64>,
    /// Queue pairs.
    #[arg(short = 'q', long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub qps: u32,
    /// Outstanding work requests per QP (default 128; latency tests use 1).
    #[arg(short = 't', long = "tx-depth", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub tx_depth: Option<u32>,
    /// Post work requests in lists of up to this many, each list one post
    /// (perftest's -l; bandwidth tests). Default: one at a time.
    #[arg(short = 'l', long = "post-list", alias = "post_list", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub post_list: Option<u32>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long, value_parser = mtu, default_value = "4096")]
    pub mtu: Mtu,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long)]
    pub duration: Option<f64>,
    /// Both ends send at once (bandwidth tests).
    #[arg(short = 'b', long)]
    pub bidirectional: bool,
    /// The receiver checks every byte.
    #[arg(long)]
    pub verify: bool,
    /// Print results as CSV.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print one JSON object per test (schema in BENCHMARKS.md).
    #[arg(long)]
    pub json: bool,
    /// Account for where the time goes: per round trip or message, the
    /// system calls by kind, context switches, CPU time, wake-ups, bytes
    /// copied and run through the ICRC, and locks (both ends in a
    /// loopback run; this end otherwise).
    #[arg(long)]
    pub account: bool,
    /// Accepted for perftest compatibility: bandwidth is always in Gb/s.
    #[arg(long = "report-gbits", alias = "report_gbits", short = 'R')]
    pub report_gbits: bool,
    /// This end's device address. A loopback run puts the client here
    /// (default 127.0.0.2) and the server on the next address (127.0.0.3);
    /// otherwise the default is SOFTRNIC_ADDR.
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long, default_value_t = softrnic::exchange::DEFAULT_PORT)]
    pub port: u16,
    /// Seconds to wait for the peer before giving up.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// Engine threads per device.
    #[arg(long = "engine-threads", default_value_t = 1)]
    pub engine_threads: usize,
    /// Split the engine threads into receive-only and send-only ones.
    #[arg(long = "split-rx-tx")]
    pub split_rx_tx: bool,
    /// The wire between devices on this host: auto (shared memory where
    /// the peer is a device here, else UDP), udp, or shm. Default:
    /// SOFTRNIC_DATAPATH, else auto.
    #[arg(long, value_parser = DatapathKind::parse)]
    pub datapath: Option<DatapathKind>,
    /// Who drives the device: inline (the program's posts and polls, for
    /// machines with few cores), dedicated (each engine thread polls its
    /// shard on a core of its own, as a NIC's cores do), or auto (dedicated
    /// when there are two cores per engine thread and two more). Default:
    /// SOFTRNIC_PROGRESS, else auto.
    #[arg(long, value_parser = ProgressMode::parse)]
    pub progress: Option<ProgressMode>,
    /// How RC QPs time retransmissions: fixed (the QP's timeout attribute,
    /// as RoCE NICs do) or adaptive (learned from the path's RTT, at least
    /// 100 us, with a tail-loss probe; retry_cnt keeps its meaning).
    /// Default: SOFTRNIC_RETRANSMISSION, else fixed.
    #[arg(long, value_parser = Retransmission::parse)]
    pub retransmission: Option<Retransmission>,
    /// The QP's retransmission timeout, as perftest's -u: 4.096 us x 2^N
    /// (14: 67 ms; 0: wait for ever).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Recover from loss by selective repeat: the responder keeps what
    /// arrives beyond a gap and the requester sends only what was lost
    /// (softrnic's extension, negotiated with the server; always with the
    /// adaptive timer). Default: SOFTRNIC_SELECTIVE_REPEAT, else go-back-N
    /// as RoCE does.
    #[arg(long)]
    pub selective_repeat: bool,
    /// Authenticate every packet with a keyed MAC (softrnic's extension,
    /// as sRDMA proposes; negotiated with the server). Both ends need the
    /// same secret in SOFTRNIC_AUTH_KEY, whose presence also turns this
    /// on. Default: off.
    #[arg(long)]
    pub auth: bool,
    /// Congestion control for this end's QPs: dcqcn, dctcp, timely, hpcc
    /// or swift (built in), the path of a WebAssembly module, or none.
    /// hpcc steers by INT: the peer must carry it too (SOFTRNIC_INT=on).
    /// Default: SOFTRNIC_CC, else none.
    #[arg(long, value_name = "NAME|PATH")]
    pub cc: Option<String>,
    /// A parameter of the algorithm, key=value (repeat, or separate with
    /// commas); the README lists each algorithm's. Default:
    /// SOFTRNIC_CC_PARAMS.
    #[arg(long = "cc-param", value_name = "KEY=VALUE")]
    pub cc_params: Vec<String>,
    /// The link's rate in Gb/s, which congestion control starts from and
    /// never exceeds. Default: SOFTRNIC_LINE_RATE, else 100.
    #[arg(long, value_parser = softrnic_engine::congestion::parse_gbps, value_name = "GBPS")]
    pub line_rate: Option<u64>,
    /// Drop this fraction of datagrams, in each direction.
    #[arg(long, value_parser = probability)]
    pub loss: Option<f64>,
    /// Reorder this fraction of datagrams.
    #[arg(long, value_parser = probability)]
    pub reorder: Option<f64>,
    /// Duplicate this fraction of datagrams.
    #[arg(long, value_parser = probability)]
    pub duplicate: Option<f64>,
    /// Corrupt one bit of this fraction of datagrams.
    #[arg(long, value_parser = probability)]
    pub corrupt: Option<f64>,
}

/// What both ends agree to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub test: Test,
    pub sizes: Vec<usize>,
    pub iters: u64,
    pub duration: Option<Duration>,
    pub qps: usize,
    pub tx_depth: usize,
    /// Work requests per post, at most.
    pub post_list: usize,
    pub mtu: Mtu,
    pub bidirectional: bool,
    pub verify: bool,
    /// Connections recover by selective repeat.
    pub selective_repeat: bool,
    /// Connections authenticate their packets.
    pub authenticate: bool,
}

impl Params {
    pub fn from_args(a: &BenchArgs) -> Result<Params, String> {
        let test = a.test;
        let sizes = if test.is_atomic() {
            if a.size.is_some_and(|s| s != 8) {
                return Err("atomic tests use 8-byte operands; drop -s".into());
            }
            vec![8]
        } else if a.all {
            (1..=23).map(|p| 1usize << p).collect()
        } else {
            vec![a.size.unwrap_or(if test.is_latency() { 2 } else { 65536 })]
        };
        if a.bidirectional && test.is_latency() {
            return Err("-b/--bidirectional applies to bandwidth tests only".into());
        }
        let duration = match a.duration {
            Some(d) if !(d > 0.0 && d <= 3600.0) => {
                return Err(format!("-D {d}: give a duration from 0 to 3600 seconds"));
            }
            Some(d) => Some(Duration::from_secs_f64(d)),
            None => None,
        };
        let iters = a.iters.unwrap_or(if test.is_latency() { 1000 } else { 5000 });
        if iters == 0 {
            return Err("-n must be at least 1".into());
        }
        let tx_depth = if test.is_latency() { 1 } else { a.tx_depth.unwrap_or(128) as usize };
        let post_list = match a.post_list {
            Some(_) if test.is_latency() => return Err("-l/--post-list applies to bandwidth tests only".into()),
            Some(n) if n as usize > tx_depth => {
                return Err(format!(
                    "-l {n} is more than the {tx_depth} requests -t lets be outstanding; give -l at most -t"
                ));
            }
            n => n.unwrap_or(1) as usize,
        };
        Ok(Params {
            test,
            sizes,
            iters,
            duration,
            qps: if test.is_latency() { 1 } else { a.qps as usize },
            tx_depth,
            post_list,
            mtu: a.mtu,
            bidirectional: a.bidirectional,
            verify: a.verify,
            selective_repeat: a.selective_repeat || softrnic::environment::selective_repeat()?,
            authenticate: match softrnic::environment::auth_key()? {
                Some(_) => true,
                None if a.auth => {
                    return Err("--auth needs the secret both ends share: set SOFTRNIC_AUTH_KEY (16 bytes or more, \
                                the same at both ends)"
                        .into());
                }
                None => false,
            },
        })
    }

    /// The line the client sends the server.
    pub fn to_line(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(usize::to_string).collect();
        format!(
            "PARAMS test={} sizes={} iters={} duration={} qps={} depth={} list={} mtu={} bidir={} verify={} sr={} auth={}",
            self.test,
            sizes.join(","),
            self.iters,
            self.duration.map_or(0.0, |d| d.as_secs_f64()),
            self.qps,
            self.tx_depth,
            self.post_list,
            self.mtu.bytes(),
            self.bidirectional,
            self.verify,
            self.selective_repeat,
            self.authenticate
        )
    }

    pub fn parse(line: &str) -> Result<Params, String> {
        let bad = |what: &str| format!("bad {what} in the client's parameters {line:?}");
        let mut words = line.split_whitespace();
        if words.next() != Some("PARAMS") {
            return Err(format!("the client did not send parameters: {line:?}"));
        }
        let mut p = Params {
            test: Test::WriteBw,
            sizes: vec![],
            iters: 1,
            duration: None,
            qps: 1,
            tx_depth: 1,
            post_list: 1,
            mtu: Mtu::Mtu4096,
            bidirectional: false,
            verify: false,
            selective_repeat: false,
            authenticate: false,
        };
        for word in words {
            let (k, v) = word.split_once('=').ok_or_else(|| bad("word"))?;
            match k {
                "test" => p.test = Test::from_str(v, true).map_err(|_| bad("test"))?,
                "sizes" => {
                    p.sizes = v.split(',').map(|s| s.parse().map_err(|_| bad("size"))).collect::<Result<_, _>>()?
                }
                "iters" => p.iters = v.parse().map_err(|_| bad("iters"))?,
                "duration" => {
                    let d: f64 = v.parse().map_err(|_| bad("duration"))?;
                    p.duration = (d > 0.0).then(|| Duration::from_secs_f64(d));
                }
                "qps" => p.qps = v.parse().map_err(|_| bad("qps"))?,
                "depth" => p.tx_depth = v.parse().map_err(|_| bad("depth"))?,
                "list" => p.post_list = v.parse().map_err(|_| bad("list"))?,
                "mtu" => p.mtu = Mtu::from_bytes(v.parse().map_err(|_| bad("mtu"))?).ok_or_else(|| bad("mtu"))?,
                "bidir" => p.bidirectional = v == "true",
                "verify" => p.verify = v == "true",
                "sr" => p.selective_repeat = v == "true",
                "auth" => p.authenticate = v == "true",
                _ => {}
            }
        }
        if p.sizes.is_empty()
            || p.sizes.iter().any(|&s| s > MAX_SIZE)
            || p.qps == 0
            || p.tx_depth == 0
            || !(1..=p.tx_depth).contains(&p.post_list)
        {
            return Err(bad("sizes, qps, depth or list"));
        }
        Ok(p)
    }

    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }

    /// Message slots per QP in each side's buffer: enough for every
    /// outstanding request, within 256 MiB in all.
    pub fn slots(&self) -> usize {
        let budget = (256usize << 20) / self.qps.max(1);
        // Latency tests keep one slot for each direction.
        let wanted = if self.test.is_latency() { 2 } else { self.tx_depth };
        wanted.clamp(1, (budget / self.max_size().max(1)).max(2))
    }

    /// Bytes of one QP's part of the buffer.
    pub fn qp_stride(&self) -> usize {
        (self.slots() * self.max_size().max(8)).next_multiple_of(64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<Params, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        Params::from_args(&cli.bench)
    }

    #[test]
    fn perftest_flags_and_defaults() {
        let p = parse(&["write_bw", "-s", "64K", "-q", "4", "-t", "64", "-m", "1024"]).unwrap();
        assert_eq!((p.sizes, p.qps, p.tx_depth, p.mtu, p.iters), (vec![65536], 4, 64, Mtu::Mtu1024, 5000));
        let p = parse(&["send_lat"]).unwrap();
        assert_eq!((p.sizes, p.iters, p.tx_depth), (vec![2], 1000, 1));
        let p = parse(&["read_bw", "-a"]).unwrap();
        assert_eq!((p.sizes.first(), p.sizes.last()), (Some(&2), Some(&(8 << 20))));
        assert_eq!(parse(&["atomic_lat"]).unwrap().sizes, vec![8]);
        assert_eq!(parse(&["send_bw", "-l", "16"]).unwrap().post_list, 16);
        assert_eq!(parse(&["send_bw"]).unwrap().post_list, 1);
    }

    #[test]
    fn bad_flags_say_what_is_wrong() {
        assert!(parse(&["write_bw", "-m", "1500"]).unwrap_err().contains("not an IB MTU"));
        assert!(parse(&["write_bw", "-s", "9M"]).unwrap_err().contains("larger than the largest"));
        assert!(parse(&["write_bw", "--loss", "2"]).unwrap_err().contains("from 0 to 1"));
        assert!(parse(&["send_lat", "-b"]).unwrap_err().contains("bandwidth tests only"));
        assert!(parse(&["send_lat", "-l", "2"]).unwrap_err().contains("bandwidth tests only"));
        assert!(parse(&["send_bw", "-t", "8", "-l", "16"]).unwrap_err().contains("give -l at most -t"));
        assert!(parse(&["atomic_bw", "-s", "16"]).unwrap_err().contains("8-byte"));
        assert!(parse(&["no_such_test"]).is_err());
    }

    #[test]
    fn parameters_travel_as_one_line() {
        let p = parse(&["send_bw", "-a", "-q", "2", "-D", "1.5", "-b", "--verify", "--selective-repeat", "-l", "4"])
            .unwrap();
        assert!(p.selective_repeat && p.post_list == 4);
        assert_eq!(Params::parse(&p.to_line()).unwrap(), p);
        assert!(Params::parse("HELLO").is_err());
    }
}
