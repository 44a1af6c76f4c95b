//! The extended CQ (`ibv_create_cq_ex`) and its polling API: a poll
//! session from `ibv_start_poll` to `ibv_end_poll`, one completion at a
//! time through `ibv_next_poll`, its fields read with `ibv_wc_read_*`
//! (rdma-core's `verbs.h` has the inline wrappers; they call the function
//! pointers every `ibv_cq_ex` carries).
//!
//! Completion timestamps count nanoseconds of the device's clock (time
//! since it opened): `hca_core_clock` is 1 000 000 kHz and
//! `ibv_query_rt_values_ex` reads the same clock. The wall-clock variant
//! is that instant on `CLOCK_REALTIME`.

use std::ffi::{c_int, c_uint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use softrnic_transport::{Completion, Instant};

use crate::abi::*;
use crate::context::Context;
use crate::cq::{Cq, NewCq, to_wc};
use crate::ffi::{guard, refuse, refuse_null};

/// The device clock's frequency in kHz, as `ibv_query_device_ex` reports
/// it: one tick a nanosecond.
pub const CORE_CLOCK_KHZ: u64 = 1_000_000;

/// What a CQ's completions carry for the extended API: everything the
/// standard `ibv_wc` has, and both timestamps. VLANs, flow tags and tag
/// matching belong to NICs softrnic does not imitate.
const SUPPORTED_WC_FLAGS: u64 = IBV_WC_EX_WITH_BYTE_LEN
    | IBV_WC_EX_WITH_IMM
    | IBV_WC_EX_WITH_QP_NUM
    | IBV_WC_EX_WITH_SRC_QP
    | IBV_WC_EX_WITH_SLID
    | IBV_WC_EX_WITH_SL
    | IBV_WC_EX_WITH_DLID_PATH_BITS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

/// A CQ's extended polling state: whose session it is, and the completion
/// the session stands on.
pub struct Cursor {
    /// What the program asked its completions to carry (`IBV_WC_EX_WITH_*`,
    /// all of which softrnic fills whether asked or not).
    pub wc_flags: u64,
    /// A session is open (`ibv_start_poll` found a completion, and
    /// `ibv_end_poll` has not come yet). Providers hold the CQ's lock for
    /// that long; a second thread's `ibv_start_poll` waits likewise.
    session: AtomicBool,
    current: Mutex<Option<Completion>>,
}

impl Cursor {
    pub fn new(wc_flags: u64) -> Cursor {
        Cursor { wc_flags, session: AtomicBool::new(false), current: Mutex::new(None) }
    }

    fn begin(&self) {
        while self.session.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
    }

    fn end(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.session.store(false, Ordering::Release);
    }

    fn current(&self) -> Option<Completion> {
        *self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Gives every CQ the extended API's operations.
pub fn fill_ops(cq: &mut ibv_cq_ex) {
    cq.start_poll = Some(start_poll);
    cq.next_poll = Some(next_poll);
    cq.end_poll = Some(end_poll);
    cq.read_opcode = Some(read_opcode);
    cq.read_vendor_err = Some(read_vendor_err);
    cq.read_byte_len = Some(read_byte_len);
    cq.read_imm_data = Some(read_imm_data);
    cq.read_qp_num = Some(read_qp_num);
    cq.read_src_qp = Some(read_src_qp);
    cq.read_wc_flags = Some(read_wc_flags);
    cq.read_slid = Some(read_slid);
    cq.read_sl = Some(read_sl);
    cq.read_dlid_path_bits = Some(read_dlid_path_bits);
    cq.read_completion_ts = Some(read_completion_ts);
    cq.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
}

/// `verbs_context.create_cq_ex`, behind `ibv_create_cq_ex`.
pub unsafe extern "C" fn create_cq_ex(context: *mut ibv_context, attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    guard("ibv_create_cq_ex", || {
        const VERB: &str = "ibv_create_cq_ex";
        if attr.is_null() {
            return refuse_null(VERB, libc::EINVAL, "NULL attributes");
        }
        // SAFETY: readable attributes (caller).
        let attr = unsafe { &*attr };
        if attr.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
            return refuse_null(VERB, libc::EINVAL, format!("unknown comp_mask bits {:#x}", attr.comp_mask));
        }
        if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
            return refuse_null(VERB, libc::EOPNOTSUPP, "parent domains are not supported by softrnic");
        }
        if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0 && attr.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0 {
            return refuse_null(VERB, libc::EOPNOTSUPP, "of the flags, softrnic supports only SINGLE_THREADED");
        }
        if attr.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            let why = format!(
                "wc_flags {:#x} ask for CVLAN, FLOW_TAG or TM_INFO, which softrnic does not report",
                attr.wc_flags & !SUPPORTED_WC_FLAGS
            );
            return refuse_null(VERB, libc::EOPNOTSUPP, why);
        }
        let new = NewCq {
            cqe: attr.cqe,
            cq_context: attr.cq_context,
            channel: attr.channel,
            comp_vector: attr.comp_vector,
            wc_flags: attr.wc_flags,
        };
        // SAFETY: a live context, and a live channel or NULL (caller).
        match unsafe { crate::cq::create(context, new) } {
            Ok(cq) => cq as *mut ibv_cq_ex,
            Err((errno, why)) => refuse_null(VERB, errno, why),
        }
    })
}

