//! libibverbs, loaded at run time: whichever `libibverbs.so.1` the dynamic
//! loader finds (softrnic's drop-in library through `LD_LIBRARY_PATH`,
//! or rdma-core's with a real NIC or Soft-RoCE), called through its
//! exported functions and, for the data path, through the context's ops
//! table as `<infiniband/verbs.h>`'s inline functions do.
//!
//! Every verbs object is wrapped in an owner that destroys it on drop. The
//! unsafe code of the program lives here: each call's contract is the
//! verbs man page's (live objects from this library, buffers of the sizes
//! given).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;

use libloading::Library;
use softrnic_verbs_abi as abi;

/// The exported functions `rdma_bench` calls.
struct Functions {
    get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut abi::ibv_device,
    free_device_list: unsafe extern "C" fn(*mut *mut abi::ibv_device),
    get_device_name: unsafe extern "C" fn(*mut abi::ibv_device) -> *const c_char,
    open_device: unsafe extern "C" fn(*mut abi::ibv_device) -> *mut abi::ibv_context,
    close_device: unsafe extern "C" fn(*mut abi::ibv_context) -> c_int,
    query_port: unsafe extern "C" fn(*mut abi::ibv_context, u8, *mut abi::ibv_port_attr) -> c_int,
    query_gid: unsafe extern "C" fn(*mut abi::ibv_context, u8, c_int, *mut abi::ibv_gid) -> c_int,
    alloc_pd: unsafe extern "C" fn(*mut abi::ibv_context) -> *mut abi::ibv_pd,
    dealloc_pd: unsafe extern "C" fn(*mut abi::ibv_pd) -> c_int,
    reg_mr: unsafe extern "C" fn(*mut abi::ibv_pd, *mut c_void, usize, c_int) -> *mut abi::ibv_mr,
    dereg_mr: unsafe extern "C" fn(*mut abi::ibv_mr) -> c_int,
    create_cq: unsafe extern "C" fn(*mut abi::ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut abi::ibv_cq,
    destroy_cq: unsafe extern "C" fn(*mut abi::ibv_cq) -> c_int,
    create_qp: unsafe extern "C" fn(*mut abi::ibv_pd, *mut abi::ibv_qp_init_attr) -> *mut abi::ibv_qp,
    modify_qp: unsafe extern "C" fn(*mut abi::ibv_qp, *mut abi::ibv_qp_attr, c_int) -> c_int,
    destroy_qp: unsafe extern "C" fn(*mut abi::ibv_qp) -> c_int,
    wc_status_str: unsafe extern "C" fn(c_int) -> *const c_char,
}

/// The loaded library and an open device on it.
pub struct Verbs {
    f: Functions,
    context: *mut abi::ibv_context,
    pd: *mut abi::ibv_pd,
    /// The device's name, as `ibv_devices` prints it.
    pub device_name: String,
    /// Kept loaded for as long as the functions above are used.
    _library: Library,
}

// SAFETY: libibverbs is thread-safe: a context and a PD may be used from
// any thread, which is how multi-threaded verbs programs use them.
unsafe impl Send for Verbs {}
// SAFETY: as above; `Verbs` has no interior state of its own.
unsafe impl Sync for Verbs {}

/// The port every QP uses (verbs devices number ports from 1).
const PORT: u8 = 1;

fn last_os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl Verbs {
    /// Loads `libibverbs.so.1` and opens `device` (or the first device),
    /// with a protection domain for everything the benchmark registers.
    pub fn open(device: Option<&str>) -> Result<Verbs, String> {
        // SAFETY: loading libibverbs runs its initialisers, which expect
        // nothing of the loading program.
        let library = unsafe { Library::new("libibverbs.so.1") }
            .map_err(|e| format!("cannot load libibverbs.so.1 ({e}); install rdma-core's libibverbs1, or point LD_LIBRARY_PATH at softrnic's (scripts/build-libibverbs.sh)"))?;
        // SAFETY: each symbol is looked up with the C signature verbs.h
        // declares for it.
        let f = unsafe {
            macro_rules! symbol {
                ($name:literal) => {
                    *library.get($name).map_err(|e| format!("libibverbs.so.1 lacks a verbs function: {e}"))?
                };
            }
            Functions {
                get_device_list: symbol!(b"ibv_get_device_list"),
                free_device_list: symbol!(b"ibv_free_device_list"),
                get_device_name: symbol!(b"ibv_get_device_name"),
                open_device: symbol!(b"ibv_open_device"),
                close_device: symbol!(b"ibv_close_device"),
                query_port: symbol!(b"ibv_query_port"),
                query_gid: symbol!(b"ibv_query_gid"),
                alloc_pd: symbol!(b"ibv_alloc_pd"),
                dealloc_pd: symbol!(b"ibv_dealloc_pd"),
                reg_mr: symbol!(b"ibv_reg_mr"),
                dereg_mr: symbol!(b"ibv_dereg_mr"),
                create_cq: symbol!(b"ibv_create_cq"),
                destroy_cq: symbol!(b"ibv_destroy_cq"),
                create_qp: symbol!(b"ibv_create_qp"),
                modify_qp: symbol!(b"ibv_modify_qp"),
                destroy_qp: symbol!(b"ibv_destroy_qp"),
                wc_status_str: symbol!(b"ibv_wc_status_str"),
            }
        };
        let (context, device_name) = open_device(&f, device)?;
        // SAFETY: `context` is the open device.
        let pd = unsafe { (f.alloc_pd)(context) };
        if pd.is_null() {
            // SAFETY: as above; nothing else uses it.
            unsafe { (f.close_device)(context) };
            return Err(last_os_error("ibv_alloc_pd"));
        }
        Ok(Verbs { f, context, pd, device_name, _library: library })
    }

    /// The port's active MTU, as the `ibv_mtu` enum (1 = 256 ... 5 = 4096).
    pub fn active_mtu(&self) -> Result<u8, String> {
        // SAFETY: an all-zero port attribute is a valid value to fill.
        let mut attr: abi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a whole ibv_port_attr,
        // at least the size the exported function fills.
        if unsafe { (self.f.query_port)(self.context, PORT, &mut attr) } != 0 {
            return Err(last_os_error("ibv_query_port"));
        }
        if attr.state != abi::IBV_PORT_ACTIVE {
            return Err(format!("port {PORT} of {} is not active (state {})", self.device_name, attr.state));
        }
        Ok(attr.active_mtu as u8)
    }

    /// GID `index` of the port.
    pub fn gid(&self, index: i32) -> Result<[u8; 16], String> {
        let mut gid = abi::ibv_gid { raw: [0; 16] };
        // SAFETY: the context is open and `gid` is an ibv_gid.
        if unsafe { (self.f.query_gid)(self.context, PORT, index, &mut gid) } != 0 {
            return Err(format!(
                "{} has no GID at -gidIndex {index}: {}",
                self.device_name,
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: every bit pattern is a valid `raw`.
        Ok(unsafe { gid.raw })
    }

    /// What `ibv_wc_status_str` calls a completion status.
    pub fn status_str(&self, status: i32) -> String {
        // SAFETY: the function returns a static string for any status.
        let text = unsafe { CStr::from_ptr((self.f.wc_status_str)(status)) };
        text.to_string_lossy().into_owned()
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // SAFETY: every object made on the PD has been destroyed by now
        // (they borrow `Verbs`), so both may go.
        unsafe {
            (self.f.dealloc_pd)(self.pd);
            (self.f.close_device)(self.context);
        }
    }
}

/// What to do when this libibverbs sees no device.
const NO_DEVICE_HINT: &str =
    "run over softrnic's libibverbs.so.1 (LD_LIBRARY_PATH=target/softrnic/lib), or load a NIC's driver";

/// Opens the device named `wanted`, or the first one.
fn open_device(f: &Functions, wanted: Option<&str>) -> Result<(*mut abi::ibv_context, String), String> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid out-parameter.
    let list = unsafe { (f.get_device_list)(&mut count) };
    if list.is_null() {
        return Err(format!("{}: {NO_DEVICE_HINT}", last_os_error("ibv_get_device_list found no RDMA support")));
    }
    // SAFETY: the list holds `count` device pointers.
    let devices = unsafe { std::slice::from_raw_parts(list, count.max(0) as usize) };
    let names: Vec<String> = devices
        .iter()
        // SAFETY: each entry is a device of the list, whose name is a C string.
        .map(|&d| unsafe { CStr::from_ptr((f.get_device_name)(d)) }.to_string_lossy().into_owned())
        .collect();
    let chosen = match wanted {
        Some(name) => names.iter().position(|n| n == name),
        None => (!names.is_empty()).then_some(0),
    };
    let result = match chosen {
        // SAFETY: the device is an entry of the live list.
        Some(i) => match unsafe { (f.open_device)(devices[i]) } {
            context if context.is_null() => Err(last_os_error(&format!("ibv_open_device({})", names[i]))),
            context => Ok((context, names[i].clone())),
        },
        None if names.is_empty() => Err(format!("no RDMA device: {NO_DEVICE_HINT}")),
        None => Err(format!(
            "no device named {}: -deviceName takes one of {}",
            wanted.unwrap_or_default(),
            names.join(", ")
        )),
    };
    // SAFETY: the list came from ibv_get_device_list; an opened context
    // does not need it.
    unsafe { (f.free_device_list)(list) };
    result
}

/// A registered buffer the benchmark's messages live in.
pub struct Buffer<'v> {
    verbs: &'v Verbs,
    mr: *mut abi::ibv_mr,
    base: *mut u8,
    len: usize,
}

impl<'v> Buffer<'v> {
    /// Allocates `len` bytes (zeroed) and registers them for local and
    /// remote access.
    pub fn new(verbs: &'v Verbs, len: usize) -> Result<Buffer<'v>, String> {
        let len = len.max(1);
        // The allocation is owned by this Buffer and freed in drop; the NIC
        // writes it, so no Rust reference ever covers it whole.
        let base = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        let access = abi::IBV_ACCESS_LOCAL_WRITE | abi::IBV_ACCESS_REMOTE_WRITE | abi::IBV_ACCESS_REMOTE_READ;
        // SAFETY: `base` points at `len` bytes that live until the MR is
        // deregistered in drop.
        let mr = unsafe { (verbs.f.reg_mr)(verbs.pd, base.cast(), len, access as c_int) };
        if mr.is_null() {
            let error = last_os_error("ibv_reg_mr");
            // SAFETY: `base` came from the boxed slice of `len` bytes above.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(base, len)) });
            return Err(error);
        }
        Ok(Buffer { verbs, mr, base, len })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR is live.
        unsafe { (*self.mr).lkey }
    }

    /// The address of byte `offset`, for a scatter/gather entry.
    pub fn addr(&self, offset: usize) -> u64 {
        assert!(offset <= self.len);
        self.base as u64 + offset as u64
    }

    /// Reads `len` bytes at `offset` into `out`. The caller reads only a
    /// slot whose receive has completed (so the NIC no longer writes it).
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.len);
        // SAFETY: in bounds (checked); the slot is quiescent, as the caller
        // guarantees by reading only after its completion, and the copy
        // goes through a raw pointer, never a reference to NIC memory.
        unsafe { ptr::copy_nonoverlapping(self.base.add(offset), out.as_mut_ptr(), out.len()) };
    }

    /// Writes `data` at `offset`; the caller writes only a slot no posted
    /// work request uses.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(offset + data.len() <= self.len);
        // SAFETY: in bounds (checked); no work request reads the slot now.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len()) };
    }
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        // SAFETY: the QPs that used the MR are gone (they are dropped
        // first), so the MR and then the memory may go.
        unsafe {
            (self.verbs.f.dereg_mr)(self.mr);
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(self.base, self.len)));
        }
    }
}

