//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`).

use std::ffi::c_int;

use softrnic_provider::provider::DeviceSrq;
use softrnic_transport::{SrqAttr, SrqId};

use crate::abi::*;
use crate::acks::{AckFields, Reported};
use crate::c_view::CView;
use crate::context::{Context, limits};
use crate::ffi::{refuse, refuse_null};
use crate::memory::Pd;
use crate::qp::post_recv_chain;

#[repr(C)]
pub struct Srq {
    pub ibv: CView<ibv_srq>,
    pub id: SrqId,
    queue: DeviceSrq,
    /// Asynchronous events naming this SRQ handed out.
    pub async_events: Reported,
}

impl Srq {
    /// # Safety
    /// `srq` must come from [`ibv_create_srq`] and not be destroyed.
    pub unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> &'a Srq {
        // SAFETY: `ibv` is the first field of a boxed `Srq` (caller).
        unsafe { &*(srq as *const Srq) }
    }

    fn context(&self) -> &Context {
        // SAFETY: an SRQ never outlives its context.
        unsafe { Context::from_ibv((*self.ibv.get()).context) }
    }

    /// The acknowledgement fields of its asynchronous events.
    pub fn acks(&self) -> AckFields {
        let srq = self.ibv.get();
        // SAFETY: projections into our own live allocation.
        unsafe {
            AckFields {
                mutex: &raw mut (*srq).mutex,
                cond: &raw mut (*srq).cond,
                completed: &raw mut (*srq).events_completed,
            }
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    crate::ffi::guard("ibv_create_srq", || {
        const VERB: &str = "ibv_create_srq";
        if pd.is_null() || init.is_null() {
            return refuse_null(VERB, libc::EINVAL, "NULL PD or attributes");
        }
        // SAFETY: a live PD and readable attributes (caller).
        let (p, a) = unsafe { (Pd::from_ibv(pd), &mut *init) };
        if a.attr.max_wr == 0 || a.attr.max_wr > limits::MAX_QP_WR || a.attr.max_sge > limits::MAX_SGE {
            return refuse_null(
                VERB,
                libc::EINVAL,
                format!("max_wr must be 1..={}, max_sge at most {}", limits::MAX_QP_WR, limits::MAX_SGE),
            );
        }
        let attr = SrqAttr { max_wr: a.attr.max_wr, max_sge: a.attr.max_sge.max(1), limit: a.attr.srq_limit };
        let ctx = p.context();
        let queue = match ctx.provider.create_srq(p.id, attr) {
            Ok(queue) => queue,
            Err(e) => return refuse_null(VERB, e.errno(), e),
        };
        // SAFETY: all-zero pthread objects are their static initialisers.
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = ctx.ibv();
        ibv.srq_context = a.srq_context;
        ibv.pd = pd;
        let id = queue.id();
        ibv.handle = id.0;
        let srq = Box::into_raw(Box::new(Srq { ibv: CView::new(ibv), id, queue, async_events: Reported::default() }));
        ctx.objects().srqs.insert(id, srq as usize);
        srq as *mut ibv_srq
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    crate::ffi::guard("ibv_modify_srq", || {
        const VERB: &str = "ibv_modify_srq";
        // SAFETY: a live SRQ and readable attributes (caller).
        let (s, a) = unsafe { (Srq::from_ibv(srq), &*attr) };
        if mask & IBV_SRQ_MAX_WR != 0 {
            return refuse(VERB, libc::EOPNOTSUPP, "resizing an SRQ is not supported");
        }
        if mask & IBV_SRQ_LIMIT != 0
            && let Err(e) = s.context().provider.set_srq_limit(&s.queue, a.srq_limit)
        {
            return refuse(VERB, e.errno(), e);
        }
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    crate::ffi::guard("ibv_query_srq", || {
        // SAFETY: a live SRQ (caller).
        let s = unsafe { Srq::from_ibv(srq) };
        let a = match s.context().provider.query_srq(&s.queue) {
            Ok(a) => a,
            Err(e) => return refuse("ibv_query_srq", e.errno(), e),
        };
        // SAFETY: writable attributes (caller).
        unsafe { *attr = ibv_srq_attr { max_wr: a.max_wr, max_sge: a.max_sge, srq_limit: a.limit } };
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    crate::ffi::guard("ibv_destroy_srq", || {
        // SAFETY: a live SRQ (caller).
        let s = unsafe { Srq::from_ibv(srq) };
        let ctx = s.context();
        let id = s.id;
        if let Err(e) = ctx.provider.destroy_srq(&s.queue) {
            return refuse("ibv_destroy_srq", e.errno(), e);
        }
        ctx.objects().srqs.remove(&id);
        // SAFETY: live until freed below.
        unsafe { s.acks().wait_for(&s.async_events) };
        // SAFETY: boxed in `ibv_create_srq`, freed once here.
        drop(unsafe { Box::from_raw(srq as *mut Srq) });
        0
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    crate::ffi::guard("post_srq_recv", || {
        // SAFETY: a live SRQ (caller).
        let s = unsafe { Srq::from_ibv(srq) };
        // SAFETY: forwarded contract.
        unsafe { post_recv_chain("ibv_post_srq_recv", wr, bad_wr, |r| s.context().provider.post_srq_recv(&s.queue, r)) }
    })
}
