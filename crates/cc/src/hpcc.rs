//! HPCC: window- and rate-based, driven by in-band telemetry. Every switch
//! on the path records its egress port's rate, clock, bytes sent and queue
//! depth; the receiver echoes the records; the sender computes each link's
//! utilisation (throughput over capacity plus the queue it would take one
//! base RTT to drain) and steers the most utilised link to `eta`.
//!
//! Reference: Li et al., "HPCC: High Precision Congestion Control",
//! SIGCOMM 2019, Algorithm 1, and its ns-3 model (`RdmaHw::UpdateRateHp`,
//! the single-rate form): the utilisation is smoothed over a base RTT;
//! a reference rate is committed once per round of data ([`Rounds`]) and
//! each ACK reacts from it (fast reaction); above `eta`, or after `max_stage`
//! additive steps, the rate is the reference over U/eta plus `rai`,
//! otherwise the reference plus `rai`. The window is rate × base RTT.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `eta` | 0.95 | the utilisation aimed at |
//! | `max_stage` | 5 | additive steps before a multiplicative one |
//! | `rai` | line rate × (1 − eta) / 10, Mb/s | additive step |
//! | `base_rtt` | the path's, µs | T |
//! | `min_rate` | 100 Mb/s | the rate never goes below |

use crate::event::{Control, Event, IntHop, MAX_HOPS, Path};
use crate::params::{ParamError, Params};
use crate::{CongestionControl, FromParams, Rounds};

const KNOWN: &[&str] = &["eta", "max_stage", "rai", "base_rtt", "min_rate"];

/// One QP's HPCC.
#[derive(Debug, Clone, PartialEq)]
pub struct Hpcc {
    eta: f64,
    max_stage: u32,
    rai: f64,
    base_rtt_ns: f64,
    min_rate: f64,
    line_rate: f64,
    mtu: u64,
    /// The rate committed at the last per-window update, and the rate in
    /// force now.
    reference: f64,
    rate: f64,
    stage: u32,
    /// The smoothed utilisation.
    u: f64,
    /// The records of the previous ACK, hop by hop.
    hops: [IntHop; MAX_HOPS],
    nhops: usize,
    rounds: Rounds,
    /// The last ACK ended a round: the INT it brought commits.
    round_ended: bool,
    /// INT has been heard: `hops` holds records to compare with.
    primed: bool,
}

impl Hpcc {
    pub fn rate_bps(&self) -> f64 {
        self.rate
    }

    pub fn utilisation(&self) -> f64 {
        self.u
    }

    fn on_int(&mut self, hops: &[IntHop]) {
        let hops = &hops[..hops.len().min(MAX_HOPS)];
        if !self.primed {
            // The first echo: nothing to take differences from.
            self.remember(hops);
            self.primed = true;
            return;
        }
        let full_update = core::mem::take(&mut self.round_ended);
        let mut max_u = 0.0;
        let mut dt = 0u32;
        for (i, hop) in hops.iter().enumerate() {
            let Some(prev) = self.hops.get(i).filter(|_| i < self.nhops) else {
                continue;
            };
            let tau = hop.timestamp_ns.wrapping_sub(prev.timestamp_ns);
            if tau == 0 || hop.rate_bps == 0 {
                continue;
            }
            let tx_rate = f64::from(hop.tx_bytes.wrapping_sub(prev.tx_bytes)) * 8e9 / f64::from(tau);
            let queue = f64::from(hop.queue_bytes.min(prev.queue_bytes));
            let u = tx_rate / hop.rate_bps as f64 + queue * 8e9 / (hop.rate_bps as f64 * self.base_rtt_ns);
            if u > max_u {
                max_u = u;
                dt = tau;
            }
        }
        self.remember(hops);
        if dt > 0 {
            let dt = f64::from(dt).min(self.base_rtt_ns);
            self.u = (self.u * (self.base_rtt_ns - dt) + max_u * dt) / self.base_rtt_ns;
            let (rate, stage) = if self.u >= self.eta || self.stage >= self.max_stage {
                (self.reference / (self.u / self.eta) + self.rai, 0)
            } else {
                (self.reference + self.rai, self.stage + 1)
            };
            self.rate = rate.clamp(self.min_rate, self.line_rate);
            if full_update {
                self.reference = self.rate;
                self.stage = stage;
            }
        }
    }

    fn remember(&mut self, hops: &[IntHop]) {
        self.hops[..hops.len()].copy_from_slice(hops);
        self.nhops = hops.len();
    }

    fn control(&self) -> Control {
        let window = (self.rate * self.base_rtt_ns / 8e9) as u64;
        Control { rate_bps: self.rate as u64, window_bytes: window.max(self.mtu), timer_at_ns: 0 }
    }
}

