//! The cost of one congestion-control event: every built-in natively, and
//! the DCQCN module in the sandbox against the same DCQCN natively (E3's
//! "per-event cost", target: the sandbox within 5x of native).
//!
//! `cargo bench -p softrnic-cc-wasm --bench per_event`; the module needs
//! the wasm32-unknown-unknown target.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{Criterion, criterion_group, criterion_main};
use softrnic_cc::{Builtin, CongestionControl, Event, IntHop, Path};
use softrnic_cc_wasm::{WasmAlgorithm, build_module};
use softrnic_transport::congestion::Algorithm;

const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };
static HOPS: [IntHop; 1] =
    [IntHop { rate_bps: 100_000_000_000, timestamp_ns: 7, tx_bytes: 9, queue_bytes: 1000, _reserved: 0 }];

/// A mix of events as a congested QP sees them: mostly packets sent and
/// ACKs, some CNPs, INT and timers.
fn events() -> Vec<Event<'static>> {
    (0..64)
        .map(|i| match i % 8 {
            0 | 2 | 4 | 6 => Event::Sent { bytes: 4096 },
            1 | 5 => {
                Event::Ack { acked_bytes: 8192, in_flight_bytes: 65536, rtt_ns: Some(12_000 + i), ecn_echo: i % 3 == 0 }
            }
            3 => Event::Cnp,
            _ => Event::Int { hops: &HOPS },
        })
        .collect()
}

/// Runs `events` through `algorithm` once per iteration, per event.
fn bench(c: &mut Criterion, name: &str, mut algorithm: Box<dyn CongestionControl + Send>) {
    let events = events();
    let mut now = 0u64;
    c.bench_function(name, |b| {
        b.iter(|| {
            for event in &events {
                now += 300;
                black_box(algorithm.on_event(now, black_box(event)));
            }
        })
    });
}

fn per_event(c: &mut Criterion) {
    for name in softrnic_cc::BUILTINS {
        bench(c, &format!("native/{name} (64 events)"), Builtin::new(name, "").unwrap().build(&PATH));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    match build_module(&root.join("examples/cc/dcqcn"), &root.join("target/wasm-examples")) {
        Ok(module) => {
            let algorithm = WasmAlgorithm::load(&module, "").unwrap();
            bench(c, "sandbox/dcqcn (64 events)", algorithm.build(&PATH));
        }
        Err(e) => eprintln!("the sandboxed DCQCN is not measured: {e}"),
    }
}

criterion_group!(benches, per_event);
criterion_main!(benches);
