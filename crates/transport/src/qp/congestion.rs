//! A QP's part in congestion control, in both of RoCEv2's roles.
//!
//! As the **reaction point** (the sender of data: a requester, or a
//! responder answering READs) it holds its algorithm's state, tells it
//! what happens, and obeys the [`Control`] it answers: the rate goes to
//! the pacer, the window bounds what is in flight, the timer joins the
//! QP's deadlines.
//!
//! As the **notification point** (the receiver of data) it answers a
//! CE-marked packet with a CNP to the sending QP, at most one per
//! `min_time_between_cnps`; CNPs leave outside the PSN-ordered answers
//! (the shard queues them). It also remembers CE for the BECN bit of its
//! next ACK (DCTCP's echo) and the INT records of the last request, which
//! its answers echo.

use std::collections::VecDeque;

use softrnic_cc::{CongestionControl, Control, Event, Path};
use softrnic_wire::Psn;

use super::{Ctx, Pacer, QpState, QueuePair};
use crate::congestion::{Choice, IntMark, IntRecords};
use std::time::Duration;

use crate::time::{Instant, ack_timeout};

/// The reaction point's state.
pub(super) struct ReactionPoint {
    algorithm: Box<dyn CongestionControl + Send>,
    path: Path,
    control: Control,
    timer: Option<Instant>,
    wants_int: bool,
    /// New request packets that asked for an ACK, oldest first, and when
    /// they left: each ACK that covers one is an RTT sample.
    timed: VecDeque<(Psn, Instant)>,
}

/// Request packets timed at once at most: more than a window's ACK
/// requests never wait.
const TIMED_MAX: usize = 64;

impl std::fmt::Debug for ReactionPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReactionPoint").field("control", &self.control).field("timer", &self.timer).finish()
    }
}

/// The notification point's state.
#[derive(Debug, Default)]
pub(super) struct NotificationPoint {
    /// When this QP last asked for a CNP.
    last_cnp: Option<Instant>,
    /// CE arrived since the last ACK: the next one carries BECN.
    pub ce_unechoed: bool,
    /// The INT records of the last request, for the answers to echo.
    pub int_to_echo: Option<IntRecords>,
}

