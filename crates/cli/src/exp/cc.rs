//! `softrnic exp e3` (also `cc`): user-defined congestion control, E3.
//! For each algorithm, built in and loaded as a WebAssembly module alike:
//! its size (source lines, module bytes), its per-event cost natively and
//! in the sandbox, and evidence that it controls the rate: an 8-to-1
//! incast at 100 Gb/s in the simulator and a 4-to-1 incast through the
//! lab's real switch between network namespaces (with --quick 2-to-1, and
//! for DCQCN and HPCC only), each with Jain's fairness, link utilisation
//! and the peak and p99 queue.
//!
//! Writes `cc_results.csv` (the table), `cc_sim_series.csv` (per flow
//! rates and the queue over time), `cc_sim_figure.svg`, and the lab's
//! `incast_results.csv`, logs and `incast_figure.svg`.

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrnic_cc::{CongestionControl, Event, IntHop};
use softrnic_cc_wasm::{WasmAlgorithm, build_module, target_installed};
use softrnic_sim::incast::{IncastConfig, IncastRun, jain};
use softrnic_transport::Choice;
use softrnic_transport::congestion::Algorithm;

use clap::Args;

use super::Common;
use super::figure::Series;
use super::incast::IncastArgs;
use super::panels::{self, Panel};

/// The algorithms `--quick` runs through the lab's switch.
const QUICK_LAB: [&str; 2] = ["dcqcn", "hpcc"];

/// DCQCN as Zhu et al. configure it, which the simulated incast runs:
/// NVIDIA's defaults converge too, over longer than the run.
const DCQCN_PAPER: &str = "rpg_time_reset=55,rpg_byte_reset=10000000,rpg_threshold=5,rpg_ai_rate=40,\
rpg_hai_rate=100,dce_tcp_rtt=55,dce_tcp_g=1020,rate_reduce_monitor_period=50";

const COLUMNS: &str = "algorithm,kind,source_lines,module_bytes,ns_per_event_native,ns_per_event_sandbox,\
sim_utilisation,sim_fairness,sim_peak_queue_kb,sim_p99_queue_kb,lab_rate_gbps,lab_fairness,lab_peak_queue_kb,lab_p99_queue_kb";

/// One row of E3: an algorithm and where its code is.
struct Algo {
    name: &'static str,
    /// Built in (its file in crates/cc/src), or a module (its crate in
    /// examples/cc).
    module: Option<&'static str>,
    /// The parameters the simulated incast gives it.
    sim_params: &'static str,
}

const ALGOS: &[Algo] = &[
    Algo { name: "none", module: None, sim_params: "" },
    Algo { name: "dcqcn", module: None, sim_params: DCQCN_PAPER },
    Algo { name: "dctcp", module: None, sim_params: "" },
    Algo { name: "timely", module: None, sim_params: "" },
    Algo { name: "hpcc", module: None, sim_params: "" },
    Algo { name: "swift", module: None, sim_params: "" },
    Algo { name: "dcqcn.wasm", module: Some("dcqcn"), sim_params: DCQCN_PAPER },
    Algo { name: "aimd.wasm", module: Some("aimd"), sim_params: "" },
];

