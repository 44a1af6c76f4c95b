//! One rsocket: a synchronous rdma_cm ID (whose own event channel's
//! descriptor is the socket's number, as rdma-core numbers rsockets),
//! its options, and once connected its [`Stream`].
//!
//! Every call tries once under the socket's lock and says whether it is
//! done, failed, or must wait ([`Attempt`]); the exported calls in
//! `mod.rs` wait between tries without the lock, so one thread can send
//! while another sleeps in a receive.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};

use crate::abi::*;
use crate::api::{self, rdma_accept, rdma_connect, rdma_destroy_id, rdma_disconnect, rdma_reject};
use crate::id::{EventBox, Id};

use super::message::{Hello, Kind};
use super::options::Options;
use super::stream::{Sizes, Stream};

/// What one try of a call came to.
pub enum Attempt<T> {
    Done(T),
    Failed(c_int),
    /// Nothing to do until a completion or a CM event comes.
    Wait,
}

impl<T> From<Result<T, c_int>> for Attempt<T> {
    fn from(result: Result<T, c_int>) -> Attempt<T> {
        result.map_or_else(Attempt::Failed, Attempt::Done)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Open,
    Listening,
    Connected,
}

pub struct RSocket {
    /// The socket's number: its ID's event channel's descriptor.
    pub fd: c_int,
    id: *mut rdma_cm_id,
    pub state: State,
    pub options: Options,
    /// A failure not yet reported (`SO_ERROR`).
    pub error: c_int,
    pub stream: Option<Stream>,
    /// Connection requests a listener has taken and not yet accepted.
    requests: VecDeque<Box<EventBox>>,
    /// The peer disconnected.
    peer_gone: bool,
    /// `rshutdown(SHUT_RD)`.
    shut_read: bool,
}

// SAFETY: the ID, its QP and the stream's verbs objects belong to the
// socket alone and are used only under the socket's lock (the table
// keeps every socket behind a mutex).
unsafe impl Send for RSocket {}

impl RSocket {
    /// A stream socket's ID, synchronous (its own channel).
    pub fn new() -> Result<RSocket, c_int> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a writable out pointer; no channel makes it synchronous.
        if unsafe { api::rdma_create_id(std::ptr::null_mut(), &mut id, std::ptr::null_mut(), RDMA_PS_TCP) } != 0 {
            return Err(errno());
        }
        // SAFETY: a synchronous ID has its own channel.
        let fd = unsafe { (*(*id).channel).fd };
        Ok(RSocket {
            fd,
            id,
            state: State::Open,
            options: Options::default(),
            error: 0,
            stream: None,
            requests: VecDeque::new(),
            peer_gone: false,
            shut_read: false,
        })
    }

    /// The addresses of the connection: this side's or the peer's.
    pub fn address(&self, peer: bool) -> &libc::sockaddr_storage {
        // SAFETY: the socket's live ID.
        let route = unsafe { &(*self.id).route.addr };
        if peer { &route.dst_addr } else { &route.src_addr }
    }

