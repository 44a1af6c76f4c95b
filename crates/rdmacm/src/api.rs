//! The exported rdma_cm calls (`<rdma/rdma_cma.h>`), with rdma-core 44's
//! names and behaviour: failures return -1 (or NULL) with `errno` set,
//! and `SOFTRNIC_DEBUG=1` says why on stderr.
//!
//! An ID created without an event channel is synchronous, as in
//! rdma-core: `rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`
//! and `rdma_accept` return once done, and `rdma_get_request` waits for a
//! connection request.

use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;

use softrnic_verbs_abi::ffi::{guard, refuse, refuse_null, set_errno};
use softrnic_verbs_abi::*;
use softrnic_wire::cm::{self, IpHeader, PrivateData, Req, SidrReq, TransportService};

use crate::abi::*;
use crate::device::{CmDevice, device};
use crate::id::{self, Channel, DEFAULT_ACK_TIMEOUT, EventBox, Happened, Id, Pending};
use crate::protocol::RESPONSE_TIMEOUT_EXP;
use crate::verbs;

/// The first port `rdma_bind_addr` hands out for port 0.
const EPHEMERAL_PORTS: std::ops::Range<u16> = 32768..61000;

/// The value of a `Result` whose error is the call's return value (-1,
/// `errno` set), or that return.
macro_rules! or_return {
    ($result:expr) => {
        match $result {
            Ok(value) => value,
            Err(rc) => return rc,
        }
    };
}

/// Fails a call: -1 with `errno`.
pub(crate) fn fail(verb: &str, errno: c_int, why: impl std::fmt::Display) -> c_int {
    set_errno(refuse(verb, errno, why));
    -1
}

/// The device, or a failure every program should see (not only under
/// `SOFTRNIC_DEBUG`): nothing works without it.
fn the_device(verb: &str) -> Result<&'static CmDevice, c_int> {
    device().map(|d| &**d).map_err(|why| {
        eprintln!("{why}");
        fail(verb, libc::ENODEV, why)
    })
}

/// The ID behind a program's pointer, or a failure.
///
/// # Safety
/// `id` is null or a live ID.
pub(crate) unsafe fn live<'a>(verb: &str, id: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    match id.is_null() {
        true => Err(fail(verb, libc::EINVAL, "NULL rdma_cm_id")),
        // SAFETY: live (caller).
        false => Ok(unsafe { Id::from_c(id) }),
    }
}

/// The service ID of port `port` in port space `ps`.
fn service_id(ps: c_int, port: u16) -> u64 {
    (ps as u64) << 16 | u64::from(port)
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", || match Channel::new() {
        Ok(channel) => Box::into_raw(channel).cast(),
        Err(e) => refuse_null("rdma_create_event_channel", e.raw_os_error().unwrap_or(libc::ENOMEM), e),
    })
}

/// # Safety
/// `channel` came from [`rdma_create_event_channel`]; no ID uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", || {
        if !channel.is_null() {
            // SAFETY: made by Box::into_raw (caller).
            drop(unsafe { Box::from_raw(channel.cast::<Channel>()) });
        }
    })
}

/// # Safety
/// `channel` is null or live; `id` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard("rdma_create_id", || {
        const VERB: &str = "rdma_create_id";
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP => IBV_QPT_UD,
            _ => {
                return fail(
                    VERB,
                    libc::EPROTONOSUPPORT,
                    format!("port space {ps:#x}: give RDMA_PS_TCP or RDMA_PS_UDP"),
                );
            }
        };
        // SAFETY: forwarded contract.
        unsafe { create_id(VERB, channel, id, context, ps, qp_type) }
    })
}

/// # Safety
/// As [`rdma_create_id`].
unsafe fn create_id(
    verb: &str,
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
    qp_type: c_int,
) -> c_int {
    if out.is_null() {
        return fail(verb, libc::EINVAL, "NULL id pointer");
    }
    let device = or_return!(the_device(verb));
    if device.lock().gone {
        return fail(verb, libc::ENODEV, DEVICE_GONE);
    }
    match Id::new(device, channel, context, ps, qp_type) {
        Ok(id) => {
            device.lock().ids.insert(id as usize);
            // SAFETY: writable (caller).
            unsafe { *out = id.cast() };
            0
        }
        Err(e) => fail(verb, libc::ENOMEM, e),
    }
}

