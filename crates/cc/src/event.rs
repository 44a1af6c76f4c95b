//! What an algorithm hears and what it answers.

/// The path a QP's algorithm starts from.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct Path {
    /// The link's rate, bits per second: no algorithm sends faster.
    pub line_rate_bps: u64,
    /// The round trip of the path without queueing, nanoseconds.
    pub base_rtt_ns: u64,
    /// Bytes of payload per packet (the QP's path MTU).
    pub mtu: u64,
}

impl Path {
    /// The bandwidth-delay product in bytes: what fills the pipe.
    pub fn bdp_bytes(&self) -> f64 {
        self.line_rate_bps as f64 * self.base_rtt_ns as f64 / 8e9
    }
}

/// What one switch's egress port looked like as a packet left it, as the
/// receiver echoed it (HPCC's INT record). The clock and the byte count
/// wrap at 2^32, as on the wire: take differences with `wrapping_sub`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(C)]
pub struct IntHop {
    /// The egress link's rate.
    pub rate_bps: u64,
    /// The switch's clock, nanoseconds, modulo 2^32.
    pub timestamp_ns: u32,
    /// Bytes the port has sent, modulo 2^32.
    pub tx_bytes: u32,
    /// The egress queue's depth, bytes.
    pub queue_bytes: u32,
    pub _reserved: u32,
}

/// The most hops a packet records (the wire's `int::MAX_HOPS`).
pub const MAX_HOPS: usize = 5;

/// Something that happened to a QP. Time comes separately, with every
/// event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event<'a> {
    /// A packet of `bytes` left (a request, or a READ response: the data
    /// direction).
    Sent { bytes: u64 },
    /// An acknowledgement moved the window on by `acked_bytes`, leaving
    /// `in_flight_bytes` outstanding. `rtt_ns` is a round-trip sample when
    /// it covers a packet that was timed; `ecn_echo` says the receiver saw
    /// CE since its last ACK (the BECN bit of the ACK, DCTCP's ECE).
    Ack { acked_bytes: u64, in_flight_bytes: u64, rtt_ns: Option<u64>, ecn_echo: bool },
    /// A sequence-error NAK: a packet was lost.
    Nak,
    /// A congestion notification packet from the receiver.
    Cnp,
    /// The retransmission timer ran out.
    Timeout,
    /// In-band telemetry echoed with the last ACK, one record per hop
    /// from the sender outwards.
    Int { hops: &'a [IntHop] },
    /// The timer the algorithm asked for is due.
    Timer,
}

/// What an algorithm wants after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Control {
    /// The sending rate, bits per second, from 1 to the line rate.
    pub rate_bps: u64,
    /// Bytes in flight at most; [`Control::NO_WINDOW`] for none.
    pub window_bytes: u64,
    /// When to hear [`Event::Timer`] next (nanoseconds on the event
    /// clock); 0 for never.
    pub timer_at_ns: u64,
}

impl Control {
    pub const NO_WINDOW: u64 = u64::MAX;

    /// Full speed, no window, no timer.
    pub fn line_rate(path: &Path) -> Control {
        Control { rate_bps: path.line_rate_bps, window_bytes: Control::NO_WINDOW, timer_at_ns: 0 }
    }

    /// Why this answer cannot be obeyed, if it cannot: a rate of zero
    /// stops the QP for good, a rate above the line's is no limit at all,
    /// a window below one packet never lets a packet go, a timer in the
    /// past fires for ever.
    pub fn check(&self, path: &Path, now_ns: u64) -> Result<(), &'static str> {
        if self.rate_bps == 0 {
            return Err("a rate of 0");
        }
        if self.rate_bps > path.line_rate_bps {
            return Err("a rate above the line rate");
        }
        if self.window_bytes < path.mtu {
            return Err("a window smaller than one packet");
        }
        if self.timer_at_ns != 0 && self.timer_at_ns <= now_ns {
            return Err("a timer that is already due");
        }
        Ok(())
    }
}
