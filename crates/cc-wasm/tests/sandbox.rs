//! The sandbox: the DCQCN example module answers exactly as the native
//! DCQCN does, and hostile modules are refused at load or unloaded for
//! their QP without stalling anything.

use std::mem::offset_of;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use softrnic_cc::guest::Io;
use softrnic_cc::{CongestionControl, Dcqcn, Event, FromParams, IntHop, Params, Path};
use softrnic_cc_wasm::{MODULE_LIMIT, TABLE_LIMIT, WasmAlgorithm, build_module, target_installed};
use softrnic_transport::congestion::Algorithm;

const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };

/// Builds `examples/cc/<name>`; `None` (and a note why) where the
/// WebAssembly target is missing on a developer's machine. Under CI the
/// target is installed (`.ci/run`), and its absence fails.
fn example(name: &str) -> Option<PathBuf> {
    static TARGET: OnceLock<bool> = OnceLock::new();
    if !*TARGET.get_or_init(target_installed) {
        assert!(std::env::var_os("CI").is_none(), "CI must install the wasm32-unknown-unknown target");
        eprintln!("skipped: rustup target add wasm32-unknown-unknown to build the example modules");
        return None;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = build_module(&root.join("examples/cc").join(name), &root.join("target/wasm-examples"));
    Some(built.unwrap_or_else(|e| panic!("{e}")))
}

/// A trace with every kind of event, over a congested millisecond.
fn trace() -> Vec<(u64, Event<'static>)> {
    static HOPS: [IntHop; 2] =
        [IntHop { rate_bps: 100_000_000_000, timestamp_ns: 7, tx_bytes: 9, queue_bytes: 1000, _reserved: 0 }; 2];
    let mut events = Vec::new();
    for i in 0..2000u64 {
        let now = i * 500;
        events.push((now, Event::Sent { bytes: 4096 }));
        match i % 7 {
            0 => events.push((now + 1, Event::Cnp)),
            1 => events.push((
                now + 1,
                Event::Ack { acked_bytes: 8192, in_flight_bytes: 65536, rtt_ns: Some(12_000), ecn_echo: i % 3 == 0 },
            )),
            2 => events.push((now + 1, Event::Timer)),
            3 if i % 50 == 3 => events.push((now + 1, Event::Timeout)),
            4 if i % 40 == 4 => events.push((now + 1, Event::Nak)),
            5 => events.push((now + 1, Event::Int { hops: &HOPS })),
            _ => {}
        }
    }
    events
}

#[test]
fn the_dcqcn_module_answers_as_the_native_dcqcn_does() {
    let Some(module) = example("dcqcn") else { return };
    let params = "rpg_ai_rate=20,rpg_time_reset=100";
    let algorithm = WasmAlgorithm::load(&module, params).unwrap();
    let mut sandboxed = algorithm.build(&PATH);
    let mut native = Dcqcn::from_params(&Params::new(params), &PATH).unwrap();
    let mut cuts = 0;
    for (now, event) in trace() {
        let (a, b) = (sandboxed.on_event(now, &event), native.on_event(now, &event));
        assert_eq!(a, b, "at {now} ns after {event:?}");
        cuts += u32::from(matches!(event, Event::Cnp) && a.rate_bps < PATH.line_rate_bps);
    }
    assert!(cuts > 100, "the trace exercised the algorithm");
}

#[test]
fn a_module_written_from_scratch_loads_and_controls_the_rate() {
    let Some(module) = example("aimd") else { return };
    let mut aimd = WasmAlgorithm::load(&module, "add=1000").unwrap().build(&PATH);
    let cut = aimd.on_event(1000, &Event::Cnp);
    assert_eq!(cut.rate_bps, 50_000_000_000);
    let back = aimd.on_event(cut.timer_at_ns, &Event::Timer);
    assert_eq!(back.rate_bps, 51_000_000_000);
}

#[test]
fn bad_parameters_are_the_modules_own_one_line_error() {
    let Some(module) = example("dcqcn") else { return };
    let e = WasmAlgorithm::load(&module, "rpg_ai_rat=5").unwrap_err();
    assert!(e.ends_with("no parameter `rpg_ai_rat`; this algorithm takes rpg_time_reset, rpg_byte_reset, rpg_threshold, rpg_ai_rate, rpg_hai_rate, rpg_min_dec_fac, rpg_min_rate, rate_to_set_on_first_cnp, clamp_tgt_rate, dce_tcp_g, dce_tcp_rtt, rate_reduce_monitor_period, initial_alpha_value"), "{e}");
    assert!(!e.contains('\n'));
}

/// A module in the text format with `body` as its `softrnic_cc_on_event`
/// and `extra` beside it; its I/O block at 1024.
fn wat_module(body: &str, extra: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(module
            (memory (export "memory") 1)
            (func (export "softrnic_cc_abi") (result i32) i32.const 1)
            (func (export "softrnic_cc_io") (result i32) i32.const 1024)
            (func (export "softrnic_cc_init") (result i32) i32.const 0)
            (func (export "softrnic_cc_on_event") {body})
            {extra})"#
    ))
    .unwrap()
}

