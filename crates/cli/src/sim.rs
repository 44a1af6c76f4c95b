//! `softrnic sim`: the simulator on seeds nobody has tried, for as long as
//! it is given. CI proves the same 2000 seeds on every landing; this finds
//! the next failing one, the way TigerBeetle's VOPR runs around the clock.
//! Each seed is a whole scenario (`softrnic_sim::scenario`): a random
//! workload over a hostile network, checked against the oracle. Every
//! failure is printed as it is found, with the line that replays it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use signal_hook::consts::SIGINT;
use signal_hook::flag;
use softrnic_sim::scenario::{self, Network};

#[derive(Args, Debug, Clone)]
pub struct SimArgs {
    /// How long to run (90s, 10m, 8h); with --seeds, whichever ends first.
    #[arg(long = "for", value_parser = duration)]
    pub duration: Option<Duration>,
    /// Seeds to run over each network [default: 1000, or no limit with --for].
    #[arg(long)]
    pub seeds: Option<u64>,
    /// The first seed [default: drawn at random, so that each run tries
    /// seeds no run has tried].
    #[arg(long)]
    pub first: Option<u64>,
    /// The networks: hostile (one faulty link), switched (two switches),
    /// one_host (two devices of one machine, payloads by reference) or all.
    #[arg(long, default_value = "all", value_parser = networks)]
    pub network: Networks,
    /// Threads running seeds [default: one per CPU].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run this one seed and print what it did.
    #[arg(long, conflicts_with_all = ["duration", "seeds", "first", "threads"])]
    pub seed: Option<u64>,
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); give one such as 90s, 10m or 8h"))
}

/// The networks `--network` names.
#[derive(Debug, Clone)]
pub struct Networks(Vec<Network>);

fn networks(text: &str) -> Result<Networks, String> {
    match text {
        "all" => Ok(Networks(Network::ALL.to_vec())),
        name => Network::parse(name).map(|n| Networks(vec![n])).map_err(|e| format!("{e}, or all")),
    }
}

/// A seed that failed: over which network, and what the oracle said.
struct Failure {
    network: Network,
    seed: u64,
    verdict: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FAILED {} seed {}: {}\n  replay: {}",
            self.network.name(),
            self.seed,
            self.verdict,
            self.network.replay(self.seed)
        )
    }
}

pub fn run(args: &SimArgs) -> Result<(), String> {
    let networks = &args.network.0;
    if let Some(seed) = args.seed {
        return replay(seed, networks);
    }
    let seeds = match (args.seeds, args.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) => 1000,
    };
    if seeds == 0 {
        return Err("--seeds 0 runs nothing; give at least 1".into());
    }
    // Far from the seeds the tests run (0 and up), and short enough to type.
    let first = args.first.unwrap_or_else(|| fastrand::u64(1_000_000..1_000_000_000_000));
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err("--threads 0 runs nothing; give at least 1".into());
    }
    let deadline = args.duration.map(|d| Instant::now() + d);
    let names: Vec<&str> = networks.iter().map(|n| n.name()).collect();
    let until = match (args.seeds, args.duration) {
        (_, Some(d)) if seeds == u64::MAX => format!("for {}", humantime::format_duration(d)),
        (_, Some(d)) => format!("{seeds} seeds or {}, whichever ends first", humantime::format_duration(d)),
        _ => format!("{seeds} seeds"),
    };
    let over = match names.as_slice() {
        [one] => format!("the {one} network"),
        [most @ .., last] => format!("the {} and {last} networks", most.join(", ")),
        [] => unreachable!("--network names at least one"),
    };
    println!("softrnic sim: seeds from {first} over {over}, {until}, {threads} thread(s)");

    let started = Instant::now();
    let report = hunt(first, seeds, networks, threads, deadline)?;
    let elapsed = started.elapsed();
    println!(
        "{} seeds ({}..{}) over {over} in {}: {} failed",
        report.tried,
        first,
        first.wrapping_add(report.tried),
        humantime::format_duration(Duration::from_secs(elapsed.as_secs())),
        report.failures.len()
    );
    if report.failures.is_empty() {
        Ok(())
    } else {
        Err(format!("{} failing seed(s), each above with its replay line", report.failures.len()))
    }
}

/// What a hunt found.
struct Report {
    /// Seeds finished over every network.
    tried: u64,
    failures: Vec<Failure>,
}

/// Runs seeds `first..first + seeds` over each of `networks` on `threads`
/// threads, until they are done or `deadline` passes; prints each failure
/// as it is found.
fn hunt(
    first: u64,
    seeds: u64,
    networks: &[Network],
    threads: usize,
    deadline: Option<Instant>,
) -> Result<Report, String> {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} {pos} seeds, {msg}").expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(250));
    bar.set_message("0 failed");
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    // Ctrl-C ends the hunt once the seeds running finish, with its report;
    // a second one ends the program.
    let stop = Arc::new(AtomicBool::new(false));
    let interrupt =
        [flag::register_conditional_shutdown(SIGINT, 130, stop.clone()), flag::register(SIGINT, stop.clone())]
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("cannot catch Ctrl-C: {e}"))?;
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= seeds {
                        return;
                    }
                    let seed = first.wrapping_add(i);
                    for &network in networks {
                        if let Err(verdict) = scenario::judge(seed, network) {
                            let failure = Failure { network, seed, verdict };
                            // Printed whether or not the bar is drawn (it is not in CI's log).
                            bar.suspend(|| println!("{failure}"));
                            let mut failures = failures.lock().unwrap_or_else(|e| e.into_inner());
                            failures.push(failure);
                            bar.set_message(format!("{} failed", failures.len()));
                        }
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    bar.inc(1);
                }
            });
        }
    });
    for id in interrupt {
        signal_hook::low_level::unregister(id);
    }
    bar.finish_and_clear();
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|f| (f.seed, f.network.name()));
    Ok(Report { tried: done.load(Ordering::Relaxed), failures })
}

/// Runs `seed` over each network and prints what it did.
fn replay(seed: u64, networks: &[Network]) -> Result<(), String> {
    let mut failed = 0;
    for &network in networks {
        let started = Instant::now();
        match scenario::judge(seed, network) {
            Ok(outcome) => println!(
                "{} seed {seed}: passed in {:.2?} ({:.3} ms simulated): {} packets sent, {} dropped, {} retransmitted, {} timeouts",
                network.name(),
                started.elapsed(),
                outcome.virtual_time.as_secs_f64() * 1e3,
                outcome.network.sent,
                outcome.network.dropped,
                outcome.retransmitted,
                outcome.timeouts
            ),
            Err(verdict) => {
                failed += 1;
                println!("{}", Failure { network, seed, verdict });
            }
        }
    }
    if failed == 0 { Ok(()) } else { Err(format!("seed {seed} failed over {failed} network(s)")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_says_how_to_replay_it() {
        let failure = Failure { network: Network::Switched, seed: 42, verdict: "pair 0 side 1: ...".into() };
        assert_eq!(
            failure.to_string(),
            "FAILED switched seed 42: pair 0 side 1: ...\n  replay: SOFTRNIC_SIM_SEED=42 cargo test --release -p softrnic-sim --test simulation switched"
        );
    }
}
