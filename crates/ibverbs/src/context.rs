//! An open device (`ibv_open_device`): a running softrnic NIC behind a
//! `verbs_context`, and the verbs that query it.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::mem::offset_of;
use std::sync::Arc;

use softrnic_engine::{BindError, EngineConfig, Nic, OpenError};
use softrnic_event::EventFd;
use softrnic_provider::{DeviceEvent, Provider};
use softrnic_transport::{AsyncEvent, CqId, PdId, SrqId};

use crate::abi::*;
use crate::acks::Reported;
use crate::c_view::CView;
use crate::cq::Cq;
use crate::device::{SoftDevice, device};
use crate::engines::{self, ContextEngine, ContextEvents};
use crate::ffi::{copy_c_string, refuse, refuse_null, set_errno};
use crate::qp::Qp;
use crate::srq::Srq;

/// Most of each resource a device offers (`ibv_device_attr`), shared with
/// `softrnic devinfo`.
pub use softrnic_transport::limits;

/// The objects an asynchronous event may name, by the transport's
/// handles, so `ibv_get_async_event` can hand back the program's pointers.
///
/// With the PDs and MRs it also lists everything the context holds in its
/// engine, which a context that closes without destroying them releases:
/// the engine outlives it when another context shares it, and a region
/// left registered would let a peer write into memory the program frees.
#[derive(Default)]
pub struct Objects {
    pub qps: HashMap<u32, usize>,
    pub srqs: HashMap<SrqId, usize>,
    pub cqs: HashMap<CqId, usize>,
    pub pds: HashSet<PdId>,
    /// Registered regions, by lkey.
    pub mrs: HashSet<u32>,
    /// Memory windows, by handle (an rkey with its low 8 bits clear).
    pub mws: HashSet<u32>,
}

/// What `ibv_open_device` returns a pointer into (`vctx.context`).
#[repr(C)]
pub struct Context {
    pub vctx: CView<verbs_context>,
    /// The engine, shared with the process's other contexts on the device
    /// (`engines.rs`), or a session with softrnicd.
    pub provider: Provider<ContextEngine>,
    pub device: &'static SoftDevice,
    /// This context's objects and asynchronous events.
    pub events: Arc<ContextEvents>,
    /// What `cmd_fd` holds: the kernel's would be the uverbs command file.
    /// softrnic takes no commands through it, but programs `dup` it or
    /// hand it to `poll`, so it is a real descriptor that never becomes
    /// readable, closed with the context.
    command_fd: EventFd,
}

impl Context {
    /// The context behind a program's `ibv_context` pointer.
    ///
    /// # Safety
    /// `ctx` must come from [`ibv_open_device`] and not be closed yet.
    pub unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> &'a Context {
        // SAFETY: every `ibv_context` softrnic hands out is the
        // `vctx.context` field of a boxed `Context` (caller's promise).
        unsafe { &*(ctx.byte_sub(offset_of!(Context, vctx) + offset_of!(verbs_context, context)) as *const Context) }
    }

    pub fn ibv(&self) -> *mut ibv_context {
        // SAFETY: a projection into our own allocation; no reference is made.
        unsafe { &raw mut (*self.vctx.get()).context }
    }

    /// Takes out of the engine what the program left: QPs first (no more
    /// traffic), then SRQs, CQs, windows, regions and PDs. The program's handles
    /// die with the context, as the kernel's uverbs file does it.
    fn release_objects(&self) {
        let objects = std::mem::take(&mut *self.objects());
        for &qpn in objects.qps.keys() {
            let _ = self.provider.destroy_qp(qpn);
        }
        for &srq in objects.srqs.keys() {
            let _ = self.provider.release_srq(srq);
        }
        for &cq in objects.cqs.keys() {
            let _ = self.provider.destroy_cq_id(cq);
        }
        // Windows before regions: a bound window keeps its region.
        for &handle in &objects.mws {
            let _ = self.provider.dealloc_window(handle);
        }
        for &lkey in &objects.mrs {
            let _ = self.provider.deregister(lkey);
        }
        for &pd in &objects.pds {
            let _ = self.provider.dealloc_pd(pd);
        }
    }

    pub fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.events.objects()
    }
}

