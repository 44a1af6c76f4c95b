//! `softrnic exp fct`: flow completion times on HPCC's 320-server fat tree,
//! in the simulator, with softrnic's own transport and switch pipeline
//! (`softrnic_sim::fct`). Writes `fct_results.csv` (a row per flow),
//! `fct_summary.csv` (slowdown at p50, p95 and p99 per flow-size bucket, as
//! HPCC's `fct_analysis.py` reports it) and `fct_figure.svg`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use softrnic_sim::fct::{FatTree, FctConfig, FctRun, Workload, buckets};

use clap::Args;

use super::Common;
use super::figure::Series;
use super::panels::{self, Panel};

/// The flags of `exp fct`.
#[derive(Args, Debug, Clone)]
pub struct FctArgs {
    #[command(flatten)]
    pub common: Common,
    /// The congestion controls to compare: none, dcqcn, dctcp, timely,
    /// hpcc, swift.
    #[arg(long, value_delimiter = ',')]
    pub cc: Vec<String>,
    /// The flow-size distributions (websearch, hadoop).
    #[arg(long, value_delimiter = ',')]
    pub workload: Vec<String>,
    /// The offered loads, as fractions of a link (default 0.3).
    #[arg(long, value_delimiter = ',')]
    pub load: Vec<f64>,
    /// Divide HPCC's link rates and buffers by this (10: 10 and 40 Gb/s),
    /// so that a window of simulated time runs in minutes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub scale: u64,
}

pub fn run(args: &FctArgs) -> Result<(), String> {
    let ccs = if args.cc.is_empty() { vec!["none".to_string()] } else { args.cc.clone() };
    let mut algorithms = Vec::new();
    for cc in &ccs {
        let choice = match cc.as_str() {
            "none" => None,
            name => Some(softrnic_transport::Choice::builtin(name, "").map_err(|e| format!("--cc {cc}: {e}"))?),
        };
        algorithms.push((cc.clone(), choice));
    }
    let workloads = match args.workload.as_slice() {
        [] => vec![Workload::WebSearch],
        names => names.iter().map(|n| Workload::parse(n)).collect::<Result<_, _>>()?,
    };
    let loads = match args.load.as_slice() {
        [] => vec![0.3],
        loads => loads.to_vec(),
    };
    if let Some(bad) = loads.iter().find(|l| !(0.01..=0.95).contains(*l)) {
        return Err(format!(
            "--load {bad}: give the offered load as a fraction of a link, from 0.01 to 0.95 (HPCC uses 0.3 and 0.5)"
        ));
    }
    let scale = args.scale;
    let window = Duration::from_micros(if args.common.quick { 1_000 } else { 5_000 });
    std::fs::create_dir_all(&args.common.out)
        .map_err(|e| format!("cannot create {}: {e}", args.common.out.display()))?;
    let mut flows_csv = String::from("cc,workload,load,src,dst,size_bytes,start_us,fct_us,ideal_us,slowdown\n");
    let mut summary_csv = String::from("cc,workload,load,max_size_bytes,flows,p50,p95,p99\n");
    let mut percentiles: [Vec<Series>; 3] = Default::default();
    let tree = FatTree::hpcc(scale);
    println!(
        "fat tree: {} servers at {} Gb/s, {} switches, fabric links {} Gb/s (HPCC's rates / {scale}); flows start within {:?} of simulated time",
        tree.hosts(),
        tree.host_rate_bps as f64 / 1e9,
        tree.graph().switches,
        tree.fabric_rate_bps as f64 / 1e9,
        window
    );
    for (cc, algorithm) in &algorithms {
        for &workload in &workloads {
            for &load in &loads {
                let config = FctConfig {
                    tree,
                    workload,
                    load,
                    window,
                    limit: window * 40,
                    seed: 1,
                    algorithm: algorithm.clone(),
                };
                let wall = Instant::now();
                let run = config.run();
                let wall = wall.elapsed();
                println!("{cc}: {}", report(workload, load, &run, wall));
                for f in &run.flows {
                    let Some(fct) = f.fct else { continue };
                    let _ = writeln!(
                        flows_csv,
                        "{cc},{},{load},{},{},{},{:.3},{:.3},{:.3},{:.4}",
                        workload.name(),
                        f.src,
                        f.dst,
                        f.size,
                        f.start.as_secs_f64() * 1e6,
                        fct.as_secs_f64() * 1e6,
                        f.ideal.as_secs_f64() * 1e6,
                        f.slowdown().unwrap_or(0.0)
                    );
                }
                let name = format!("{cc} {} load {load}", workload.name());
                let mut points: [Vec<(f64, f64)>; 3] = Default::default();
                for b in buckets(workload, &run.flows) {
                    let _ = writeln!(
                        summary_csv,
                        "{cc},{},{load},{},{},{:.3},{:.3},{:.3}",
                        workload.name(),
                        b.max_size,
                        b.flows,
                        b.p50,
                        b.p95,
                        b.p99
                    );
                    for (i, p) in [b.p50, b.p95, b.p99].into_iter().enumerate() {
                        points[i].push((b.max_size as f64, p));
                    }
                }
                for (i, points) in points.into_iter().enumerate() {
                    percentiles[i].push(Series { name: name.clone(), points });
                }
            }
        }
    }
    let write = |name: &str, text: &str| {
        let path = args.common.out.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("fct_results.csv", &flows_csv)?;
    write("fct_summary.csv", &summary_csv)?;
    let [p50, p95, p99] = percentiles;
    let panel = |label: &str, series| Panel {
        x_label: "flow size (bytes, bucket's upper bound)".into(),
        y_label: format!("FCT slowdown, {label}"),
        x_log: true,
        series,
    };
    let figure = args.common.out.join("fct_figure.svg");
    panels::write(
        &figure,
        &format!("FCT slowdown on HPCC's fat tree ({} servers, rates / {scale})", tree.hosts()),
        &[panel("p50", p50), panel("p95", p95), panel("p99", p99)],
    )?;
    println!("fct: fct_results.csv and fct_summary.csv in {}", args.common.out.display());
    println!("figure {}", figure.display());
    Ok(())
}

/// One line per run: what happened and how fast the simulator went.
fn report(workload: Workload, load: f64, run: &FctRun, wall: Duration) -> String {
    let finished = run.flows.iter().filter(|f| f.fct.is_some()).count();
    let mut slowdowns: Vec<f64> = run.flows.iter().filter_map(|f| f.slowdown()).collect();
    slowdowns.sort_by(f64::total_cmp);
    let at = |p: f64| slowdowns.get(((slowdowns.len().max(1) - 1) as f64 * p) as usize).copied().unwrap_or(0.0);
    format!(
        "{} load {load}: {finished} of {} flows finished, slowdown p50 {:.2} p95 {:.2} p99 {:.2}; {} datagrams, {} dropped; {:.1} ms simulated in {:.1} s ({:.0} datagrams per wall second, {:.0}x slower than real time)",
        workload.name(),
        run.flows.len(),
        at(0.5),
        at(0.95),
        at(0.99),
        run.packets,
        run.dropped,
        run.simulated.as_secs_f64() * 1e3,
        wall.as_secs_f64(),
        run.packets as f64 / wall.as_secs_f64(),
        wall.as_secs_f64() / run.simulated.as_secs_f64().max(1e-9),
    )
}
