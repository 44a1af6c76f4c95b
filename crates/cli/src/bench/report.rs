//! Results and how they are printed: perftest's tables, the percentile
//! block of EXPERIMENTS.md E1, CSV, or one JSON object per test.

use hdrhistogram::Histogram;
use serde::Serialize;
use softrnic::Context;

use super::account::Account;
use super::params::{Params, Test};

/// Significant figures of the latency histogram.
pub const SIGFIG: u8 = 3;

/// One size of a bandwidth test, as the JSON schema names it.
#[derive(Debug, Clone, Serialize)]
pub struct BwResult {
    pub test: &'static str,
    pub size: usize,
    pub iters: u64,
    pub qps: usize,
    pub tx_depth: usize,
    /// Work requests per post, at most (`-l`).
    pub post_list: usize,
    pub mtu: u32,
    pub bw_peak_gbps: f64,
    pub bw_avg_gbps: f64,
    pub msg_rate_mpps: f64,
    pub seconds: f64,
    /// `true` when `--verify` checked every byte, `null` without it.
    pub verified: Option<bool>,
    /// This end's request packets sent again and retransmission timer
    /// expiries since its device opened: what loss recovery cost.
    pub retransmitted: u64,
    pub timeouts: u64,
    /// This end's packets sent and received with their payload by
    /// reference: copied once, between two devices' regions on this host.
    pub by_reference: u64,
    /// Bytes this end registered for its messages (the benchmark's
    /// buffers, pinned).
    pub registered_bytes: usize,
    /// The process's peak resident memory (`VmHWM`), both ends where one
    /// process runs both: less the registered bytes, what the engines
    /// and the program hold themselves.
    pub resident_peak_bytes: Option<u64>,
    /// Where the time went (`--account`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<Account>,
}

/// The process's peak resident memory so far, from `/proc/self/status`.
pub fn resident_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?.trim();
    kib.parse::<u64>().ok().map(|k| k << 10)
}

/// One size of a latency test.
#[derive(Debug, Clone, Serialize)]
pub struct LatResult {
    pub test: &'static str,
    pub size: usize,
    pub iters: u64,
    pub mtu: u32,
    pub min_ns: f64,
    pub p5_ns: f64,
    pub p25_ns: f64,
    pub p50_ns: f64,
    pub p75_ns: f64,
    pub p95_ns: f64,
    pub p99_ns: f64,
    pub p999_ns: f64,
    pub mean_ns: f64,
    pub stddev_ns: f64,
    pub max_ns: f64,
    pub verified: Option<bool>,
    /// Where the time went (`--account`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<Account>,
    #[serde(skip)]
    pub histogram: Histogram<u64>,
}

impl LatResult {
    pub fn new(test: Test, size: usize, mtu: u32, histogram: Histogram<u64>, verified: Option<bool>) -> LatResult {
        let q = |q: f64| histogram.value_at_quantile(q) as f64;
        LatResult {
            test: test.name(),
            size,
            iters: histogram.len(),
            mtu,
            min_ns: histogram.min() as f64,
            p5_ns: q(0.05),
            p25_ns: q(0.25),
            p50_ns: q(0.50),
            p75_ns: q(0.75),
            p95_ns: q(0.95),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            mean_ns: histogram.mean(),
            stddev_ns: histogram.stdev(),
            max_ns: histogram.max() as f64,
            verified,
            account: None,
            histogram,
        }
    }
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

const RULE: &str = "---------------------------------------------------------------------------------------";

/// The banner perftest prints before the results.
pub fn banner(params: &Params, format: Format, local: &str, remote: &str, engine: &Context) {
    if format != Format::Table {
        return;
    }
    println!("{RULE}");
    println!("                    {}", params.test.title());
    let wire = match (engine.shared_memory(), engine.through_daemon_now()) {
        (false, false) => "UDP",
        (true, false) => "UDP, shared memory on this host",
        (false, true) => "UDP, through softrnicd",
        (true, true) => "UDP, shared memory on this host, through softrnicd",
    };
    println!(" Number of qps   : {:<8} Transport type : softrnic (RoCEv2 over {wire})", params.qps);
    println!(" Connection type : RC       Using SRQ      : OFF");
    println!(
        " TX depth        : {:<8} Engine threads : {} ({} progress)",
        params.tx_depth,
        engine.engine_threads(),
        engine.progress_mode()
    );
    if params.post_list > 1 {
        println!(" Post list       : {}", params.post_list);
    }
    println!(" Mtu             : {}[B]", params.mtu.bytes());
    println!(" Link type       : Ethernet");
    if let Some(d) = params.duration {
        println!(" Duration        : {:.1} s", d.as_secs_f64());
    }
    println!("{RULE}");
    println!(" local address : {local}");
    println!(" remote address: {remote}");
    println!("{RULE}");
}

/// Prints the column headers of a table (or CSV).
pub fn header(test: Test, format: Format) {
    match (format, test.is_latency()) {
        (Format::Table, false) => {
            println!(" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]")
        }
        (Format::Table, true) => println!(
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
        ),
        (Format::Csv, false) => {
            println!("test,size,iters,qps,tx_depth,mtu,bw_peak_gbps,bw_avg_gbps,msg_rate_mpps,seconds,verified")
        }
        (Format::Csv, true) => println!(
            "test,size,iters,mtu,min_ns,p5_ns,p25_ns,p50_ns,p75_ns,p95_ns,p99_ns,p999_ns,mean_ns,stddev_ns,max_ns,verified"
        ),
        (Format::Json, _) => {}
    }
}

fn verified(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "true",
        Some(false) => "false",
        None => "",
    }
}