fn extended_ops() -> verbs_context {
    // SAFETY: `verbs_context` is plain data (pointers, integers, options of
    // function pointers, pthread objects whose zero value is their static
    // initialiser on glibc), so all-zero is a valid value.
    let mut v: verbs_context = unsafe { std::mem::zeroed() };
    v.query_port = Some(query_port_ex);
    v.query_device_ex = Some(query_device_ex);
    v.create_qp_ex = Some(crate::qp::create_qp_ex);
    v.create_cq_ex = Some(crate::cq_ex::create_cq_ex);
    v.query_rt_values = Some(crate::cq_ex::query_rt_values);
    v.sz = size_of::<verbs_context>();
    v.context.ops._compat_query_device = Some(ibv_query_device);
    v.context.ops.poll_cq = Some(crate::cq::poll_cq);
    v.context.ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    v.context.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
    v.context.ops.post_send = Some(crate::qp::post_send);
    v.context.ops.post_recv = Some(crate::qp::post_recv);
    v.context.ops.alloc_mw = Some(crate::window::alloc_mw);
    v.context.ops.bind_mw = Some(crate::window::bind_mw);
    v.context.ops.dealloc_mw = Some(crate::window::dealloc_mw);
    v.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    v.context.num_comp_vectors = 1;
    v
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(ibv_device: *mut ibv_device) -> *mut ibv_context {
    crate::ffi::guard("ibv_open_device", || {
        let device = match device() {
            Ok(d) if std::ptr::eq(ibv_device, &d.ibv) => d,
            _ => return refuse_null("ibv_open_device", libc::ENODEV, "not a softrnic device"),
        };
        let events = match ContextEvents::new() {
            Ok(events) => events,
            Err(e) => return refuse_null("ibv_open_device", e.raw_os_error().unwrap_or(libc::EMFILE), e),
        };
        let engine = || {
            let config = EngineConfig::from_env(device.addr).map_err(OpenError::Config)?;
            engines::attach(device.addr, &events, || Nic::open(config))
        };
        let provider = match Provider::open(device.addr, engine) {
            Ok(provider) => provider,
            Err(why) => {
                // Programs print only "Couldn't get context"; say what to do.
                eprintln!("softrnic: cannot open {} on {}: {why}", crate::device::DEVICE_NAME, device.addr);
                let errno = match &why {
                    softrnic_provider::OpenError::Daemon(e) => e.errno(),
                    softrnic_provider::OpenError::Engine(e) => match e {
                        OpenError::Bind(BindError::NotLocal(_)) => libc::EADDRNOTAVAIL,
                        OpenError::Bind(BindError::InUse(..)) => libc::EADDRINUSE,
                        OpenError::Bind(BindError::Other(_, e)) | OpenError::Io(e) => {
                            e.raw_os_error().unwrap_or(libc::EIO)
                        }
                        OpenError::Config(_) => libc::EINVAL,
                    },
                };
                return refuse_null("ibv_open_device", errno, why);
            }
        };
        finish_open(ibv_device, device, events, provider)
    })
}

fn finish_open(
    ibv_device: *mut ibv_device,
    device: &'static SoftDevice,
    events: Arc<ContextEvents>,
    provider: Provider<ContextEngine>,
) -> *mut ibv_context {
    let command_fd = match EventFd::new() {
        Ok(fd) => fd,
        Err(e) => return refuse_null("ibv_open_device", e.raw_os_error().unwrap_or(libc::EMFILE), e),
    };
    let ctx = Box::new(Context { vctx: CView::new(extended_ops()), provider, device, events, command_fd });
    let ctx = Box::leak(ctx);
    // SAFETY: the context is ours alone until returned.
    unsafe {
        (*ctx.ibv()).device = ibv_device;
        // Through softrnicd the daemon writes the context's events to a
        // socket of its own; in the process, the engine routes them to the
        // context's queue.
        (*ctx.ibv()).async_fd = ctx.provider.async_fd();
        (*ctx.ibv()).cmd_fd = std::os::fd::AsRawFd::as_raw_fd(&ctx.command_fd);
    }
    ctx.ibv()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    crate::ffi::guard("ibv_close_device", || {
        // SAFETY: the program hands back a context from `ibv_open_device`; the
        // box was leaked there and is reclaimed exactly once, here.
        let ctx = unsafe { Box::from_raw(Context::from_ibv(context) as *const Context as *mut Context) };
        ctx.release_objects();
        // The engine is let go with the context (`ContextEngine`).
        drop(ctx);
        0
    })
}

/// `ibv_device_attr` for softrnic0.
fn device_attr(device: &SoftDevice) -> ibv_device_attr {
    use limits::*;
    // SAFETY: `ibv_device_attr` is integers and a char array: all-zero is
    // valid.
    let mut a: ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_c_string(&mut a.fw_ver, concat!("softrnic ", env!("CARGO_PKG_VERSION")));
    a.node_guid = device.guid_be();
    a.sys_image_guid = device.guid_be();
    a.max_mr_size = u64::MAX;
    a.page_size_cap = !0xfff;
    a.vendor_id = VENDOR_ID;
    a.vendor_part_id = 0;
    a.hw_ver = 1;
    a.max_qp = MAX_QP as c_int;
    a.max_qp_wr = MAX_QP_WR as c_int;
    a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN
        | IBV_DEVICE_N_NOTIFY_CQ
        | IBV_DEVICE_SYS_IMAGE_GUID
        | IBV_DEVICE_MEM_WINDOW
        | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
    a.max_sge = MAX_SGE as c_int;
    a.max_sge_rd = MAX_SGE as c_int;
    a.max_cq = MAX_CQ as c_int;
    a.max_cqe = MAX_CQE as c_int;
    a.max_mr = MAX_MR as c_int;
    a.max_pd = MAX_PD as c_int;
    a.max_qp_rd_atom = MAX_RD_ATOMIC as c_int;
    a.max_res_rd_atom = (u32::from(MAX_RD_ATOMIC) * MAX_QP) as c_int;
    a.max_qp_init_rd_atom = MAX_RD_ATOMIC as c_int;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_ah = MAX_AH as c_int;
    a.max_srq = MAX_SRQ as c_int;
    a.max_mw = MAX_MW as c_int;
    a.max_mcast_grp = MAX_MCAST_GRP as c_int;
    a.max_mcast_qp_attach = MAX_MCAST_QP_ATTACH as c_int;
    a.max_total_mcast_qp_attach = (MAX_MCAST_GRP * MAX_MCAST_QP_ATTACH) as c_int;
    a.max_srq_wr = MAX_QP_WR as c_int;
    a.max_srq_sge = MAX_SGE as c_int;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    crate::ffi::guard("ibv_query_device", || {
        if context.is_null() || attr.is_null() {
            return refuse("ibv_query_device", libc::EINVAL, "NULL argument");
        }
        // SAFETY: a live context and a writable attribute struct (caller).
        unsafe { *attr = device_attr(Context::from_ibv(context).device) };
        0
    })
}

unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    crate::ffi::guard("query_device_ex", || {
        // SAFETY: `input` is NULL or readable (caller).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return refuse("ibv_query_device_ex", libc::EINVAL, "unknown comp_mask in the input");
        }
        if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
            return refuse("ibv_query_device_ex", libc::EINVAL, "attribute buffer too small");
        }
        // SAFETY: `attr` has `attr_size` writable bytes (caller), of which we
        // zero at most our struct's size and write the legacy part.
        unsafe {
            std::ptr::write_bytes(attr as *mut u8, 0, attr_size.min(size_of::<ibv_device_attr_ex>()));
            let orig = device_attr(Context::from_ibv(context).device);
            (*attr).orig_attr = orig;
            if attr_size >= offset_of!(ibv_device_attr_ex, hca_core_clock) + size_of::<u64>() {
                // Completions carry timestamps of a nanosecond clock (cq_ex.rs).
                (*attr).completion_timestamp_mask = u64::MAX;
                (*attr).hca_core_clock = crate::cq_ex::CORE_CLOCK_KHZ;
            }
            if attr_size >= size_of::<ibv_device_attr_ex>() {
                // `device_cap_flags_ex` (the tail's first word): the legacy
                // flags and ATOMIC WRITE.
                let flags = u64::from(orig.device_cap_flags) | IB_UVERBS_DEVICE_ATOMIC_WRITE;
                let mut extended = [0u8; ATTR_EX_TAIL];
                extended[..8].copy_from_slice(&flags.to_ne_bytes());
                (*attr).extended = extended;
                (*attr).phys_port_cnt_ex = 1;
            }
        }
        0
    })
}