/// A module that answers `rate` with no window and no timer.
fn answering(rate: u64) -> Vec<u8> {
    let control = 1024 + offset_of!(Io, control);
    let window = control + 8;
    wat_module(&format!("i32.const {control} i64.const {rate} i64.store i32.const {window} i64.const -1 i64.store"), "")
}

/// Runs events through a hostile module's QP: each must come back at
/// once, and after the failure the QP runs the native DCQCN.
fn survives(bytes: &[u8], expected: &str) {
    let algorithm = WasmAlgorithm::from_bytes("hostile.wasm", bytes, "").expect("loads");
    let mut qp = algorithm.build(&PATH);
    let started = Instant::now();
    let first = qp.on_event(0, &Event::Sent { bytes: 4096 });
    assert!(first.check(&PATH, 0).is_ok(), "{expected}: the fallback answered {first:?}");
    // DCQCN now: a CNP cuts the rate.
    let cut = qp.on_event(1000, &Event::Cnp);
    assert!(cut.rate_bps < PATH.line_rate_bps, "{expected}: the fallback is DCQCN");
    for i in 0..1000 {
        qp.on_event(2000 + i, &Event::Sent { bytes: 4096 });
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{expected}: the engine stalled");
}

#[test]
fn a_module_that_loops_forever_runs_out_of_fuel() {
    survives(&wat_module("(loop br 0)", ""), "an infinite loop");
}

#[test]
fn a_module_that_traps_is_unloaded() {
    survives(&wat_module("unreachable", ""), "a trap");
    // Out of bounds: its memory is all it can touch.
    survives(&wat_module("i32.const 1000000 i64.const 1 i64.store", ""), "a wild store");
}

#[test]
fn nonsense_answers_unload_the_module() {
    survives(&answering(0), "a rate of 0");
    survives(&answering(PATH.line_rate_bps + 1), "a rate above the line rate");
    let sane = WasmAlgorithm::from_bytes("sane.wasm", &answering(PATH.line_rate_bps / 2), "").unwrap();
    let answer = sane.build(&PATH).on_event(0, &Event::Cnp);
    assert_eq!(answer.rate_bps, PATH.line_rate_bps / 2, "a module that answers sense is obeyed");
}

#[test]
fn modules_that_break_the_interface_are_refused_at_load() {
    let refuse = |bytes: &[u8], expected: &str| {
        let e = WasmAlgorithm::from_bytes("m.wasm", bytes, "").unwrap_err();
        assert!(e.contains(expected), "{e}");
        assert!(!e.contains('\n'), "{e}");
    };
    refuse(b"not wasm", "not a WebAssembly module");
    let importing = wat::parse_str(
        r#"(module (import "wasi_snapshot_preview1" "fd_write" (func (param i32 i32 i32 i32) (result i32))))"#,
    )
    .unwrap();
    refuse(&importing, "imports wasi_snapshot_preview1::fd_write; a congestion-control module may import nothing");
    refuse(&wat::parse_str("(module (memory (export \"memory\") 1))").unwrap(), "does not export `softrnic_cc_abi`");
    let huge = wat::parse_str(
        r#"(module
            (memory (export "memory") 100)
            (func (export "softrnic_cc_abi") (result i32) i32.const 1)
            (func (export "softrnic_cc_io") (result i32) i32.const 1024)
            (func (export "softrnic_cc_init") (result i32) i32.const 0)
            (func (export "softrnic_cc_on_event")))"#,
    )
    .unwrap();
    refuse(&huge, "cannot start");
    let old = wat::parse_str(
        r#"(module
            (memory (export "memory") 1)
            (func (export "softrnic_cc_abi") (result i32) i32.const 99)
            (func (export "softrnic_cc_io") (result i32) i32.const 1024)
            (func (export "softrnic_cc_init") (result i32) i32.const 0)
            (func (export "softrnic_cc_on_event")))"#,
    )
    .unwrap();
    refuse(&old, "speaks interface version 99");
    let wild_io = wat::parse_str(
        r#"(module
            (memory (export "memory") 1)
            (func (export "softrnic_cc_abi") (result i32) i32.const 1)
            (func (export "softrnic_cc_io") (result i32) i32.const 65000)
            (func (export "softrnic_cc_init") (result i32) i32.const 0)
            (func (export "softrnic_cc_on_event")))"#,
    )
    .unwrap();
    refuse(&wild_io, "its I/O block lies outside its memory");
}

