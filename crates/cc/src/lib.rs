//! Congestion control for softrnic: one trait, five built-in algorithms,
//! and the SDK for writing a sixth that softrnic loads at run time.
//!
//! An algorithm is a state machine with one hook. The transport calls
//! [`CongestionControl::on_event`] with the time and what happened to the
//! QP (a packet sent, an ACK with bytes acknowledged and maybe an RTT
//! sample, a NAK, a CNP, a timeout, INT records, the timer it asked for)
//! and obeys the [`Control`] it gets back: a rate for the QP's pacer, a
//! window of bytes in flight, and when to call again. Per-QP state is the
//! implementing type itself, of fixed size. Nothing here reads a clock or
//! allocates, so the same code runs in the engine, in the simulator, and
//! compiled to WebAssembly in the sandbox ([`guest`]).
//!
//! The shape learns from DOCA PCC (events in, a rate out), Linux's
//! `tcp_congestion_ops` and CCP, and is simpler than each: one function,
//! one answer, no callbacks into the NIC.
//!
//! Built in, one file each with its reference and parameters:
//! [`dcqcn`], [`dctcp`], [`timely`], [`hpcc`], [`swift`].

#![no_std]
#![forbid(unsafe_op_in_unsafe_fn)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod dcqcn;
pub mod dctcp;
mod event;
pub mod guest;
pub mod hpcc;
mod params;
#[cfg(feature = "alloc")]
mod registry;
mod round_trip;
pub mod swift;
pub mod timely;

pub use dcqcn::Dcqcn;
pub use dctcp::Dctcp;
pub use event::{Control, Event, IntHop, MAX_HOPS, Path};
pub use hpcc::Hpcc;
pub use params::{ParamError, Params};
#[cfg(feature = "alloc")]
pub use registry::{BUILTINS, Builtin};
pub use round_trip::Rounds;
pub use swift::Swift;
pub use timely::Timely;

/// A congestion-control algorithm: the state of one QP and its one hook.
pub trait CongestionControl {
    /// Something happened at `now_ns` (any clock, in nanoseconds, that
    /// only moves forward): what the QP should do now.
    fn on_event(&mut self, now_ns: u64, event: &Event) -> Control;

    /// Whether the algorithm needs in-band telemetry: the QP then sends
    /// its data with an INT header for switches to fill, which only a
    /// peer that enabled INT accepts (docs/ARCHITECTURE.md, "INT").
    fn wants_int(&self) -> bool {
        false
    }
}

/// How an algorithm's per-QP state comes to be: from the user's
/// parameters and the QP's path.
pub trait FromParams: CongestionControl + Sized {
    fn from_params<'p>(params: &Params<'p>, path: &Path) -> Result<Self, ParamError<'p>>;
}

/// `base` to the power `n`, by squaring: the same bits on every target
/// (`f64::powi` is std's, and its rounding is the platform's).
pub fn powi(mut base: f64, mut n: u64) -> f64 {
    let mut result = 1.0;
    while n > 0 {
        if n & 1 == 1 {
            result *= base;
        }
        base *= base;
        n >>= 1;
    }
    result
}