pub(crate) fn port_attr(device: &SoftDevice) -> ibv_port_attr {
    // SAFETY: integers only; all-zero is valid.
    let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = softrnic_transport::Mtu::Mtu4096 as c_int;
    p.active_mtu = device.active_mtu as c_int;
    p.gid_tbl_len = limits::GID_TABLE_LEN as c_int;
    p.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
    p.max_msg_sz = limits::MAX_MSG_SIZE;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 2; // 4X
    p.active_speed = 32; // 25 Gb/s per lane, as EDR reports
    p.phys_state = 5; // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET;
    p
}

fn check_port(verb: &str, port: u32) -> Result<(), c_int> {
    if port == 1 {
        Ok(())
    } else {
        Err(refuse(verb, libc::EINVAL, format!("port {port} does not exist; softrnic0 has port 1")))
    }
}

unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    size: usize,
) -> c_int {
    crate::ffi::guard("query_port_ex", || {
        if let Err(e) = check_port("ibv_query_port", port.into()) {
            return e;
        }
        // SAFETY: a live context (caller).
        let p = port_attr(unsafe { Context::from_ibv(context) }.device);
        // SAFETY: `attr` has `size` writable bytes (caller); we write at most
        // our struct's size, as the header's version did.
        unsafe {
            std::ptr::copy_nonoverlapping(&p as *const _ as *const u8, attr as *mut u8, size.min(size_of_val(&p)))
        };
        0
    })
}

