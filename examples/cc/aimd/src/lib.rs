//! AIMD on CNPs: the smallest algorithm that controls a rate, written as a
//! user writes one (README, "Write your own algorithm").
//!
//! A CNP halves the rate (at most once per `cut_every` µs); every `step`
//! µs without one adds `add` Mb/s back, up to the line rate.

#![no_std]

use softrnic_cc::{CongestionControl, Control, Event, FromParams, ParamError, Params, Path};

pub struct Aimd {
    line_rate: u64,
    rate: u64,
    add: u64,
    step_ns: u64,
    cut_every_ns: u64,
    last_cut: Option<u64>,
    next_step: u64,
}

impl FromParams for Aimd {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Aimd, ParamError<'p>> {
        params.check(&["add", "step", "cut_every"])?;
        Ok(Aimd {
            line_rate: path.line_rate_bps,
            rate: path.line_rate_bps,
            add: (params.get("add", 100.0)? * 1e6) as u64,
            step_ns: (params.get("step", 50.0)? * 1e3) as u64,
            cut_every_ns: (params.get("cut_every", 10.0)? * 1e3) as u64,
            last_cut: None,
            next_step: 0,
        })
    }
}

impl CongestionControl for Aimd {
    fn on_event(&mut self, now: u64, event: &Event) -> Control {
        match event {
            Event::Cnp if self.last_cut.is_none_or(|at| now >= at + self.cut_every_ns) => {
                self.rate = (self.rate / 2).max(1_000_000);
                self.last_cut = Some(now);
                self.next_step = now + self.step_ns;
            }
            Event::Timer if now >= self.next_step => {
                self.rate = (self.rate + self.add).min(self.line_rate);
                self.next_step = now + self.step_ns;
            }
            _ => {}
        }
        let recovering = self.rate < self.line_rate;
        Control {
            rate_bps: self.rate,
            window_bytes: Control::NO_WINDOW,
            timer_at_ns: if recovering { self.next_step.max(now + 1) } else { 0 },
        }
    }
}

softrnic_cc::export_algorithm!(Aimd);