/// # Safety
/// `id` is live; the program is done with it and its events.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_destroy_id", || {
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live("rdma_destroy_id", id) });
        let Ok(device) = device() else { return 0 };
        let s = std::mem::take(&mut *id.lock());
        {
            let mut state = device.lock();
            if let Some(conn) = s.conn {
                // An ID destroyed while connected takes its connection
                // down first, as the kernel's CM does.
                if state.cm.disconnect(device.now(), conn).is_err() {
                    state.cm.forget(conn);
                }
                state.conns.remove(&conn);
            }
            if let Some(service) = s.listening {
                state.cm.stop_listening(service);
                state.listeners.remove(&service);
            }
            if let Some(bound) = s.bound {
                state.ports.remove(&(id.public.ps, bound.port()));
            }
            device.flush_and_wake(&mut state);
            // Nothing new can reach the channel for this ID now.
            let me = id as *mut Id as usize;
            state.ids.remove(&me);
            id.channel().queue.retain(|p| p.id != me);
        }
        free_event(id);
        // A thread may still be handling an event for it (rdma-core's
        // rdma_destroy_id waits too: the program must ack them all).
        id.unacked.wait_all_acked();
        drop(s);
        // SAFETY: made by Id::new; the program gave it up.
        drop(unsafe { Box::from_raw(id as *mut Id) });
        0
    })
}

/// Frees the event a synchronous call (`rdma_get_request`, `rdma_connect`,
/// `rdma_accept`) left on the ID.
fn free_event(id: &mut Id) {
    if !id.public.event.is_null() {
        // SAFETY: made by Box::into_raw where it was left (rdma_get_request,
        // wait_established, rsockets' accept), freed only here.
        drop(unsafe { Box::from_raw(id.public.event.cast::<EventBox>()) });
        id.public.event = std::ptr::null_mut();
    }
}

/// Binds `id` to `addr` (port 0: a free one): the device's address, any
/// address, or a loopback one, which binds the device as the kernel's CM
/// binds it to its first device (libfabric's passive endpoints bind
/// "localhost").
fn bind(verb: &str, device: &CmDevice, id: &mut Id, addr: SocketAddr) -> c_int {
    if !addr.ip().is_unspecified() && !addr.ip().is_loopback() && addr.ip() != device.addr {
        return fail(
            verb,
            libc::EADDRNOTAVAIL,
            format!(
                "{} is not softrnic0's address ({}): run the program with SOFTRNIC_ADDR={}",
                addr.ip(),
                device.addr,
                addr.ip()
            ),
        );
    }
    let ps = id.public.ps;
    let mut state = device.lock();
    let port = match addr.port() {
        0 => {
            let start = EPHEMERAL_PORTS.start + (id::random_psn() as u16 % EPHEMERAL_PORTS.len() as u16);
            let free = (0..EPHEMERAL_PORTS.len() as u16)
                .map(|i| EPHEMERAL_PORTS.start + (start - EPHEMERAL_PORTS.start + i) % EPHEMERAL_PORTS.len() as u16)
                .find(|p| !state.ports.contains(&(ps, *p)));
            match free {
                Some(p) => p,
                None => return fail(verb, libc::EADDRINUSE, "every ephemeral port is bound"),
            }
        }
        p if state.ports.contains(&(ps, p)) => {
            return fail(verb, libc::EADDRINUSE, format!("port {p} is bound already"));
        }
        p => p,
    };
    state.ports.insert((ps, port));
    drop(state);
    let local = SocketAddr::new(addr.ip(), port);
    id.lock().bound = Some(local);
    id.set_route(device, SocketAddr::new(device.addr, port), None);
    0
}

/// # Safety
/// `id` live; `addr` a readable sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    guard("rdma_bind_addr", || {
        const VERB: &str = "rdma_bind_addr";
        // SAFETY: forwarded contract.
        let (id, addr) = match unsafe { (live(VERB, id), id::read_sockaddr(addr)) } {
            (Ok(id), Some(addr)) => (id, addr),
            (Err(rc), _) => return rc,
            (_, None) => return fail(VERB, libc::EAFNOSUPPORT, "not an AF_INET or AF_INET6 address"),
        };
        if id.lock().bound.is_some() {
            return fail(VERB, libc::EINVAL, "the ID is bound already");
        }
        match the_device(VERB) {
            Ok(device) => bind(VERB, device, id, addr),
            Err(rc) => rc,
        }
    })
}

/// Queues an event the library raises itself (address and route
/// resolution); a synchronous ID's call is its own answer.
pub(crate) fn raise(id: &mut Id, what: Happened) {
    if !id.is_sync() {
        let me = id as *mut Id as usize;
        id.channel().queue.push(Pending { id: me, what });
    }
}

/// # Safety
/// `id` live; `src` null or a sockaddr; `dst` a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard("rdma_resolve_addr", || {
        const VERB: &str = "rdma_resolve_addr";
        // SAFETY: forwarded contract.
        let (id, src, dst) = match unsafe { (live(VERB, id), id::read_sockaddr(src), id::read_sockaddr(dst)) } {
            (Ok(id), src, Some(dst)) => (id, src, dst),
            (Err(rc), ..) => return rc,
            (_, _, None) => return fail(VERB, libc::EINVAL, "no destination address"),
        };
        let device = or_return!(the_device(VERB));
        if id.lock().bound.is_none() {
            let src = src.unwrap_or(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), 0));
            let rc = bind(VERB, device, id, src);
            if rc != 0 {
                return rc;
            }
        }
        let local = id.lock().bound.expect("bound above");
        id.lock().peer = Some(dst);
        id.set_route(device, SocketAddr::new(device.addr, local.port()), Some(dst));
        raise(id, Happened::AddrResolved);
        0
    })
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard("rdma_resolve_route", || {
        const VERB: &str = "rdma_resolve_route";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        if id.lock().peer.is_none() {
            return fail(VERB, libc::EINVAL, "resolve the address first (rdma_resolve_addr)");
        }
        // IP routes: the path is the two addresses, set already.
        raise(id, Happened::RouteResolved);
        0
    })
}

