//! The WebAssembly interface: how an algorithm built for
//! `wasm32-unknown-unknown` talks to softrnic's sandbox.
//!
//! A module exports its linear memory and four functions, and imports
//! nothing:
//!
//! | export | does |
//! |---|---|
//! | `softrnic_cc_abi` | returns [`ABI_VERSION`] |
//! | `softrnic_cc_io` | returns the address of the module's [`Io`] block |
//! | `softrnic_cc_init` | builds the state from `Io::path` and `Io::params`; 0 on success, else writes `Io::message` |
//! | `softrnic_cc_on_event` | reads the event from `Io`, writes `Io::control` |
//!
//! One instance serves one QP, so the state is the module's own static:
//! it cannot reach another QP's. The host writes the event into the block
//! and reads the answer back; nothing else crosses.
//!
//! A user writes the algorithm against [`CongestionControl`](crate::CongestionControl) and
//! [`FromParams`], and exports
//! it with [`export_algorithm!`](crate::export_algorithm); the README's
//! "Write your own algorithm" walks through it.

use crate::{Control, Event, FromParams, IntHop, MAX_HOPS, Params, Path};

/// The interface version this crate speaks.
pub const ABI_VERSION: u32 = 1;
/// Bytes of parameter text a module receives at most.
pub const PARAMS_MAX: usize = 512;
/// Bytes of the message a module may leave when `init` fails.
pub const MESSAGE_MAX: usize = 1024;

/// Event kinds on the wire between host and module.
pub mod kind {
    pub const SENT: u32 = 1;
    pub const ACK: u32 = 2;
    pub const NAK: u32 = 3;
    pub const CNP: u32 = 4;
    pub const TIMEOUT: u32 = 5;
    pub const INT: u32 = 6;
    pub const TIMER: u32 = 7;
}

/// The block the host and a module exchange through, in the module's
/// memory. The host addresses fields by `offset_of!`.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct Io {
    pub now_ns: u64,
    pub kind: u32,
    /// Records in `hops` (INT), or for ACK 1 if `ecn_echo`.
    pub count: u32,
    /// SENT: bytes. ACK: bytes acknowledged.
    pub a: u64,
    /// ACK: the RTT sample in ns, 0 for none.
    pub b: u64,
    /// ACK: bytes in flight.
    pub c: u64,
    pub hops: [IntHop; MAX_HOPS],
    pub control: Control,
    pub path: Path,
    /// Set by `init`: whether the algorithm wants INT.
    pub wants_int: u32,
    pub params_len: u32,
    pub params: [u8; PARAMS_MAX],
    pub message_len: u32,
    pub message: [u8; MESSAGE_MAX],
}

impl Io {
    pub const EMPTY: Io = Io {
        now_ns: 0,
        kind: 0,
        count: 0,
        a: 0,
        b: 0,
        c: 0,
        hops: [IntHop { rate_bps: 0, timestamp_ns: 0, tx_bytes: 0, queue_bytes: 0, _reserved: 0 }; MAX_HOPS],
        control: Control { rate_bps: 0, window_bytes: 0, timer_at_ns: 0 },
        path: Path { line_rate_bps: 0, base_rtt_ns: 0, mtu: 0 },
        wants_int: 0,
        params_len: 0,
        params: [0; PARAMS_MAX],
        message_len: 0,
        message: [0; MESSAGE_MAX],
    };

    /// Writes `event` at `now` into the block (the host's half).
    pub fn set_event(&mut self, now: u64, event: &Event) {
        self.now_ns = now;
        (self.kind, self.count, self.a, self.b, self.c) = match *event {
            Event::Sent { bytes } => (kind::SENT, 0, bytes, 0, 0),
            Event::Ack { acked_bytes, in_flight_bytes, rtt_ns, ecn_echo } => {
                (kind::ACK, u32::from(ecn_echo), acked_bytes, rtt_ns.unwrap_or(0), in_flight_bytes)
            }
            Event::Nak => (kind::NAK, 0, 0, 0, 0),
            Event::Cnp => (kind::CNP, 0, 0, 0, 0),
            Event::Timeout => (kind::TIMEOUT, 0, 0, 0, 0),
            Event::Int { hops } => {
                let n = hops.len().min(MAX_HOPS);
                self.hops[..n].copy_from_slice(&hops[..n]);
                (kind::INT, n as u32, 0, 0, 0)
            }
            Event::Timer => (kind::TIMER, 0, 0, 0, 0),
        };
    }

