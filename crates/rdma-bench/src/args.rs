//! The flags, spelled as libr's `rdma_bench` spells them (`-serverIp`,
//! one dash); the two-dash spelling works too.

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rdma_bench",
    about = "RDMA latency and multi-QP throughput with verified data (libr's flags and output)",
    after_help = "Start the server first (-nodeId 0), then the client (-nodeId 1) with the same -serverIp.\n\
                  -outstanding 1 measures latency (round trips, percentiles); more measures throughput."
)]
pub struct Args {
    /// The server's IP address: the server listens there, the client connects.
    #[arg(long = "serverIp")]
    pub server_ip: String,
    /// 0 for the server (receives and verifies), 1 for the client (sends).
    #[arg(long = "nodeId", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub node_id: u8,
    /// The RDMA device (as ibv_devices lists it); the first one if not given.
    #[arg(long = "deviceName")]
    pub device_name: Option<String>,
    /// The GID index on port 1.
    #[arg(long = "gidIndex", default_value_t = 0)]
    pub gid_index: i32,
    /// The QPs' local ACK timeout, 4.096 µs × 2^N (perftest's `-u`); each
    /// of its 7 retries waits this long for an ACK.
    #[arg(long = "qpTimeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    pub qp_timeout: u8,
    /// Bytes of registered memory per QP; by default just what the
    /// messages in flight need.
    #[arg(long = "bufSize")]
    pub buf_size: Option<usize>,
    /// Rounds of -numPack messages per QP.
    #[arg(long = "iterations", default_value_t = 500)]
    pub iterations: u64,
    /// Queue pairs, each driven by its own thread at both ends.
    #[arg(long = "threads", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: u32,
    /// Bytes per message.
    #[arg(long = "packSize", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=(1 << 30)))]
    pub pack_size: u32,
    /// Messages in flight per QP; 1 measures latency.
    #[arg(long = "outstanding", default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub outstanding: u32,
    /// Messages per round.
    #[arg(long = "numPack", default_value_t = 1024)]
    pub num_pack: u64,
    /// Exit after this many seconds whatever happens (status 3 if the run
    /// has not finished), so that a runner never waits on a stuck role.
    #[arg(long = "auto_exit_sec")]
    pub auto_exit_sec: Option<u64>,
    /// Client: send the buffer as it is and have the server check
    /// nothing, so that only the transport is measured (the offloaded
    /// stack's experiments); the server prints `recv speed` lines.
    #[arg(long = "noVerify")]
    pub no_verify: bool,
    /// Server: do E6's Snap-like baseline's work per message as well (copy
    /// the payload and the completion, walk 8 nodes of a linked list of
    /// 4 KiB nodes; the list's size in MiB, 0 for none).
    #[arg(long = "snapListMiB", default_value_t = 0)]
    pub snap_list_mib: usize,
    /// The TCP port the two ends exchange QP numbers on.
    #[arg(long = "port", default_value_t = 18515)]
    pub port: u16,
}

impl Args {
    /// Parses libr-style arguments: a flag of more than one letter after
    /// a single dash (`-serverIp`) reads as `--serverIp`.
    pub fn parse_libr_style() -> Args {
        Args::parse_from(std::env::args_os().map(|arg| match arg.to_str() {
            Some(s) if is_single_dash_word(s) => format!("-{s}").into(),
            _ => arg,
        }))
    }

    /// Messages each QP carries.
    pub fn messages(&self) -> u64 {
        self.iterations.saturating_mul(self.num_pack)
    }

    pub fn latency_mode(&self) -> bool {
        self.outstanding == 1
    }
}

fn is_single_dash_word(s: &str) -> bool {
    let rest = s.strip_prefix('-').unwrap_or("");
    rest.len() > 1 && !rest.starts_with('-') && rest.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, clap::Error> {
        let words =
            line.split_whitespace().map(|w| if is_single_dash_word(w) { format!("-{w}") } else { w.to_string() });
        Args::try_parse_from(std::iter::once("rdma_bench".to_string()).chain(words))
    }

    #[test]
    fn reads_libr_flags() {
        let a = parse("-serverIp 10.0.0.1 -nodeId 1 -deviceName mlx5_0 -gidIndex 3 -bufSize 65536 -iterations 10 -threads 8 -packSize 64 -outstanding 48 -numPack 100 -auto_exit_sec 20").unwrap();
        assert_eq!(
            (a.server_ip.as_str(), a.node_id, a.device_name.as_deref(), a.gid_index),
            ("10.0.0.1", 1, Some("mlx5_0"), 3)
        );
        assert_eq!(
            (a.buf_size, a.iterations, a.threads, a.pack_size, a.outstanding, a.num_pack),
            (Some(65536), 10, 8, 64, 48, 100)
        );
        assert_eq!((a.auto_exit_sec, a.messages(), a.latency_mode()), (Some(20), 1000, false));
        assert!(parse("--serverIp 10.0.0.1 --nodeId 0 --outstanding 1").unwrap().latency_mode());
        assert_eq!(a.qp_timeout, 14, "perftest's default");
        assert_eq!(parse("-serverIp 10.0.0.1 -nodeId 0 -qpTimeout 18").unwrap().qp_timeout, 18);
    }

    #[test]
    fn refuses_what_libr_would_not_run() {
        assert!(parse("-serverIp 10.0.0.1 -nodeId 2").is_err());
        assert!(parse("-serverIp 10.0.0.1 -nodeId 0 -packSize 0").is_err());
        assert!(parse("-nodeId 0").is_err(), "the server's address is needed");
        assert!(parse("-serverIp 10.0.0.1 -nodeId 0 -bogus 1").is_err());
        assert!(parse("-serverIp 10.0.0.1 -nodeId 0 -qpTimeout 32").is_err(), "the field has 5 bits");
    }
}