pub fn print_bw(r: &BwResult, format: Format) {
    match format {
        Format::Table => {
            println!(
                " {:<10} {:<10}       {:<10.2}         {:<10.2}           {:.6}",
                r.size, r.iters, r.bw_peak_gbps, r.bw_avg_gbps, r.msg_rate_mpps
            );
            if let Some(account) = &r.account {
                super::account::print(account);
            }
        }
        Format::Csv => println!(
            "{},{},{},{},{},{},{:.4},{:.4},{:.6},{:.6},{}",
            r.test,
            r.size,
            r.iters,
            r.qps,
            r.tx_depth,
            r.mtu,
            r.bw_peak_gbps,
            r.bw_avg_gbps,
            r.msg_rate_mpps,
            r.seconds,
            verified(r.verified)
        ),
        Format::Json => println!("{}", serde_json::to_string(r).expect("serialisable")),
    }
}

pub fn print_lat(r: &LatResult, format: Format) {
    let us = |ns: f64| ns / 1000.0;
    match format {
        Format::Table => {
            println!(
                " {:<6} {:<10}     {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
                r.size,
                r.iters,
                us(r.min_ns),
                us(r.max_ns),
                us(r.p50_ns),
                us(r.mean_ns),
                us(r.stddev_ns),
                us(r.p99_ns),
                us(r.p999_ns)
            );
            print_percentile_block(&r.histogram);
            if let Some(account) = &r.account {
                super::account::print(account);
            }
        }
        Format::Csv => println!(
            "{},{},{},{},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.0},{:.3},{:.3},{:.0},{}",
            r.test,
            r.size,
            r.iters,
            r.mtu,
            r.min_ns,
            r.p5_ns,
            r.p25_ns,
            r.p50_ns,
            r.p75_ns,
            r.p95_ns,
            r.p99_ns,
            r.p999_ns,
            r.mean_ns,
            r.stddev_ns,
            r.max_ns,
            verified(r.verified)
        ),
        Format::Json => println!("{}", serde_json::to_string(r).expect("serialisable")),
    }
}

/// The E1 block: percentiles in ns and the HDR histogram's summary, as
/// `rdma_bench` prints it.
pub fn print_percentile_block(h: &Histogram<u64>) {
    print!("{}", softrnic_rdma_bench::report::latency(h));
}

pub fn footer(format: Format) {
    if format == Format::Table {
        println!("{RULE}");
    }
}

/// A latency histogram in nanoseconds, 1 ns to 100 s.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, SIGFIG).expect("valid bounds")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_json_has_the_documented_fields() {
        let mut h = new_histogram();
        for v in [1000u64, 2000, 3000, 4000] {
            h.record(v).unwrap();
        }
        let r = LatResult::new(Test::SendLat, 64, 4096, h, None);
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        for field in [
            "size",
            "iters",
            "p5_ns",
            "p25_ns",
            "p50_ns",
            "p75_ns",
            "p95_ns",
            "p99_ns",
            "mean_ns",
            "stddev_ns",
            "max_ns",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["iters"], 4);
        assert!((json["p50_ns"].as_f64().unwrap() - 2000.0).abs() < 5.0);
    }
}
