//! Swift: a window steered to a target delay that grows with the path's
//! hop count.
//!
//! Reference: Kumar et al., "Swift: Delay is Simple and Effective for
//! Congestion Control in the Datacenter", SIGCOMM 2020, Algorithm 1.
//! Below the target the window grows by `ai` packets per RTT; above it
//! the window is cut in proportion to the overshoot, by at most `max_mdf`
//! and at most once per RTT; a retransmission timeout cuts by `max_mdf`.
//! The target is `base_target` plus `hop_scale` per hop (the hop count
//! comes from the INT echo when the path has it, else from `hops`). A
//! window below one packet is kept by pacing: one packet per RTT/cwnd.
//! (Swift's flow-based scaling of the target is left out.)
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `base_target` | base RTT + 5 µs | the target delay with no hops, µs |
//! | `hop_scale` | 1 µs | target added per hop |
//! | `hops` | 1 | hops, until INT says |
//! | `ai` | 1 packet | additive increase per RTT |
//! | `beta` | 0.8 | multiplicative decrease factor |
//! | `max_mdf` | 0.5 | the largest cut |
//! | `min_cwnd` | 0.01 packets | the smallest window |
//! | `max_cwnd` | 4 BDP | the largest window, packets |

use crate::event::{Control, Event, Path};
use crate::params::{ParamError, Params};
use crate::{CongestionControl, FromParams};

const KNOWN: &[&str] = &["base_target", "hop_scale", "hops", "ai", "beta", "max_mdf", "min_cwnd", "max_cwnd"];

/// One QP's Swift.
#[derive(Debug, Clone, PartialEq)]
pub struct Swift {
    base_target: f64,
    hop_scale: f64,
    hops: f64,
    ai: f64,
    beta: f64,
    max_mdf: f64,
    min_cwnd: f64,
    max_cwnd: f64,
    mtu: f64,
    line_rate: f64,
    /// The window, packets.
    cwnd: f64,
    /// The last RTT sample, ns.
    rtt: f64,
    last_decrease: Option<u64>,
}

impl Swift {
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The delay aimed at, ns.
    pub fn target(&self) -> f64 {
        self.base_target + self.hops * self.hop_scale
    }

    fn on_ack(&mut self, now: u64, acked_bytes: u64, rtt: f64) {
        self.rtt = rtt;
        let acked = acked_bytes as f64 / self.mtu;
        if rtt < self.target() {
            self.cwnd += if self.cwnd >= 1.0 { self.ai * acked / self.cwnd } else { self.ai * acked };
        } else if self.may_decrease(now) {
            let cut = (self.beta * (rtt - self.target()) / rtt).min(self.max_mdf);
            self.decrease(now, 1.0 - cut);
        }
        self.cwnd = self.cwnd.clamp(self.min_cwnd, self.max_cwnd);
    }

    fn may_decrease(&self, now: u64) -> bool {
        self.last_decrease.is_none_or(|at| (now - at) as f64 >= self.rtt)
    }

    fn decrease(&mut self, now: u64, keep: f64) {
        self.cwnd = (self.cwnd * keep).max(self.min_cwnd);
        self.last_decrease = Some(now);
    }

    fn control(&self) -> Control {
        // Below one packet the window cannot space packets: pacing does.
        let rate = if self.cwnd < 1.0 { self.cwnd * self.mtu * 8e9 / self.rtt } else { self.line_rate };
        Control {
            rate_bps: (rate.min(self.line_rate) as u64).max(1),
            window_bytes: ((self.cwnd * self.mtu) as u64).max(self.mtu as u64),
            timer_at_ns: 0,
        }
    }
}

impl FromParams for Swift {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Swift, ParamError<'p>> {
        params.check(KNOWN)?;
        let us = |key, default: f64| params.get(key, default).map(|v| v * 1e3);
        let mtu = path.mtu.max(1) as f64;
        let bdp = (path.bdp_bytes() / mtu).max(1.0);
        let max_cwnd = params.get("max_cwnd", 4.0 * bdp)?.max(1.0);
        Ok(Swift {
            base_target: us("base_target", path.base_rtt_ns as f64 / 1e3 + 5.0)?,
            hop_scale: us("hop_scale", 1.0)?,
            hops: params.get("hops", 1.0)?,
            ai: params.get("ai", 1.0)?,
            beta: params.get("beta", 0.8)?,
            max_mdf: params.get("max_mdf", 0.5)?.min(1.0),
            min_cwnd: params.get("min_cwnd", 0.01)?.max(1e-6),
            max_cwnd,
            mtu,
            line_rate: path.line_rate_bps as f64,
            cwnd: max_cwnd.min(bdp),
            rtt: path.base_rtt_ns.max(1) as f64,
            last_decrease: None,
        })
    }
}

impl CongestionControl for Swift {
    fn on_event(&mut self, now: u64, event: &Event) -> Control {
        match *event {
            Event::Ack { acked_bytes, rtt_ns: Some(rtt), .. } => self.on_ack(now, acked_bytes, rtt.max(1) as f64),
            Event::Timeout => self.decrease(now, 1.0 - self.max_mdf),
            Event::Int { hops } => self.hops = hops.len() as f64,
            _ => {}
        }
        self.control()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };

    fn ack(s: &mut Swift, now: u64, rtt_us: u64) -> Control {
        s.on_event(
            now,
            &Event::Ack { acked_bytes: 4096, in_flight_bytes: 0, rtt_ns: Some(rtt_us * 1000), ecn_echo: false },
        )
    }

    #[test]
    fn below_target_the_window_grows_by_ai_per_rtt() {
        let mut s = Swift::from_params(&Params::NONE, &PATH).unwrap();
        let w = s.cwnd();
        // One window of ACKs adds about one packet.
        for _ in 0..(w as usize) {
            ack(&mut s, 0, 12);
        }
        assert!((s.cwnd() - w - 1.0).abs() < 0.1, "{} -> {}", w, s.cwnd());
    }

    #[test]
    fn above_target_it_cuts_by_the_overshoot_once_per_rtt() {
        let mut s = Swift::from_params(&Params::NONE, &PATH).unwrap();
        let w = s.cwnd();
        // Target 16 µs (10 + 5 + 1 hop); 40 µs overshoots by 60 %: cut by
        // min(0.8 * 0.6, 0.5) = 0.48.
        ack(&mut s, 1_000_000, 40);
        assert!((s.cwnd() - w * 0.52).abs() < 1e-9);
        ack(&mut s, 1_010_000, 40);
        assert!((s.cwnd() - w * 0.52).abs() < 1e-9, "a second cut within an RTT");
        ack(&mut s, 1_040_000, 40);
        assert!((s.cwnd() - w * 0.52 * 0.52).abs() < 1e-9);
    }

    #[test]
    fn int_hops_raise_the_target_and_tiny_windows_pace() {
        let mut s = Swift::from_params(&Params::new("min_cwnd=0.001"), &PATH).unwrap();
        let hops = [crate::IntHop::default(); 3];
        s.on_event(0, &Event::Int { hops: &hops });
        assert_eq!(s.target(), 18_000.0);
        s.cwnd = 0.5;
        let c = ack(&mut s, 0, 100);
        // Half a packet per 100 µs RTT (the cut applies first).
        let cwnd = s.cwnd();
        assert_eq!(c.rate_bps, (cwnd * 4096.0 * 8e9 / 100_000.0) as u64);
        assert_eq!(c.window_bytes, 4096);
    }
}