/// # Safety
/// `id` live; `pd` null or live; `attr` readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    guard("rdma_create_qp", || {
        // SAFETY: forwarded contract.
        unsafe { create_qp("rdma_create_qp", id, pd, attr) }
    })
}

/// # Safety
/// As [`rdma_create_qp`].
unsafe fn create_qp(verb: &str, id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int {
    // SAFETY: forwarded contract.
    let id = or_return!(unsafe { live(verb, id) });
    if attr.is_null() {
        return fail(verb, libc::EINVAL, "NULL QP attributes");
    }
    if !id.public.qp.is_null() {
        return fail(verb, libc::EINVAL, "the ID has a QP already");
    }
    let device = or_return!(the_device(verb));
    let pd = if pd.is_null() { device.pd } else { pd };
    // SAFETY: readable and writable (caller).
    let a = unsafe { &mut *attr };
    if a.qp_type == 0 {
        // Unset (rdma_client leaves it): the ID's port space says.
        a.qp_type = id.public.qp_type;
    }
    // SAFETY: verbs calls on the program's objects and ones made here.
    unsafe {
        if a.send_cq.is_null() || a.recv_cq.is_null() {
            // As rdma-core: CQs (and channels) of the ID's own.
            let owner = id as *mut Id as *mut c_void;
            let make = |depth: u32| -> Option<(*mut ibv_comp_channel, *mut ibv_cq)> {
                let channel = verbs::ibv_create_comp_channel(device.context);
                let cq = verbs::ibv_create_cq(device.context, depth.max(1) as c_int, owner, channel, 0);
                (!channel.is_null() && !cq.is_null()).then_some((channel, cq))
            };
            let (Some(send), Some(recv)) = (make(a.cap.max_send_wr), make(a.cap.max_recv_wr)) else {
                return fail(verb, libc::ENOMEM, "cannot create the ID's CQs");
            };
            (id.public.send_cq_channel, id.public.send_cq) = send;
            (id.public.recv_cq_channel, id.public.recv_cq) = recv;
            a.send_cq = send.1;
            a.recv_cq = recv.1;
            id.lock().own_cqs = true;
        }
        let qp = verbs::ibv_create_qp(pd, a);
        if qp.is_null() {
            let errno = *libc::__errno_location();
            destroy_own_cqs(id);
            return fail(verb, errno, "ibv_create_qp failed");
        }
        id.public.qp = qp;
        id.public.pd = pd;
        id.public.qp_type = a.qp_type;
        // INIT now; a UD QP also RTR and RTS (it needs no peer); an RC QP
        // gets there when the connection is made.
        let states: &[c_int] =
            if a.qp_type == IBV_QPT_UD { &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] } else { &[IBV_QPS_INIT] };
        for &state in states {
            let moved =
                id::qp_attr(device, id, state).map(|(mut attr, mask)| verbs::ibv_modify_qp(qp, &mut attr, mask));
            if !matches!(moved, Ok(0)) {
                verbs::ibv_destroy_qp(qp);
                id.public.qp = std::ptr::null_mut();
                destroy_own_cqs(id);
                return fail(verb, libc::EINVAL, format!("cannot move the new QP to state {state}"));
            }
        }
    }
    0
}

fn destroy_own_cqs(id: &mut Id) {
    if !std::mem::take(&mut id.lock().own_cqs) {
        return;
    }
    // SAFETY: CQs and channels this library made for the ID, their QP gone.
    unsafe {
        for cq in [&mut id.public.send_cq, &mut id.public.recv_cq] {
            if !cq.is_null() {
                verbs::ibv_destroy_cq(*cq);
                *cq = std::ptr::null_mut();
            }
        }
        for channel in [&mut id.public.send_cq_channel, &mut id.public.recv_cq_channel] {
            if !channel.is_null() {
                verbs::ibv_destroy_comp_channel(*channel);
                *channel = std::ptr::null_mut();
            }
        }
    }
}