// SAFETY: the buffer is plain memory and an MR, both usable from any thread.
unsafe impl Send for Buffer<'_> {}

/// What the other end needs to reach a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub mtu: u8,
}

/// An RC queue pair with its own completion queue.
pub struct Qp<'v> {
    verbs: &'v Verbs,
    cq: *mut abi::ibv_cq,
    qp: *mut abi::ibv_qp,
}

// SAFETY: a QP and its CQ may be used from any thread; each `Qp` is used
// by one thread at a time (it is moved, never shared).
unsafe impl Send for Qp<'_> {}

/// A completion, as much of `ibv_wc` as the benchmark reads.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    pub wr_id: u64,
    pub status: i32,
    pub is_recv: bool,
}

/// `IBV_WC_RECV`: the first receive-side opcode (bit 7 set).
const WC_RECV_FLAG: i32 = 1 << 7;

impl<'v> Qp<'v> {
    /// Creates an RC QP with room for `send` and `recv` work requests.
    pub fn new(verbs: &'v Verbs, send: u32, recv: u32) -> Result<Qp<'v>, String> {
        let cqe = (send + recv) as c_int;
        // SAFETY: the context is open; no channel, vector 0.
        let cq = unsafe { (verbs.f.create_cq)(verbs.context, cqe, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(last_os_error("ibv_create_cq"));
        }
        let mut init = abi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: ptr::null_mut(),
            cap: abi::ibv_qp_cap {
                max_send_wr: send,
                max_recv_wr: recv,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: abi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD is live and `init` a filled ibv_qp_init_attr.
        let qp = unsafe { (verbs.f.create_qp)(verbs.pd, &mut init) };
        if qp.is_null() {
            let error = last_os_error("ibv_create_qp");
            // SAFETY: the CQ is ours and unused.
            unsafe { (verbs.f.destroy_cq)(cq) };
            return Err(error);
        }
        Ok(Qp { verbs, cq, qp })
    }

    /// What `ibv_wc_status_str` calls a completion status.
    pub fn status_str(&self, status: i32) -> String {
        self.verbs.status_str(status)
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.qp).qp_num }
    }

    /// INIT, RTR to `remote`, RTS: the usual three steps of an RC QP.
    pub fn connect(&self, local: &QpInfo, remote: &QpInfo, gid_index: i32, timeout: u8) -> Result<(), String> {
        // SAFETY: all-zero is a valid ibv_qp_attr to fill in.
        let mut attr: abi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = abi::IBV_QPS_INIT;
        attr.port_num = PORT;
        attr.qp_access_flags = abi::IBV_ACCESS_LOCAL_WRITE | abi::IBV_ACCESS_REMOTE_WRITE | abi::IBV_ACCESS_REMOTE_READ;
        self.modify(
            &mut attr,
            abi::IBV_QP_STATE | abi::IBV_QP_PKEY_INDEX | abi::IBV_QP_PORT | abi::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;

        // SAFETY: as above.
        let mut attr: abi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = abi::IBV_QPS_RTR;
        attr.path_mtu = c_int::from(local.mtu.min(remote.mtu));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 1;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.port_num = PORT;
        attr.ah_attr.grh.dgid = abi::ibv_gid { raw: remote.gid };
        attr.ah_attr.grh.sgid_index = gid_index as u8;
        attr.ah_attr.grh.hop_limit = 64;
        let rtr = abi::IBV_QP_STATE
            | abi::IBV_QP_AV
            | abi::IBV_QP_PATH_MTU
            | abi::IBV_QP_DEST_QPN
            | abi::IBV_QP_RQ_PSN
            | abi::IBV_QP_MAX_DEST_RD_ATOMIC
            | abi::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, rtr, "RTR")?;

        // SAFETY: as above.
        let mut attr: abi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = abi::IBV_QPS_RTS;
        attr.sq_psn = local.psn;
        attr.timeout = timeout;
        attr.retry_cnt = 7;
        // 7: retry for ever while the receiver is not ready.
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 1;
        let rts = abi::IBV_QP_STATE
            | abi::IBV_QP_SQ_PSN
            | abi::IBV_QP_TIMEOUT
            | abi::IBV_QP_RETRY_CNT
            | abi::IBV_QP_RNR_RETRY
            | abi::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, rts, "RTS")
    }

