//! `softrnic demo`: the sans-IO transport at work, with no sockets at all.
//! Two simulated hosts run seeded workloads (SEND, WRITE, READ, ATOMIC,
//! with and without immediate data, 0 B to MiBs) through a network that
//! drops, reorders, duplicates and corrupts packets; every byte of memory is
//! compared with what a perfect network would have produced.

use clap::Args;
use softrnic_sim::scenario::{self, Limits, Network};

#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// First seed of the run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many seeded scenarios to run.
    #[arg(long, default_value_t = 20)]
    pub runs: u64,
    /// Largest probability of each fault (loss, reordering, duplication,
    /// corruption), from 0 to 1.
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    pub faults: f64,
}

fn probability(text: &str) -> Result<f64, String> {
    let p: f64 = text.parse().map_err(|_| format!("`{text}` is not a number; give a probability such as 0.01"))?;
    if (0.0..=1.0).contains(&p) { Ok(p) } else { Err(format!("{p} is not a probability; use a value from 0 to 1")) }
}

pub fn run(args: &DemoArgs) -> Result<(), String> {
    let limits = Limits { max_fault: args.faults, ..Limits::default() };
    println!("softrnic demo: {} seeded runs, faults up to {:.0}% each\n", args.runs, args.faults * 100.0);
    println!(
        "{:>6} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>11}",
        "seed", "packets", "dropped", "corrupted", "resent", "NAKs", "RNR", "virtual ms"
    );
    let started = std::time::Instant::now();
    let mut packets = 0;
    for seed in args.seed..args.seed + args.runs {
        let outcome = scenario::run(seed, limits)
            .map_err(|failure| format!("{failure}\nreplay it with: {}", Network::Hostile.replay(seed)))?;
        packets += outcome.network.sent;
        println!(
            "{:>6} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>11.3}",
            seed,
            outcome.network.sent,
            outcome.network.dropped,
            outcome.network.corrupted,
            outcome.retransmitted,
            outcome.seq_naks,
            outcome.rnr_naks,
            outcome.virtual_time.as_secs_f64() * 1e3
        );
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "\nall {} runs verified: every work request completed once, in order, and memory matches a perfect network",
        args.runs
    );
    println!(
        "{packets} packets through the transport in {secs:.2} s ({:.2} M packets/s of protocol processing)",
        packets as f64 / secs / 1e6
    );
    Ok(())
}