    pub fn bind(&mut self, addr: *const libc::sockaddr) -> Result<(), c_int> {
        if self.state != State::Open {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program's address, its length checked by the caller.
        match unsafe { api::rdma_bind_addr(self.id, addr as *mut _) } {
            0 => Ok(()),
            _ => Err(errno()),
        }
    }

    pub fn listen(&mut self, backlog: c_int) -> Result<(), c_int> {
        match self.state {
            State::Listening => return Ok(()),
            State::Connected => return Err(libc::EISCONN),
            State::Open => {}
        }
        // SAFETY: the socket's live ID.
        if unsafe { api::rdma_listen(self.id, backlog) } != 0 {
            return Err(errno());
        }
        self.state = State::Listening;
        Ok(())
    }

    /// Connects to `addr`, waiting until the connection is up or refused
    /// (softrnic's CM answers on the local network in a round trip).
    pub fn connect(&mut self, addr: *const libc::sockaddr) -> Result<(), c_int> {
        match self.state {
            State::Connected => return Err(libc::EISCONN),
            State::Listening => return Err(libc::EINVAL),
            State::Open => {}
        }
        let id = self.id;
        // SAFETY: the socket's live synchronous ID; the program's
        // address, checked by the caller.
        unsafe {
            if api::rdma_resolve_addr(id, std::ptr::null_mut(), addr as *mut _, 2000) != 0
                || api::rdma_resolve_route(id, 2000) != 0
            {
                return Err(errno());
            }
        }
        let stream = self.make_stream(id)?;
        let hello = stream.hello().emit();
        let mut param = conn_param(&hello);
        // SAFETY: the ID with its QP; the parameters live across the call.
        if unsafe { rdma_connect(id, &mut param) } != 0 {
            let e = errno();
            drop(stream);
            return Err(e);
        }
        // A synchronous connect leaves its ESTABLISHED event on the ID,
        // with the peer's private data.
        // SAFETY: the event rdma_connect left, live until the next.
        let peer = unsafe { (*id).event.as_ref() }.map(peer_hello);
        self.established(stream, peer)
    }

    fn sizes(&self) -> Sizes {
        Sizes { send_buffer: self.options.send_buffer, receive_buffer: self.options.receive_buffer }
    }

    fn make_stream(&self, id: *mut rdma_cm_id) -> Result<Stream, c_int> {
        let device = crate::device().map_err(|_| libc::ENODEV)?;
        // SAFETY: a live ID without a QP, which the socket keeps as long
        // as the stream.
        unsafe { Stream::new(id, device.pd, self.sizes()) }
    }

    fn established(&mut self, mut stream: Stream, peer: Option<Result<Hello, String>>) -> Result<(), c_int> {
        match peer {
            Some(Ok(hello)) => stream.hear(hello),
            Some(Err(why)) => {
                api::fail("rconnect", libc::EPROTO, format!("the peer is not a softrnic rsocket: {why}"));
                return Err(libc::EPROTO);
            }
            None => return Err(libc::EPROTO),
        }
        self.stream = Some(stream);
        self.state = State::Connected;
        Ok(())
    }

    /// Takes the CM events that came: connection requests for a
    /// listener, the peer's disconnection, the device going away.
    fn take_events(&mut self) {
        // SAFETY: the socket's live ID and its channel.
        while let Some(event) = unsafe { api::try_event(Id::from_c(self.id).channel()) } {
            match event.public.event {
                RDMA_CM_EVENT_CONNECT_REQUEST if self.state == State::Listening => self.requests.push_back(event),
                RDMA_CM_EVENT_DISCONNECTED => self.peer_gone = true,
                RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    self.error = libc::ENODEV;
                    if let Some(stream) = &mut self.stream {
                        stream.failed.get_or_insert(libc::ENODEV);
                    }
                }
                _ => {}
            }
        }
    }

    /// Takes what came (completions, CM events): whether anything did.
    pub fn progress(&mut self) -> bool {
        let requests = self.requests.len();
        self.take_events();
        let completions = self.stream.as_mut().is_some_and(Stream::progress);
        completions || self.requests.len() != requests
    }

    /// Arms the notifications a sleep waits for; whether something came
    /// meanwhile (then do not sleep).
    pub fn arm(&mut self) -> bool {
        self.stream.as_mut().is_some_and(Stream::arm) || self.progress()
    }

    /// The descriptors that wake a sleeper once armed.
    pub fn wake_fds(&self) -> Vec<c_int> {
        let mut fds = vec![self.fd];
        fds.extend(self.stream.as_ref().map(Stream::wake_fd));
        fds
    }

    pub fn drain_wakeups(&mut self) {
        if let Some(stream) = &mut self.stream {
            stream.drain_wakeups();
        }
    }

