//! Completion queues and completion channels (`ibv_create_cq`,
//! `ibv_poll_cq`, `ibv_req_notify_cq`, `ibv_get_cq_event`).
//!
//! A channel is an [`EventQueue`] of CQ handles whose descriptor is the
//! channel's `fd` (through softrnicd, a datagram socket the daemon writes
//! CQ handles to): readable while events wait, blocking or not as the
//! program sets it, exactly as the kernel's completion event file.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};

use softrnic_provider::{CompletionChannel, DeviceCq};
use softrnic_transport::{Completion, CqId};

use crate::abi::*;
use crate::acks::{AckFields, Reported};
use crate::c_view::CView;
use crate::context::{Context, limits};
use crate::ffi::{refuse, refuse_null, set_errno};

#[repr(C)]
pub struct CompChannel {
    pub ibv: CView<ibv_comp_channel>,
    /// Where its notifications arrive: from the engine in the process, or
    /// from softrnicd over a socket.
    pub events: CompletionChannel,
    /// The program's pointer for each CQ attached to the channel.
    pub cqs: Mutex<HashMap<CqId, usize>>,
}

/// A CQ. Every one is an `ibv_cq_ex`, whose first fields are `ibv_cq`'s:
/// the program may poll it with `ibv_poll_cq` or, when it made it with
/// `ibv_create_cq_ex`, with `ibv_start_poll` and the rest (`cq_ex.rs`).
#[repr(C)]
pub struct Cq {
    pub ibv: CView<ibv_cq_ex>,
    pub id: CqId,
    /// Completion events handed out by `ibv_get_cq_event`.
    pub comp_events: Reported,
    /// Asynchronous events (`IBV_EVENT_CQ_ERR`) handed out.
    pub async_events: Reported,
    pub(crate) queue: DeviceCq,
    /// Completions taken from the device but not yet handed out: polling
    /// reuses its allocation.
    scratch: Mutex<Vec<Completion>>,
    /// The extended polling API's state.
    pub(crate) extended: crate::cq_ex::Cursor,
}

impl Cq {
    /// # Safety
    /// `cq` must come from [`ibv_create_cq`] and not be destroyed.
    pub unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> &'a Cq {
        // SAFETY: `ibv` is the first field of a boxed `Cq` (caller).
        unsafe { &*(cq as *const Cq) }
    }

    pub(crate) fn context(&self) -> &Context {
        // SAFETY: a CQ never outlives its context, and the field never
        // changes.
        unsafe { Context::from_ibv((*self.ibv.get()).context) }
    }

    fn channel(&self) -> Option<&CompChannel> {
        // SAFETY: the field never changes; a channel outlives the CQs
        // attached to it (destroying it first fails with EBUSY).
        let channel = unsafe { (*self.ibv.get()).channel };
        (!channel.is_null()).then(|| unsafe { &*(channel as *const CompChannel) })
    }

    /// One completion, or none: after driving the device (the policy of
    /// `ibv_poll_cq`) when `drive`, else only what the CQ holds.
    pub(crate) fn poll_one(&self, drive: bool) -> Option<Completion> {
        let mut out = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        out.clear();
        match drive {
            true => self.context().provider.poll_cq(&self.queue, 1, &mut out),
            false => self.queue.poll_held(1, &mut out),
        };
        out.pop()
    }

    /// The acknowledgement fields of completion events (`async` false) or
    /// asynchronous ones.
    pub fn acks(&self, async_events: bool) -> AckFields {
        let cq = self.ibv.get();
        // SAFETY: projections into our own live allocation; no reference
        // is made.
        unsafe {
            AckFields {
                mutex: &raw mut (*cq).mutex,
                cond: &raw mut (*cq).cond,
                completed: if async_events {
                    &raw mut (*cq).async_events_completed
                } else {
                    &raw mut (*cq).comp_events_completed
                },
            }
        }
    }
}