/// # Safety
/// `id` live; `attr` readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
    guard("rdma_create_qp_ex", || {
        const VERB: &str = "rdma_create_qp_ex";
        if attr.is_null() {
            return fail(VERB, libc::EINVAL, "NULL attributes");
        }
        // SAFETY: readable (caller).
        let a = unsafe { &*attr };
        if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return fail(VERB, libc::EOPNOTSUPP, format!("comp_mask {:#x}: only IBV_QP_INIT_ATTR_PD", a.comp_mask));
        }
        let mut basic = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 { a.pd } else { std::ptr::null_mut() };
        // SAFETY: forwarded contract.
        unsafe { create_qp(VERB, id, pd, &mut basic) }
    })
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard("rdma_destroy_qp", || {
        // SAFETY: forwarded contract.
        if let Ok(id) = unsafe { live("rdma_destroy_qp", id) } {
            if !id.public.qp.is_null() {
                // SAFETY: the ID's QP.
                unsafe { verbs::ibv_destroy_qp(id.public.qp) };
                id.public.qp = std::ptr::null_mut();
            }
            destroy_own_cqs(id);
        }
    })
}

/// The user's private data, checked against what a message leaves for it.
///
/// # Safety
/// `data` is null or `len` readable bytes.
unsafe fn user_data<'a>(verb: &str, data: *const c_void, len: u8, room: usize) -> Result<&'a [u8], c_int> {
    if data.is_null() || len == 0 {
        return Ok(&[]);
    }
    if usize::from(len) > room {
        return Err(fail(verb, libc::EINVAL, format!("{len} bytes of private data; this message carries {room}")));
    }
    // SAFETY: readable (caller).
    Ok(unsafe { std::slice::from_raw_parts(data.cast(), len.into()) })
}

/// rdma_cm's IP header, then the user's data.
fn with_ip_header(header: IpHeader, data: &[u8]) -> PrivateData {
    let mut bytes = [0u8; cm::MAX_PRIVATE_DATA];
    header.emit(&mut bytes).expect("room for the header");
    bytes[IpHeader::LEN..IpHeader::LEN + data.len()].copy_from_slice(data);
    PrivateData::new(&bytes[..IpHeader::LEN + data.len()]).expect("checked length")
}

/// # Safety
/// `id` live; `param` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_connect", || {
        const VERB: &str = "rdma_connect";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let device = or_return!(the_device(VERB));
        let (Some(local), Some(peer)) = ({
            let s = id.lock();
            (s.bound, s.peer)
        }) else {
            return fail(VERB, libc::EINVAL, "resolve the address and route first");
        };
        // SAFETY: readable or null (caller).
        let p = unsafe { param.as_ref() }.copied().unwrap_or(rdma_conn_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            responder_resources: device.max_responder_resources,
            initiator_depth: device.max_initiator_depth,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        });
        let header = IpHeader { src_port: local.port(), src: device.addr, dst: peer.ip() };
        let udp = id.public.ps == RDMA_PS_UDP;
        let room = if udp { cm::SIDR_REQ_PRIVATE_DATA } else { cm::REQ_PRIVATE_DATA } - IpHeader::LEN;
        // SAFETY: as the parameter says (caller).
        let data = or_return!(unsafe { user_data(VERB, p.private_data, p.private_data_len, room) });
        let private_data = with_ip_header(header, data);
        let service_id = service_id(id.public.ps, peer.port());
        let now = device.now();
        let conn = if udp {
            let mut state = device.lock();
            let conn = state.cm.sidr_request(
                now,
                peer.ip(),
                SidrReq { request_id: 0, pkey: 0xffff, service_id, private_data },
            );
            state.conns.insert(conn, id as *mut Id as usize);
            device.flush_and_wake(&mut state);
            conn
        } else {
            // SAFETY: the ID's QP, when it has one, is live.
            let qpn = if id.public.qp.is_null() { p.qp_num } else { unsafe { (*id.public.qp).qp_num } };
            let psn = id::random_psn();
            let (responder_resources, initiator_depth) = (
                p.responder_resources.min(device.max_responder_resources),
                p.initiator_depth.min(device.max_initiator_depth),
            );
            {
                let mut s = id.lock();
                s.psn = psn;
                s.responder_resources = responder_resources;
                s.initiator_depth = initiator_depth;
                s.retry_count = p.retry_count.min(7);
                s.rnr_retry_count = p.rnr_retry_count.min(7);
            }
            let req = Req {
                local_comm_id: 0,
                service_id,
                local_ca_guid: 0,
                local_qkey: 0,
                local_qpn: qpn,
                responder_resources,
                initiator_depth,
                remote_cm_response_timeout: RESPONSE_TIMEOUT_EXP,
                transport: if id.public.qp_type == IBV_QPT_UC { TransportService::Uc } else { TransportService::Rc },
                end_to_end_flow_control: p.flow_control != 0,
                starting_psn: psn,
                local_cm_response_timeout: RESPONSE_TIMEOUT_EXP,
                retry_count: p.retry_count.min(7),
                pkey: 0xffff,
                path_mtu: device.active_mtu,
                rnr_retry_count: p.rnr_retry_count.min(7),
                max_cm_retries: crate::protocol::MAX_RETRIES,
                srq: p.srq != 0 || !id.public.srq.is_null(),
                primary_local_lid: 0xffff,
                primary_remote_lid: 0xffff,
                // SAFETY: every bit pattern is a valid GID.
                primary_local_gid: unsafe { device.gid.raw },
                // SAFETY: as above.
                primary_remote_gid: unsafe { crate::device::gid_of(peer.ip()).raw },
                primary_flow_label: 0,
                primary_packet_rate: 0,
                primary_traffic_class: 0,
                primary_hop_limit: 64,
                primary_sl: 0,
                primary_subnet_local: false,
                primary_local_ack_timeout: id.lock().ack_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT),
                private_data,
            };
            let mut state = device.lock();
            let conn = state.cm.connect(now, peer.ip(), req);
            state.conns.insert(conn, id as *mut Id as usize);
            device.flush_and_wake(&mut state);
            conn
        };
        id.lock().conn = Some(conn);
        if id.is_sync() {
            return wait_established(VERB, device, id);
        }
        0
    })
}

