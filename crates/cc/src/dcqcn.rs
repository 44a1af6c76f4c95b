//! DCQCN, the reaction point of ConnectX NICs: rate-based, driven by the
//! CNPs the receiver sends for CE-marked packets.
//!
//! Reference: Zhu et al., "Congestion Control for Large-Scale RDMA
//! Deployments", SIGCOMM 2015; the ConnectX behaviour as HPCC's ns-3 model
//! (`RdmaHw`, the "Mellanox" DCQCN) implements it. Parameters carry the
//! names of NVIDIA's DCQCN knobs (the mlx5 driver's `rp_*` congestion
//! parameters) with their documented defaults:
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `rpg_time_reset` | 300 µs | the rate-increase timer |
//! | `rpg_byte_reset` | 32767 B | the rate-increase byte counter |
//! | `rpg_threshold` | 1 | increase events of fast recovery (F) |
//! | `rpg_ai_rate` | 5 Mb/s | additive increase |
//! | `rpg_hai_rate` | 50 Mb/s | hyper increase |
//! | `rpg_min_dec_fac` | 50 % | one cut keeps at least this much of the rate |
//! | `rpg_min_rate` | 1 Mb/s | the rate never goes below |
//! | `rate_to_set_on_first_cnp` | 0 Mb/s | 0: the first CNP cuts like any other |
//! | `clamp_tgt_rate` | 0 | 1: every cut sets the target to the current rate |
//! | `dce_tcp_g` | 1019 | alpha keeps dce_tcp_g/1024 of itself per update |
//! | `dce_tcp_rtt` | 1 µs | the alpha update period |
//! | `rate_reduce_monitor_period` | 4 µs | at most one cut per period |
//! | `initial_alpha_value` | 1023 | alpha at the first CNP, of 1023 |
//!
//! (`min_time_between_cnps`, the notification point's CNP spacing, is the
//! receiver's: the transport's `TransportConfig`.)
//!
//! Alpha is updated lazily: an event applies every update period that
//! passed since the last one at once (a CNP in the first of them), which is
//! what a timer every `dce_tcp_rtt` would have done, without a timer a
//! microsecond.

use crate::event::{Control, Event, Path};
use crate::params::{ParamError, Params};
use crate::{CongestionControl, FromParams, powi};

const KNOWN: &[&str] = &[
    "rpg_time_reset",
    "rpg_byte_reset",
    "rpg_threshold",
    "rpg_ai_rate",
    "rpg_hai_rate",
    "rpg_min_dec_fac",
    "rpg_min_rate",
    "rate_to_set_on_first_cnp",
    "clamp_tgt_rate",
    "dce_tcp_g",
    "dce_tcp_rtt",
    "rate_reduce_monitor_period",
    "initial_alpha_value",
];

const MBPS: f64 = 1e6;
const US: u64 = 1000;

/// DCQCN's settings, in the units it computes in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnParams {
    pub time_reset_ns: u64,
    pub byte_reset: u64,
    pub threshold: u32,
    pub ai_bps: f64,
    pub hai_bps: f64,
    /// The fraction of the rate one cut keeps at least.
    pub min_dec_fac: f64,
    pub min_rate_bps: f64,
    pub first_cnp_rate_bps: f64,
    pub clamp_target: bool,
    /// The fraction of alpha an update keeps.
    pub g_keep: f64,
    pub alpha_period_ns: u64,
    pub reduce_period_ns: u64,
    pub initial_alpha: f64,
}

impl DcqcnParams {
    pub fn parse<'p>(params: &Params<'p>) -> Result<DcqcnParams, ParamError<'p>> {
        params.check(KNOWN)?;
        let us = |key, default| params.get(key, default).map(|v| (v * US as f64) as u64);
        Ok(DcqcnParams {
            time_reset_ns: us("rpg_time_reset", 300.0)?,
            byte_reset: params.get("rpg_byte_reset", 32767.0)? as u64,
            threshold: params.get("rpg_threshold", 1.0)? as u32,
            ai_bps: params.get("rpg_ai_rate", 5.0)? * MBPS,
            hai_bps: params.get("rpg_hai_rate", 50.0)? * MBPS,
            min_dec_fac: params.get("rpg_min_dec_fac", 50.0)?.min(100.0) / 100.0,
            min_rate_bps: params.get("rpg_min_rate", 1.0)?.max(1e-6) * MBPS,
            first_cnp_rate_bps: params.get("rate_to_set_on_first_cnp", 0.0)? * MBPS,
            clamp_target: params.get("clamp_tgt_rate", 0.0)? != 0.0,
            g_keep: params.get("dce_tcp_g", 1019.0)?.min(1024.0) / 1024.0,
            alpha_period_ns: us("dce_tcp_rtt", 1.0)?.max(1),
            reduce_period_ns: us("rate_reduce_monitor_period", 4.0)?,
            initial_alpha: params.get("initial_alpha_value", 1023.0)?.min(1023.0) / 1023.0,
        })
    }
}

