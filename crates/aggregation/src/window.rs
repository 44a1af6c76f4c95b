//! A worker's two windows, in chunks outstanding (A2TP):
//!
//! - the **link window** follows the network, DCTCP's way: each round (a
//!   window's worth of ACKs) updates α ← (1 − g)·α + g·F from the fraction
//!   F of ACKs that saw ECN and cuts the window by α/2 if any did; it
//!   grows by a chunk per ACK (slow start) until the first cut, then by a
//!   chunk per round;
//! - the **aggregator window** follows the switch's pool: each round
//!   measures the fraction β of chunks that found their aggregator taken;
//!   above 10 % it cuts the window by (β − 0.1)^γ / 1.9, where γ in (0, 1]
//!   is how healthy the job is (1 when its chunks finish in a round trip,
//!   less the longer they wait for a straggler: with β − 0.1 below 1, a
//!   smaller γ cuts harder). Every ACK without a collision grows it: by a
//!   chunk while the last round saw the pool free (probing costs little:
//!   a chunk that collides goes to the server, no queue fills, and a job
//!   left alone takes the pool within a few rounds), by γ while it is
//!   contended. While contended it holds at most γ of the link window: a
//!   straggler's aggregators sit idle while it waits for its last worker,
//!   and another job could fill them. It never exceeds the link window.
//!
//! The link window bounds every chunk outstanding; the aggregator window
//! bounds those that ask the switch for an aggregator, and the rest fall
//! back to the job's server, which sums them in software: a job that gives
//! up aggregators keeps its link's rate. ATP's policy is the link window
//! alone, every chunk asking the switch.

/// DCTCP's gain for α.
const G: f64 = 1.0 / 16.0;
/// The collision fraction A2TP tolerates before cutting.
const BETA_FLOOR: f64 = 0.1;

/// Which windows a worker keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Both windows: a job that collides backs off the pool, a straggling
    /// job the most.
    A2tp,
    /// The link window only.
    Atp,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "a2tp" => Ok(Policy::A2tp),
            "atp" => Ok(Policy::Atp),
            _ => Err(format!("unknown policy {s:?}: say a2tp (both windows) or atp (the link window alone)")),
        }
    }
}

/// Counts one round of ACKs (as many as the window held when it began).
#[derive(Debug, Clone, Copy)]
struct Round {
    size: u32,
    acked: u32,
    flagged: u32,
}

impl Round {
    fn new(window: f64) -> Round {
        Round { size: window.max(1.0) as u32, acked: 0, flagged: 0 }
    }

    /// Counts an ACK; at the round's end, the fraction flagged.
    fn count(&mut self, flagged: bool, window: f64) -> Option<f64> {
        self.acked += 1;
        self.flagged += u32::from(flagged);
        if self.acked < self.size {
            return None;
        }
        let fraction = f64::from(self.flagged) / f64::from(self.acked);
        *self = Round::new(window);
        Some(fraction)
    }
}

/// DCTCP's window over chunks.
#[derive(Debug, Clone, Copy)]
pub struct LinkWindow {
    window: f64,
    /// Slow start below this; set at each cut.
    threshold: f64,
    alpha: f64,
    max: f64,
    round: Round,
}

impl LinkWindow {
    pub fn new(initial: u32, max: u32) -> LinkWindow {
        let window = f64::from(initial.clamp(1, max.max(1)));
        let max = f64::from(max.max(1));
        LinkWindow { window, threshold: max, alpha: 1.0, max, round: Round::new(window) }
    }