/// The source tree this softrnic was built from.
fn source_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The flags of e3.
#[derive(Args, Debug, Clone)]
pub struct CcArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &CcArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.common.out)
        .map_err(|e| format!("cannot create {}: {e}", args.common.out.display()))?;
    let root = source_root();
    if !target_installed() {
        return Err(format!(
            "E3 builds its user modules for {}: rustup target add {}",
            softrnic_cc_wasm::TARGET,
            softrnic_cc_wasm::TARGET
        ));
    }
    // The modules, built from examples/cc.
    let mut modules = std::collections::BTreeMap::new();
    for algo in ALGOS {
        if let Some(dir) = algo.module {
            let path = build_module(&root.join("examples/cc").join(dir), &root.join("target/wasm-examples"))?;
            modules.insert(algo.name, path);
        }
    }
    let choice = |algo: &Algo, params: &str| -> Result<Option<Choice>, String> {
        match (algo.name, modules.get(algo.name)) {
            ("none", _) => Ok(None),
            (_, Some(path)) => Ok(Some(Choice(Arc::new(WasmAlgorithm::load(path, params)?)))),
            (name, None) => Choice::builtin(name, params).map(Some),
        }
    };

    // DCQCN converges over some 10 ms: even --quick runs 20.
    let duration = Duration::from_millis(if args.common.quick { 20 } else { 50 });
    println!(
        "E3 in the simulator: 8-to-1 incast at 100 Gb/s through the switch pipeline (1 µs links, 16 MB buffer, PFC, RED at HPCC's thresholds), {} ms",
        duration.as_millis()
    );
    let mut table = vec![COLUMNS.to_string()];
    let mut series_csv = String::from("algorithm,time_us,kind,flow,value\n");
    let mut queue_panel = Vec::new();
    let mut rate_panels = Vec::new();
    let mut rows = Vec::new();
    for algo in ALGOS {
        let config =
            IncastConfig { duration, settle: duration / 4, ..IncastConfig::e3(8, choice(algo, algo.sim_params)?) };
        let wall = Instant::now();
        let sim = config.run();
        println!(
            "  {:11} utilisation {:.3}, fairness {:.3}, queue peak {} KB, p99 {} KB, {} CNPs ({:.1} s)",
            algo.name,
            sim.utilisation,
            sim.fairness,
            sim.peak_queue / 1000,
            sim.p99_queue / 1000,
            sim.cnps,
            wall.elapsed().as_secs_f64()
        );
        record_series(&mut series_csv, algo.name, &sim);
        let us = |t: &Duration| t.as_secs_f64() * 1e6;
        queue_panel.push(Series {
            name: algo.name.to_string(),
            points: sim.times.iter().zip(&sim.queue_bytes).map(|(t, &q)| (us(t), q as f64 / 1000.0)).collect(),
        });
        rate_panels.push(Panel {
            x_label: "time (µs)".into(),
            y_label: format!("{} (Gb/s per flow)", algo.name),
            x_log: false,
            series: sim
                .flow_gbps
                .iter()
                .enumerate()
                .map(|(i, r)| Series {
                    name: format!("flow {}", i + 1),
                    points: sim.times.iter().map(us).zip(r.iter().copied()).collect(),
                })
                .collect(),
        });
        rows.push((algo, sim));
    }
    let mut panels_all = vec![Panel {
        x_label: "time (µs)".into(),
        y_label: "bottleneck queue (KB)".into(),
        x_log: false,
        series: queue_panel,
    }];
    panels_all.extend(rate_panels);
    let figure = args.common.out.join("cc_sim_figure.svg");
    panels::write(&figure, "E3: 8-to-1 incast at 100 Gb/s in the simulator", &panels_all)?;
    let series_path = args.common.out.join("cc_sim_series.csv");
    std::fs::write(&series_path, series_csv).map_err(|e| format!("cannot write {}: {e}", series_path.display()))?;

    // The real switch: every algorithm, HPCC with INT on UDP port 4792.
    // --quick takes two algorithms through the lab, the two whose real
    // incast the issue names (DCQCN, and HPCC with the switch's INT); the
    // simulator runs them all either way.
    let lab_names: Vec<String> = ALGOS
        .iter()
        .filter(|a| !args.common.quick || QUICK_LAB.contains(&a.name))
        .map(|a| modules.get(a.name).map_or(a.name.to_string(), |p| p.display().to_string()))
        .collect();
    let lab = match softrnic_lab::namespaces::unavailable() {
        Some(reason) if std::env::var_os("CI").is_none() => {
            println!("E3 through the lab's switch skipped: {reason}");
            Vec::new()
        }
        _ => {
            let senders = Some(if args.common.quick { 2 } else { 4 });
            let lab_args =
                IncastArgs { common: args.common.clone(), senders, cc: Vec::new(), verbs: false, rate: None };
            super::incast::run_each(&lab_args, &lab_names)?
        }
    };

    println!("E3: algorithm, size, per-event cost, simulated and real incast");
    for (algo, sim) in &rows {
        let source = source_lines(&root, algo);
        let module = modules.get(algo.name);
        let bytes = module.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
        let (native, sandbox) = per_event_cost(algo, module)?;
        let lab_run =
            lab.iter().find(|(cc, _)| cc == algo.name || module.is_some_and(|p| *cc == p.display().to_string()));
        let lab_cells = match lab_run {
            Some((_, Ok(run))) => {
                let rates = run.steady_rates();
                let (peak, p99) = run.queue_peak_p99();
                format!("{:.3},{:.3},{},{}", rates.iter().sum::<f64>(), jain(&rates), peak / 1000, p99 / 1000)
            }
            Some((_, Err(_))) => "failed,,,".to_string(),
            None => ",,,".to_string(),
        };
        let cell = |v: Option<String>| v.unwrap_or_default();
        let row = format!(
            "{},{},{},{},{},{},{:.3},{:.3},{},{},{lab_cells}",
            algo.name,
            if module.is_some() {
                "module"
            } else if algo.name == "none" {
                "-"
            } else {
                "built-in"
            },
            cell(source.map(|n| n.to_string())),
            cell(bytes.map(|n| n.to_string())),
            cell(native.map(|n| format!("{n:.1}"))),
            cell(sandbox.map(|n| format!("{n:.1}"))),
            sim.utilisation,
            sim.fairness,
            sim.peak_queue / 1000,
            sim.p99_queue / 1000,
        );
        println!("  {row}");
        table.push(row);
    }
    let path = args.common.out.join("cc_results.csv");
    std::fs::write(&path, table.join("\n") + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!(
        "E3: {} in {}, series in {}, figure {}",
        table.len() - 1,
        path.display(),
        series_path.display(),
        figure.display()
    );
    Ok(())
}