/// The next event on `channel` as the program gets it, waiting for one
/// unless the channel's fd is non-blocking. A failed wait (EAGAIN, or
/// EINTR when a signal interrupts it, as the kernel's file says) is the
/// call's failure, set in `errno` without a debug line: programs poll.
///
/// # Safety
/// Every entry on `channel` is for a live ID.
unsafe fn next_event(device: &CmDevice, channel: &Channel) -> Result<Box<EventBox>, c_int> {
    loop {
        let pending = channel.queue.pop().map_err(|e| {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            -1
        })?;
        // SAFETY: for a live ID (caller).
        if let Some(event) = unsafe { id::finish(device, pending) } {
            return Ok(event);
        }
    }
}

/// The next event on `channel` if one is queued; never waits (rsockets
/// take their sockets' events so).
///
/// # Safety
/// Every entry on `channel` is for a live ID.
pub(crate) unsafe fn try_event(channel: &Channel) -> Option<Box<EventBox>> {
    let device = device().ok()?;
    loop {
        let pending = channel.queue.try_pop()?;
        // SAFETY: for a live ID (caller).
        if let Some(event) = unsafe { id::finish(device, pending) } {
            return Some(event);
        }
    }
}

/// Why a call fails once the device has gone.
const DEVICE_GONE: &str = "the device has gone away (softrnicd stopped)";

/// A synchronous ID's call waits for its connection to come up.
fn wait_established(verb: &str, device: &CmDevice, id: &mut Id) -> c_int {
    loop {
        // SAFETY: the ID's own channel holds only its events.
        let event = or_return!(unsafe { next_event(device, id.channel()) });
        let (kind, status) = (event.public.event, event.public.status);
        match kind {
            RDMA_CM_EVENT_ESTABLISHED => {
                // Left on the ID with its private data, as rdma-core's
                // synchronous calls leave their last event.
                free_event(id);
                id.public.event = Box::into_raw(event).cast();
                return 0;
            }
            RDMA_CM_EVENT_REJECTED => return fail(verb, libc::ECONNREFUSED, format!("rejected (reason {status})")),
            RDMA_CM_EVENT_UNREACHABLE | RDMA_CM_EVENT_CONNECT_ERROR => {
                return fail(verb, status.unsigned_abs() as c_int, "the peer did not answer");
            }
            RDMA_CM_EVENT_DEVICE_REMOVAL => return fail(verb, libc::ENODEV, DEVICE_GONE),
            _ => continue,
        }
    }
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_establish", || {
        const VERB: &str = "rdma_establish";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let (Ok(device), Some(conn)) = (device(), id.lock().conn) else {
            return fail(VERB, libc::EINVAL, "no connection to establish");
        };
        let mut state = device.lock();
        match state.cm.confirm(conn, PrivateData::EMPTY) {
            Ok(()) => {
                device.flush_and_wake(&mut state);
                0
            }
            Err(why) => fail(VERB, libc::EINVAL, why),
        }
    })
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard("rdma_listen", || {
        const VERB: &str = "rdma_listen";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let device = or_return!(the_device(VERB));
        let Some(bound) = id.lock().bound else {
            return fail(VERB, libc::EINVAL, "bind the ID first (rdma_bind_addr)");
        };
        let service = service_id(id.public.ps, bound.port());
        let mut state = device.lock();
        // 0 or less: the default, as the kernel's rdma_ucm takes it.
        if let Err(why) = state.cm.listen(service, usize::try_from(backlog).unwrap_or(0)) {
            return fail(VERB, libc::EADDRINUSE, why);
        }
        state.listeners.insert(service, id as *mut Id as usize);
        drop(state);
        id.lock().listening = Some(service);
        0
    })
}

