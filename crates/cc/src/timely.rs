//! TIMELY: rate-based, driven by round-trip times and their gradient.
//!
//! Reference: Mittal et al., "TIMELY: RTT-based Congestion Control for the
//! Datacenter", SIGCOMM 2015, Algorithm 1 (also HPCC's ns-3 model). Below
//! `t_low` the rate grows by `delta`; above `t_high` it is cut in
//! proportion to how far the RTT overshoots; between the two the smoothed
//! RTT gradient decides: falling or flat grows the rate (by `5·delta`
//! after `hai_after` such samples in a row, hyper-active increase), rising
//! cuts it by `beta` times the normalised gradient, but never by more than
//! `max_cut` at once (the paper's formula goes negative for a gradient
//! above 1/beta; a spike then stopped the flow). One update per RTT
//! sample: the transport times every packet that asks for an ACK, so a
//! sample comes with each acknowledged message, as TIMELY's completion
//! events do. The steps scale with the line rate: the paper's 10 Mb/s is
//! for 10 Gb/s links.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `t_low` | 50 µs | below: additive increase |
//! | `t_high` | 500 µs | above: multiplicative decrease |
//! | `beta` | 0.8 | decrease factor |
//! | `alpha` | 0.875 | EWMA weight of a new RTT difference |
//! | `delta` | line rate / 1000, Mb/s | additive step |
//! | `hai_after` | 5 | samples of falling RTT before hyper increase |
//! | `min_rtt` | the path's base RTT, µs | normalises the gradient |
//! | `max_cut` | 0.5 | the largest cut one sample makes |
//! | `min_rate` | line rate / 1000, Mb/s | the rate never goes below |

use crate::event::{Control, Event, Path};
use crate::params::{ParamError, Params};
use crate::{CongestionControl, FromParams};

const KNOWN: &[&str] = &["t_low", "t_high", "beta", "alpha", "delta", "hai_after", "min_rtt", "max_cut", "min_rate"];

/// One QP's TIMELY.
#[derive(Debug, Clone, PartialEq)]
pub struct Timely {
    t_low: f64,
    t_high: f64,
    beta: f64,
    alpha: f64,
    delta: f64,
    hai_after: u32,
    min_rtt: f64,
    max_cut: f64,
    min_rate: f64,
    line_rate: f64,
    rate: f64,
    prev_rtt: Option<f64>,
    rtt_diff: f64,
    /// Samples in a row with a falling or flat gradient.
    falling: u32,
}

impl Timely {
    pub fn rate_bps(&self) -> f64 {
        self.rate
    }

    fn on_rtt(&mut self, rtt: f64) {
        let Some(prev) = self.prev_rtt.replace(rtt) else {
            return;
        };
        self.rtt_diff = (1.0 - self.alpha) * self.rtt_diff + self.alpha * (rtt - prev);
        let gradient = self.rtt_diff / self.min_rtt;
        if rtt < self.t_low {
            self.falling = 0;
            self.rate += self.delta;
        } else if rtt > self.t_high {
            self.falling = 0;
            self.rate *= 1.0 - (self.beta * (1.0 - self.t_high / rtt)).min(self.max_cut);
        } else if gradient <= 0.0 {
            self.falling += 1;
            self.rate += if self.falling >= self.hai_after { 5.0 * self.delta } else { self.delta };
        } else {
            self.falling = 0;
            self.rate *= 1.0 - (self.beta * gradient).min(self.max_cut);
        }
        self.rate = self.rate.clamp(self.min_rate, self.line_rate);
    }
}

impl FromParams for Timely {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Timely, ParamError<'p>> {
        params.check(KNOWN)?;
        let us = |key, default: f64| params.get(key, default).map(|v| v * 1e3);
        let line_rate = path.line_rate_bps as f64;
        Ok(Timely {
            t_low: us("t_low", 50.0)?,
            t_high: us("t_high", 500.0)?,
            beta: params.get("beta", 0.8)?,
            alpha: params.get("alpha", 0.875)?.min(1.0),
            delta: params.get("delta", line_rate / 1e9)? * 1e6,
            hai_after: params.get("hai_after", 5.0)? as u32,
            min_rtt: us("min_rtt", path.base_rtt_ns as f64 / 1e3)?.max(1.0),
            max_cut: params.get("max_cut", 0.5)?.min(1.0),
            min_rate: (params.get("min_rate", line_rate / 1e9)? * 1e6).clamp(1.0, line_rate),
            line_rate,
            rate: line_rate,
            prev_rtt: None,
            rtt_diff: 0.0,
            falling: 0,
        })
    }
}

impl CongestionControl for Timely {
    fn on_event(&mut self, _now: u64, event: &Event) -> Control {
        if let Event::Ack { rtt_ns: Some(rtt), .. } = *event {
            self.on_rtt(rtt as f64);
        }
        Control { rate_bps: self.rate as u64, window_bytes: Control::NO_WINDOW, timer_at_ns: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path { line_rate_bps: 10_000_000_000, base_rtt_ns: 20_000, mtu: 4096 };

    fn rtt(t: &mut Timely, us: u64) -> f64 {
        t.on_event(0, &Event::Ack { acked_bytes: 4096, in_flight_bytes: 0, rtt_ns: Some(us * 1000), ecn_echo: false });
        t.rate_bps()
    }

    #[test]
    fn a_rising_rtt_cuts_by_beta_times_the_gradient() {
        let mut t = Timely::from_params(&Params::NONE, &PATH).unwrap();
        t.rate = 5e9;
        rtt(&mut t, 100);
        // +5 µs: rtt_diff = 0.875 * 5 µs, gradient = 4.375/20.
        let r = rtt(&mut t, 105);
        let expected = 5e9 * (1.0 - 0.8 * (0.875 * 5.0 / 20.0));
        assert!((r - expected).abs() < 1.0, "{r} vs {expected}");
        // A steep rise cuts by max_cut, not to nothing.
        let r = rtt(&mut t, 200);
        assert!((r - expected * 0.5).abs() < 1.0, "{r}");
    }

    #[test]
    fn a_falling_rtt_adds_delta_then_five_delta() {
        let mut t = Timely::from_params(&Params::NONE, &PATH).unwrap();
        t.rate = 5e9;
        rtt(&mut t, 300);
        let mut rate = 5e9;
        for k in 1..=6 {
            let r = rtt(&mut t, 300 - 10 * k);
            rate += if k >= 5 { 50e6 } else { 10e6 };
            assert!((r - rate).abs() < 1.0, "sample {k}: {r} vs {rate}");
        }
    }

    #[test]
    fn outside_the_band_the_thresholds_rule() {
        let mut t = Timely::from_params(&Params::NONE, &PATH).unwrap();
        t.rate = 5e9;
        rtt(&mut t, 30);
        assert_eq!(rtt(&mut t, 40), 5e9 + 10e6, "below t_low: additive, whatever the gradient");
        let r = rtt(&mut t, 1000);
        let expected = (5e9 + 10e6) * (1.0 - 0.8 * (1.0 - 500.0 / 1000.0));
        assert!((r - expected).abs() < 1.0);
    }
}