    /// The next connection request, accepted: the new socket.
    pub fn accept(&mut self) -> Attempt<RSocket> {
        if self.state != State::Listening {
            return Attempt::Failed(libc::EINVAL);
        }
        self.progress();
        let Some(request) = self.requests.pop_front() else { return Attempt::Wait };
        let child = request.public.id;
        let peer = peer_hello(&request.public);
        // SAFETY: the request's new ID (synchronous, its own channel); the
        // request event rides on it, as rdma_get_request leaves it, for
        // rdma_accept or rdma_destroy_id to free.
        let mut socket = unsafe {
            (*child).event = Box::into_raw(request).cast();
            RSocket {
                fd: (*(*child).channel).fd,
                id: child,
                state: State::Open,
                options: Options { nonblocking: false, ..self.options },
                error: 0,
                stream: None,
                requests: VecDeque::new(),
                peer_gone: false,
                shut_read: false,
            }
        };
        if let Err(why) = &peer {
            api::fail("raccept", libc::EPROTO, format!("a connection request not from a softrnic rsocket: {why}"));
            // SAFETY: the request's ID, refused and dropped with the socket.
            unsafe { rdma_reject(child, std::ptr::null(), 0) };
            return Attempt::Failed(libc::ECONNABORTED);
        }
        let stream = match socket.make_stream(child) {
            Ok(stream) => stream,
            Err(e) => return Attempt::Failed(e),
        };
        let hello = stream.hello().emit();
        let mut param = conn_param(&hello);
        // SAFETY: the ID with its QP; a synchronous accept waits for the
        // RTU.
        if unsafe { rdma_accept(child, &mut param) } != 0 {
            return Attempt::Failed(libc::ECONNABORTED);
        }
        match socket.established(stream, Some(peer)) {
            Ok(()) => Attempt::Done(socket),
            Err(e) => Attempt::Failed(e),
        }
    }

    fn connected(&mut self) -> Result<&mut Stream, c_int> {
        self.stream.as_mut().ok_or(libc::ENOTCONN)
    }