/// # Safety
/// `listen` a live synchronous listening ID; `id` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int {
    guard("rdma_get_request", || {
        const VERB: &str = "rdma_get_request";
        // SAFETY: forwarded contract.
        let listener = or_return!(unsafe { live(VERB, listen) });
        if id.is_null() || !listener.is_sync() {
            return fail(VERB, libc::EINVAL, "needs a synchronous listening ID (created without a channel)");
        }
        let device = or_return!(the_device(VERB));
        loop {
            // SAFETY: the listener's own channel holds its events and those
            // of no ID it has handed out (those are synchronous too).
            let event = or_return!(unsafe { next_event(device, listener.channel()) });
            match event.public.event {
                RDMA_CM_EVENT_CONNECT_REQUEST => {}
                RDMA_CM_EVENT_DEVICE_REMOVAL => return fail(VERB, libc::ENODEV, DEVICE_GONE),
                _ => continue,
            }
            // SAFETY: a new ID made by finish.
            let child = unsafe { Id::from_c(event.public.id) };
            let ep = listener.lock().ep_qp_init;
            if let Some((pd, mut attr)) = ep {
                // SAFETY: the child is live; the saved attributes are a copy.
                let rc = unsafe { create_qp(VERB, event.public.id, pd as *mut ibv_pd, &mut attr) };
                if rc != 0 {
                    return rc;
                }
            }
            child.public.event = Box::into_raw(event).cast();
            // SAFETY: writable (caller).
            unsafe { *id = (child as *mut Id).cast() };
            return 0;
        }
    })
}

/// # Safety
/// `id` live (from a connection request); `param` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard("rdma_accept", || {
        const VERB: &str = "rdma_accept";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let device = or_return!(the_device(VERB));
        let (Some(conn), remote) = ({
            let s = id.lock();
            (s.conn, s.remote)
        }) else {
            return fail(VERB, libc::EINVAL, "not a connection request's ID");
        };
        // SAFETY: readable or null (caller).
        let p = unsafe { param.as_ref() }.copied();
        let udp = id.public.ps == RDMA_PS_UDP;
        let room = if udp { cm::SIDR_REP_PRIVATE_DATA } else { cm::REP_PRIVATE_DATA };
        // SAFETY: as the parameter says (caller).
        let data = match p.map(|p| unsafe { user_data(VERB, p.private_data, p.private_data_len, room) }) {
            Some(Err(rc)) => return rc,
            Some(Ok(d)) => d,
            None => &[],
        };
        let private_data = PrivateData::new(data).expect("checked length");
        if !udp {
            let remote = remote.unwrap_or_default();
            let mut s = id.lock();
            // Never more than the other side can use.
            let (most_responder, most_initiator) = (device.max_responder_resources, device.max_initiator_depth);
            s.responder_resources =
                p.map_or(most_responder, |p| p.responder_resources).min(remote.initiator_depth).min(most_responder);
            s.initiator_depth =
                p.map_or(most_initiator, |p| p.initiator_depth).min(remote.responder_resources).min(most_initiator);
            if let Some(p) = p {
                s.rnr_retry_count = p.rnr_retry_count.min(7);
            }
            drop(s);
            if let Err(rc) = id::connect_qp(device, id) {
                return fail(VERB, rc.abs(), "cannot move the QP to RTS");
            }
        }
        let (rep, sidr) = match id::answer(id, private_data) {
            Ok(a) => a,
            Err(rc) => return fail(VERB, rc, "cannot answer"),
        };
        let mut state = device.lock();
        let answered = match (rep, sidr) {
            (Some(rep), _) => state.cm.accept(device.now(), conn, rep),
            (None, Some(sidr)) => state.cm.sidr_reply(conn, sidr),
            (None, None) => Err("nothing to answer with"),
        };
        if udp {
            state.conns.remove(&conn);
        }
        device.flush_and_wake(&mut state);
        drop(state);
        if let Err(why) = answered {
            return fail(VERB, libc::EINVAL, why);
        }
        if udp {
            id.lock().conn = None;
        }
        free_event(id);
        if id.is_sync() && !udp {
            return wait_established(VERB, device, id);
        }
        0
    })
}

/// # Safety
/// `id` live (from a connection request); `data` null or `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    guard("rdma_reject", || {
        const VERB: &str = "rdma_reject";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        // SAFETY: as the arguments say (caller).
        let data = or_return!(unsafe { user_data(VERB, data, len, cm::REJ_PRIVATE_DATA) });
        let (Ok(device), Some(conn)) = (device(), id.lock().conn.take()) else {
            return fail(VERB, libc::EINVAL, "not a connection request's ID");
        };
        let mut state = device.lock();
        let rejected = state.cm.reject(conn, PrivateData::new(data).expect("checked length"));
        state.conns.remove(&conn);
        device.flush_and_wake(&mut state);
        drop(state);
        free_event(id);
        match rejected {
            Ok(()) => 0,
            Err(why) => fail(VERB, libc::EINVAL, why),
        }
    })
}