    pub fn chunks(&self) -> f64 {
        self.window
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    pub fn on_ack(&mut self, ecn: bool) {
        if !ecn {
            let step = if self.window < self.threshold { 1.0 } else { 1.0 / self.window };
            self.window = (self.window + step).min(self.max);
        }
        if let Some(marked) = self.round.count(ecn, self.window) {
            self.alpha = (1.0 - G) * self.alpha + G * marked;
            if marked > 0.0 {
                self.window = (self.window * (1.0 - self.alpha / 2.0)).max(1.0);
                self.threshold = self.window;
            }
        }
    }

    pub fn on_timeout(&mut self) {
        self.window = (self.window / 2.0).max(1.0);
        self.threshold = self.window;
        self.round = Round::new(self.window);
    }
}

/// A2TP's window over aggregators.
#[derive(Debug, Clone, Copy)]
pub struct AggregatorWindow {
    window: f64,
    round: Round,
    /// The last round's collision fraction.
    pub beta: f64,
}

impl AggregatorWindow {
    pub fn new(initial: u32) -> AggregatorWindow {
        let window = f64::from(initial.max(1));
        AggregatorWindow { window, round: Round::new(window), beta: 0.0 }
    }

    pub fn chunks(&self) -> f64 {
        self.window
    }

    /// An ACK; `collided` if the chunk found its aggregator taken;
    /// `health` is γ; `link` the link window, the ceiling.
    pub fn on_ack(&mut self, collided: bool, health: f64, link: f64) {
        if !collided {
            // A free pool is probed fast; a contended one as fast as the
            // job is healthy, so a straggler creeps back.
            self.window += if self.beta > BETA_FLOOR { health.clamp(0.01, 1.0) } else { 1.0 };
        }
        if let Some(beta) = self.round.count(collided, self.window) {
            self.beta = beta;
            if beta > BETA_FLOOR {
                let cut = (beta - BETA_FLOOR).powf(health.clamp(0.01, 1.0)) / 1.9;
                self.window *= 1.0 - cut;
            }
        }
        // While the pool is contended a job holds at most its health's
        // share of the link window: a straggler's aggregators sit idle
        // while it waits, and another job could fill them.
        let ceiling = if self.beta > BETA_FLOOR { link * health.clamp(0.01, 1.0) } else { link };
        self.window = self.window.clamp(1.0, ceiling.max(1.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_link_window_grows_a_chunk_a_round_and_cuts_by_alpha_on_marks() {
        let mut w = LinkWindow::new(10, 1000);
        for _ in 0..10 {
            w.on_ack(false);
        }
        assert_eq!(w.chunks(), 20.0, "slow start doubles it in a round");
        w.on_timeout();
        for _ in 0..10 {
            w.on_ack(false);
        }
        assert!((w.chunks() - 10.0 - 10.0 / 10.5).abs() < 0.1, "then a chunk a round: {}", w.chunks());
        // α decays while nothing is marked.
        let alpha = w.alpha();
        assert!(alpha < 1.0);
        // A fully marked round: α rises by g·(1 − α), the window falls by α/2.
        let before = w.chunks();
        for _ in 0..11 {
            w.on_ack(true);
        }
        let expected_alpha = (1.0 - G) * alpha + G;
        assert!((w.alpha() - expected_alpha).abs() < 1e-9);
        assert!((w.chunks() - before * (1.0 - expected_alpha / 2.0)).abs() < 0.01, "{}", w.chunks());
    }

    /// The same collisions cut a straggling job (γ small) far harder than
    /// a healthy one, and neither above the link window.
    #[test]
    fn a_straggler_gives_up_more_aggregators() {
        let cut = |health: f64| {
            let mut w = AggregatorWindow::new(100);
            for i in 0..100 {
                w.on_ack(i % 2 == 0, health, 1000.0);
            }
            w.chunks()
        };
        let (healthy, straggler) = (cut(1.0), cut(0.1));
        // Fifty collision-free ACKs grow it to 150, then the cut.
        assert!((healthy - 150.0 * (1.0 - 0.4 / 1.9)).abs() < 1.0, "β = 0.5 cuts a healthy job by 0.4/1.9: {healthy}");
        assert!(straggler < 80.0, "and a straggler by 0.4^0.1/1.9: {straggler}");
        let mut w = AggregatorWindow::new(100);
        w.on_ack(false, 1.0, 7.0);
        assert_eq!(w.chunks(), 7.0, "never above the link window");
    }
}
