//! E3 in the simulator: an 8-to-1 incast at 100 Gb/s through the switch
//! pipeline, once per congestion-control algorithm. Without one the
//! queue fills the buffer; DCQCN and HPCC keep the link busy, share it
//! fairly and bound the queue (HPCC near empty); the others visibly
//! control the rate.

use std::time::Duration;

use softrnic_sim::incast::{IncastConfig, IncastRun};
use softrnic_transport::Choice;

/// DCQCN as Zhu et al. configure it (the timer and byte counter of the
/// paper, alpha's gain 1/256 every 55 µs, one cut per 50 µs at most):
/// NVIDIA's defaults converge too, but over longer than a test runs.
pub const DCQCN_PAPER: &str = "rpg_time_reset=55,rpg_byte_reset=10000000,rpg_threshold=5,rpg_ai_rate=40,\
rpg_hai_rate=100,dce_tcp_rtt=55,dce_tcp_g=1020,rate_reduce_monitor_period=50";

fn incast(name: &str, params: &str) -> IncastRun {
    let algorithm = (name != "none").then(|| Choice::builtin(name, params).unwrap());
    let config = IncastConfig {
        duration: Duration::from_millis(20),
        settle: Duration::from_millis(5),
        ..IncastConfig::e3(8, algorithm)
    };
    let run = config.run();
    println!(
        "{name}: fairness {:.3}, utilisation {:.3}, queue peak {} p99 {}, {} CNPs",
        run.fairness, run.utilisation, run.peak_queue, run.p99_queue, run.cnps
    );
    run
}

#[test]
fn without_congestion_control_the_queue_fills_the_buffer() {
    let run = incast("none", "");
    // Eight windows of 2 MB meet PFC: several MB stand in the queue.
    assert!(run.p99_queue > 4 << 20, "p99 queue {}", run.p99_queue);
    assert!(run.utilisation > 0.95);
}

#[test]
fn dcqcn_keeps_the_link_busy_and_fair_with_a_bounded_queue() {
    let run = incast("dcqcn", DCQCN_PAPER);
    assert!(run.utilisation >= 0.90, "utilisation {}", run.utilisation);
    assert!(run.fairness >= 0.95, "fairness {}", run.fairness);
    // Below RED's Kmax at 100 Gb/s (1.6 MB): marking holds it there.
    assert!(run.p99_queue < 1_600_000, "p99 queue {}", run.p99_queue);
    assert!(run.cnps > 0);
}

#[test]
fn hpcc_keeps_the_link_busy_and_fair_with_the_queue_near_empty() {
    let run = incast("hpcc", "");
    assert!(run.utilisation >= 0.90, "utilisation {}", run.utilisation);
    assert!(run.fairness >= 0.95, "fairness {}", run.fairness);
    assert!(run.p99_queue < 64 * 1024, "p99 queue {}", run.p99_queue);
}

#[test]
fn dctcp_timely_and_swift_control_the_rate() {
    let none = incast("none", "");
    for name in ["dctcp", "timely", "swift"] {
        let run = incast(name, "");
        assert!(run.p99_queue < none.p99_queue / 2, "{name}: p99 queue {} against {}", run.p99_queue, none.p99_queue);
        assert!(run.fairness >= 0.8, "{name}: fairness {}", run.fairness);
    }
}

#[test]
fn a_late_joiner_gets_its_share() {
    // Staggered join: four flows 1 ms apart. The last one, joining a
    // link the others fill, ends with about a quarter of it.
    for (name, params) in [("dcqcn", DCQCN_PAPER), ("hpcc", "")] {
        let algorithm = Some(Choice::builtin(name, params).unwrap());
        let config = IncastConfig {
            stagger: Duration::from_millis(1),
            duration: Duration::from_millis(40),
            settle: Duration::from_millis(17),
            ..IncastConfig::e3(4, algorithm)
        };
        let run = config.run();
        let last = run.flow_gbps[3].iter().rev().take(100).sum::<f64>() / 100.0;
        assert!(last > 25.0 * 0.7, "{name}: the late joiner has {last:.1} Gb/s");
        assert!(run.fairness >= 0.95, "{name}: fairness {}", run.fairness);
    }
}