/// # Safety
/// As [`rdma_reject`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_reject_ece(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { rdma_reject(id, data, len) }
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_notify(_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // The passive side learns of an established connection from its RTU;
    // the first data packet has nothing more to tell it.
    0
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard("rdma_disconnect", || {
        const VERB: &str = "rdma_disconnect";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        // Outstanding work completes flushed, as the kernel's CM does it.
        id::fail_qp(id);
        let (Ok(device), Some(conn)) = (device(), id.lock().conn) else {
            return fail(VERB, libc::EINVAL, "the ID is not connected");
        };
        let mut state = device.lock();
        // A connection the other side took down already is down: fine.
        let _ = state.cm.disconnect(device.now(), conn);
        device.flush_and_wake(&mut state);
        0
    })
}

/// # Safety
/// `channel` live; `event` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
    guard("rdma_get_cm_event", || {
        const VERB: &str = "rdma_get_cm_event";
        if channel.is_null() || event.is_null() {
            return fail(VERB, libc::EINVAL, "NULL channel or event pointer");
        }
        let device = or_return!(the_device(VERB));
        // SAFETY: live (caller).
        let channel = unsafe { Channel::from_c(channel) };
        // SAFETY: events of destroyed IDs leave the queue with them.
        let e = or_return!(unsafe { next_event(device, channel) });
        // SAFETY: writable (caller).
        unsafe { *event = Box::into_raw(e).cast() };
        0
    })
}

/// # Safety
/// `event` came from [`rdma_get_cm_event`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", || {
        if event.is_null() {
            return fail("rdma_ack_cm_event", libc::EINVAL, "NULL event");
        }
        // SAFETY: made by Box::into_raw, acked once (caller).
        drop(unsafe { Box::from_raw(event.cast::<EventBox>()) });
        0
    })
}

fn port_of(storage: &libc::sockaddr_storage) -> u16 {
    // SAFETY: a sockaddr_storage holds a sockaddr of its family.
    unsafe { id::read_sockaddr((storage as *const libc::sockaddr_storage).cast()) }.map_or(0, |a| a.port().to_be())
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: live (caller).
    guard("rdma_get_src_port", || unsafe { id.as_ref() }.map_or(0, |id| port_of(&id.route.addr.src_addr)))
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: live (caller).
    guard("rdma_get_dst_port", || unsafe { id.as_ref() }.map_or(0, |id| port_of(&id.route.addr.dst_addr)))
}

/// # Safety
/// `num_devices` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", || {
        let device = match the_device("rdma_get_devices") {
            Ok(d) => d,
            Err(_) => return std::ptr::null_mut(),
        };
        let list = Box::into_raw(Box::new([device.context, std::ptr::null_mut()]));
        if !num_devices.is_null() {
            // SAFETY: writable (caller).
            unsafe { *num_devices = 1 };
        }
        list.cast()
    })
}

/// # Safety
/// `list` came from [`rdma_get_devices`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    guard("rdma_free_devices", || {
        if !list.is_null() {
            // SAFETY: made by rdma_get_devices.
            drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_context; 2]>()) });
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    let name: &'static [u8] = match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    name.as_ptr().cast()
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: usize,
) -> c_int {
    guard("rdma_set_option", || {
        const VERB: &str = "rdma_set_option";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        match (level, name) {
            // The type of service, address reuse and IPv6-only change
            // nothing softrnic's CM does.
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) => 0,
            // The QP's local ACK timeout, as the kernel's CM takes it: one
            // byte, a code of 0 to 31, for an RC ID, used when the QP
            // moves to RTS (and sent in the REQ).
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                if value.is_null() || len != 1 {
                    return fail(VERB, libc::EINVAL, "the ACK timeout is one byte (a u8)");
                }
                // SAFETY: one readable byte (caller; checked non-null).
                let timeout = unsafe { *value.cast::<u8>() };
                if timeout > 31 {
                    return fail(VERB, libc::EINVAL, format!("ACK timeout {timeout} is out of range 0..=31"));
                }
                if id.public.qp_type != IBV_QPT_RC {
                    return fail(VERB, libc::EINVAL, "an ACK timeout is for an RC ID");
                }
                id.lock().ack_timeout = Some(timeout);
                0
            }
            _ => fail(VERB, libc::ENOSYS, format!("option {level}/{name} (InfiniBand paths have no meaning on IP)")),
        }
    })
}

/// # Safety
/// `id` live; `channel` null or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
    guard("rdma_migrate_id", || {
        const VERB: &str = "rdma_migrate_id";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let Ok(device) = device() else { return fail(VERB, libc::ENODEV, "no device") };
        let me = id as *mut Id as usize;
        // Under the device's lock, so the agent delivers nothing between.
        let _state = device.lock();
        let old = id.channel();
        let queued: Vec<Pending> = std::iter::from_fn(|| old.queue.try_pop()).collect();
        let (moving, staying): (Vec<Pending>, Vec<Pending>) = queued.into_iter().partition(|p| p.id == me);
        for p in staying {
            old.queue.push(p);
        }
        if channel.is_null() {
            let own = match Channel::new() {
                Ok(c) => c,
                Err(e) => return fail(VERB, libc::ENOMEM, e),
            };
            id.public.channel = &own.public as *const _ as *mut _;
            id.lock().own_channel = Some(own);
        } else {
            id.public.channel = channel;
            id.lock().own_channel = None;
        }
        for p in moving {
            id.channel().queue.push(p);
        }
        0
    })
}