/// The exported `ibv_query_port`, which the header calls only when the
/// extended op is missing, and programs built against old headers call
/// with the shorter `struct _compat_ibv_port_attr` (no `port_cap_flags2`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    crate::ffi::guard("ibv_query_port", || {
        // SAFETY: the same contract, with the compat struct's size.
        unsafe { query_port_ex(context, port, attr, std::mem::offset_of!(ibv_port_attr, port_cap_flags2)) }
    })
}

fn gid_entry(device: &SoftDevice, index: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: device.gid(),
        gid_index: index,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: device.interface.as_ref().map_or(0, |(_, index)| *index),
    }
}

fn check_gid_index(verb: &str, index: i64) -> Result<u32, c_int> {
    u32::try_from(index).ok().filter(|&i| i < limits::GID_TABLE_LEN).ok_or_else(|| {
        refuse(verb, libc::EINVAL, format!("GID index {index} does not exist; softrnic0's table has index 0 only"))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    crate::ffi::guard("ibv_query_gid", || {
        if check_port("ibv_query_gid", port.into()).is_err() || check_gid_index("ibv_query_gid", index.into()).is_err()
        {
            return -1;
        }
        // SAFETY: a live context and a writable GID (caller).
        unsafe { *gid = Context::from_ibv(context).device.gid() };
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    crate::ffi::guard("_ibv_query_gid_ex", || {
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return refuse("ibv_query_gid_ex", libc::EINVAL, "flags must be 0 and the entry full-sized");
        }
        if let Err(e) = check_port("ibv_query_gid_ex", port) {
            return e;
        }
        let index = match check_gid_index("ibv_query_gid_ex", index.into()) {
            Ok(i) => i,
            Err(e) => return e,
        };
        // SAFETY: a live context and a writable entry (caller).
        unsafe { *entry = gid_entry(Context::from_ibv(context).device, index) };
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    crate::ffi::guard("_ibv_query_gid_table", || {
        if flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return -(refuse("ibv_query_gid_table", libc::EINVAL, "flags must be 0 and entries full-sized") as isize);
        }
        if max_entries < limits::GID_TABLE_LEN as usize {
            return -(refuse("ibv_query_gid_table", libc::EINVAL, "room for fewer entries than the table has")
                as isize);
        }
        // SAFETY: a live context; `entries` holds `max_entries` entries of
        // `entry_size` bytes (caller).
        unsafe {
            let device = Context::from_ibv(context).device;
            (entries as *mut u8).cast::<ibv_gid_entry>().write_unaligned(gid_entry(device, 0));
        }
        limits::GID_TABLE_LEN as isize
    })
}

/// `IBVERBS_PRIVATE_34`'s GID type query, which `ibv_devinfo` uses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    _context: *mut ibv_context,
    port: u8,
    index: c_uint,
    kind: *mut c_int,
) -> c_int {
    crate::ffi::guard("ibv_query_gid_type", || {
        if check_port("ibv_query_gid_type", port.into()).is_err()
            || check_gid_index("ibv_query_gid_type", index.into()).is_err()
        {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a writable enum (caller).
        unsafe { *kind = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(_context: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    crate::ffi::guard("ibv_query_pkey", || {
        if check_port("ibv_query_pkey", port.into()).is_err() || index != 0 {
            return -1;
        }
        // SAFETY: a writable pkey (caller). The default P_Key, in network order.
        unsafe { *pkey = softrnic_wire::DEFAULT_PKEY.to_be() };
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_pkey_index(_context: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    crate::ffi::guard("ibv_get_pkey_index", || {
        if check_port("ibv_get_pkey_index", port.into()).is_ok() && u16::from_be(pkey) & 0x7fff == 0x7fff {
            0
        } else {
            -libc::ENOENT
        }
    })
}

// ----- asynchronous events -----

/// The pointer and `ibv_event_type` of an event, or `None` when the object
/// it names is already gone.
pub(crate) fn translate(objects: &Objects, event: DeviceEvent) -> Option<(*mut c_void, c_int)> {
    let event = match event {
        DeviceEvent::Object(event) => event,
        // The element is a union; a device's own events fill its
        // `port_num`, 1 (as mlx5 reports its fatal error).
        DeviceEvent::Fatal => return Some((std::ptr::without_provenance_mut(1), IBV_EVENT_DEVICE_FATAL)),
    };
    let qp = |qpn: u32| objects.qps.get(&qpn).map(|&p| p as *mut c_void);
    Some(match event {
        AsyncEvent::QpFatal { qpn } => (qp(qpn)?, IBV_EVENT_QP_FATAL),
        AsyncEvent::QpRequestError { qpn } => (qp(qpn)?, IBV_EVENT_QP_REQ_ERR),
        AsyncEvent::QpAccessError { qpn } => (qp(qpn)?, IBV_EVENT_QP_ACCESS_ERR),
        AsyncEvent::QpLastWqeReached { qpn } => (qp(qpn)?, IBV_EVENT_QP_LAST_WQE_REACHED),
        AsyncEvent::SrqLimitReached { srq } => (*objects.srqs.get(&srq)? as *mut c_void, IBV_EVENT_SRQ_LIMIT_REACHED),
        AsyncEvent::CqError { cq } => (*objects.cqs.get(&cq)? as *mut c_void, IBV_EVENT_CQ_ERR),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    crate::ffi::guard("ibv_get_async_event", || {
        // SAFETY: a live context (caller).
        let ctx = unsafe { Context::from_ibv(context) };
        loop {
            // Blocks unless the program made `async_fd` non-blocking.
            let next = ctx.provider.next_async_event();
            let next = match next {
                Ok(e) => e,
                Err(e) => {
                    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                    return -1;
                }
            };
            let objects = ctx.objects();
            if let Some((element, event_type)) = translate(&objects, next) {
                // Counted while the object is listed: its destroy unlists it
                // under this lock, then waits for the count to be acknowledged.
                if next != DeviceEvent::Fatal {
                    // SAFETY: listed, so live.
                    unsafe { reported(element, event_type).one_more() };
                }
                drop(objects);
                // SAFETY: a writable event (caller).
                unsafe { *event = ibv_async_event { element, event_type } };
                return 0;
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    crate::ffi::guard("ibv_ack_async_event", || {
        // SAFETY: an event from `ibv_get_async_event` whose object, being
        // unacknowledged, cannot have been destroyed (caller).
        unsafe {
            let ibv_async_event { element, event_type } = *event;
            match event_type {
                // Names no object: nothing waits for its acknowledgement.
                IBV_EVENT_DEVICE_FATAL => {}
                IBV_EVENT_CQ_ERR => Cq::from_ibv(element as *mut ibv_cq).acks(true).acknowledge(1),
                IBV_EVENT_SRQ_LIMIT_REACHED => Srq::from_ibv(element as *mut ibv_srq).acks().acknowledge(1),
                _ => Qp::from_ibv(element as *mut ibv_qp).acks().acknowledge(1),
            }
        }
    })
}

/// Where the events naming `element` are counted.
///
/// # Safety
/// `element` must be a live object of the kind `event_type` names.
unsafe fn reported<'a>(element: *mut c_void, event_type: c_int) -> &'a Reported {
    // SAFETY: caller's promise.
    unsafe {
        match event_type {
            IBV_EVENT_CQ_ERR => &Cq::from_ibv(element as *mut ibv_cq).async_events,
            IBV_EVENT_SRQ_LIMIT_REACHED => &Srq::from_ibv(element as *mut ibv_srq).async_events,
            _ => &Qp::from_ibv(element as *mut ibv_qp).async_events,
        }
    }
}