impl FromParams for Hpcc {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Hpcc, ParamError<'p>> {
        params.check(KNOWN)?;
        let line_rate = path.line_rate_bps as f64;
        Ok(Hpcc {
            eta: params.get("eta", 0.95)?.clamp(0.01, 1.0),
            max_stage: params.get("max_stage", 5.0)? as u32,
            // HPCC's W_AI = W_init (1 - eta) / N, for N = 10 flows a link
            // is expected to carry: 500 Mb/s at 100 Gb/s.
            rai: params.get("rai", line_rate * 0.05 / 10.0 / 1e6)? * 1e6,
            base_rtt_ns: (params.get("base_rtt", path.base_rtt_ns as f64 / 1e3)? * 1e3).max(1.0),
            min_rate: (params.get("min_rate", 100.0)? * 1e6).clamp(1.0, line_rate),
            line_rate,
            mtu: path.mtu,
            reference: line_rate,
            rate: line_rate,
            stage: 0,
            u: 0.0,
            hops: [IntHop::default(); MAX_HOPS],
            nhops: 0,
            rounds: Rounds::default(),
            round_ended: false,
            primed: false,
        })
    }
}

impl CongestionControl for Hpcc {
    fn wants_int(&self) -> bool {
        true
    }

    fn on_event(&mut self, _now: u64, event: &Event) -> Control {
        match *event {
            Event::Ack { acked_bytes, in_flight_bytes, .. } => {
                self.round_ended |= self.rounds.on_ack(acked_bytes, in_flight_bytes);
            }
            Event::Int { hops } => self.on_int(hops),
            _ => {}
        }
        self.control()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };

    /// A hop of a 100 Gb/s link that sent `bytes` by `t_ns` with `queue`.
    fn hop(t_ns: u32, bytes: u32, queue: u32) -> IntHop {
        IntHop { rate_bps: 100_000_000_000, timestamp_ns: t_ns, tx_bytes: bytes, queue_bytes: queue, _reserved: 0 }
    }

    /// Feeds one round: its data acknowledged, with INT.
    fn window(h: &mut Hpcc, hops: &[IntHop]) -> Control {
        h.on_event(0, &Event::Ack { acked_bytes: 100_000, in_flight_bytes: 100_000, rtt_ns: None, ecn_echo: false });
        h.on_event(0, &Event::Int { hops })
    }

    #[test]
    fn an_overloaded_link_scales_the_window_by_eta_over_u() {
        let mut h = Hpcc::from_params(&Params::new("rai=0"), &PATH).unwrap();
        window(&mut h, &[hop(0, 0, 125_000)]);
        // A full link (12.5 bytes/ns) with a base RTT's worth of queue
        // (125 KB at 100 Gb/s and 10 µs): U = 1 + 1 = 2, over a whole RTT.
        let c = window(&mut h, &[hop(10_000, 125_000, 125_000)]);
        assert!((h.utilisation() - 2.0).abs() < 1e-9);
        let expected = 100e9 / (2.0 / 0.95);
        assert!((c.rate_bps as f64 - expected).abs() < 1.0);
        assert_eq!(c.window_bytes, (expected * 10_000.0 / 8e9) as u64);
    }

    #[test]
    fn below_eta_it_adds_rai_for_max_stage_steps_then_scales() {
        let mut h = Hpcc::from_params(&Params::new("rai=1000,max_stage=2"), &PATH).unwrap();
        h.reference = 50e9;
        window(&mut h, &[hop(0, 0, 0)]);
        // Half the link: U = 0.5.
        let mut t = 0;
        let mut rates = [0.0; 3];
        for r in &mut rates {
            t += 10_000;
            *r = window(&mut h, &[hop(t, t / 2 * 25 / 2, 0)]).rate_bps as f64;
        }
        assert!((rates[0] - 51e9).abs() < 1.0);
        assert!((rates[1] - 52e9).abs() < 1.0);
        // Stage 2 reached: multiplicative, U/eta = 0.5/0.95.
        assert!((rates[2] - (52e9_f64 / (0.5 / 0.95) + 1e9).min(100e9)).abs() < 1.0);
    }

    #[test]
    fn timestamps_and_counters_wrap() {
        let mut h = Hpcc::from_params(&Params::new("rai=0"), &PATH).unwrap();
        window(&mut h, &[hop(u32::MAX - 4_999, u32::MAX - 62_499, 0)]);
        window(&mut h, &[hop(5_000, 62_500, 0)]);
        assert!((h.utilisation() - 1.0).abs() < 1e-9, "{}", h.utilisation());
    }
}