#[test]
fn growing_memory_past_the_limit_fails_inside_the_module_only() {
    // memory.grow beyond the limit returns -1 to the module; storing there
    // then traps, and the QP falls back.
    survives(
        &wat_module("i32.const 1000 memory.grow drop i32.const 2000000 i64.const 1 i64.store", ""),
        "a memory bomb",
    );
}

/// A module past [`MODULE_LIMIT`] is not compiled, and one whose tables
/// ask for more than [`TABLE_LIMIT`] entries cannot start: what a module
/// may make the daemon or the engine allocate is bounded too.
#[test]
fn huge_modules_and_tables_are_refused() {
    let refuse = |bytes: &[u8], expected: &str| {
        let e = WasmAlgorithm::from_bytes("big.wasm", bytes, "").unwrap_err();
        assert!(e.contains(expected), "{e}");
    };
    let mut padded = wat_module("", "").to_vec();
    // A custom section of filler: a valid module, too large.
    let filler = MODULE_LIMIT;
    padded.push(0);
    let mut size = filler + 2;
    while size >= 0x80 {
        padded.push((size as u8 & 0x7f) | 0x80);
        size >>= 7;
    }
    padded.push(size as u8);
    padded.extend([1, b'x']);
    padded.resize(padded.len() + filler, 0);
    refuse(&padded, &format!("a module may have {MODULE_LIMIT} at most"));
    refuse(&wat_module("", &format!("(table {} funcref)", TABLE_LIMIT + 1)), "cannot start");
    WasmAlgorithm::from_bytes("table.wasm", &wat_module("", "(table 100 funcref)"), "").expect("a small table");
}

/// Proposals a congestion-control module has no use for are off: shared
/// memory (threads), SIMD, several memories.
#[test]
fn proposals_a_module_needs_no_are_refused() {
    for (what, extra, body) in [
        ("shared memory", "(memory 1 1 shared)", ""),
        ("SIMD", "", "v128.const i64x2 0 0 drop"),
        ("a second memory", "(memory 1)", ""),
    ] {
        let bytes = wat_module(body, extra);
        let e = WasmAlgorithm::from_bytes("m.wasm", &bytes, "").unwrap_err();
        assert!(e.contains("not a WebAssembly module softrnic can run"), "{what}: {e}");
    }
}

/// Every QP has an instance, and each reserves no more address space than
/// its memory may grow to (wasmtime's default was 4 GiB and a guard each:
/// 64 QPs reserved over 256 GiB).
#[test]
fn an_instance_reserves_only_its_memory() {
    let virtual_kib = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
    };
    let algorithm = WasmAlgorithm::from_bytes("small.wasm", &answering(PATH.line_rate_bps / 2), "").unwrap();
    let before = virtual_kib();
    let qps: Vec<_> = (0..64).map(|_| algorithm.build(&PATH)).collect();
    let grown = virtual_kib().saturating_sub(before);
    assert!(grown < 2 << 20, "64 instances reserved {} MiB", grown >> 10);
    drop(qps);
}
