//! In-network aggregation in the simulator: the lab's switch stage,
//! workers and servers, in virtual time.

use std::time::Duration;

use softrnic_aggregation::Policy;
use softrnic_sim::aggregation::{Scenario, run};

#[test]
fn every_sum_is_exact_through_a_lossy_switch() {
    let scenario = Scenario {
        loss: 0.01,
        min_rto: Duration::from_micros(100),
        straggler: None,
        first_job_steps: None,
        duration: Duration::from_millis(5),
        ..Scenario::small(Policy::A2tp)
    };
    let outcome = run(&scenario).unwrap();
    assert!(outcome.steps.iter().all(|&s| s >= 3), "both jobs progress: {:?}", outcome.steps);
    assert!(outcome.resent > 0, "loss made workers resend");
    assert!(outcome.aggregated > 0 && outcome.collisions > 0, "{outcome:?}");
}

/// A2TP against ATP's policy with one job straggling (its last worker
/// starts each step 200 µs late) and the healthy job ending first, over
/// eight seeds (a run can settle into a different regime, so one seed
/// proves little): under A2TP the healthy job holds more of the pool than
/// the straggler while both run, the straggler holds less than under ATP,
/// the healthy job keeps its goodput, and the straggler takes more of the
/// pool once alone.
#[test]
fn a_straggler_gives_up_the_pool_while_the_healthy_job_runs() {
    const SEEDS: u64 = 8;
    // Means over the seeds: (healthy %, healthy Gb/s, straggler %, straggler alone %).
    let measure = |policy| {
        let mut sums = [0.0; 4];
        for seed in 1..=SEEDS {
            let s = Scenario { seed, ..Scenario::small(policy) };
            let outcome = run(&s).unwrap();
            let ended = outcome.ended[0].expect("the healthy job finishes its steps");
            let (healthy, goodput) = outcome.mean(0, Duration::from_millis(1), ended);
            let (straggler, _) = outcome.mean(1, Duration::from_millis(1), ended);
            let (alone, _) = outcome.mean(1, ended + Duration::from_millis(1), s.duration);
            for (sum, x) in sums.iter_mut().zip([healthy, goodput, straggler, alone]) {
                *sum += x / SEEDS as f64;
            }
        }
        sums
    };
    let [a2tp_healthy, a2tp_goodput, a2tp_straggler, a2tp_alone] = measure(Policy::A2tp);
    let [_, atp_goodput, atp_straggler, _] = measure(Policy::Atp);
    assert!(
        a2tp_healthy > a2tp_straggler,
        "A2TP: healthy {a2tp_healthy:.1} % of the pool, straggler {a2tp_straggler:.1} %"
    );
    assert!(
        a2tp_straggler < 0.8 * atp_straggler,
        "the straggler holds {a2tp_straggler:.1} % under A2TP, {atp_straggler:.1} % under ATP"
    );
    assert!(
        a2tp_goodput >= atp_goodput * 0.95,
        "the healthy job: {a2tp_goodput:.2} Gb/s under A2TP, {atp_goodput:.2} under ATP"
    );
    assert!(
        a2tp_alone > 1.5 * a2tp_straggler,
        "alone the straggler takes more: {a2tp_alone:.1} % after {a2tp_straggler:.1} %"
    );
}

/// The seed's shape while both jobs run (`Scenario::seed`): the healthy
/// job holds 30 to 60 % of the pool at 85 % or more of its throughput
/// alone; the straggler gives the pool up (under a tenth of it, less than
/// under ATP) and keeps its link's rate by falling back to its server
/// rather than starving (the seed: 15 Gb/s at 1-5 %).
#[test]
fn at_the_seeds_shape_the_straggler_falls_back_and_the_healthy_job_keeps_its_rate() {
    let shape = |policy| {
        let s = Scenario { duration: Duration::from_millis(6), ..Scenario::seed(policy) };
        let outcome = run(&s).unwrap();
        let ended = outcome.ended[0].unwrap_or(s.duration);
        let (healthy, straggler) =
            (outcome.mean(0, s.sample_every * 5, ended), outcome.mean(1, s.sample_every * 5, ended));
        let alone = Scenario { duration: Duration::from_millis(3), ..s.alone() };
        let (_, alone_gbps) = run(&alone).unwrap().mean(0, alone.sample_every * 5, alone.duration);
        (healthy, straggler, alone_gbps)
    };
    let ((occupancy, gbps), (straggler_occupancy, straggler_gbps), alone_gbps) = shape(Policy::A2tp);
    assert!((30.0..60.0).contains(&occupancy), "the healthy job holds {occupancy:.1} % of the pool");
    assert!(gbps >= 0.85 * alone_gbps, "the healthy job: {gbps:.1} Gb/s, {alone_gbps:.1} alone");
    assert!(straggler_occupancy < 10.0, "the straggler holds {straggler_occupancy:.1} %");
    assert!(straggler_gbps > 10.0, "the straggler falls back at {straggler_gbps:.1} Gb/s, not starving");
    let (_, (atp_straggler, _), _) = shape(Policy::Atp);
    assert!(straggler_occupancy < atp_straggler, "A2TP {straggler_occupancy:.1} %, ATP {atp_straggler:.1} %");
}
