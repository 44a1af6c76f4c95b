//! The RDMA device rdma_cm IDs use, and its CM agent's end of QP1.
//!
//! On a hardware device the kernel owns QP1 and runs the CM; here the
//! library does, in the process, over the same engine the program's verbs
//! use: it opens the device once (rdma-core's librdmacm keeps one verbs
//! context per device too), creates the GSI QP with softrnic's
//! `softrnic_create_gsi_qp`, and starts the agent thread
//! ([`crate::agent`]), which receives CM MADs and runs the protocol's
//! timers. Whoever changes the protocol's state (the agent, or a program's
//! thread in `rdma_connect`, `rdma_accept`, ...) sends what it produced at
//! once, under the same lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use softrnic_event::EventFd;
use softrnic_verbs_abi::*;
use softrnic_wire::GRH_LEN;
use softrnic_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};

use crate::protocol::{Cm, ConnId, ServiceId, Transmit};
use crate::verbs;

/// Receive and send slots of the GSI QP: as deep as Linux's MAD layer
/// makes QP1's queues (`ib_mad`'s 512 and 128). A burst of requests
/// beyond the receive queue is dropped, and sent again a response timeout
/// later.
const RECV_SLOTS: usize = 512;
const SEND_SLOTS: usize = 128;
const RECV_SLOT_LEN: usize = GRH_LEN + MAD_LEN;
/// Marks the work request IDs of sends.
const SEND_TAG: u64 = 1 << 63;
/// The most address handles the agent keeps; when it needs another it
/// destroys them all (a send copies its address when posted, so those in
/// flight are not disturbed) and makes them again as peers speak.
const MAX_AHS: usize = 256;

/// What the protocol's state lock guards.
pub struct CmState {
    pub cm: Cm,
    /// Which rdma_cm ID each connection belongs to (the ID's address).
    pub conns: HashMap<ConnId, usize>,
    /// Which listening ID each service belongs to.
    pub listeners: HashMap<ServiceId, usize>,
    /// Ports bound, per port space.
    pub ports: HashSet<(i32, u16)>,
    /// Every live rdma_cm ID (its address): each hears the device go.
    pub ids: HashSet<usize>,
    /// The device went away (softrnicd stopped): its IDs were told, and
    /// no new one is made.
    pub gone: bool,
    /// MADs waiting for a free send slot: at most
    /// [`MAX_TRANSMITS`](crate::protocol::MAX_TRANSMITS).
    backlog: VecDeque<Transmit>,
    free_send_slots: Vec<usize>,
    /// An address handle per peer: at most [`MAX_AHS`], since a stranger
    /// who forges requests from many addresses earns each an answer.
    ahs: HashMap<IpAddr, usize>,
}

/// The device, its QP1 and the CM agent's state.
pub struct CmDevice {
    pub context: *mut ibv_context,
    /// The protection domain QPs get when the program names none.
    pub pd: *mut ibv_pd,
    pub addr: IpAddr,
    pub gid: ibv_gid,
    /// The port's active MTU (the IBTA code).
    pub active_mtu: u8,
    /// The most RDMA READs and atomics a QP of the device may have
    /// outstanding as responder (`max_qp_rd_atom`) and as initiator
    /// (`max_qp_init_rd_atom`): the bounds of a connection's
    /// `responder_resources` and `initiator_depth`, as rdma-core's
    /// librdmacm takes them from the device.
    pub max_responder_resources: u8,
    pub max_initiator_depth: u8,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    /// Receive slots, then send slots, in one registered buffer.
    buffer: Box<[u8]>,
    lkey: u32,
    state: Mutex<CmState>,
    /// Wakes the agent thread: a timer moved.
    pub(crate) wake: EventFd,
    epoch: Instant,
}

// SAFETY: the raw pointers are verbs objects, which libibverbs lets any
// thread use; the buffer's slots are handed out under `state`'s lock.
unsafe impl Send for CmDevice {}
// SAFETY: as above.
unsafe impl Sync for CmDevice {}

static DEVICE: OnceLock<Result<Arc<CmDevice>, String>> = OnceLock::new();

/// The device, opened and its agent started on first use.
pub fn device() -> Result<&'static Arc<CmDevice>, String> {
    DEVICE
        .get_or_init(|| {
            let device = Arc::new(CmDevice::open()?);
            crate::agent::start(device.clone())?;
            Ok(device)
        })
        .as_ref()
        .map_err(|e| e.clone())
}

/// The IPv4-mapped (or IPv6) GID of `addr`, and back.
pub fn gid_of(addr: IpAddr) -> ibv_gid {
    let raw = match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    ibv_gid { raw }
}