impl QueuePair {
    /// Chooses the algorithm this QP runs (`None`: none). A QP that is
    /// sending already starts it afresh now; one that is not yet starts it
    /// when it enters RTS, once its path MTU is known.
    pub(crate) fn choose_congestion_control(&mut self, ctx: &Ctx, algorithm: Option<Choice>) {
        self.algorithm = algorithm;
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            self.start_congestion_control(ctx);
        }
    }

    /// The device's default algorithm, for a QP just created.
    pub(crate) fn default_congestion_control(&mut self, algorithm: Option<Choice>) {
        if self.state == QpState::Reset {
            self.algorithm = algorithm;
        }
    }

    /// The algorithm this QP runs, if any.
    pub fn congestion_control(&self) -> Option<&Choice> {
        self.algorithm.as_ref()
    }

    /// Gives the QP its algorithm's fresh state.
    pub(super) fn start_congestion_control(&mut self, ctx: &Ctx) {
        self.rp = self.algorithm.as_ref().map(|choice| {
            let path = Path {
                line_rate_bps: ctx.config.congestion.line_rate_bps,
                base_rtt_ns: ctx.config.congestion.base_rtt.as_nanos() as u64,
                mtu: u64::from(self.mtu()),
            };
            let algorithm = choice.0.build(&path);
            let wants_int = algorithm.wants_int();
            ReactionPoint {
                algorithm,
                path,
                control: Control::line_rate(&path),
                timer: None,
                wants_int,
                timed: VecDeque::new(),
            }
        });
        self.apply_rate();
    }

    /// The window congestion control set, if it runs.
    pub fn congestion_window(&self) -> Option<u64> {
        self.rp.as_ref().map(|rp| rp.control.window_bytes)
    }

    /// The rate congestion control set, if it runs.
    pub fn congestion_rate(&self) -> Option<u64> {
        self.rp.as_ref().map(|rp| rp.control.rate_bps)
    }

    /// Tells the algorithm what happened and obeys its answer.
    pub(super) fn cc_event(&mut self, ctx: &Ctx, event: Event) {
        let Some(rp) = &mut self.rp else {
            return;
        };
        let control = rp.algorithm.on_event(ctx.now.as_nanos(), &event);
        // The sandbox checks what user code says; a built-in's answer is
        // trusted but still kept within what can be obeyed, and never below
        // a packet a millisecond nor 16 packets per retransmission timeout:
        // slower, the QP's own timer would give up on packets the pacer
        // still holds.
        let timeout = ack_timeout(self.attrs.timeout).unwrap_or(Duration::from_millis(100));
        let per_timeout = (u128::from(rp.path.mtu) * 8 * 16 * 1_000_000_000 / timeout.as_nanos().max(1)) as u64;
        let floor = (rp.path.mtu * 8 * 1000).max(per_timeout);
        let rate = control.rate_bps.clamp(floor.min(rp.path.line_rate_bps), rp.path.line_rate_bps);
        let window = control.window_bytes.max(rp.path.mtu);
        rp.timer =
            (control.timer_at_ns != 0).then(|| Instant::from_nanos(control.timer_at_ns.max(ctx.now.as_nanos() + 1)));
        let rate_changed = rate != rp.control.rate_bps;
        rp.control = Control { rate_bps: rate, window_bytes: window, timer_at_ns: control.timer_at_ns };
        if rate_changed {
            self.apply_rate();
        }
    }

    /// Sets the pacer to the lower of the user's limit and the algorithm's
    /// rate. Under congestion control a QP is paced even at line rate, as
    /// a NIC's wire paces it: a window let out at once would queue in the
    /// host and inflate every RTT sample.
    pub(super) fn apply_rate(&mut self) {
        let cc = self.rp.as_ref().map(|rp| rp.control.rate_bps);
        let rate = match (self.rate_limit, cc) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (&mut self.pacer, rate) {
            (Some(pacer), Some(rate)) => pacer.set_rate(rate),
            (pacer, rate) => *pacer = rate.map(Pacer::new),
        }
        if self.pacer.is_none() {
            self.paced_until = None;
        }
    }

    /// The window in packets congestion control allows: the algorithm's,
    /// and in any case no more than the pacer lets out in half the QP's
    /// retransmission timeout (at least 4 packets). A flight that took
    /// longer to leave would time out while still leaving, go back, and
    /// spend the QP's retries without the peer ever being silent.
    pub(super) fn congestion_window_packets(&self) -> Option<u32> {
        let rp = self.rp.as_ref()?;
        let mtu = u64::from(self.mtu()).max(1);
        let timeout = ack_timeout(self.attrs.timeout).unwrap_or(Duration::from_millis(100));
        let paced = (u128::from(rp.control.rate_bps) * (timeout / 2).as_nanos() / 8_000_000_000) as u64 / mtu;
        let window = rp.control.window_bytes.div_ceil(mtu).min(paced.max(4));
        Some(window.clamp(1, u64::from(u32::MAX)) as u32)
    }

    /// When the algorithm's timer is due.
    pub(super) fn congestion_timer(&self) -> Option<Instant> {
        self.rp.as_ref().and_then(|rp| rp.timer)
    }

    pub(super) fn congestion_timeout(&mut self, ctx: &Ctx) {
        if self.congestion_timer().is_some_and(|t| t <= ctx.now) {
            if let Some(rp) = &mut self.rp {
                rp.timer = None;
            }
            self.cc_event(ctx, Event::Timer);
        }
    }

    /// A data packet of `len` bytes left: the pacer and the algorithm
    /// count it, with the payload it carries by reference.
    pub(super) fn on_data_sent(&mut self, ctx: &Ctx, len: usize) {
        let len = ctx.referenced.unwrap_or(len);
        if let Some(pacer) = &mut self.pacer {
            pacer.on_send(ctx.now, len);
        }
        self.cc_event(ctx, Event::Sent { bytes: len as u64 });
    }

    /// A new request packet of `psn` that asks for an ACK left now.
    pub(super) fn time_for_congestion_control(&mut self, ctx: &Ctx, psn: Psn) {
        if let Some(rp) = &mut self.rp
            && rp.timed.len() < TIMED_MAX
        {
            rp.timed.push_back((psn, ctx.now));
        }
    }

    /// Packets are going again: an ACK will not say which copy it answers
    /// (Karn's rule), so nothing in flight is timed any more.
    pub(super) fn forget_timed_for_congestion_control(&mut self) {
        if let Some(rp) = &mut self.rp {
            rp.timed.clear();
        }
    }

    /// The window moved on by `acked` bytes as of `una`: the algorithm hears
    /// it, with the round trip of the newest timed packet it covers.
    pub(super) fn on_acknowledged(&mut self, ctx: &Ctx, acked: u64, ecn_echo: bool) {
        let Some(rp) = &mut self.rp else {
            return;
        };
        let mut rtt_ns = None;
        while let Some(&(psn, sent)) = rp.timed.front()
            && psn.is_before(self.req.una)
        {
            rtt_ns = Some((ctx.now - sent).as_nanos() as u64);
            rp.timed.pop_front();
        }
        let in_flight = self.req.sent_end.distance_from(self.req.una).max(0) as u64 * u64::from(self.mtu());
        self.cc_event(ctx, Event::Ack { acked_bytes: acked, in_flight_bytes: in_flight, rtt_ns, ecn_echo });
    }

    /// Whether the pacer holds data back now; if so, the QP wakes when it
    /// lets go.
    pub(super) fn paced(&mut self, ctx: &Ctx) -> bool {
        match self.pacer.filter(|p| !p.may_send(ctx.now)) {
            Some(pacer) => {
                self.paced_until = Some(pacer.ready_at());
                true
            }
            None => false,
        }
    }

    /// How this QP's requests travel: with an empty INT header when its
    /// algorithm wants telemetry and the device speaks INT.
    pub(super) fn request_int(&self, ctx: &Ctx) -> IntMark {
        match &self.rp {
            Some(rp) if rp.wants_int && ctx.config.congestion.int => IntMark::Collect,
            _ => IntMark::None,
        }
    }

    /// How this QP's answers travel: echoing the last request's records.
    pub(super) fn answer_int(&self) -> IntMark {
        self.np.int_to_echo.map_or(IntMark::None, IntMark::Echo)
    }

    /// The notification point: a packet for this QP arrived with CE.
    /// Returns whether to send the peer QP a CNP now.
    pub(crate) fn on_congestion_experienced(&mut self, ctx: &Ctx) -> bool {
        self.np.ce_unechoed = true;
        let spacing = ctx.config.congestion.min_time_between_cnps;
        if self.np.last_cnp.is_some_and(|at| ctx.now < at + spacing) {
            return false;
        }
        self.np.last_cnp = Some(ctx.now);
        true
    }

    /// The reaction point: the peer sent a CNP.
    pub(crate) fn on_cnp(&mut self, ctx: &Ctx) {
        self.cc_event(ctx, Event::Cnp);
    }
}
