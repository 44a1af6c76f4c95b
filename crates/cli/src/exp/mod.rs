//! `softrnic exp NAME`: the evaluations as commands (E8). Each experiment
//! runs its own roles as processes, and writes
//!
//! ```text
//! results/<exp>_results.csv    a row per measurement (kept as it goes)
//! results/<exp>_logs/          one log per role per point
//! results/<exp>_figure.svg     one line per configuration, references beside
//! ```
//!
//! [`Experiment`] is the one table of them, in the way cargo lists its
//! commands: each entry names the experiment (its number and a name),
//! its help, and its own flags, parsed by clap; each experiment's file has
//! its arguments and its `run`. A flag an experiment does not honour is
//! refused by the parser, and both `softrnic exp` and `softrnic exp
//! --help` list what the table holds.

mod aggregation;
mod applications;
mod cc;
mod daemon;
mod fct;
mod figure;
mod hosts;
mod incast;
mod listening;
mod namespace;
mod offload;
mod panels;
mod roles;
mod storage;
mod sweep;
mod sweeps;
mod vm;

use std::path::PathBuf;

use clap::{Args, Subcommand};

pub(crate) use roles::stop as stop_child;

/// `softrnic exp`: one experiment, or none to list them.
#[derive(Args, Debug)]
pub struct ExpArgs {
    #[command(subcommand)]
    experiment: Option<Experiment>,
}

/// Every experiment, with its own flags. The doc comment's first line is
/// the experiment's line in the listing.
#[derive(Subcommand, Debug)]
enum Experiment {
    /// Round trips of 1 KiB messages, one outstanding (rdma_bench -outstanding 1), beside raw UDP
    #[command(name = "e1", visible_alias = "latency")]
    E1(sweep::SweepArgs),
    /// rdma_bench throughput over packet sizes, QPs and engine threads (48 outstanding)
    #[command(name = "e2", visible_alias = "throughput")]
    E2(sweep::SweepArgs),
    /// Congestion control, built in and user modules: size, cost, incasts (simulated and through the lab's switch)
    #[command(name = "e3", visible_alias = "cc")]
    E3(cc::CcArgs),
    /// The offloaded stack's transmit designs: engine copy, bulk copy, header-only (softrnicd --tx)
    #[command(name = "e4", visible_alias = "offload-tx")]
    E4(offload::OffloadArgs),
    /// Its receive designs: direct, per-connection buffers, an in-cache pool (softrnicd --rx)
    #[command(name = "e5", visible_alias = "offload-rx")]
    E5(offload::OffloadArgs),
    /// 2 KiB over 1..8 connections: the offloaded stack, plain RDMA, a Snap-like stack, TCP
    #[command(name = "e6", visible_alias = "stacks")]
    E6(offload::OffloadArgs),
    /// 4 KiB block storage with a CRC each: CPU-only, CRC offloaded, CRC and copy offloaded to softrnicd, TCP
    #[command(name = "e7", visible_alias = "storage")]
    E7(storage::StorageArgs),
    /// Throughput the careful way: softrnic SEND and WRITE (UDP, shared memory) beside a TCP socket
    #[command(name = "e9", visible_alias = "careful")]
    E9(sweep::SweepArgs),
    /// In-network aggregation shared by two jobs, one straggling (the lab's switch, needs root; and the simulator)
    #[command(name = "e10", visible_alias = "aggregation")]
    E10(aggregation::AggregationArgs),
    /// perftest through softrnicd, against the host and the forwarding design; --vm: in QEMU guests
    #[command(name = "e11", visible_alias = "containers")]
    E11(daemon::E11Args),
    /// 2 to 128 pairs of ib_write_bw through one softrnicd, and forwarded
    #[command(name = "e12", visible_alias = "scalability")]
    E12(daemon::E12Args),
    /// N senders to one receiver through the lab's switch (needs root)
    Incast(incast::IncastArgs),
    /// Flow completion times on HPCC's fat tree, in the simulator
    #[command(visible_alias = "fattree")]
    Fct(fct::FctArgs),
    /// Graph 500 BFS and SSSP over MPI and a GroupBy/SortBy shuffle, 16 processes on two hosts, beside TCP (needs root)
    #[command(name = "e13", visible_alias = "applications")]
    E13(applications::ApplicationsArgs),
}