pub fn addr_of(gid: &ibv_gid) -> IpAddr {
    // SAFETY: every bit pattern is a valid `raw`.
    let v6 = Ipv6Addr::from(unsafe { gid.raw });
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

fn failed(what: &str) -> String {
    format!("softrnic librdmacm: {what} failed: {}", std::io::Error::last_os_error())
}

impl CmDevice {
    fn open() -> Result<CmDevice, String> {
        // SAFETY: plain verbs calls on objects this function creates; each
        // result is checked before use.
        unsafe {
            let mut n = 0;
            let list = verbs::ibv_get_device_list(&mut n);
            if list.is_null() || n == 0 {
                return Err("softrnic librdmacm: no RDMA device (is softrnic's libibverbs.so.1 loaded?)".into());
            }
            let context = verbs::ibv_open_device(*list);
            verbs::ibv_free_device_list(list);
            if context.is_null() {
                return Err(failed("ibv_open_device"));
            }
            let mut gid = ibv_gid { raw: [0; 16] };
            if verbs::ibv_query_gid(context, 1, 0, &mut gid) != 0 {
                return Err(failed("ibv_query_gid"));
            }
            let mut port: ibv_port_attr = std::mem::zeroed();
            if verbs::ibv_query_port(context, 1, &mut port) != 0 {
                return Err(failed("ibv_query_port"));
            }
            let mut device_attr: ibv_device_attr = std::mem::zeroed();
            if verbs::ibv_query_device(context, &mut device_attr) != 0 {
                return Err(failed("ibv_query_device"));
            }
            let pd = verbs::ibv_alloc_pd(context);
            let channel = verbs::ibv_create_comp_channel(context);
            if pd.is_null() || channel.is_null() {
                return Err(failed("allocating the CM agent's PD and channel"));
            }
            let cq =
                verbs::ibv_create_cq(context, (RECV_SLOTS + SEND_SLOTS) as c_int, std::ptr::null_mut(), channel, 0);
            if cq.is_null() {
                return Err(failed("ibv_create_cq"));
            }
            let mut init: ibv_qp_init_attr = std::mem::zeroed();
            init.send_cq = cq;
            init.recv_cq = cq;
            init.qp_type = IBV_QPT_UD;
            init.sq_sig_all = 1;
            init.cap = ibv_qp_cap {
                max_send_wr: SEND_SLOTS as u32,
                max_recv_wr: RECV_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            };
            let qp = verbs::softrnic_create_gsi_qp(pd, &mut init);
            if qp.is_null() {
                let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
                let hint = match busy {
                    // Through softrnicd the device is the address's, for
                    // every program that opens it.
                    true => "; another program on this address runs rdma_cm: give each its own SOFTRNIC_ADDR",
                    false => "",
                };
                return Err(failed("creating QP1") + hint);
            }
            let mut attr: ibv_qp_attr = std::mem::zeroed();
            attr.qp_state = IBV_QPS_INIT;
            attr.port_num = 1;
            attr.qkey = GSI_QKEY;
            let init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
            let mut ok = verbs::ibv_modify_qp(qp, &mut attr, init_mask) == 0;
            attr.qp_state = IBV_QPS_RTR;
            ok &= verbs::ibv_modify_qp(qp, &mut attr, IBV_QP_STATE) == 0;
            attr.qp_state = IBV_QPS_RTS;
            ok &= verbs::ibv_modify_qp(qp, &mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
            if !ok {
                return Err(failed("moving QP1 to RTS"));
            }
            let mut buffer = vec![0u8; RECV_SLOTS * RECV_SLOT_LEN + SEND_SLOTS * MAD_LEN].into_boxed_slice();
            let mr = verbs::ibv_reg_mr(pd, buffer.as_mut_ptr().cast(), buffer.len(), IBV_ACCESS_LOCAL_WRITE as c_int);
            if mr.is_null() {
                return Err(failed("registering the CM agent's buffers"));
            }
            let device = CmDevice {
                context,
                pd,
                addr: addr_of(&gid),
                gid,
                active_mtu: port.active_mtu as u8,
                max_responder_resources: device_attr.max_qp_rd_atom.clamp(0, 255) as u8,
                max_initiator_depth: device_attr.max_qp_init_rd_atom.clamp(0, 255) as u8,
                qp,
                cq,
                channel,
                lkey: (*mr).lkey,
                buffer,
                state: Mutex::new(CmState {
                    cm: Cm::new(seed()?),
                    conns: HashMap::new(),
                    listeners: HashMap::new(),
                    ports: HashSet::new(),
                    ids: HashSet::new(),
                    gone: false,
                    backlog: VecDeque::new(),
                    free_send_slots: (0..SEND_SLOTS).collect(),
                    ahs: HashMap::new(),
                }),
                wake: EventFd::new().map_err(|e| format!("softrnic librdmacm: eventfd: {e}"))?,
                epoch: Instant::now(),
            };
            for slot in 0..RECV_SLOTS {
                device.post_receive(slot)?;
            }
            verbs::req_notify_cq(cq);
            Ok(device)
        }
    }

    /// The protocol's clock.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub fn lock(&self) -> MutexGuard<'_, CmState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The completion channel the agent waits on.
    pub(crate) fn channel_fd(&self) -> c_int {
        // SAFETY: the channel lives as long as the device.
        unsafe { (*self.channel).fd }
    }

    fn recv_slot_addr(&self, slot: usize) -> u64 {
        self.buffer.as_ptr() as u64 + (slot * RECV_SLOT_LEN) as u64
    }

    fn send_slot_addr(&self, slot: usize) -> *mut u8 {
        let at = RECV_SLOTS * RECV_SLOT_LEN + slot * MAD_LEN;
        // SAFETY: in bounds; a send slot is written only by the thread that
        // took it from the free list, under the state lock.
        unsafe { self.buffer.as_ptr().add(at).cast_mut() }
    }

    fn post_receive(&self, slot: usize) -> Result<(), String> {
        let mut sge = ibv_sge { addr: self.recv_slot_addr(slot), length: RECV_SLOT_LEN as u32, lkey: self.lkey };
        let mut wr = ibv_recv_wr { wr_id: slot as u64, next: std::ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
        // SAFETY: a live QP; the slot is registered memory the QP owns
        // until its completion.
        match unsafe { verbs::post_recv(self.qp, &mut wr) } {
            0 => Ok(()),
            _ => Err(failed("posting a receive on QP1")),
        }
    }

    /// Takes what arrived on QP1 to the protocol and frees the send slots
    /// whose sends completed, then re-arms the CQ and looks once more: a
    /// completion that lands between the last look and the arming would
    /// otherwise wait, unannounced, for the next timer.
    pub(crate) fn drain(&self, state: &mut CmState) {
        loop {
            self.take_completions(state);
            // SAFETY: a live CQ.
            unsafe { verbs::req_notify_cq(self.cq) };
            if !self.take_completions(state) {
                return;
            }
        }
    }

    /// Polls QP1's CQ empty; returns whether anything completed.
    fn take_completions(&self, state: &mut CmState) -> bool {
        // SAFETY: a C structure of integers.
        let mut wc: [ibv_wc; 16] = unsafe { zeroed() };
        let mut any = false;
        loop {
            // SAFETY: a live CQ and room for 16 completions.
            let n = unsafe { verbs::poll_cq(self.cq, wc.len() as c_int, wc.as_mut_ptr()) };
            if n <= 0 {
                return any;
            }
            any = true;
            for c in &wc[..n as usize] {
                self.completed(state, c);
            }
        }
    }

    /// One completion: a send slot free again, or a MAD for the protocol
    /// (its receive slot posted again).
    fn completed(&self, state: &mut CmState, c: &ibv_wc) {
        if c.wr_id & SEND_TAG != 0 {
            state.free_send_slots.push((c.wr_id & !SEND_TAG) as usize);
            return;
        }
        let slot = c.wr_id as usize;
        // CM MADs come from the peer's QP1, whose controlled Q_Key no
        // other QP may take: one from any other QP is a forgery.
        let from_gsi = c.src_qp == GSI_QPN;
        if c.status == IBV_WC_SUCCESS && !from_gsi {
            state.cm.dropped += 1;
        }
        if c.status == IBV_WC_SUCCESS && from_gsi && c.byte_len as usize >= GRH_LEN + MAD_LEN {
            let at = slot * RECV_SLOT_LEN;
            let grh = &self.buffer[at..at + GRH_LEN];
            // For RoCEv2 over IPv4 the GRH area holds the IPv4 header in its
            // last 20 bytes; over IPv6, a GRH.
            let peer = if c.sl == 2 || grh[20] >> 4 == 4 {
                IpAddr::V4(Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]))
            } else {
                let raw: [u8; 16] = grh[8..24].try_into().expect("16 bytes");
                addr_of(&ibv_gid { raw })
            };
            state.cm.handle_mad(self.now(), peer, &self.buffer[at + GRH_LEN..at + GRH_LEN + MAD_LEN]);
        }
        if c.status != IBV_WC_WR_FLUSH_ERR && self.post_receive(slot).is_err() {
            eprintln!("softrnic librdmacm: cannot repost a receive on QP1");
        }
    }

    /// Acknowledges the channel's event (the agent read the fd). False
    /// when the channel says the device is gone (`EIO`, as the kernel's
    /// event files say it of a removed device).
    pub(crate) fn ack_event(&self) -> bool {
        let mut cq = std::ptr::null_mut();
        let mut context = std::ptr::null_mut();
        // SAFETY: a live channel with an event waiting (the fd polled
        // readable); the CQ is ours.
        unsafe {
            if verbs::ibv_get_cq_event(self.channel, &mut cq, &mut context) == 0 {
                verbs::ibv_ack_cq_events(cq, 1);
                return true;
            }
        }
        std::io::Error::last_os_error().raw_os_error() != Some(libc::EIO)
    }

    /// The device went away: every ID hears `RDMA_CM_EVENT_DEVICE_REMOVAL`
    /// on its channel, as the kernel's CM tells the IDs of a device
    /// removed under them.
    pub(crate) fn removed(&self) {
        let mut state = self.lock();
        state.gone = true;
        for &id in &state.ids {
            // SAFETY: IDs leave the set (under this lock) before they are
            // freed, and an ID's channel outlives it.
            let channel = unsafe { crate::id::Channel::from_c((*(id as *mut crate::id::Id)).public.channel) };
            channel.queue.push(crate::id::Pending { id, what: crate::id::Happened::DeviceRemoved });
        }
    }

    /// [`CmDevice::flush`] for a program's thread, which may have set a
    /// timer the agent sleeps past: wakes the agent too.
    pub fn flush_and_wake(&self, state: &mut CmState) {
        self.flush(state);
        self.wake.signal();
    }

    /// Sends every MAD the protocol produced, or queues it for a send slot
    /// (completions free slots, and wake the agent, which comes back).
    pub fn flush(&self, state: &mut CmState) {
        while let Some(t) = state.cm.poll_transmit() {
            if state.backlog.len() < crate::protocol::MAX_TRANSMITS {
                state.backlog.push_back(t);
            } else {
                state.cm.transmits_dropped += 1;
            }
        }
        while !state.backlog.is_empty() {
            let Some(slot) = state.free_send_slots.pop() else { break };
            let t = state.backlog.pop_front().expect("not empty");
            if let Err(e) = self.send(state, slot, &t) {
                state.free_send_slots.push(slot);
                eprintln!("{e}");
            }
        }
    }

    fn send(&self, state: &mut CmState, slot: usize, t: &Transmit) -> Result<(), String> {
        let ah = match state.ahs.get(&t.dst) {
            Some(&ah) => ah as *mut ibv_ah,
            None => {
                if state.ahs.len() >= MAX_AHS {
                    for (_, ah) in state.ahs.drain() {
                        // SAFETY: an AH this agent made; posted sends hold
                        // copies of its address, not the handle.
                        unsafe { verbs::ibv_destroy_ah(ah as *mut ibv_ah) };
                    }
                }
                // SAFETY: a C structure of integers and a union of bytes.
                let mut attr: ibv_ah_attr = unsafe { zeroed() };
                attr.is_global = 1;
                attr.port_num = 1;
                attr.grh.dgid = gid_of(t.dst);
                attr.grh.hop_limit = 64;
                // SAFETY: a live PD and a filled-in attribute.
                let ah = unsafe { verbs::ibv_create_ah(self.pd, &mut attr) };
                if ah.is_null() {
                    return Err(failed(&format!("an address handle to {}", t.dst)));
                }
                state.ahs.insert(t.dst, ah as usize);
                ah
            }
        };
        let at = self.send_slot_addr(slot);
        // SAFETY: the slot is this thread's (taken from the free list under
        // the lock) and MAD_LEN long.
        unsafe { std::ptr::copy_nonoverlapping(t.mad.as_ptr(), at, MAD_LEN) };
        let mut sge = ibv_sge { addr: at as u64, length: MAD_LEN as u32, lkey: self.lkey };
        // SAFETY: a C structure of integers and raw pointers.
        let mut wr: ibv_send_wr = unsafe { zeroed() };
        wr.wr_id = SEND_TAG | slot as u64;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.ud = ibv_send_wr_ud { ah, remote_qpn: GSI_QPN, remote_qkey: GSI_QKEY };
        // SAFETY: a live QP, a valid work request over registered memory.
        match unsafe { verbs::post_send(self.qp, &mut wr) } {
            0 => Ok(()),
            _ => Err(failed("sending a CM MAD")),
        }
    }
}

/// An all-zero C structure.
///
/// # Safety
/// All-zero must be a valid `T`: a plain C structure of integers, raw
/// pointers, optional function pointers and unions of those.
pub(crate) unsafe fn zeroed<T>() -> T {
    // SAFETY: the caller's.
    unsafe { std::mem::zeroed() }
}

/// The seed of the agent's communication IDs, from the operating system.
fn seed() -> Result<[u8; 32], String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| format!("softrnic librdmacm: no random numbers from the operating system for the CM: {e}"))?;
    Ok(seed)
}
