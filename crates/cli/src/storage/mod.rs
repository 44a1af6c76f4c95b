//! `softrnic storage`: E7's block-storage service, both ends. Every
//! request is a self-contained 4 KiB block in the shape of Alibaba's
//! Solar protocol ([`softrnic::block`]): a 64-byte header and a CRC-32
//! over the payload, answered by an 8-byte acknowledgement (a write) or
//! the block (a read). A client's threads each write a range of the
//! server's in-memory store and read it back, checking every CRC and
//! every byte; the client prints the seed's `Total Speed: N Mops`.
//!
//! ```text
//! softrnicd &
//! softrnic storage --server --addr 127.0.0.2 &
//! softrnic storage --client --addr 127.0.0.3 --server-addr 127.0.0.2 --design crc-copy --threads 4
//! Total Speed: 0.123456 Mops
//! ```
//!
//! The designs differ in who does the per-block work ([`Design`]); the
//! server serves whichever design each client connection names.

mod client;
mod server;
mod tcp;

pub(crate) use server::WORK_LINE;

use std::net::SocketAddr;

use clap::{Args, ValueEnum};
use softrnic::block::BLOCK_LEN;
use softrnic::exchange::DEFAULT_PORT;

use crate::addr::End;

/// Who computes and checks the CRCs and copies the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Design {
    /// The applications compute and check every CRC and copy every block
    /// into and out of the store (over softrnic SENDs).
    Cpu,
    /// softrnicd computes the CRC of each block sent and checks it on each
    /// block received; the applications still copy the blocks.
    Crc,
    /// softrnicd also places each written block's payload into the
    /// server's store and gathers each read's from there: the server
    /// application sees headers only.
    CrcCopy,
    /// The same RPC over kernel TCP, the applications doing all of it.
    Tcp,
}

impl Design {
    pub const ALL: [Design; 4] = [Design::Cpu, Design::Crc, Design::CrcCopy, Design::Tcp];

    /// Whether softrnicd computes and checks the CRCs.
    fn offloads_crc(self) -> bool {
        matches!(self, Design::Crc | Design::CrcCopy)
    }

    fn from_name(name: &str) -> Option<Design> {
        Design::ALL.into_iter().find(|d| d.to_string() == name)
    }
}

impl std::fmt::Display for Design {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self.to_possible_value().expect("no design is hidden");
        f.write_str(value.get_name())
    }
}

#[derive(Args, Debug, Clone)]
pub struct StorageArgs {
    #[command(flatten)]
    pub ends: crate::addr::Ends,
    /// The server's port (connections name their design there).
    #[arg(long, default_value_t = DEFAULT_PORT + 200)]
    pub port: u16,
    /// Who does the per-block work (client; the server follows).
    #[arg(long, value_enum, default_value_t = Design::CrcCopy)]
    pub design: Design,
    /// Client threads, each with a connection and a range of the store.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Blocks each thread writes and reads back, in turn.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub blocks: u32,
    /// Requests each thread keeps in flight.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub depth: u32,
    /// How long to measure, seconds.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// First send one block with a wrong CRC, and check that the server
    /// refuses it with a CRC error and stores nothing.
    #[arg(long)]
    pub corrupt: bool,
    /// The server's store, MiB (it must hold every client thread's range).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub store_mib: u32,
}

pub fn run(args: &StorageArgs) -> Result<(), String> {
    match args.ends.end()? {
        End::Server(addr) => server::serve(addr, args.port, args.store_mib as usize * (1 << 20)),
        End::Client { addr, server } => {
            if !(args.seconds > 0.0 && args.seconds.is_finite()) {
                return Err(format!("--seconds {} is not a positive number of seconds", args.seconds));
            }
            client::measure(addr, SocketAddr::new(server, args.port), args)
        }
    }
}

/// The payload a thread writes to the block at `offset` in round
/// `generation`: distinct per block and round, so a block read back from
/// the wrong place or round shows.
fn content(offset: u64, generation: u64, out: &mut [u8]) {
    let seed = offset.rotate_left(20) ^ generation.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for (i, word) in out.chunks_exact_mut(8).enumerate() {
        let value = seed ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        word.copy_from_slice(&value.to_le_bytes());
    }
}

/// CPU seconds a process has used (user and system), from its
/// `/proc/PID/stat` (`None`: this process's): the per-block cost the
/// designs move about.
pub(crate) fn cpu_seconds(pid: Option<u32>) -> f64 {
    let path = pid.map_or("/proc/self/stat".to_string(), |pid| format!("/proc/{pid}/stat"));
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line (12th and 13th after it).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / rustix::param::clock_ticks_per_second() as f64
}

/// A whole block's request or answer: header and payload.
const MESSAGE: usize = softrnic::block::HEADER_LEN + BLOCK_LEN;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_differs_by_block_and_round() {
        let block = |offset, generation| {
            let mut out = vec![0; BLOCK_LEN];
            content(offset, generation, &mut out);
            out
        };
        assert_eq!(block(4096, 1), block(4096, 1));
        assert_ne!(block(4096, 1), block(8192, 1));
        assert_ne!(block(4096, 1), block(4096, 2));
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let start = cpu_seconds(None);
        let mut x = 0u64;
        while cpu_seconds(None) == start {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(cpu_seconds(Some(std::process::id())) > start && x > 0);
    }

    #[test]
    fn designs_are_named_as_their_flags() {
        for design in Design::ALL {
            assert_eq!(Design::from_name(&design.to_string()), Some(design));
        }
        assert_eq!(Design::CrcCopy.to_string(), "crc-copy");
    }
}
