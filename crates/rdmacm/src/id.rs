//! rdma_cm IDs, event channels and events: the objects a program holds,
//! each a C structure (first, so the program's pointer is the object's)
//! followed by what the library keeps about it.
//!
//! The agent thread turns the protocol's events into [`Pending`] entries
//! on the channel of the ID they concern ([`deliver`]); the program's
//! `rdma_get_cm_event` takes one and makes it an `rdma_cm_event`
//! ([`finish`]), doing on the way what rdma-core's librdmacm does there:
//! a new ID for a connection request, the QP moved to RTS and the RTU sent
//! when the REP arrives, the QP moved to the error state on a disconnect.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Condvar, Mutex, MutexGuard};

use softrnic_event::EventQueue;
use softrnic_verbs_abi::ffi::refuse;
use softrnic_verbs_abi::*;
use softrnic_wire::cm::{IpHeader, PrivateData, Rep, Req, SidrRep, sidr_status};

use crate::abi::*;
use crate::device::{CmDevice, CmState, gid_of, zeroed};
use crate::protocol::{ConnId, Event, ServiceId};
use crate::verbs;

/// An event channel: the program's `rdma_event_channel` (its fd is the
/// queue's, readable while events wait) and the queue.
#[repr(C)]
pub struct Channel {
    pub public: rdma_event_channel,
    pub queue: EventQueue<Pending>,
}

impl Channel {
    pub fn new() -> std::io::Result<Box<Channel>> {
        let queue = EventQueue::new()?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&queue);
        Ok(Box::new(Channel { public: rdma_event_channel { fd }, queue }))
    }

    /// The channel behind a program's pointer.
    ///
    /// # Safety
    /// `ptr` came from [`Channel::new`] and is live.
    pub unsafe fn from_c<'a>(ptr: *mut rdma_event_channel) -> &'a Channel {
        // SAFETY: `public` is the first field of a live `Channel`.
        unsafe { &*ptr.cast::<Channel>() }
    }
}

/// An event on its way to the program.
pub struct Pending {
    /// The [`Id`] it is for (its address).
    pub id: usize,
    pub what: Happened,
}

pub enum Happened {
    AddrResolved,
    RouteResolved,
    /// What the protocol raised (boxed: a request carries its REQ).
    Protocol(Box<Event>),
    /// The device went away.
    DeviceRemoved,
    /// `rdma_join_multicast` joined `group`; `context` is the program's.
    MulticastJoined {
        group: IpAddr,
        context: usize,
    },
}

/// What the other side said about itself: from its REQ (passive side) or
/// its REP (active side).
#[derive(Debug, Clone, Copy, Default)]
pub struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub qkey: u32,
}

