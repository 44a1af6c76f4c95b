//! Where a running device publishes its counters, so that `softrnic
//! devinfo` in another process can show them: a `key value` text file per
//! device address in the runtime directory.

use std::fmt::Write as _;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::NicCounters;

/// How often a running device writes its file (and once more when it
/// closes). Each write creates and renames a file in one directory: a
/// daemon with hundreds of devices made the directory's lock its hottest
/// spot when they wrote every 250 ms.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `<runtime dir>/<addr>.counters` ([`crate::runtime_dir`]).
pub fn path(addr: IpAddr) -> PathBuf {
    crate::runtime_dir::path().join(format!("{addr}.counters"))
}

/// The counters as `name value` lines, in a fixed order.
pub fn render(c: &NicCounters) -> String {
    let t = &c.transport;
    let rows: [(&str, u64); 38] = [
        ("tx_packets", t.tx_packets),
        ("tx_bytes", t.tx_bytes),
        ("rx_packets", t.rx_packets),
        ("rx_bytes", t.rx_bytes),
        ("retransmitted_packets", t.retransmitted_packets),
        ("timeouts", t.timeouts),
        ("tail_loss_probes", t.tail_loss_probes),
        ("rx_icrc_errors", t.rx_icrc_errors),
        ("rx_malformed", t.rx_malformed),
        ("rx_unknown_qp", t.rx_unknown_qp),
        ("rx_out_of_sequence", t.rx_out_of_sequence),
        ("rx_duplicate_requests", t.rx_duplicate_requests),
        ("uc_messages_dropped", t.uc_messages_dropped),
        ("seq_naks_sent", t.seq_naks_sent),
        ("seq_naks_received", t.seq_naks_received),
        ("rnr_naks_sent", t.rnr_naks_sent),
        ("rnr_naks_received", t.rnr_naks_received),
        ("credit_waits", t.credit_waits),
        ("credit_probes", t.credit_probes),
        ("fatal_naks_sent", t.fatal_naks_sent),
        ("fatal_naks_received", t.fatal_naks_received),
        ("rx_placed_out_of_order", t.rx_placed_out_of_order),
        ("rx_beyond_window", t.rx_beyond_window),
        ("selective_naks_sent", t.selective_naks_sent),
        ("selective_naks_received", t.selective_naks_received),
        ("rx_cnps", t.rx_cnps),
        // The names mlx5 gives them in hw_counters.
        ("rp_cnp_handled", t.rx_cnps),
        ("np_cnp_sent", t.cnps_sent),
        ("tx_dropped_by_kernel", c.tx_dropped_by_kernel),
        ("rx_missteered", c.rx_missteered),
        ("rx_dropped_by_kernel", c.rx_dropped_by_kernel),
        ("injected_drops", c.injected_tx.dropped + c.injected_rx.dropped),
        ("injected_corruptions", c.injected_tx.corrupted + c.injected_rx.corrupted),
        ("injected_duplicates", c.injected_tx.duplicated + c.injected_rx.duplicated),
        ("engine_stall_max_us", c.engine_stall_max_us),
        ("np_ecn_marked_roce_packets", c.np_ecn_marked_roce_packets),
        ("rx_int_packets", c.rx_int_packets),
        ("rx_int_malformed", c.rx_int_malformed),
    ];
    let mut out = String::new();
    for (name, value) in rows {
        let _ = writeln!(out, "{name} {value}");
    }
    out
}

/// Writes the counters to `path`, in a directory made private first: a
/// file there is no one else's to plant.
pub fn write(path: &std::path::Path, counters: &NicCounters) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        crate::runtime_dir::make_private(dir)?;
    }
    // Write then rename, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, render(counters))?;
    std::fs::rename(tmp, path)
}
