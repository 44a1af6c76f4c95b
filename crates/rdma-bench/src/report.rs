//! The output lines, as libr's `rdma_bench` prints them: a throughput line
//! per thread, and with one request outstanding the latency percentiles
//! and HdrHistogram's summary.

use std::time::Duration;

use hdrhistogram::Histogram;

/// The receiver's line for a thread whose data all verified.
pub fn verified(thread: u32, duration: Duration, bytes: u64) -> String {
    format!(
        "Data verification success, thread [{thread}], duration [{:.6}]s, throughput [{:.6}] Gbps",
        duration.as_secs_f64(),
        gbps(bytes, duration)
    )
}

/// The receiver's line for a thread when the client asked for no
/// verification (`-noVerify`), as the offloaded stack's receive
/// experiment (E5) prints it.
pub fn received(thread: u32, duration: Duration, bytes: u64) -> String {
    format!(
        "Receive done, thread [{thread}], duration [{:.6}]s, recv speed [{:.6}] Gbps",
        duration.as_secs_f64(),
        gbps(bytes, duration)
    )
}

/// The sender's line for a thread.
pub fn sent(thread: u32, duration: Duration, bytes: u64) -> String {
    format!(
        "Send done, thread [{thread}], duration [{:.6}]s, throughput [{:.6}] Gbps",
        duration.as_secs_f64(),
        gbps(bytes, duration)
    )
}

/// Which end printed a per-thread line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `Send done`: the client.
    Sent,
    /// `Data verification success`: the server, data checked.
    Verified,
    /// `Receive done`: the server, data not checked (`-noVerify`).
    Received,
}

/// A per-thread line, read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThreadLine {
    pub end: End,
    pub thread: u32,
    pub seconds: f64,
    pub gbps: f64,
}

impl ThreadLine {
    /// Reads one of the lines above; `None` for any other line. The
    /// seeds' `Gpbs` misspelling reads too.
    pub fn parse(line: &str) -> Option<ThreadLine> {
        let end = [
            ("Send done, ", End::Sent),
            ("Data verification success, ", End::Verified),
            ("Receive done, ", End::Received),
        ]
        .into_iter()
        .find_map(|(prefix, end)| line.starts_with(prefix).then_some(end))?;
        let between = |open: &str| line.split(open).nth(1)?.split(']').next();
        Some(ThreadLine {
            end,
            thread: between("thread [")?.parse().ok()?,
            seconds: between("duration [")?.parse().ok()?,
            gbps: between("throughput [").or_else(|| between("recv speed ["))?.parse().ok()?,
        })
    }

    /// The seed's own spelling of the line, without the end's prefix
    /// (`thread [1], duration [2.842365]s, throughput [18.025908] Gbps`).
    pub fn seed_line(&self) -> String {
        let rate = if self.end == End::Received { "recv speed" } else { "throughput" };
        format!("thread [{}], duration [{:.6}]s, {rate} [{:.6}] Gbps", self.thread, self.seconds, self.gbps)
    }
}

pub fn gbps(bytes: u64, duration: Duration) -> f64 {
    bytes as f64 * 8.0 / duration.as_secs_f64().max(1e-9) / 1e9
}

/// A latency histogram in nanoseconds, three significant digits (2048
/// sub-buckets), growing to the largest value recorded, as HdrHistogram
/// records it (so `Buckets` tells the range, as in the seed's output).
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is valid")
}

/// The percentile lines and HdrHistogram's summary.
pub fn latency(h: &Histogram<u64>) -> String {
    let quantiles = [0.05, 0.25, 0.50, 0.75, 0.95].map(|q| h.value_at_quantile(q));
    let sub_buckets = (2 * 10u64.pow(h.sigfig() as u32)).next_power_of_two();
    percentiles(quantiles) + &summary(h.mean(), h.stdev(), h.max() as f64, h.len(), h.buckets(), sub_buckets)
}

/// The 5th, 25th, 50th, 75th and 95th percentile lines.
fn percentiles(values: [u64; 5]) -> String {
    let names = ["5th percentile", "25th percentile", "50th percentile (median)", "75th percentile", "95th percentile"];
    names.iter().zip(values).map(|(name, v)| format!("{name}: {v} ns\n")).collect()
}

/// HdrHistogram's summary block (its `outputPercentileDistribution`
/// footer, without the `#`).
fn summary(mean: f64, stdev: f64, max: f64, count: u64, buckets: u8, sub_buckets: u64) -> String {
    format!(
        "[Mean    = {mean:12.3}, StdDeviation   = {stdev:12.3}]\n\
         [Max     = {max:12.3}, Total count    = {count:12}]\n\
         [Buckets = {buckets:12}, SubBuckets     = {sub_buckets:12}]\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's own output (E1 in ../shared/EXPERIMENTS.md).
    const SEED_BLOCK: &str = "\
5th percentile: 3096 ns
25th percentile: 3168 ns
50th percentile (median): 3168 ns
75th percentile: 3168 ns
95th percentile: 3168 ns
[Mean    =     3231.062, StdDeviation   =      548.675]
[Max     =   241663.955, Total count    =       512000]
[Buckets =            7, SubBuckets     =         2048]
";

    #[test]
    fn lines_read_as_libr_prints_them() {
        let line = verified(0, Duration::from_micros(188_152), 32_749_568);
        assert_eq!(line, "Data verification success, thread [0], duration [0.188152]s, throughput [1.392473] Gbps");
        let block =
            percentiles([3096, 3168, 3168, 3168, 3168]) + &summary(3231.062, 548.675, 241_663.955, 512_000, 7, 2048);
        assert_eq!(block, SEED_BLOCK);
    }

    #[test]
    fn thread_lines_read_back() {
        // The seeds' E4 and E5 lines, with the ends' prefixes.
        let line = "Send done, thread [1], duration [2.842365]s, throughput [18.025908] Gbps";
        let sent = ThreadLine::parse(line).unwrap();
        assert_eq!((sent.end, sent.thread, sent.seconds, sent.gbps), (End::Sent, 1, 2.842365, 18.025908));
        assert_eq!(sent.seed_line(), line.strip_prefix("Send done, ").unwrap());
        let line = "Receive done, thread [2], duration [2.632949]s, recv speed [50.976189] Gbps";
        assert_eq!(ThreadLine::parse(line).unwrap().seed_line(), line.strip_prefix("Receive done, ").unwrap());
        let printed = ThreadLine::parse(&received(3, Duration::from_secs(2), 1_000_000_000)).unwrap();
        assert_eq!((printed.end, printed.thread, printed.gbps), (End::Received, 3, 4.0));
        let seed = "Data verification success, thread [0], duration [0.1]s, throughput [0.5] Gpbs";
        assert_eq!(ThreadLine::parse(seed).map(|l| (l.end, l.gbps)), Some((End::Verified, 0.5)));
        assert_eq!(ThreadLine::parse("rdma_bench server on softrnic0: ..."), None);
    }

    #[test]
    fn a_histogram_reports_its_range_as_hdrhistogram_does() {
        let mut h = histogram();
        for v in [3096, 3168, 3168, 3168, 241_663] {
            h.record(v).unwrap();
        }
        let block = latency(&h);
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines.len(), 8);
        assert_eq!(lines[2], format!("50th percentile (median): {} ns", h.value_at_quantile(0.5)));
        // Recorded from 1 ns, 241663 ns takes 8 buckets of 2048 (the seed's
        // histogram counted 7 from its own lowest value).
        assert_eq!(lines[7], "[Buckets =            8, SubBuckets     =         2048]");
        assert!(lines[6].ends_with("Total count    =            5]"), "{}", lines[6]);
    }
}