    fn modify(&self, attr: &mut abi::ibv_qp_attr, mask: c_int, to: &str) -> Result<(), String> {
        // SAFETY: the QP is live; `attr` holds what `mask` names.
        match unsafe { (self.verbs.f.modify_qp)(self.qp, attr, mask) } {
            0 => Ok(()),
            errno => Err(format!("ibv_modify_qp to {to}: {}", std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// The context's ops table (where verbs.h's inline functions look).
    fn ops(&self) -> &abi::ibv_context_ops {
        // SAFETY: the QP's context is the open device, alive as long as
        // `verbs`; its ops table does not change.
        unsafe { &(*(*self.qp).context).ops }
    }

    /// Posts a signalled SEND of `len` bytes at `addr`.
    pub fn post_send(&self, wr_id: u64, addr: u64, len: u32, lkey: u32) -> Result<(), String> {
        let mut sge = abi::ibv_sge { addr, length: len, lkey };
        // SAFETY: all-zero is a valid ibv_send_wr (no next, no union use).
        let mut wr: abi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = abi::IBV_WR_SEND;
        wr.send_flags = abi::IBV_SEND_SIGNALED;
        let mut bad = ptr::null_mut();
        let post = self.ops().post_send.ok_or("the library's ops table has no post_send")?;
        // SAFETY: the QP is live; `wr` and its SGE outlive the call (the
        // library copies what it keeps).
        match unsafe { post(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            errno => Err(format!("ibv_post_send: {}", std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// Posts a receive of `len` bytes at `addr`.
    pub fn post_recv(&self, wr_id: u64, addr: u64, len: u32, lkey: u32) -> Result<(), String> {
        let mut sge = abi::ibv_sge { addr, length: len, lkey };
        let mut wr = abi::ibv_recv_wr { wr_id, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        let mut bad = ptr::null_mut();
        let post = self.ops().post_recv.ok_or("the library's ops table has no post_recv")?;
        // SAFETY: as for post_send.
        match unsafe { post(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            errno => Err(format!("ibv_post_recv: {}", std::io::Error::from_raw_os_error(errno))),
        }
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize, String> {
        const BATCH: usize = 16;
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [abi::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let poll = self.ops().poll_cq.ok_or("the library's ops table has no poll_cq")?;
        // SAFETY: the CQ is live and `wcs` holds BATCH entries.
        let n = unsafe { poll(self.cq, max.min(BATCH) as c_int, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(format!("ibv_poll_cq failed ({n})"));
        }
        for wc in &wcs[..n as usize] {
            out.push(Completion { wr_id: wc.wr_id, status: wc.status, is_recv: wc.opcode & WC_RECV_FLAG != 0 });
        }
        Ok(n as usize)
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        // SAFETY: the QP and then its CQ, both ours.
        unsafe {
            (self.verbs.f.destroy_qp)(self.qp);
            (self.verbs.f.destroy_cq)(self.cq);
        }
    }
}