impl CompChannel {
    /// The engine's shards the attached CQs draw on, which the engine's
    /// threads drive while a thread blocks on the channel.
    fn shards(&self) -> u64 {
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: attached CQs are live (destroying one detaches it under
        // this lock).
        cqs.values().fold(0, |mask, &cq| mask | unsafe { Cq::from_ibv(cq as *mut ibv_cq) }.queue.shards())
    }

    fn context(&self) -> &Context {
        // SAFETY: the channel's context outlives it.
        unsafe { Context::from_ibv((*self.ibv.get()).context) }
    }

    /// The CQs attached, as C's `refcnt`; only create and destroy of CQs
    /// change it, from any thread.
    fn refcnt(&self) -> &AtomicI32 {
        // SAFETY: an aligned `int` inside our live allocation, only ever
        // accessed atomically.
        unsafe { AtomicI32::from_ptr(&raw mut (*self.ibv.get()).refcnt) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    crate::ffi::guard("ibv_create_comp_channel", || {
        if context.is_null() {
            return refuse_null("ibv_create_comp_channel", libc::EINVAL, "NULL context");
        }
        // SAFETY: a live context (caller).
        let events = match unsafe { Context::from_ibv(context) }.provider.create_channel() {
            Ok(channel) => channel,
            Err(e) => return refuse_null("ibv_create_comp_channel", e.errno(), e),
        };
        let ibv = CView::new(ibv_comp_channel { context, fd: events.fd(), refcnt: 0 });
        Box::into_raw(Box::new(CompChannel { ibv, events, cqs: Mutex::default() })) as *mut ibv_comp_channel
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    crate::ffi::guard("ibv_destroy_comp_channel", || {
        // SAFETY: a live channel (caller).
        let ch = unsafe { &*(channel as *const CompChannel) };
        if ch.refcnt().load(Ordering::Acquire) > 0 {
            return refuse("ibv_destroy_comp_channel", libc::EBUSY, "CQs still use the channel");
        }
        let _ = ch.context().provider.destroy_channel(&ch.events);
        // SAFETY: boxed in `ibv_create_comp_channel`, freed once here.
        drop(unsafe { Box::from_raw(channel as *mut CompChannel) });
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    crate::ffi::guard("ibv_create_cq", || {
        let Ok(cqe) = u32::try_from(cqe) else {
            return refuse_null("ibv_create_cq", libc::EINVAL, format!("cqe {cqe} is outside 1..={}", limits::MAX_CQE));
        };
        let Ok(comp_vector) = u32::try_from(comp_vector) else {
            return refuse_null("ibv_create_cq", libc::EINVAL, "softrnic0 has one completion vector (0)");
        };
        let attr = NewCq { cqe, cq_context, channel, comp_vector, wc_flags: 0 };
        // SAFETY: a live context and channel, or NULL (caller).
        unsafe { create(context, attr) }
            .map_or_else(|(errno, why)| refuse_null("ibv_create_cq", errno, why), |cq| cq as *mut ibv_cq)
    })
}

/// What a new CQ is made with, from either create verb.
pub(crate) struct NewCq {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    /// What its completions carry for the extended polling API
    /// (`IBV_WC_EX_WITH_*`).
    pub wc_flags: u64,
}

/// Makes a CQ, or says why not (errno, reason).
///
/// # Safety
/// `context` is NULL or live; `attr.channel` is NULL or a live channel of it.
pub(crate) unsafe fn create(context: *mut ibv_context, attr: NewCq) -> Result<*mut Cq, (c_int, String)> {
    if context.is_null() {
        return Err((libc::EINVAL, "NULL context".into()));
    }
    if attr.cqe < 1 || attr.cqe > limits::MAX_CQE {
        return Err((libc::EINVAL, format!("cqe {} is outside 1..={}", attr.cqe, limits::MAX_CQE)));
    }
    if attr.comp_vector != 0 {
        return Err((libc::EINVAL, "softrnic0 has one completion vector (0)".into()));
    }
    // SAFETY: a live context (caller).
    let ctx = unsafe { Context::from_ibv(context) };
    let queue = ctx.provider.create_cq(attr.cqe as usize).map_err(|e| (e.errno(), e.to_string()))?;
    let id = queue.id();
    // SAFETY: all-zero pthread objects are their static initialisers, and
    // the rest is pointers, integers and empty function pointers.
    let mut ibv: ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = context;
    ibv.channel = attr.channel;
    ibv.cq_context = attr.cq_context;
    ibv.handle = id.0;
    ibv.cqe = attr.cqe as c_int;
    crate::cq_ex::fill_ops(&mut ibv);
    let cq = Box::into_raw(Box::new(Cq {
        ibv: CView::new(ibv),
        id,
        comp_events: Reported::default(),
        async_events: Reported::default(),
        queue,
        scratch: Mutex::new(Vec::new()),
        extended: crate::cq_ex::Cursor::new(attr.wc_flags),
    }));
    if !attr.channel.is_null() {
        // SAFETY: a live channel (caller), owned by `CompChannel`.
        let ch = unsafe { &*(attr.channel as *const CompChannel) };
        ch.refcnt().fetch_add(1, Ordering::AcqRel);
        ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).insert(id, cq as usize);
        if let Err(e) = ctx.provider.attach_cq(id, Some(&ch.events)) {
            eprintln!("softrnic: CQ {}: its completion channel: {e}", id.0);
        }
    }
    ctx.objects().cqs.insert(id, cq as usize);
    Ok(cq)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    crate::ffi::guard("ibv_destroy_cq", || {
        // SAFETY: a live CQ (caller).
        let c = unsafe { Cq::from_ibv(cq) };
        let ctx = c.context();
        let id = c.id;
        if let Err(e) = ctx.provider.destroy_cq(&c.queue) {
            return refuse("ibv_destroy_cq", e.errno(), e);
        }
        ctx.objects().cqs.remove(&id);
        if let Some(ch) = c.channel() {
            ch.cqs.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            // Events the program never collected die with the CQ (through
            // the daemon, `ibv_get_cq_event` skips them).
            ctx.provider.forget_cq(id, &ch.events);
            ch.refcnt().fetch_sub(1, Ordering::AcqRel);
        }
        // No event can name the CQ any more; wait for the program to
        // acknowledge those it took, as rdma-core does.
        // SAFETY: the CQ is live until freed below.
        unsafe {
            c.acks(false).wait_for(&c.comp_events);
            c.acks(true).wait_for(&c.async_events);
        }
        // SAFETY: boxed in `ibv_create_cq`, freed once here.
        drop(unsafe { Box::from_raw(cq as *mut Cq) });
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    crate::ffi::guard("ibv_resize_cq", || {
        // SAFETY: a live CQ (caller).
        let c = unsafe { Cq::from_ibv(cq) };
        if cqe < 1 || cqe as u32 > limits::MAX_CQE {
            return refuse("ibv_resize_cq", libc::EINVAL, format!("cqe {cqe} is outside 1..={}", limits::MAX_CQE));
        }
        // Through softrnicd the ring is a power of two, at least cqe.
        let resized = c.context().provider.resize_cq(&c.queue, cqe as u32).map(|slots| slots as c_int);
        match resized {
            Ok(size) => {
                // SAFETY: the program owns the CQ and is not polling it now
                // (verbs forbids resizing concurrently with polling).
                unsafe { (*c.ibv.get()).cqe = size };
                0
            }
            Err(e) => refuse("ibv_resize_cq", e.errno(), e),
        }
    })
}

/// What a RoCE NIC reports in `sl` of a UD receive: the network header in
/// front of the payload, as mlx5's CQE has it (0 a GRH, 1 IPv6, 2 IPv4).
/// UCX reads it to find the sender's address in the 40 bytes before the
/// data; with 0 it reads an IPv4 packet's header as a GRH and drops it.
fn roce_network_header(c: &Completion) -> u8 {
    match (c.grh, c.source) {
        (true, Some(std::net::IpAddr::V4(_))) => 2,
        (true, Some(std::net::IpAddr::V6(_))) => 1,
        _ => 0,
    }
}

/// Writes a completion in `ibv_wc`'s form.
pub fn to_wc(c: &Completion) -> ibv_wc {
    let mut flags = 0;
    let mut imm = 0;
    if let Some(v) = c.imm_data {
        flags |= IBV_WC_WITH_IMM;
        imm = v.to_be();
    }
    // `invalidated_rkey` shares the field, in host order.
    if let Some(rkey) = c.invalidated_rkey {
        flags |= IBV_WC_WITH_INV;
        imm = rkey;
    }
    if c.grh {
        flags |= IBV_WC_GRH;
    }
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status as c_int,
        opcode: c.opcode as c_int,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_data: imm,
        qp_num: c.qp_num,
        src_qp: c.src_qp,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: roce_network_header(c),
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`. With nothing ready it receives what has arrived, so a
/// program spinning on its CQ drives the NIC itself; ACKs owed then leave
/// with its next post, or within microseconds if it posts nothing.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    crate::ffi::guard("poll_cq", || {
        if num_entries <= 0 {
            return 0;
        }
        // SAFETY: a live CQ (caller).
        let c = unsafe { Cq::from_ibv(cq) };
        let mut out = c.scratch.lock().unwrap_or_else(|e| e.into_inner());
        out.clear();
        let n = c.context().provider.poll_cq(&c.queue, num_entries as usize, &mut out);
        for (i, completion) in out.iter().enumerate() {
            // SAFETY: `wc` has room for `num_entries` entries (caller) and
            // `i < n <= num_entries`.
            unsafe { wc.add(i).write(to_wc(completion)) };
        }
        n as c_int
    })
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    crate::ffi::guard("req_notify_cq", || {
        // SAFETY: a live CQ (caller).
        let c = unsafe { Cq::from_ibv(cq) };
        c.queue.request_notify(solicited_only != 0);
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    crate::ffi::guard("ibv_get_cq_event", || {
        // SAFETY: a live channel (caller).
        let ch = unsafe { &*(channel as *const CompChannel) };
        loop {
            // Blocks unless the program made the channel's fd non-blocking;
            // the engine threads drive the CQs' shards meanwhile.
            let fired = ch.events.take(&ch.context().provider, ch.shards());
            let fired = match fired {
                Ok(id) => id,
                Err(e) => {
                    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            };
            let cqs = ch.cqs.lock().unwrap_or_else(|e| e.into_inner());
            let Some(&ptr) = cqs.get(&fired) else {
                continue; // destroyed since it fired
            };
            let fired_cq = ptr as *mut ibv_cq;
            // Counted while the CQ is attached: its destroy detaches it under
            // this lock, then waits for the count to be acknowledged.
            // SAFETY: attached, so live.
            unsafe { Cq::from_ibv(fired_cq) }.comp_events.one_more();
            drop(cqs);
            // SAFETY: `fired_cq` is live (destroying it removes it from the
            // map); the out-pointers are writable (caller).
            unsafe {
                *cq = fired_cq;
                *cq_context = (*fired_cq).cq_context;
            }
            return 0;
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    crate::ffi::guard("ibv_ack_cq_events", || {
        // SAFETY: a live CQ (caller).
        unsafe { Cq::from_ibv(cq).acks(false).acknowledge(nevents) }
    })
}