/// What the library keeps about an ID.
#[derive(Default)]
pub struct IdState {
    pub bound: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    pub conn: Option<ConnId>,
    pub listening: Option<ServiceId>,
    pub remote: Option<Remote>,
    /// This side's first PSN.
    pub psn: u32,
    /// What this side offered or accepted.
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// The QP's local ACK timeout (the IBTA's code: 4.096 µs × 2^n), as
    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)` set it; else
    /// [`DEFAULT_ACK_TIMEOUT`].
    pub ack_timeout: Option<u8>,
    /// A channel the library made for a synchronous ID (created without
    /// one): calls wait for their own events.
    pub own_channel: Option<Box<Channel>>,
    /// `rdma_create_ep` on a passive endpoint: the QP each request it
    /// hands out (`rdma_get_request`) gets.
    pub ep_qp_init: Option<(usize, ibv_qp_init_attr)>,
    /// CQs and channels `rdma_create_qp` made because the program gave
    /// none, destroyed with the QP.
    pub own_cqs: bool,
    /// Multicast groups joined, and whether the ID's QP was attached.
    pub multicast: Vec<(IpAddr, bool)>,
}

/// The local ACK timeout a connection's QP gets unless the program sets
/// one: code 14, 4.096 µs × 2^14 = 67 ms.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// An rdma_cm ID.
#[repr(C)]
pub struct Id {
    pub public: rdma_cm_id,
    pub state: Mutex<IdState>,
    /// The path `route.path_rec` points to.
    pub path: ibv_sa_path_rec,
    pub unacked: Unacked,
}

/// The events of an ID that the program has taken and not yet acked.
/// `rdma_destroy_id` waits for them, as rdma-core's does: the thread
/// handling one (rping's CM thread printing a disconnect) still reads the
/// ID, so the ID must outlive the event.
#[derive(Default)]
pub struct Unacked {
    count: Mutex<u32>,
    all_acked: Condvar,
}

impl Unacked {
    fn hold(&self) {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    fn release(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *count -= 1;
        if *count == 0 {
            self.all_acked.notify_all();
        }
    }

    /// Returns once every event taken has been acked.
    pub fn wait_all_acked(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > 0 {
            count = self.all_acked.wait(count).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Id {
    /// A new ID on `channel` (or, if null, one of its own: synchronous).
    pub fn new(
        device: &CmDevice,
        channel: *mut rdma_event_channel,
        context: *mut std::ffi::c_void,
        ps: c_int,
        qp_type: c_int,
    ) -> std::io::Result<*mut Id> {
        // SAFETY: all-zero is valid for the C structures.
        let mut id = Box::new(Id {
            public: unsafe { zeroed() },
            state: Mutex::default(),
            path: unsafe { zeroed() },
            unacked: Unacked::default(),
        });
        id.public.verbs = device.context;
        id.public.context = context;
        id.public.ps = ps;
        id.public.port_num = 1;
        id.public.qp_type = qp_type;
        id.public.channel = channel;
        if channel.is_null() {
            let own = Channel::new()?;
            id.public.channel = &own.public as *const _ as *mut _;
            id.state.get_mut().unwrap_or_else(|e| e.into_inner()).own_channel = Some(own);
        }
        let raw = Box::into_raw(id);
        // SAFETY: just made; the path lives in the same allocation.
        unsafe { (*raw).public.route.path_rec = &mut (*raw).path };
        Ok(raw)
    }

    /// The ID behind a program's pointer.
    ///
    /// # Safety
    /// `ptr` came from [`Id::new`] and is live.
    pub unsafe fn from_c<'a>(ptr: *mut rdma_cm_id) -> &'a mut Id {
        // SAFETY: `public` is the first field of a live `Id`.
        unsafe { &mut *ptr.cast::<Id>() }
    }

    pub fn lock(&self) -> MutexGuard<'_, IdState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn channel(&self) -> &Channel {
        // SAFETY: an ID's channel outlives it (rdma_destroy_event_channel
        // on a channel with IDs is the program's error, as in rdma-core).
        unsafe { Channel::from_c(self.public.channel) }
    }

    pub fn is_sync(&self) -> bool {
        self.lock().own_channel.is_some()
    }

    /// Sets the route's addresses (and the path) once both ends are known.
    pub fn set_route(&mut self, device: &CmDevice, local: SocketAddr, peer: Option<SocketAddr>) {
        write_sockaddr(&mut self.public.route.addr.src_addr, local);
        self.public.route.addr.addr.sgid = gid_of(local.ip());
        self.public.route.addr.addr.pkey = 0xffff_u16.to_be();
        if let Some(peer) = peer {
            write_sockaddr(&mut self.public.route.addr.dst_addr, peer);
            self.public.route.addr.addr.dgid = gid_of(peer.ip());
            self.path.sgid = gid_of(local.ip());
            self.path.dgid = gid_of(peer.ip());
            self.path.pkey = 0xffff;
            self.path.hop_limit = 64;
            self.path.mtu = device.active_mtu;
            self.path.reversible = 1;
            self.path.numb_path = 1;
            self.public.route.num_paths = 1;
        }
    }
}

/// Writes `addr` as a `sockaddr_in` or `sockaddr_in6` into `storage`.
pub fn write_sockaddr(storage: &mut libc::sockaddr_storage, addr: SocketAddr) {
    // SAFETY: a sockaddr_storage is big and aligned enough for both.
    unsafe {
        *storage = zeroed();
        match addr {
            SocketAddr::V4(v4) => {
                let sin = &mut *(storage as *mut _ as *mut libc::sockaddr_in);
                sin.sin_family = libc::AF_INET as u16;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            }
            SocketAddr::V6(v6) => {
                let sin6 = &mut *(storage as *mut _ as *mut libc::sockaddr_in6);
                sin6.sin6_family = libc::AF_INET6 as u16;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
            }
        }
    }
}

/// Reads a `sockaddr_in` or `sockaddr_in6`.
///
/// # Safety
/// `addr` is null or points to a sockaddr as long as its family says.
pub unsafe fn read_sockaddr(addr: *const libc::sockaddr) -> Option<SocketAddr> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the family says which structure it is (caller).
    unsafe {
        match i32::from((*addr).sa_family) {
            libc::AF_INET => {
                let sin = &*(addr as *const libc::sockaddr_in);
                let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                let sin6 = &*(addr as *const libc::sockaddr_in6);
                Some(SocketAddr::new(
                    std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into(),
                    u16::from_be(sin6.sin6_port),
                ))
            }
            _ => None,
        }
    }
}

/// Hands each event the protocol raised to the channel of its ID; a
/// request for a listener that is gone is rejected.
pub fn deliver(device: &CmDevice, state: &mut CmState) {
    while let Some(event) = state.cm.poll_event() {
        let target = match &event {
            Event::ConnectRequest { service, .. } | Event::SidrRequest { service, .. } => {
                state.listeners.get(service).copied()
            }
            Event::Reply { conn, .. }
            | Event::Rejected { conn, .. }
            | Event::Established { conn }
            | Event::Disconnected { conn }
            | Event::Unreachable { conn }
            | Event::SidrReply { conn, .. } => state.conns.get(conn).copied(),
        };
        match (target, &event) {
            (Some(id), _) => {
                // SAFETY: IDs leave the maps (under this lock) before they
                // are freed.
                let channel = unsafe { Channel::from_c((*(id as *mut Id)).public.channel) };
                channel.queue.push(Pending { id, what: Happened::Protocol(Box::new(event)) });
            }
            (None, Event::ConnectRequest { conn, .. } | Event::SidrRequest { conn, .. }) => {
                let _ = state.cm.reject(*conn, PrivateData::EMPTY);
                device.flush(state);
            }
            (None, _) => {}
        }
    }
}

/// An event is acked when it is freed: by `rdma_ack_cm_event`, or by the
/// library once a synchronous call has read it.
impl Drop for EventBox {
    fn drop(&mut self) {
        // SAFETY: the ID is live: its `rdma_destroy_id` waits for this.
        if let Some(id) = unsafe { self.holds.as_ref() } {
            id.unacked.release();
        }
    }
}

/// An event as the program gets it, with room for its private data.
#[repr(C)]
pub struct EventBox {
    pub public: rdma_cm_event,
    private_data: [u8; softrnic_wire::cm::MAX_PRIVATE_DATA],
    /// The ID whose destruction waits for this event's ack (null for a
    /// connection request: rdma-core counts that against the listener and
    /// completes it as it hands the event out).
    holds: *const Id,
}

impl EventBox {
    /// An event for `id`, which must be live.
    fn new(id: *mut rdma_cm_id, event: c_int, status: c_int) -> Box<EventBox> {
        let holds = if event == RDMA_CM_EVENT_CONNECT_REQUEST { std::ptr::null() } else { id.cast::<Id>() };
        // SAFETY: `public` is the first field of a live `Id` (the caller's).
        if let Some(id) = unsafe { holds.as_ref() } {
            id.unacked.hold();
        }
        // SAFETY: all-zero is valid for the C structures.
        let mut b = Box::new(EventBox {
            public: unsafe { zeroed() },
            private_data: [0; softrnic_wire::cm::MAX_PRIVATE_DATA],
            holds,
        });
        b.public.id = id;
        b.public.event = event;
        b.public.status = status;
        b
    }

    /// Sets `param.conn` from what the other side sent.
    fn conn(&mut self, data: &[u8], remote: &Remote, srq: bool) {
        self.private_data[..data.len()].copy_from_slice(data);
        self.public.param.conn = rdma_conn_param {
            private_data: self.private_data.as_ptr().cast(),
            private_data_len: data.len() as u8,
            responder_resources: remote.responder_resources,
            initiator_depth: remote.initiator_depth,
            flow_control: 1,
            retry_count: remote.retry_count,
            rnr_retry_count: remote.rnr_retry_count,
            srq: srq as u8,
            qp_num: remote.qpn,
        };
    }

    /// Sets `param.ud`: the peer's QP, Q_Key and an AH to it.
    fn ud(&mut self, data: &[u8], peer: IpAddr, qpn: u32, qkey: u32) {
        self.private_data[..data.len()].copy_from_slice(data);
        self.public.param.ud = rdma_ud_param {
            private_data: self.private_data.as_ptr().cast(),
            private_data_len: data.len() as u8,
            ah_attr: ah_to(peer),
            qp_num: qpn,
            qkey,
        };
    }
}

/// An address handle's attributes for `peer`.
pub fn ah_to(peer: IpAddr) -> ibv_ah_attr {
    // SAFETY: all-zero is valid.
    let mut ah: ibv_ah_attr = unsafe { zeroed() };
    ah.is_global = 1;
    ah.port_num = 1;
    ah.dlid = 0;
    ah.grh.dgid = gid_of(peer);
    ah.grh.hop_limit = 64;
    ah.grh.sgid_index = 0;
    ah
}

/// Moves the ID's QP (if it has one) to RTR then RTS with what both sides
/// agreed; see [`qp_attr`].
pub fn connect_qp(device: &CmDevice, id: &Id) -> Result<(), c_int> {
    if id.public.qp.is_null() {
        return Ok(());
    }
    for qp_state in [IBV_QPS_RTR, IBV_QPS_RTS] {
        let (mut attr, mask) = qp_attr(device, id, qp_state)?;
        // SAFETY: the ID's live QP.
        let rc = unsafe { verbs::ibv_modify_qp(id.public.qp, &mut attr, mask) };
        if rc != 0 {
            return Err(rc);
        }
    }
    Ok(())
}

/// Moves the ID's QP (if any) to the error state: its outstanding work
/// completes flushed.
pub fn fail_qp(id: &Id) {
    if id.public.qp.is_null() {
        return;
    }
    // SAFETY: all-zero is valid; the ID's live QP.
    unsafe {
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = IBV_QPS_ERR;
        verbs::ibv_modify_qp(id.public.qp, &mut attr, IBV_QP_STATE);
    }
}

/// The attributes that take the ID's QP to `qp_state`, and their mask:
/// what `rdma_init_qp_attr` returns and what the library itself uses.
pub fn qp_attr(device: &CmDevice, id: &Id, qp_state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    let s = id.lock();
    // SAFETY: all-zero is valid.
    let mut attr: ibv_qp_attr = unsafe { zeroed() };
    attr.qp_state = qp_state;
    let ud = id.public.qp_type == IBV_QPT_UD;
    let mask = match qp_state {
        IBV_QPS_INIT if ud => {
            attr.port_num = 1;
            attr.qkey = RDMA_UDP_QKEY;
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
        }
        IBV_QPS_INIT => {
            attr.port_num = 1;
            // What the kernel's CM grants a connected QP: the peer may
            // write, read and use atomics (the READ and atomic depth it
            // gets is what the REQ and REP agree).
            attr.qp_access_flags =
                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        }
        IBV_QPS_RTR if ud => IBV_QP_STATE,
        IBV_QPS_RTR => {
            let (Some(remote), Some(peer)) = (s.remote, s.peer) else { return Err(libc::EINVAL) };
            attr.path_mtu = device.active_mtu as _;
            attr.dest_qp_num = remote.qpn;
            attr.rq_psn = remote.psn;
            attr.ah_attr = ah_to(peer.ip());
            // This side answers as many READs as it offered to.
            attr.max_dest_rd_atomic = s.responder_resources.max(1);
            // What the kernel's CM programs for a connected QP at RTR
            // (`cm_init_qp_rtr_attr`): code 0, the longest RNR wait the
            // IBTA defines, 655.36 ms. End-to-end credits keep a sender
            // from meeting it but for a probe into an empty queue.
            attr.min_rnr_timer = 0;
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        IBV_QPS_RTS if ud => {
            attr.sq_psn = s.psn;
            IBV_QP_STATE | IBV_QP_SQ_PSN
        }
        IBV_QPS_RTS => {
            attr.sq_psn = s.psn;
            attr.timeout = s.ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT);
            attr.retry_cnt = s.retry_count.min(7);
            attr.rnr_retry = s.rnr_retry_count.min(7);
            attr.max_rd_atomic = s.initiator_depth.max(1);
            IBV_QP_STATE
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => return Err(libc::EINVAL),
    };
    Ok((attr, mask))
}

/// Makes a pending entry the `rdma_cm_event` the program gets; `None`
/// when there is nothing to tell (an event for a connection the ID has
/// left).
///
/// # Safety
/// `pending.id` is a live [`Id`].
pub unsafe fn finish(device: &CmDevice, pending: Pending) -> Option<Box<EventBox>> {
    let id_ptr = pending.id as *mut Id;
    // SAFETY: live (caller).
    let id = unsafe { &mut *id_ptr };
    let public = id_ptr.cast::<rdma_cm_id>();
    let raised = match pending.what {
        Happened::AddrResolved => return Some(EventBox::new(public, RDMA_CM_EVENT_ADDR_RESOLVED, 0)),
        Happened::RouteResolved => return Some(EventBox::new(public, RDMA_CM_EVENT_ROUTE_RESOLVED, 0)),
        Happened::DeviceRemoved => return Some(EventBox::new(public, RDMA_CM_EVENT_DEVICE_REMOVAL, 0)),
        Happened::MulticastJoined { group, context } => {
            let mut event = EventBox::new(public, RDMA_CM_EVENT_MULTICAST_JOIN, 0);
            event.ud(&[], group, softrnic_wire::bth::MULTICAST_QPN, RDMA_UDP_QKEY);
            // The program's context rides in `private_data`, as librdmacm
            // hands it back.
            event.public.param.ud.private_data = context as *const c_void;
            return Some(event);
        }
        Happened::Protocol(event) => *event,
    };
    let event = match raised {
        Event::ConnectRequest { conn, peer, req, .. } => {
            return connect_request(device, id, conn, peer, req);
        }
        Event::SidrRequest { conn, peer, req, .. } => {
            let (header, data) = match split_ip_header(req.private_data.as_slice()) {
                Some(split) => split,
                None => {
                    let _ = reject(device, conn);
                    return None;
                }
            };
            let child = new_child(device, id, conn, SocketAddr::new(peer, header.src_port))?;
            let mut event = EventBox::new(child.cast(), RDMA_CM_EVENT_CONNECT_REQUEST, 0);
            event.public.listen_id = public;
            event.ud(data, peer, 0, 0);
            event
        }
        Event::Reply { conn, rep } => {
            if id.lock().conn != Some(conn) {
                return None;
            }
            let remote = remote_of_rep(&rep);
            id.lock().remote = Some(remote);
            if id.public.qp.is_null() {
                // The program moves its own QP, then calls rdma_establish.
                let mut event = EventBox::new(public, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
                event.conn(rep.private_data.as_slice(), &remote, rep.srq);
                return Some(event);
            }
            if let Err(rc) = connect_qp(device, id) {
                let _ = reject(device, conn);
                return Some(EventBox::new(public, RDMA_CM_EVENT_CONNECT_ERROR, -rc.abs()));
            }
            confirm(device, conn);
            let mut event = EventBox::new(public, RDMA_CM_EVENT_ESTABLISHED, 0);
            event.conn(rep.private_data.as_slice(), &remote, rep.srq);
            event
        }
        Event::Established { conn } => {
            if id.lock().conn != Some(conn) {
                return None;
            }
            EventBox::new(public, RDMA_CM_EVENT_ESTABLISHED, 0)
        }
        Event::Rejected { conn, reason, private_data } => {
            forget_conn(device, id, conn);
            let peer = id.lock().peer;
            refuse(
                "rdma_get_cm_event",
                libc::ECONNREFUSED,
                format!("{peer:?} rejected the connection (reason {reason})"),
            );
            let mut event = EventBox::new(public, RDMA_CM_EVENT_REJECTED, c_int::from(reason));
            event.conn(private_data.as_slice(), &Remote::default(), false);
            event
        }
        Event::Disconnected { conn } => {
            if id.lock().conn != Some(conn) {
                return None;
            }
            // The QP is left alone, as rdma-core's library and the kernel's
            // CM leave it: the program answers with rdma_disconnect, which
            // flushes it. Programs such as rping destroy the QP with
            // ibv_destroy_qp (not rdma_destroy_qp) while this event may
            // still be on its way, so the ID's QP pointer can dangle here.
            EventBox::new(public, RDMA_CM_EVENT_DISCONNECTED, 0)
        }
        Event::Unreachable { conn } => {
            forget_conn(device, id, conn);
            EventBox::new(public, RDMA_CM_EVENT_UNREACHABLE, -libc::ETIMEDOUT)
        }
        Event::SidrReply { conn, rep } => {
            forget_conn(device, id, conn);
            let peer = id.lock().peer?;
            if rep.status != sidr_status::VALID {
                return Some(EventBox::new(public, RDMA_CM_EVENT_UNREACHABLE, -libc::ECONNREFUSED));
            }
            let mut event = EventBox::new(public, RDMA_CM_EVENT_ESTABLISHED, 0);
            event.ud(rep.private_data.as_slice(), peer.ip(), rep.qpn, rep.qkey);
            event
        }
    };
    Some(event)
}

fn remote_of_rep(rep: &Rep) -> Remote {
    Remote {
        qpn: rep.local_qpn,
        psn: rep.starting_psn,
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        retry_count: 7,
        rnr_retry_count: rep.rnr_retry_count,
        qkey: rep.local_qkey,
    }
}

/// rdma_cm's header, then the program's own private data.
fn split_ip_header(data: &[u8]) -> Option<(IpHeader, &[u8])> {
    let header = IpHeader::parse(data).ok()?;
    Some((header, &data[IpHeader::LEN..]))
}

fn connect_request(
    device: &CmDevice,
    listener: &mut Id,
    conn: ConnId,
    peer: IpAddr,
    req: Req,
) -> Option<Box<EventBox>> {
    let Some((header, data)) = split_ip_header(req.private_data.as_slice()) else {
        let _ = reject(device, conn);
        return None;
    };
    let child = new_child(device, listener, conn, SocketAddr::new(peer, header.src_port))?;
    let remote = Remote {
        qpn: req.local_qpn,
        psn: req.starting_psn,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        qkey: req.local_qkey,
    };
    // SAFETY: just made.
    let child_id = unsafe { &*child };
    {
        let mut s = child_id.lock();
        s.remote = Some(remote);
        s.retry_count = req.retry_count;
        s.rnr_retry_count = req.rnr_retry_count;
        // The passive side's QP times out as the active side asked, as
        // the kernel's CM takes the REQ's local ACK timeout for its path.
        s.ack_timeout = Some(req.primary_local_ack_timeout.min(31));
    }
    let mut event = EventBox::new(child.cast(), RDMA_CM_EVENT_CONNECT_REQUEST, 0);
    event.public.listen_id = (listener as *mut Id).cast();
    event.conn(data, &remote, req.srq);
    Some(event)
}

/// A new ID for connection `conn`, which the listener's program will
/// accept or reject: on the listener's channel, or, for a synchronous
/// listener, synchronous itself (its own channel, so that `rdma_accept`
/// waiting for it takes no other connection's request). Its local address
/// is the device's, whatever the listener bound (any, or loopback).
fn new_child(device: &CmDevice, listener: &mut Id, conn: ConnId, peer: SocketAddr) -> Option<*mut Id> {
    let local = SocketAddr::new(device.addr, listener.lock().bound?.port());
    let channel = if listener.is_sync() { std::ptr::null_mut() } else { listener.public.channel };
    let child = Id::new(device, channel, listener.public.context, listener.public.ps, listener.public.qp_type).ok()?;
    // SAFETY: just made.
    let c = unsafe { &mut *child };
    c.set_route(device, local, Some(peer));
    {
        let mut s = c.lock();
        s.bound = Some(local);
        s.peer = Some(peer);
        s.conn = Some(conn);
        s.psn = random_psn();
    }
    {
        let mut state = device.lock();
        state.conns.insert(conn, child as usize);
        state.ids.insert(child as usize);
    }
    Some(child)
}

fn reject(device: &CmDevice, conn: ConnId) -> Result<(), &'static str> {
    let mut state = device.lock();
    let result = state.cm.reject(conn, PrivateData::EMPTY);
    state.conns.remove(&conn);
    device.flush_and_wake(&mut state);
    result
}

fn confirm(device: &CmDevice, conn: ConnId) {
    let mut state = device.lock();
    let _ = state.cm.confirm(conn, PrivateData::EMPTY);
    device.flush_and_wake(&mut state);
}

fn forget_conn(device: &CmDevice, id: &Id, conn: ConnId) {
    let mut s = id.lock();
    if s.conn == Some(conn) {
        s.conn = None;
    }
    drop(s);
    let mut state = device.lock();
    state.conns.remove(&conn);
    state.cm.forget(conn);
}

/// A random first PSN (24 bits), from the operating system's generator.
pub fn random_psn() -> u32 {
    // It fails only where the kernel has neither getrandom(2) nor
    // /dev/urandom; the clock and the process then make PSNs at least
    // differ between connections.
    let random = getrandom::u32().unwrap_or_else(|_| {
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        clock.subsec_nanos() ^ std::process::id().rotate_left(16)
    });
    random & 0x00ff_ffff
}

/// An accepted request's REP, or a SIDR_REP for a UD ID.
pub fn answer(id: &Id, rep_private: PrivateData) -> Result<(Option<Rep>, Option<SidrRep>), c_int> {
    let s = id.lock();
    // SAFETY: the ID's QP, when it has one, is live.
    let qpn = if id.public.qp.is_null() { 0 } else { unsafe { (*id.public.qp).qp_num } };
    if id.public.ps == RDMA_PS_UDP {
        let service = (RDMA_PS_UDP as u64) << 16 | u64::from(s.bound.map_or(0, |b| b.port()));
        return Ok((
            None,
            Some(SidrRep {
                request_id: 0,
                status: sidr_status::VALID,
                qpn,
                service_id: service,
                qkey: RDMA_UDP_QKEY,
                private_data: rep_private,
            }),
        ));
    }
    let rep = Rep {
        local_comm_id: 0,
        remote_comm_id: 0,
        local_qkey: 0,
        local_qpn: qpn,
        starting_psn: s.psn,
        responder_resources: s.responder_resources,
        initiator_depth: s.initiator_depth,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: true,
        rnr_retry_count: s.rnr_retry_count.min(7),
        srq: !id.public.srq.is_null(),
        local_ca_guid: 0,
        private_data: rep_private,
    };
    Ok((Some(rep), None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// rping's teardown: the main thread destroys the ID while its CM
    /// thread still handles the disconnect; the destroy must wait.
    #[test]
    fn destroy_waits_for_the_event_a_thread_still_handles() {
        let unacked = Arc::new(Unacked::default());
        unacked.hold();
        unacked.hold();
        let destroyed = Arc::new(AtomicBool::new(false));
        let destroyer = std::thread::spawn({
            let (unacked, destroyed) = (unacked.clone(), destroyed.clone());
            move || {
                unacked.wait_all_acked();
                destroyed.store(true, Ordering::SeqCst);
            }
        });
        unacked.release();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!destroyed.load(Ordering::SeqCst), "the destroy returned with an event unacked");
        unacked.release();
        destroyer.join().unwrap();
        assert!(destroyed.load(Ordering::SeqCst));
        // With none held, it does not wait at all.
        unacked.wait_all_acked();
    }
}