/// `verbs_context.query_rt_values`, behind `ibv_query_rt_values_ex`: the
/// device clock now, in the units of completion timestamps.
pub unsafe extern "C" fn query_rt_values(context: *mut ibv_context, values: *mut ibv_values_ex) -> c_int {
    guard("ibv_query_rt_values_ex", || {
        if values.is_null() {
            return refuse("ibv_query_rt_values_ex", libc::EINVAL, "NULL values");
        }
        // SAFETY: a live context and writable values (caller).
        unsafe {
            let requested = (*values).comp_mask;
            (*values).comp_mask = 0;
            if requested & IBV_VALUES_MASK_RAW_CLOCK != 0 {
                let now = Context::from_ibv(context).provider.now().as_nanos();
                (*values).raw_clock = libc::timespec {
                    tv_sec: (now / 1_000_000_000) as libc::time_t,
                    tv_nsec: (now % 1_000_000_000) as libc::c_long,
                };
                (*values).comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
            }
        }
        0
    })
}

/// # Safety
/// `cq` is a live CQ of softrnic's.
unsafe fn cq_of<'a>(cq: *mut ibv_cq_ex) -> &'a Cq {
    // SAFETY: every `ibv_cq_ex` softrnic hands out heads a `Cq` (caller).
    unsafe { Cq::from_ibv(cq as *mut ibv_cq) }
}

/// Takes the next completion into the session: 0, or ENOENT when the CQ
/// holds none.
///
/// Only `ibv_start_poll` drives the device first, as `ibv_poll_cq` does.
/// `ibv_next_poll` reads what the CQ holds: a session that went on to
/// receive would take completions an armed notification announces, and a
/// program woken by that event (`ibv_rc_pingpong -t -e`) would find its CQ
/// empty and fail.
fn advance(c: &Cq, cq: *mut ibv_cq_ex, drive: bool) -> c_int {
    let Some(next) = c.poll_one(drive) else {
        return libc::ENOENT;
    };
    *c.extended.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(next);
    // SAFETY: the program reads these two fields straight from the struct
    // after the call; we write them through the raw pointer, as a provider
    // writes them.
    unsafe {
        (*cq).wr_id = next.wr_id;
        (*cq).status = next.status as c_int;
    }
    0
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard("ibv_start_poll", || {
        // SAFETY: `attr` is readable (caller); verbs.h asks for it.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return refuse("ibv_start_poll", libc::EINVAL, "ibv_poll_cq_attr.comp_mask must be 0");
        }
        // SAFETY: a live CQ (caller).
        let c = unsafe { cq_of(cq) };
        c.extended.begin();
        let found = advance(c, cq, true);
        if found != 0 {
            // No session without a completion: the program does not call
            // ibv_end_poll after ENOENT.
            c.extended.end();
        }
        found
    })
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    // SAFETY: a live CQ in a poll session (caller).
    guard("ibv_next_poll", || advance(unsafe { cq_of(cq) }, cq, false))
}

unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: a live CQ in a poll session (caller).
    guard("ibv_end_poll", || unsafe { cq_of(cq) }.extended.end())
}

/// The session's completion as `ibv_wc` has it (zeroes outside one).
fn current_wc(cq: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: a live CQ (the accessors' caller).
    let current = unsafe { cq_of(cq) }.extended.current();
    // SAFETY: ibv_wc is plain integers; all-zero is valid.
    current.map_or_else(|| unsafe { std::mem::zeroed() }, |c| to_wc(&c))
}

macro_rules! reader {
    ($name:ident -> $t:ty, |$wc:ident| $value:expr) => {
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            guard(stringify!($name), || {
                let $wc = current_wc(cq);
                $value
            })
        }
    };
}

reader!(read_opcode -> c_int, |wc| wc.opcode);
reader!(read_vendor_err -> u32, |wc| wc.vendor_err);
reader!(read_byte_len -> u32, |wc| wc.byte_len);
reader!(read_imm_data -> u32, |wc| wc.imm_data);
reader!(read_qp_num -> u32, |wc| wc.qp_num);
reader!(read_src_qp -> u32, |wc| wc.src_qp);
reader!(read_wc_flags -> c_uint, |wc| wc.wc_flags as c_uint);
reader!(read_slid -> u32, |wc| u32::from(wc.slid));
reader!(read_sl -> u8, |wc| wc.sl);
reader!(read_dlid_path_bits -> u8, |wc| wc.dlid_path_bits);

/// The completion's instant on the device clock, in ticks of
/// [`CORE_CLOCK_KHZ`] (nanoseconds).
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: a live CQ (caller).
    guard("read_completion_ts", || unsafe { cq_of(cq) }.extended.current().map_or(0, |c| c.timestamp.as_nanos()))
}

/// The completion's instant on `CLOCK_REALTIME`, in nanoseconds.
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    guard("read_completion_wallclock_ns", || {
        // SAFETY: a live CQ (caller).
        let c = unsafe { cq_of(cq) };
        let Some(completion) = c.extended.current() else { return 0 };
        wallclock_ns(completion.timestamp, c.context().provider.now(), SystemTime::now())
    })
}

/// A device instant on the wall clock: `device_now` is `wall_now`.
fn wallclock_ns(at: Instant, device_now: Instant, wall_now: SystemTime) -> u64 {
    let ago = device_now.saturating_duration_since(at);
    let since_epoch = wall_now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.saturating_sub(ago).as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_device_instant_lands_on_the_wall_clock() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let ns = wallclock_ns(Instant::from_nanos(5_000), Instant::from_nanos(12_000), wall);
        assert_eq!(ns, 1_700_000_000_000_000_000 - 7_000);
    }
}