/// E8, which is what every command here does.
pub(crate) const NOT_COMMANDS: &str = "\
E8 (automation) is how each command above runs: its sweep, every role stopped when done, a CSV, logs, a figure.
";

/// The flags every experiment takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// A small sweep (for CI and a first look).
    #[arg(long)]
    pub quick: bool,
    /// Where the CSV, the logs and the figure go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
}

/// `--runs`, for the experiments that measure each point several times.
#[derive(Args, Debug, Clone)]
pub struct Runs {
    /// Measure every point this many times and keep each value's median
    /// (shared machines are noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub runs: u32,
}

pub fn run(args: ExpArgs) -> Result<(), String> {
    let Some(experiment) = args.experiment else {
        print!("{}", listing());
        return Ok(());
    };
    match experiment {
        Experiment::E1(args) => sweep::run(&sweeps::E1, &args),
        Experiment::E2(args) => sweep::run(&sweeps::E2, &args),
        Experiment::E3(args) => cc::run(&args),
        Experiment::E4(args) => offload::e4(&args),
        Experiment::E5(args) => offload::e5(&args),
        Experiment::E6(args) => offload::e6(&args),
        Experiment::E7(args) => storage::run(&args),
        Experiment::E9(args) => sweep::run(&sweeps::E9, &args),
        Experiment::E10(args) => aggregation::run(&args),
        Experiment::E11(args) if args.vm => vm::run(&args),
        Experiment::E11(args) => daemon::e11(&args),
        Experiment::E12(args) => daemon::e12(&args),
        Experiment::Incast(args) => incast::run(&args),
        Experiment::Fct(args) => fct::run(&args),
        Experiment::E13(args) => applications::run(&args),
    }
}

/// `softrnic exp` alone: a line per experiment, read from the table.
fn listing() -> String {
    let exp = Experiment::augment_subcommands(clap::Command::new("exp"));
    let mut text = String::from(
        "Experiments (softrnic exp NAME [--quick] [--out DIR]; softrnic exp NAME --help for its flags):\n",
    );
    for e in exp.get_subcommands().filter(|e| e.get_name() != "help" && !e.is_hide_set()) {
        let aliases: Vec<&str> = e.get_visible_aliases().collect();
        let about = e.get_about().map(|a| a.to_string()).unwrap_or_default();
        text.push_str(&format!("  {:6} {:12} {about}\n", e.get_name(), aliases.join(",")));
    }
    text.push_str(NOT_COMMANDS);
    text
}

/// The median of `items` by `key`: the lower middle for an even count, so
/// that what is reported was measured.
pub(crate) fn median_by<T>(mut items: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    items.sort_by(|a, b| key(a).total_cmp(&key(b)));
    Some(items.swap_remove((items.len() - 1) / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_a_measured_value() {
        assert_eq!(median_by(vec![3.0, 1.0, 2.0], |v| *v), Some(2.0));
        assert_eq!(median_by(vec![4.0, 1.0, 3.0, 2.0], |v| *v), Some(2.0));
        assert_eq!(median_by(Vec::<f64>::new(), |v| *v), None);
    }

    #[test]
    fn the_listing_names_every_experiment_once() {
        let text = listing();
        for id in ["e1", "e2", "e3", "e4", "e5", "e6", "e7", "e9", "e10", "e11", "e12", "e13", "incast", "fct"] {
            let lines = text.lines().filter(|l| l.split_whitespace().next() == Some(id)).count();
            assert_eq!(lines, 1, "{id} in\n{text}");
        }
        assert!(text.contains("careful") && text.contains("fattree") && text.contains("applications"), "{text}");
        assert!(!text.contains("Not a command yet"), "{text}");
    }
}
