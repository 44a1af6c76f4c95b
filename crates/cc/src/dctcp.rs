//! DCTCP, rate-based, as RDMA NICs run it: the receiver echoes CE on its
//! ACKs, the sender keeps alpha (the fraction of marked bytes, averaged
//! over RTTs) and cuts its rate by alpha/2 at most once per window.
//!
//! Reference: Alizadeh et al., "Data Center TCP", SIGCOMM 2010; the
//! rate-based form of HPCC's ns-3 model (`RdmaHw::HandleAckDctcp`): alpha
//! is updated once per round of data ([`Rounds`]), a cut enters CWR until
//! what was in flight then is acknowledged, and a round without a cut adds
//! `rai`.
//!
//! | parameter | default | meaning |
//! |---|---|---|
//! | `g` | 0.0625 | alpha's gain, 1/16 |
//! | `rai` | 1000 Mb/s | the additive increase per window |
//! | `min_rate` | 100 Mb/s | the rate never goes below |

use crate::event::{Control, Event, Path};
use crate::params::{ParamError, Params};
use crate::{CongestionControl, FromParams, Rounds};

const KNOWN: &[&str] = &["g", "rai", "min_rate"];

/// One QP's DCTCP.
#[derive(Debug, Clone, PartialEq)]
pub struct Dctcp {
    g: f64,
    rai: f64,
    min_rate: f64,
    line_rate: f64,
    rate: f64,
    alpha: f64,
    rounds: Rounds,
    /// Bytes acknowledged in the round, and how many of them were marked.
    round_acked: u64,
    round_marked: u64,
    /// In CWR until this many more bytes are acknowledged.
    cwr_left: Option<u64>,
}

impl Dctcp {
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    fn on_ack(&mut self, acked: u64, in_flight: u64, ecn_echo: bool) {
        self.round_acked += acked;
        if ecn_echo {
            self.round_marked += acked;
        }
        let new_round = self.rounds.on_ack(acked, in_flight);
        if new_round {
            let fraction = self.round_marked as f64 / self.round_acked.max(1) as f64;
            self.alpha = (1.0 - self.g) * self.alpha + self.g * fraction;
            self.round_acked = 0;
            self.round_marked = 0;
        }
        self.cwr_left = match self.cwr_left {
            Some(left) if acked < left => Some(left - acked),
            _ => None,
        };
        if ecn_echo && self.cwr_left.is_none() {
            self.cwr_left = Some(in_flight.max(1));
            self.rate = (self.rate * (1.0 - self.alpha / 2.0)).max(self.min_rate);
        } else if self.cwr_left.is_none() && new_round {
            self.rate = (self.rate + self.rai).min(self.line_rate);
        }
    }
}

impl FromParams for Dctcp {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Dctcp, ParamError<'p>> {
        params.check(KNOWN)?;
        let line_rate = path.line_rate_bps as f64;
        Ok(Dctcp {
            g: params.get("g", 1.0 / 16.0)?.min(1.0),
            rai: params.get("rai", 1000.0)? * 1e6,
            min_rate: (params.get("min_rate", 100.0)? * 1e6).clamp(1.0, line_rate),
            line_rate,
            rate: line_rate,
            alpha: 1.0,
            rounds: Rounds::default(),
            round_acked: 0,
            round_marked: 0,
            cwr_left: None,
        })
    }
}

impl CongestionControl for Dctcp {
    fn on_event(&mut self, _now: u64, event: &Event) -> Control {
        if let Event::Ack { acked_bytes, in_flight_bytes, ecn_echo, .. } = *event {
            self.on_ack(acked_bytes, in_flight_bytes, ecn_echo);
        }
        Control { rate_bps: self.rate as u64, window_bytes: Control::NO_WINDOW, timer_at_ns: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };

    #[test]
    fn a_marked_window_cuts_once_by_half_alpha() {
        let mut d = Dctcp::from_params(&Params::NONE, &PATH).unwrap();
        // Two marked ACKs in one window: one cut, by alpha/2 (alpha
        // starts at 1, as in DCTCP, and the first window updates it).
        let ack = Event::Ack { acked_bytes: 10_000, in_flight_bytes: 30_000, rtt_ns: None, ecn_echo: true };
        let first = d.on_event(1, &ack).rate_bps;
        let alpha = d.alpha();
        assert_eq!(first, (100e9 * (1.0 - alpha / 2.0)) as u64);
        assert_eq!(d.on_event(2, &ack).rate_bps, first, "CWR holds further cuts");
    }

    #[test]
    fn alpha_tracks_the_marked_fraction() {
        let mut d = Dctcp::from_params(&Params::new("g=0.5"), &PATH).unwrap();
        // Ten packets in flight, three in ten marked: alpha -> 0.3.
        for i in 0..400 {
            let ack = Event::Ack { acked_bytes: 1000, in_flight_bytes: 9000, rtt_ns: None, ecn_echo: i % 10 < 3 };
            d.on_event(0, &ack);
        }
        assert!((d.alpha() - 0.3).abs() < 0.05, "alpha {}", d.alpha());
    }

    #[test]
    fn unmarked_windows_add_rai() {
        let mut d = Dctcp::from_params(&Params::new("rai=500"), &PATH).unwrap();
        d.rate = 10e9;
        for _ in 0..4 {
            d.on_event(0, &Event::Ack { acked_bytes: 1000, in_flight_bytes: 0, rtt_ns: None, ecn_echo: false });
        }
        assert_eq!(d.rate as u64, 12_000_000_000);
    }
}
