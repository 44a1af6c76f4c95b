//! Runs one simulation seed and prints what happened: `cargo run -p
//! softrnic-sim --example seed -- SEED [MAX_FAULT]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut limits = softrnic_sim::scenario::Limits::default();
    if let Some(f) = args.next().and_then(|s| s.parse().ok()) {
        limits.max_fault = f;
    }
    if let Some(steps) = args.next().and_then(|s| s.parse().ok()) {
        limits.max_steps = steps;
    }
    let start = std::time::Instant::now();
    let result = softrnic_sim::scenario::run(seed, limits);
    println!("seed {seed}: {:?} in {:?}", result, start.elapsed());
}