/// # Safety
/// `id` live; `attr` and `mask` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int {
    guard("rdma_init_qp_attr", || {
        const VERB: &str = "rdma_init_qp_attr";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        if attr.is_null() || mask.is_null() {
            return fail(VERB, libc::EINVAL, "NULL attributes or mask");
        }
        let device = or_return!(the_device(VERB));
        // SAFETY: readable (caller).
        let wanted = unsafe { (*attr).qp_state };
        match id::qp_attr(device, id, wanted) {
            Ok((a, m)) => {
                // SAFETY: writable (caller).
                unsafe { (*attr, *mask) = (a, m) };
                0
            }
            Err(rc) => fail(VERB, rc, format!("no attributes for QP state {wanted} yet")),
        }
    })
}

/// # Safety
/// `id` live; `pd` null or live; `attr` readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> c_int {
    guard("rdma_create_srq", || {
        const VERB: &str = "rdma_create_srq";
        // SAFETY: forwarded contract.
        let id = or_return!(unsafe { live(VERB, id) });
        let device = or_return!(the_device(VERB));
        let pd = if pd.is_null() { device.pd } else { pd };
        // SAFETY: a live PD and the caller's attributes.
        let srq = unsafe { verbs::ibv_create_srq(pd, attr) };
        if srq.is_null() {
            // SAFETY: this thread's errno.
            return fail(VERB, unsafe { *libc::__errno_location() }, "ibv_create_srq failed");
        }
        id.public.srq = srq;
        id.public.pd = pd;
        0
    })
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    fail("rdma_create_srq_ex", libc::EOPNOTSUPP, "extended SRQs (XRC, tag matching): use rdma_create_srq")
}

/// # Safety
/// `id` live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard("rdma_destroy_srq", || {
        // SAFETY: forwarded contract.
        if let Ok(id) = unsafe { live("rdma_destroy_srq", id) }
            && !id.public.srq.is_null()
        {
            // SAFETY: the ID's SRQ.
            unsafe { verbs::ibv_destroy_srq(id.public.srq) };
            id.public.srq = std::ptr::null_mut();
        }
    })
}

/// # Safety
/// `id` writable; `res` from `rdma_getaddrinfo`; `pd` null or live;
/// `qp_init_attr` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard("rdma_create_ep", || {
        const VERB: &str = "rdma_create_ep";
        if id.is_null() || res.is_null() {
            return fail(VERB, libc::EINVAL, "NULL id pointer or address");
        }
        // SAFETY: readable (caller).
        let r = unsafe { &*res };
        let qp_type = if r.ai_qp_type != 0 { r.ai_qp_type } else { IBV_QPT_RC };
        let ps = if r.ai_port_space != 0 { r.ai_port_space } else { RDMA_PS_TCP };
        let mut new = std::ptr::null_mut();
        // SAFETY: a new synchronous ID.
        let rc = unsafe { create_id(VERB, std::ptr::null_mut(), &mut new, std::ptr::null_mut(), ps, qp_type) };
        if rc != 0 {
            return rc;
        }
        let done = (|| {
            if r.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the new ID; the address from rdma_getaddrinfo.
                let rc = unsafe { rdma_bind_addr(new, r.ai_src_addr) };
                if rc != 0 {
                    return rc;
                }
                if !qp_init_attr.is_null() {
                    // SAFETY: readable (caller); a copy for each request.
                    let attr = unsafe { *qp_init_attr };
                    // SAFETY: the new ID.
                    unsafe { Id::from_c(new) }.lock().ep_qp_init = Some((pd as usize, attr));
                }
                return 0;
            }
            // SAFETY: the new ID; addresses from rdma_getaddrinfo.
            let rc = unsafe { rdma_resolve_addr(new, r.ai_src_addr, r.ai_dst_addr, 2000) };
            if rc != 0 {
                return rc;
            }
            // SAFETY: as above.
            let rc = unsafe { rdma_resolve_route(new, 2000) };
            if rc != 0 || qp_init_attr.is_null() {
                return rc;
            }
            // SAFETY: the new ID; the caller's attributes.
            unsafe { create_qp(VERB, new, pd, qp_init_attr) }
        })();
        if done != 0 {
            // SAFETY: the new ID, not handed out.
            unsafe { rdma_destroy_id(new) };
            return done;
        }
        // SAFETY: writable (caller).
        unsafe { *id = new };
        0
    })
}

/// # Safety
/// `id` from [`rdma_create_ep`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard("rdma_destroy_ep", || {
        // SAFETY: forwarded contract.
        unsafe {
            rdma_destroy_qp(id);
            rdma_destroy_srq(id);
            rdma_destroy_id(id);
        }
    })
}
