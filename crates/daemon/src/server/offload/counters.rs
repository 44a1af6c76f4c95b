//! What the offload designs copied, counted as they copy: the engine's
//! memory traffic as far as a machine without hardware counters (a VM)
//! lets it be measured. softrnicd prints the totals when it stops, and
//! `softrnic exp e4`/`e5` read that line back.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the designs copied, shared by every stage of the daemon.
#[derive(Debug, Default)]
pub struct OffloadCounters {
    tx_copied_bytes: AtomicU64,
    tx_staged: AtomicU64,
    tx_passed: AtomicU64,
    rx_copied_bytes: AtomicU64,
    rx_staged: AtomicU64,
    rx_passed: AtomicU64,
    staging_bytes: AtomicU64,
    staging_peak: AtomicU64,
}

/// A snapshot of [`OffloadCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Payload bytes the transmit design copied, and the sends it copied.
    pub tx_copied_bytes: u64,
    pub tx_staged: u64,
    /// Sends a copying design let through as they were.
    pub tx_passed: u64,
    /// The same for receives.
    pub rx_copied_bytes: u64,
    pub rx_staged: u64,
    pub rx_passed: u64,
    /// Staging memory held now, and the most held at once.
    pub staging_bytes: u64,
    pub staging_peak: u64,
}

impl OffloadCounters {
    pub fn snapshot(&self) -> OffloadStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        OffloadStats {
            tx_copied_bytes: get(&self.tx_copied_bytes),
            tx_staged: get(&self.tx_staged),
            tx_passed: get(&self.tx_passed),
            rx_copied_bytes: get(&self.rx_copied_bytes),
            rx_staged: get(&self.rx_staged),
            rx_passed: get(&self.rx_passed),
            staging_bytes: get(&self.staging_bytes),
            staging_peak: get(&self.staging_peak),
        }
    }

    pub(super) fn hold(&self, bytes: usize) {
        let now = self.staging_bytes.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.staging_peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(super) fn release(&self, bytes: usize) {
        self.staging_bytes.fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a send posted to the engine: `Some(bytes)` copied into a
    /// staging buffer first, or `None` let through as the program posted it.
    pub(super) fn sent(&self, copied: Option<usize>) {
        match copied {
            Some(bytes) => {
                self.tx_copied_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                self.tx_staged.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.tx_passed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a receive whose `bytes` were copied out of a staging buffer.
    pub(super) fn received(&self, bytes: usize) {
        self.rx_copied_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.rx_staged.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a receive posted as the program posted it (too large for a
    /// staging buffer).
    pub(super) fn received_in_place(&self) {
        self.rx_passed.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Display for OffloadStats {
    /// The line softrnicd prints when it stops, read back by `softrnic exp`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "offload: tx copied {} bytes in {} sends, {} passed; rx copied {} bytes in {} receives, {} passed; \
             staging {} bytes, at most {}",
            self.tx_copied_bytes,
            self.tx_staged,
            self.tx_passed,
            self.rx_copied_bytes,
            self.rx_staged,
            self.rx_passed,
            self.staging_bytes,
            self.staging_peak
        )
    }
}

impl OffloadStats {
    /// Reads the line [`OffloadStats`]'s `Display` writes.
    pub fn parse(line: &str) -> Option<OffloadStats> {
        let numbers: Vec<u64> = line
            .split_once("offload: ")?
            .1
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        let [tx_copied_bytes, tx_staged, tx_passed, rx_copied_bytes, rx_staged, rx_passed, staging_bytes, staging_peak] =
            numbers[..]
        else {
            return None;
        };
        Some(OffloadStats {
            tx_copied_bytes,
            tx_staged,
            tx_passed,
            rx_copied_bytes,
            rx_staged,
            rx_passed,
            staging_bytes,
            staging_peak,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_line_reads_back() {
        let stats = OffloadStats {
            tx_copied_bytes: 1 << 40,
            tx_staged: 2,
            tx_passed: 3,
            rx_copied_bytes: 4,
            rx_staged: 5,
            rx_passed: 6,
            staging_bytes: 7,
            staging_peak: 8,
        };
        let line = format!("softrnicd: {stats}");
        assert_eq!(
            line,
            "softrnicd: offload: tx copied 1099511627776 bytes in 2 sends, 3 passed; rx copied 4 bytes in 5 \
             receives, 6 passed; staging 7 bytes, at most 8"
        );
        assert_eq!(OffloadStats::parse(&line), Some(stats));
        assert_eq!(OffloadStats::parse("offload: tx copied 1 bytes"), None);
    }
}