impl Default for DcqcnParams {
    /// NVIDIA's defaults.
    fn default() -> Self {
        DcqcnParams::parse(&Params::NONE).expect("no parameters are valid parameters")
    }
}

/// One QP's reaction point.
#[derive(Debug, Clone, PartialEq)]
pub struct Dcqcn {
    p: DcqcnParams,
    line_rate: f64,
    /// The current rate and the rate recovery aims at.
    rate: f64,
    target: f64,
    alpha: f64,
    /// Alpha is up to date as of this update boundary.
    alpha_at: u64,
    /// A CNP arrived in the update period that began at `alpha_at`.
    cnp_in_alpha_period: bool,
    seen_cnp: bool,
    /// When the rate was last cut.
    cut_at: Option<u64>,
    /// A CNP arrived that no cut has answered yet.
    cut_pending: bool,
    /// Increase events since the last cut, by timer and by bytes.
    timer_stage: u32,
    byte_stage: u32,
    bytes_since_stage: u64,
    /// When the increase timer fires next.
    increase_at: Option<u64>,
}

impl Dcqcn {
    pub fn with(p: DcqcnParams, path: &Path) -> Dcqcn {
        let line_rate = path.line_rate_bps as f64;
        Dcqcn {
            p,
            line_rate,
            rate: line_rate,
            target: line_rate,
            alpha: p.initial_alpha,
            alpha_at: 0,
            cnp_in_alpha_period: false,
            seen_cnp: false,
            cut_at: None,
            cut_pending: false,
            timer_stage: 0,
            byte_stage: 0,
            bytes_since_stage: 0,
            increase_at: None,
        }
    }

    pub fn rate_bps(&self) -> f64 {
        self.rate
    }

    /// Continues from `rate` (a QP that ran another algorithm until now).
    pub fn set_rate(&mut self, rate: f64) {
        self.rate = rate.clamp(self.p.min_rate_bps, self.line_rate);
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Applies the alpha updates of every period that ended by `now`.
    fn update_alpha(&mut self, now: u64) {
        let periods = now.saturating_sub(self.alpha_at) / self.p.alpha_period_ns;
        if periods == 0 {
            return;
        }
        let g = 1.0 - self.p.g_keep;
        if self.cnp_in_alpha_period {
            self.alpha = self.alpha * self.p.g_keep + g;
        } else {
            self.alpha *= self.p.g_keep;
        }
        self.alpha *= powi(self.p.g_keep, periods - 1);
        self.alpha_at += periods * self.p.alpha_period_ns;
        self.cnp_in_alpha_period = false;
    }

    fn on_cnp(&mut self, now: u64) {
        if !self.seen_cnp {
            self.seen_cnp = true;
            self.alpha = self.p.initial_alpha;
            self.alpha_at = now;
            if self.p.first_cnp_rate_bps > 0.0 {
                self.rate = self.p.first_cnp_rate_bps.min(self.line_rate);
            }
        }
        self.cnp_in_alpha_period = true;
        self.cut_pending = true;
        self.maybe_cut(now);
    }

    /// Cuts the rate if a CNP is waiting and the monitor period allows.
    fn maybe_cut(&mut self, now: u64) {
        if !self.cut_pending || self.cut_at.is_some_and(|at| now < at + self.p.reduce_period_ns) {
            return;
        }
        self.cut_pending = false;
        self.cut_at = Some(now);
        if self.p.clamp_target || self.timer_stage > 0 || self.byte_stage > 0 {
            self.target = self.rate;
        }
        let keep = (1.0 - self.alpha / 2.0).max(self.p.min_dec_fac);
        self.rate = (self.rate * keep).max(self.p.min_rate_bps);
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.bytes_since_stage = 0;
        self.increase_at = Some(now + self.p.time_reset_ns);
    }

    /// One increase event: fast recovery toward the target, then additive,
    /// then hyper increase of the target.
    fn increase(&mut self) {
        let f = self.p.threshold;
        let (t, b) = (self.timer_stage, self.byte_stage);
        if t >= f || b >= f {
            let step = if t > f && b > f { self.p.hai_bps } else { self.p.ai_bps };
            self.target = (self.target + step).min(self.line_rate);
        }
        self.rate = ((self.rate + self.target) / 2.0).min(self.line_rate);
    }

    fn control(&self) -> Control {
        let recovering = self.rate < self.line_rate;
        let increase = if recovering { self.increase_at } else { None };
        let cut = if self.cut_pending { self.cut_at.map(|at| at + self.p.reduce_period_ns) } else { None };
        let timer = [increase, cut].into_iter().flatten().min().unwrap_or(0);
        Control { rate_bps: (self.rate as u64).max(1), window_bytes: Control::NO_WINDOW, timer_at_ns: timer }
    }
}

impl FromParams for Dcqcn {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Dcqcn, ParamError<'p>> {
        Ok(Dcqcn::with(DcqcnParams::parse(params)?, path))
    }
}