fn record_series(csv: &mut String, name: &str, sim: &IncastRun) {
    for (i, t) in sim.times.iter().enumerate() {
        let us = t.as_secs_f64() * 1e6;
        let _ = writeln!(csv, "{name},{us:.0},queue,,{}", sim.queue_bytes[i]);
        for (f, rates) in sim.flow_gbps.iter().enumerate() {
            let _ = writeln!(csv, "{name},{us:.0},rate_gbps,{},{:.3}", f + 1, rates[i]);
        }
    }
}

/// Lines of the algorithm's own code: its file among the built-ins, or its
/// example crate's source, without its tests.
fn source_lines(root: &Path, algo: &Algo) -> Option<usize> {
    let file = match algo.module {
        _ if algo.name == "none" => return None,
        Some(dir) => root.join("examples/cc").join(dir).join("src/lib.rs"),
        None => root.join("crates/cc/src").join(format!("{}.rs", algo.name)),
    };
    let text = std::fs::read_to_string(file).ok()?;
    let code = text.split("#[cfg(test)]").next().unwrap_or(&text);
    Some(code.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//")).count())
}

/// Nanoseconds per event, natively and in the sandbox, over the same
/// events (the median of five runs; `cargo bench -p softrnic-cc-wasm`
/// measures it with criterion).
fn per_event_cost(algo: &Algo, module: Option<&PathBuf>) -> Result<(Option<f64>, Option<f64>), String> {
    let path = softrnic_cc::Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };
    let native_name = algo.name.trim_end_matches(".wasm");
    let native = match softrnic_cc::Builtin::new(native_name, "") {
        Ok(builtin) => Some(time_events(builtin.build(&path))),
        Err(_) => None,
    };
    let sandbox = match module {
        Some(p) => Some(time_events(WasmAlgorithm::load(p, "")?.build(&path))),
        None => None,
    };
    Ok((native, sandbox))
}

fn time_events(mut algorithm: Box<dyn CongestionControl + Send>) -> f64 {
    static HOPS: [IntHop; 1] =
        [IntHop { rate_bps: 100_000_000_000, timestamp_ns: 7, tx_bytes: 9, queue_bytes: 1000, _reserved: 0 }];
    let events: Vec<Event> = (0..64u64)
        .map(|i| match i % 8 {
            0 | 2 | 4 | 6 => Event::Sent { bytes: 4096 },
            1 | 5 => {
                Event::Ack { acked_bytes: 8192, in_flight_bytes: 65536, rtt_ns: Some(12_000 + i), ecn_echo: i % 3 == 0 }
            }
            3 => Event::Cnp,
            _ => Event::Int { hops: &HOPS },
        })
        .collect();
    let mut now = 0u64;
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..2000 {
                for event in &events {
                    now += 300;
                    black_box(algorithm.on_event(now, black_box(event)));
                }
            }
            started.elapsed().as_nanos() as f64 / (2000.0 * events.len() as f64)
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[2]
}