    /// The event the block holds (the module's half); `None` for a kind
    /// this version does not know.
    pub fn event(&self) -> Option<Event<'_>> {
        Some(match self.kind {
            kind::SENT => Event::Sent { bytes: self.a },
            kind::ACK => Event::Ack {
                acked_bytes: self.a,
                in_flight_bytes: self.c,
                rtt_ns: if self.b == 0 { None } else { Some(self.b) },
                ecn_echo: self.count != 0,
            },
            kind::NAK => Event::Nak,
            kind::CNP => Event::Cnp,
            kind::TIMEOUT => Event::Timeout,
            kind::INT => Event::Int { hops: &self.hops[..(self.count as usize).min(MAX_HOPS)] },
            kind::TIMER => Event::Timer,
            _ => return None,
        })
    }

    /// Leaves `text` as the failure message.
    fn fail(&mut self, text: &str) -> u32 {
        let n = text.len().min(MESSAGE_MAX);
        self.message[..n].copy_from_slice(&text.as_bytes()[..n]);
        self.message_len = n as u32;
        1
    }
}

/// `softrnic_cc_init`'s body: builds `A` into `slot`.
pub fn init<A: FromParams>(io: &mut Io, slot: &mut Option<A>) -> u32 {
    let len = (io.params_len as usize).min(PARAMS_MAX);
    let params = io.params;
    let Ok(text) = core::str::from_utf8(&params[..len]) else {
        return io.fail("the parameters are not UTF-8");
    };
    match A::from_params(&Params::new(text), &io.path) {
        Ok(algorithm) => {
            io.wants_int = u32::from(algorithm.wants_int());
            *slot = Some(algorithm);
            0
        }
        Err(e) => {
            let mut message = Message { buf: [0; MESSAGE_MAX], len: 0 };
            let _ = core::fmt::write(&mut message, format_args!("{e}"));
            let len = message.len;
            io.fail(core::str::from_utf8(&message.buf[..len]).unwrap_or("bad parameters"))
        }
    }
}

/// `softrnic_cc_on_event`'s body.
pub fn on_event<A: FromParams>(io: &mut Io, slot: &mut Option<A>) {
    let Some(algorithm) = slot else {
        return;
    };
    let now = io.now_ns;
    io.control = match io.event() {
        Some(event) => algorithm.on_event(now, &event),
        // An event this module predates changes nothing.
        None => io.control,
    };
}

/// A fixed buffer for formatting without an allocator.
struct Message {
    buf: [u8; MESSAGE_MAX],
    len: usize,
}

impl core::fmt::Write for Message {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(MESSAGE_MAX - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Exports an algorithm from a `cdylib` built for `wasm32-unknown-unknown`:
/// `softrnic_cc::export_algorithm!(MyAlgorithm);`.
#[macro_export]
macro_rules! export_algorithm {
    ($algorithm:ty) => {
        mod __softrnic_cc_exports {
            #[allow(unused_imports)]
            use super::*;
            use $crate::guest::{self, Io};

            /// A static the single-threaded module mutates.
            struct Cell<T>(core::cell::UnsafeCell<T>);
            // SAFETY: wasm32-unknown-unknown modules have one thread, and
            // the host calls one export at a time.
            unsafe impl<T> Sync for Cell<T> {}

            static IO: Cell<Io> = Cell(core::cell::UnsafeCell::new(Io::EMPTY));
            static STATE: Cell<Option<$algorithm>> = Cell(core::cell::UnsafeCell::new(None));

            #[unsafe(no_mangle)]
            pub extern "C" fn softrnic_cc_abi() -> u32 {
                guest::ABI_VERSION
            }

            #[unsafe(no_mangle)]
            pub extern "C" fn softrnic_cc_io() -> *mut Io {
                IO.0.get()
            }

            #[unsafe(no_mangle)]
            pub extern "C" fn softrnic_cc_init() -> u32 {
                // SAFETY: one thread, one call at a time (see `Cell`): no
                // other reference to either static exists.
                unsafe { guest::init::<$algorithm>(&mut *IO.0.get(), &mut *STATE.0.get()) }
            }

            #[unsafe(no_mangle)]
            pub extern "C" fn softrnic_cc_on_event() {
                // SAFETY: as in `softrnic_cc_init`.
                unsafe { guest::on_event::<$algorithm>(&mut *IO.0.get(), &mut *STATE.0.get()) }
            }
        }
    };
}

/// A module that panics traps: the host unloads it for that QP.
#[cfg(all(feature = "guest", target_arch = "wasm32"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_cross_the_block_unchanged() {
        let hops = [IntHop { rate_bps: 1, timestamp_ns: 2, tx_bytes: 3, queue_bytes: 4, _reserved: 0 }; 2];
        let events = [
            Event::Sent { bytes: 4096 },
            Event::Ack { acked_bytes: 8192, in_flight_bytes: 4096, rtt_ns: Some(12_000), ecn_echo: true },
            Event::Ack { acked_bytes: 1, in_flight_bytes: 0, rtt_ns: None, ecn_echo: false },
            Event::Nak,
            Event::Cnp,
            Event::Timeout,
            Event::Int { hops: &hops },
            Event::Timer,
        ];
        let mut io = Io::EMPTY;
        for event in events {
            io.set_event(7, &event);
            assert_eq!(io.event(), Some(event));
            assert_eq!(io.now_ns, 7);
        }
    }
}