impl CongestionControl for Dcqcn {
    fn on_event(&mut self, now: u64, event: &Event) -> Control {
        // Whatever the event, what was due by now happens first: the
        // answer's timer is then always in the future.
        self.update_alpha(now);
        self.maybe_cut(now);
        if self.increase_at.is_some_and(|at| at <= now) {
            self.increase_at = Some(now + self.p.time_reset_ns);
            if self.rate < self.line_rate {
                self.increase();
                self.timer_stage += 1;
            }
        }
        match *event {
            Event::Cnp => self.on_cnp(now),
            Event::Sent { bytes } if self.rate < self.line_rate => {
                self.bytes_since_stage += bytes;
                if self.bytes_since_stage >= self.p.byte_reset.max(1) {
                    self.bytes_since_stage = 0;
                    self.increase();
                    self.byte_stage += 1;
                }
            }
            _ => {}
        }
        self.control()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };

    fn dcqcn(params: &str) -> Dcqcn {
        Dcqcn::from_params(&Params::new(params), &PATH).unwrap()
    }

    #[test]
    fn k_cnps_a_monitor_period_apart_cut_as_the_formula_says() {
        // With alpha frozen (g_keep = 1) each cut keeps 1 - alpha/2 of the
        // rate: after k cuts, R = C * (1 - a/2)^k.
        let mut d = dcqcn("dce_tcp_g=1024,initial_alpha_value=511.5,rpg_min_dec_fac=0");
        let alpha = 0.5;
        for k in 1..=6u64 {
            let c = d.on_event(k * 10 * US, &Event::Cnp);
            let expected = 100e9 * powi(1.0 - alpha / 2.0, k);
            assert!((c.rate_bps as f64 - expected).abs() < 1.0, "cut {k}: {} vs {expected}", c.rate_bps);
        }
    }

    #[test]
    fn cnps_inside_one_monitor_period_cut_once() {
        let mut d = dcqcn("");
        let first = d.on_event(100 * US, &Event::Cnp).rate_bps;
        let second = d.on_event(101 * US, &Event::Cnp);
        assert_eq!(second.rate_bps, first, "a second cut 1 µs later");
        // The pending CNP is answered when the period ends.
        assert_eq!(second.timer_at_ns, 104 * US);
        let third = d.on_event(104 * US, &Event::Timer);
        assert!(third.rate_bps < first);
    }

    #[test]
    fn alpha_follows_dce_tcp_g() {
        // No CNP for n periods: alpha keeps (1019/1024)^n of itself.
        let mut d = dcqcn("");
        d.on_event(0, &Event::Cnp);
        let a0 = d.alpha();
        d.on_event(1 + 100 * US, &Event::Sent { bytes: 0 });
        // The first period held the CNP: it added g once.
        let g = 5.0 / 1024.0;
        let expected = (a0 * (1.0 - g) + g) * powi(1.0 - g, 99);
        assert!((d.alpha() - expected).abs() < 1e-12, "{} vs {expected}", d.alpha());
    }

    #[test]
    fn recovery_is_fast_then_additive_then_hyper() {
        let mut d = dcqcn("rpg_threshold=2");
        let cut = d.on_event(0, &Event::Cnp).rate_bps as f64;
        let target = 100e9;
        // Fast recovery: halfway to the target, twice.
        let mut expected = cut;
        let mut t = 0;
        for _ in 0..2 {
            t += 300 * US;
            expected = (expected + target) / 2.0;
            let c = d.on_event(t, &Event::Timer);
            assert!((c.rate_bps as f64 - expected).abs() < 2.0);
        }
        // Then the target grows: it was the line rate, so it stays there.
        t += 300 * US;
        let c = d.on_event(t, &Event::Timer);
        assert!((c.rate_bps as f64 - (expected + target) / 2.0).abs() < 2.0);
    }

    #[test]
    fn the_target_grows_by_ai_then_hai_once_clamped() {
        let mut d = dcqcn("rpg_threshold=1,clamp_tgt_rate=1,rpg_byte_reset=1000000000,rate_to_set_on_first_cnp=10000");
        d.on_event(0, &Event::Cnp);
        let target = d.target;
        let mut t = 0;
        t += 300 * US;
        d.on_event(t, &Event::Timer); // stage 0: fast recovery
        assert_eq!(d.target, target);
        t += 300 * US;
        d.on_event(t, &Event::Timer); // stage 1: additive
        assert!((d.target - target - 5e6).abs() < 1e-3);
        // Hyper increase needs both counters past F: the byte counter
        // never moved, so it stays additive.
        t += 300 * US;
        d.on_event(t, &Event::Timer);
        assert!((d.target - target - 10e6).abs() < 1e-3);
    }

    #[test]
    fn at_line_rate_no_timer_runs() {
        let mut d = dcqcn("");
        assert_eq!(d.on_event(0, &Event::Sent { bytes: 4096 }), Control::line_rate(&PATH));
    }
}