    pub fn receive(&mut self, buf: &mut [u8], peek: bool) -> Attempt<usize> {
        if self.shut_read {
            return Attempt::Done(0);
        }
        self.progress();
        let peer_gone = self.peer_gone;
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        match stream.receive(buf, peek) {
            0 if buf.is_empty() => Attempt::Done(0),
            0 if stream.peer_done || peer_gone => Attempt::Done(0),
            0 => match stream.failed {
                Some(e) => Attempt::Failed(e),
                None => Attempt::Wait,
            },
            n => Attempt::Done(n),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) -> Attempt<usize> {
        self.progress();
        let peer_gone = self.peer_gone;
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        if let Some(e) = stream.failed {
            return Attempt::Failed(e);
        }
        if stream.shut_write || peer_gone {
            return Attempt::Failed(libc::EPIPE);
        }
        match stream.send(bytes) {
            Ok(0) if !bytes.is_empty() => Attempt::Wait,
            sent => sent.into(),
        }
    }

    /// Whether the peer is there to hear a message: connected, neither
    /// gone nor broken.
    pub fn talking(&mut self) -> bool {
        self.progress();
        !self.peer_gone && self.stream.as_ref().is_some_and(|s| s.failed.is_none())
    }

    /// A control message, once a slot is free.
    pub fn control(&mut self, kind: Kind, payload: &[u8]) -> Attempt<()> {
        self.progress();
        if self.peer_gone {
            return Attempt::Failed(libc::EPIPE);
        }
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        if let Some(e) = stream.failed {
            return Attempt::Failed(e);
        }
        if !stream.can_send_message() {
            return Attempt::Wait;
        }
        stream.send_control(kind, payload).into()
    }

    /// `riomap`: `len` bytes at `addr` for the peer to write, at `offset`
    /// (the first free one when `None`), once the peer can be told.
    pub fn map(&mut self, addr: u64, len: u64, offset: Option<u64>) -> Attempt<u64> {
        self.progress();
        let room = self.options.iomap_size as usize;
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        if stream.maps() >= room {
            return Attempt::Failed(libc::ENOMEM);
        }
        if !stream.can_send_message() {
            return Attempt::Wait;
        }
        stream.map(addr, len, offset).into()
    }

    /// `riounmap`: the peer is told first while it is there to hear it.
    pub fn unmap(&mut self, addr: u64) -> Attempt<()> {
        let talking = self.talking();
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        if talking && !stream.can_send_message() {
            return Attempt::Wait;
        }
        stream.unmap(addr, talking).into()
    }

    /// `riowrite`'s next piece of `bytes`, to the peer's map at `at`, once
    /// the peer has mapped it (its map rides the stream ahead of anything
    /// it sent after) and a send slot is free.
    pub fn write(&mut self, bytes: &[u8], at: u64) -> Attempt<usize> {
        self.progress();
        let stream = match self.connected() {
            Ok(s) => s,
            Err(e) => return Attempt::Failed(e),
        };
        if let Some(e) = stream.failed {
            return Attempt::Failed(e);
        }
        if !stream.can_send() || !stream.peer_mapped(at) {
            return Attempt::Wait;
        }
        stream.write(bytes, at).into()
    }

    /// `rshutdown`'s read half: reads return the end of the stream.
    pub fn shut_read(&mut self) {
        self.shut_read = true;
    }

    /// The events `rpoll` reports for `events`.
    pub fn poll_events(&mut self, events: i16) -> i16 {
        self.progress();
        let mut revents = 0;
        match (self.state, &self.stream) {
            (State::Listening, _) => {
                if !self.requests.is_empty() {
                    revents |= libc::POLLIN;
                }
            }
            (State::Connected, Some(stream)) => {
                let done = stream.peer_done || self.peer_gone;
                if stream.readable() || done || self.shut_read {
                    revents |= libc::POLLIN;
                }
                if stream.can_send_message() && !stream.shut_write && !self.peer_gone {
                    revents |= libc::POLLOUT;
                }
                if self.peer_gone && !stream.readable() {
                    revents |= libc::POLLHUP;
                }
                if stream.failed.is_some() {
                    revents |= libc::POLLERR;
                }
            }
            // A socket neither listening nor connected, as Linux polls one.
            _ => revents |= libc::POLLOUT | libc::POLLHUP,
        }
        revents & (events | libc::POLLHUP | libc::POLLERR)
    }

    /// Whether everything sent has completed (or cannot any more).
    pub fn drained(&mut self) -> bool {
        self.progress();
        self.stream.as_ref().is_none_or(|s| s.all_sent() || s.failed.is_some() || self.peer_gone)
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        // SAFETY: the socket's own ID (and the IDs of requests never
        // accepted); the stream's QP goes before its ID.
        unsafe {
            if self.state == State::Connected && !self.peer_gone {
                rdma_disconnect(self.id);
            }
            self.stream = None;
            for request in self.requests.drain(..) {
                let child = request.public.id;
                (*child).event = Box::into_raw(request).cast();
                rdma_reject(child, std::ptr::null(), 0);
                rdma_destroy_id(child);
            }
            rdma_destroy_id(self.id);
        }
    }
}

fn conn_param(hello: &[u8; Hello::LEN]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: hello.as_ptr().cast::<c_void>(),
        private_data_len: Hello::LEN as u8,
        // RDMA WRITEs only (riowrite): no READ or atomic is ever asked.
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        // A reader that stops reading holds its writer: never give up.
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

fn peer_hello(event: &rdma_cm_event) -> Result<Hello, String> {
    // SAFETY: a connection event's parameters; its private data lives
    // with the event.
    let conn = unsafe { event.param.conn };
    if conn.private_data.is_null() {
        return Err("no private data".into());
    }
    // SAFETY: as above.
    let data = unsafe { std::slice::from_raw_parts(conn.private_data.cast::<u8>(), conn.private_data_len.into()) };
    Hello::parse(data)
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}
