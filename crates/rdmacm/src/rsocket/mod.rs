//! rsockets: the socket calls over RDMA (`<rdma/rsocket.h>`), so that
//! rdma-core's `rstream`, `riostream` and `rcopy`, and unmodified socket
//! programs under rdma-core's `librspreload.so` (which turns `socket`,
//! `connect`, `send`, `poll`... into these calls), run over softrnic's RC.
//!
//! As in rdma-core, rsockets stand on the public rdma_cm and verbs calls
//! of this library: a stream socket is a synchronous rdma_cm ID with an
//! RC QP ([`socket`]); its bytes travel in SENDs through registered slots
//! ([`stream`], framed by [`message`]); its options are [`options`]. The
//! framing is softrnic's own, so both ends must be softrnic's.
//!
//! Progress happens in the calls, as in rdma-core (no thread of the
//! library's own): each call tries, then polls for a while, then sleeps on
//! the socket's completion channel and CM channel with the socket's lock
//! released (`until_done`). Datagram rsockets (`SOCK_DGRAM`, rdma-core's
//! UD rsockets) are refused with `EPROTONOSUPPORT`, so `librspreload.so`
//! leaves such sockets to the kernel.

pub mod message;
pub mod options;
mod poll;
pub mod socket;
pub mod stream;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use softrnic_verbs_abi::ffi::{guard, refuse, set_errno};

use message::Kind;
use options::Value;
use socket::{Attempt, RSocket, State};

type Shared = Arc<Mutex<RSocket>>;

/// Every open rsocket, by number.
static SOCKETS: LazyLock<Mutex<HashMap<c_int, Shared>>> = LazyLock::new(Default::default);

/// How long a blocking call (and `rpoll`) polls before it sleeps:
/// `SOFTRNIC_RSOCKET_POLL_US`, else 100 µs. A wake-up through the
/// completion channel costs about 50 µs here (`ibv_rc_pingpong -e`: 104 µs
/// a round trip, 11 µs polling), so polling twice that long keeps a
/// blocking stream's 64 B latency at 7 µs instead of 68 and its 64 KiB
/// bandwidth at 8.8 Gb/s instead of 1.9 (rdma-core's rsockets poll 10 µs,
/// their `polling_time`, against a kernel's cheaper wake-ups).
static SPIN: LazyLock<Duration> = LazyLock::new(|| {
    let us = std::env::var("SOFTRNIC_RSOCKET_POLL_US").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    Duration::from_micros(us)
});
/// The longest one sleep lasts before the call looks again (a safety
/// net: completions and CM events wake it).
const NAP: Duration = Duration::from_millis(100);
/// How long `rclose` waits for what was sent to be delivered.
const LINGER: Duration = Duration::from_secs(5);

fn table() -> MutexGuard<'static, HashMap<c_int, Shared>> {
    SOCKETS.lock().unwrap_or_else(|e| e.into_inner())
}

fn lock(socket: &Shared) -> MutexGuard<'_, RSocket> {
    socket.lock().unwrap_or_else(|e| e.into_inner())
}

fn lookup(verb: &str, fd: c_int) -> Result<Shared, c_int> {
    table().get(&fd).cloned().ok_or_else(|| fail(verb, libc::EBADF, format!("{fd} is not an rsocket")))
}

/// -1 with `errno`, as a socket call fails.
fn fail(verb: &str, errno: c_int, why: impl std::fmt::Display) -> c_int {
    set_errno(refuse(verb, errno, why));
    -1
}

/// A call's result as its C return value.
fn returned(verb: &str, result: Result<usize, c_int>) -> isize {
    match result {
        Ok(n) => n as isize,
        // EAGAIN is a non-blocking socket's everyday answer: no debug line.
        Err(libc::EAGAIN) => {
            set_errno(libc::EAGAIN);
            -1
        }
        Err(e) => fail(verb, e, "failed") as isize,
    }
}

/// Whether a call may wait for what it needs.
#[derive(Debug, Clone, Copy)]
enum Waits {
    /// As the socket's mode says (`O_NONBLOCK`: `EAGAIN` instead), and
    /// never with the call's `MSG_DONTWAIT`.
    AsTheSocket { dontwait: bool },
    /// Whatever the socket's mode: calls that finish what they start
    /// (`riomap`, `riounmap`, the end of the stream, `rclose`), which a
    /// non-blocking TCP socket never answers with `EAGAIN` either.
    Always,
}

/// Tries `attempt` until it is done or fails; between tries, polls for
/// [`struct@SPIN`], then sleeps on the socket's descriptors without its lock.
fn until_done<T>(
    socket: &Shared,
    waits: Waits,
    deadline: Option<Instant>,
    mut attempt: impl FnMut(&mut RSocket) -> Attempt<T>,
) -> Result<T, c_int> {
    let spin_until = Instant::now() + *SPIN;
    loop {
        let fds = {
            let mut s = lock(socket);
            match attempt(&mut s) {
                Attempt::Done(value) => return Ok(value),
                Attempt::Failed(e) => return Err(e),
                Attempt::Wait => {}
            }
            let may_wait = match waits {
                Waits::AsTheSocket { dontwait } => !dontwait && !s.options.nonblocking,
                Waits::Always => true,
            };
            if !may_wait {
                return Err(libc::EAGAIN);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(libc::ETIMEDOUT);
            }
            if Instant::now() < spin_until || s.arm() {
                continue;
            }
            s.wake_fds()
        };
        let nap = deadline.map_or(NAP, |d| d.saturating_duration_since(Instant::now()).min(NAP));
        softrnic_event::eventfd::wait_readable(&fds, nap).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        lock(socket).drain_wakeups();
    }
}

fn dontwait(flags: c_int) -> bool {
    flags & libc::MSG_DONTWAIT != 0
}

/// A data call's waiting: as the socket, unless `flags` say not to.
fn as_the_socket(flags: c_int) -> Waits {
    Waits::AsTheSocket { dontwait: dontwait(flags) }
}

/// Reads a program's `sockaddr` of `len` bytes: its pointer, once the
/// length covers its family's address.
fn sockaddr_in(verb: &str, addr: *const libc::sockaddr, len: libc::socklen_t) -> Result<*const libc::sockaddr, c_int> {
    if addr.is_null() {
        return Err(fail(verb, libc::EFAULT, "NULL address"));
    }
    // SAFETY: a readable sockaddr of `len` bytes (caller), whose family
    // field comes first.
    let family = c_int::from(unsafe { (*addr).sa_family });
    let need = match family {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => {
            return Err(fail(
                verb,
                libc::EAFNOSUPPORT,
                format!("address family {family}: rsockets take IPv4 and IPv6"),
            ));
        }
    };
    match (len as usize) < need {
        true => Err(fail(verb, libc::EINVAL, format!("a {len}-byte address, {need} needed"))),
        false => Ok(addr),
    }
}

/// Writes `storage`'s address into the program's `addr` of `*len` bytes
/// (truncated, as the kernel truncates) and its full length into `*len`.
///
/// # Safety
/// `addr` is null or writable for `*len` bytes; `len` null or writable.
unsafe fn give_address(
    storage: &libc::sockaddr_storage,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    if len.is_null() {
        return libc::EFAULT;
    }
    let mut storage = *storage;
    let full = match c_int::from(storage.ss_family) {
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        // Not bound yet: 0.0.0.0 port 0, as Linux names such a socket.
        0 => {
            storage.ss_family = libc::AF_INET as libc::sa_family_t;
            size_of::<libc::sockaddr_in>()
        }
        _ => size_of::<libc::sockaddr_in>(),
    };
    // SAFETY: as the contract says.
    unsafe {
        let room = (*len as usize).min(full);
        if !addr.is_null() {
            std::ptr::copy_nonoverlapping(
                (&storage as *const libc::sockaddr_storage).cast::<u8>(),
                addr.cast::<u8>(),
                room,
            );
        }
        *len = full as libc::socklen_t;
    }
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn rsocket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    guard("rsocket", || {
        const VERB: &str = "rsocket";
        // Checked before the device opens: librspreload asks for every
        // socket the program makes, the engine's own among them.
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return fail(VERB, libc::EAFNOSUPPORT, format!("domain {domain}: rsockets are IPv4 and IPv6"));
        }
        let flags = kind & (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
        if kind & !flags != libc::SOCK_STREAM {
            return fail(
                VERB,
                libc::EPROTONOSUPPORT,
                "only SOCK_STREAM: softrnic has no datagram rsockets (UD); the kernel's UDP serves those",
            );
        }
        if protocol != 0 && protocol != libc::IPPROTO_TCP {
            return fail(VERB, libc::EPROTONOSUPPORT, format!("protocol {protocol} on a stream rsocket"));
        }
        match RSocket::new() {
            Ok(mut socket) => {
                socket.options.nonblocking = flags & libc::SOCK_NONBLOCK != 0;
                let fd = socket.fd;
                table().insert(fd, Arc::new(Mutex::new(socket)));
                fd
            }
            Err(e) => fail(VERB, e, "cannot make the socket's rdma_cm ID"),
        }
    })
}

/// # Safety
/// `addr` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rbind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    guard("rbind", || {
        let socket = match lookup("rbind", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let addr = match sockaddr_in("rbind", addr, len) {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        match lock(&socket).bind(addr) {
            Ok(()) => 0,
            Err(e) => fail("rbind", e, "cannot bind"),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rlisten(fd: c_int, backlog: c_int) -> c_int {
    guard("rlisten", || {
        let socket = match lookup("rlisten", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        match lock(&socket).listen(backlog) {
            Ok(()) => 0,
            Err(e) => fail("rlisten", e, "cannot listen"),
        }
    })
}

/// # Safety
/// `addr` and `len` are null or writable (`*len` bytes at `addr`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn raccept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    guard("raccept", || {
        const VERB: &str = "raccept";
        let listener = match lookup(VERB, fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let socket = match until_done(&listener, as_the_socket(0), None, RSocket::accept) {
            Ok(s) => s,
            Err(e) => return returned(VERB, Err(e)) as c_int,
        };
        if !len.is_null() {
            // SAFETY: writable or null (caller).
            unsafe { give_address(socket.address(true), addr, len) };
        }
        let number = socket.fd;
        table().insert(number, Arc::new(Mutex::new(socket)));
        number
    })
}

/// # Safety
/// `addr` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rconnect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    guard("rconnect", || {
        const VERB: &str = "rconnect";
        let socket = match lookup(VERB, fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let addr = match sockaddr_in(VERB, addr, len) {
            Ok(a) => a,
            Err(rc) => return rc,
        };
        let mut s = lock(&socket);
        match s.connect(addr) {
            Ok(()) => 0,
            Err(e) => {
                s.error = e;
                fail(VERB, e, "cannot connect")
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rshutdown(fd: c_int, how: c_int) -> c_int {
    guard("rshutdown", || {
        let socket = match lookup("rshutdown", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
            return fail("rshutdown", libc::EINVAL, format!("how {how}"));
        }
        if lock(&socket).state != State::Connected {
            return fail("rshutdown", libc::ENOTCONN, "not connected");
        }
        if how != libc::SHUT_WR {
            lock(&socket).shut_read();
        }
        if how != libc::SHUT_RD {
            shut_write(&socket, Instant::now() + LINGER);
        }
        0
    })
}

/// Sends the end of the stream once, if the connection still stands.
fn shut_write(socket: &Shared, deadline: Instant) {
    let _ = until_done(socket, Waits::Always, Some(deadline), |s| {
        match s.stream.as_ref().map(|stream| stream.shut_write) {
            None | Some(true) => Attempt::Done(()),
            Some(false) => {
                let sent = s.control(Kind::Shutdown, &[]);
                if let (Attempt::Done(()), Some(stream)) = (&sent, s.stream.as_mut()) {
                    stream.shut_write = true;
                }
                sent
            }
        }
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn rclose(fd: c_int) -> c_int {
    guard("rclose", || {
        let Some(socket) = table().remove(&fd) else {
            return fail("rclose", libc::EBADF, format!("{fd} is not an rsocket"));
        };
        // What was sent reaches the peer before the connection goes
        // (blocking, whatever the socket's mode, as rdma-core's rclose).
        let deadline = Instant::now() + LINGER;
        shut_write(&socket, deadline);
        let _ = until_done(&socket, Waits::Always, Some(deadline), |s| match s.drained() {
            true => Attempt::Done(()),
            false => Attempt::Wait,
        });
        // The last reference: the socket's drop disconnects and frees.
        drop(socket);
        0
    })
}

/// The common receive: `rrecv`, `rread`, `rrecvfrom`, and each buffer of
/// `rreadv`/`rrecvmsg`.
fn receive(verb: &str, fd: c_int, buf: &mut [u8], flags: c_int) -> Result<usize, c_int> {
    let socket = lookup(verb, fd).map_err(|_| libc::EBADF)?;
    let peek = flags & libc::MSG_PEEK != 0;
    let wait_all = flags & libc::MSG_WAITALL != 0 && !peek;
    let mut got = until_done(&socket, as_the_socket(flags), None, |s| s.receive(buf, peek))?;
    while wait_all && got > 0 && got < buf.len() {
        match until_done(&socket, as_the_socket(flags), None, |s| s.receive(&mut buf[got..], false)) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    Ok(got)
}

/// The common send: a blocking socket sends everything, a non-blocking
/// one what there is room for (or `EAGAIN`).
fn send(verb: &str, fd: c_int, bytes: &[u8], flags: c_int) -> Result<usize, c_int> {
    let socket = lookup(verb, fd).map_err(|_| libc::EBADF)?;
    let mut sent = 0;
    loop {
        match until_done(&socket, as_the_socket(flags), None, |s| s.send(&bytes[sent..])) {
            Ok(n) => sent += n,
            Err(libc::EAGAIN) if sent > 0 => return Ok(sent),
            Err(e) => return Err(e),
        }
        let nonblocking = dontwait(flags) || lock(&socket).options.nonblocking;
        if sent == bytes.len() || nonblocking {
            return Ok(sent);
        }
    }
}

/// # Safety
/// `buf` is writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guard("rrecv", || {
        // SAFETY: writable (caller).
        let buf = unsafe { program_bytes_mut(buf, len) };
        returned("rrecv", receive("rrecv", fd, buf, flags))
    })
}

/// # Safety
/// As [`rrecv`]; `src` and `len` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    src_len: *mut libc::socklen_t,
) -> isize {
    guard("rrecvfrom", || {
        // SAFETY: writable (caller).
        let bytes = unsafe { program_bytes_mut(buf, len) };
        let got = receive("rrecvfrom", fd, bytes, flags);
        if let (Ok(_), false, Ok(socket)) = (&got, src_len.is_null(), lookup("rrecvfrom", fd)) {
            // SAFETY: writable or null (caller).
            unsafe { give_address(lock(&socket).address(true), src, src_len) };
        }
        returned("rrecvfrom", got)
    })
}

/// # Safety
/// `buf` is writable for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rread(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { rrecv(fd, buf, count, 0) }
}

/// # Safety
/// `iov` holds `count` writable buffers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rreadv(fd: c_int, iov: *const libc::iovec, count: c_int) -> isize {
    guard("rreadv", || {
        // SAFETY: forwarded contract.
        returned("rreadv", unsafe { receive_vectored("rreadv", fd, iov, count, 0) })
    })
}

/// # Safety
/// `msg` is a readable msghdr whose buffers are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rrecvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    guard("rrecvmsg", || {
        if msg.is_null() {
            return fail("rrecvmsg", libc::EFAULT, "NULL msghdr") as isize;
        }
        // SAFETY: readable (caller).
        let (iov, count) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
        // SAFETY: as above.
        let got = unsafe { receive_vectored("rrecvmsg", fd, iov, count, flags) };
        if got.is_ok() {
            // SAFETY: writable (caller): no control data, no flags.
            unsafe {
                (*msg).msg_controllen = 0;
                (*msg).msg_flags = 0;
            }
        }
        returned("rrecvmsg", got)
    })
}

/// Fills `iov`'s buffers in turn, stopping at the first that is not
/// filled.
///
/// # Safety
/// `iov` holds `count` writable buffers.
unsafe fn receive_vectored(
    verb: &str,
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    flags: c_int,
) -> Result<usize, c_int> {
    // SAFETY: as the contract says.
    let buffers = unsafe { iovecs(iov, count) }?;
    let mut total = 0;
    for (i, v) in buffers.iter().enumerate() {
        // SAFETY: writable (caller).
        let buf = unsafe { program_bytes_mut(v.iov_base, v.iov_len) };
        // Only the first may wait: the rest take what is there.
        let flags = if i == 0 { flags } else { flags | libc::MSG_DONTWAIT };
        match receive(verb, fd, buf, flags) {
            Ok(n) => {
                total += n;
                if n < v.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

/// # Safety
/// `buf` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsend(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    guard("rsend", || {
        // SAFETY: readable (caller).
        let bytes = unsafe { program_bytes(buf, len) };
        returned("rsend", send("rsend", fd, bytes, flags))
    })
}

/// # Safety
/// As [`rsend`]. The address is ignored, as for a connected TCP socket.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    _dest: *const libc::sockaddr,
    _dest_len: libc::socklen_t,
) -> isize {
    // SAFETY: forwarded contract.
    unsafe { rsend(fd, buf, len, flags) }
}

/// # Safety
/// `buf` is readable for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwrite(fd: c_int, buf: *const c_void, count: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { rsend(fd, buf, count, 0) }
}

/// # Safety
/// `iov` holds `count` readable buffers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rwritev(fd: c_int, iov: *const libc::iovec, count: c_int) -> isize {
    guard("rwritev", || {
        // SAFETY: forwarded contract.
        returned("rwritev", unsafe { send_vectored("rwritev", fd, iov, count, 0) })
    })
}

/// # Safety
/// `msg` is a readable msghdr with readable buffers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    guard("rsendmsg", || {
        if msg.is_null() {
            return fail("rsendmsg", libc::EFAULT, "NULL msghdr") as isize;
        }
        // SAFETY: readable (caller).
        let (iov, count) = unsafe { ((*msg).msg_iov, (*msg).msg_iovlen as c_int) };
        // SAFETY: as above.
        returned("rsendmsg", unsafe { send_vectored("rsendmsg", fd, iov, count, flags) })
    })
}

/// Sends `iov`'s buffers in turn, stopping where one is not all sent.
///
/// # Safety
/// `iov` holds `count` readable buffers.
unsafe fn send_vectored(
    verb: &str,
    fd: c_int,
    iov: *const libc::iovec,
    count: c_int,
    flags: c_int,
) -> Result<usize, c_int> {
    // SAFETY: as the contract says.
    let buffers = unsafe { iovecs(iov, count) }?;
    let mut total = 0;
    for v in buffers {
        // SAFETY: readable (caller).
        let bytes = unsafe { program_bytes(v.iov_base, v.iov_len) };
        match send(verb, fd, bytes, flags) {
            Ok(n) => {
                total += n;
                if n < v.iov_len {
                    break;
                }
            }
            Err(e) if total == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(total)
}

/// # Safety
/// `iov` holds `count` iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, count: c_int) -> Result<&'a [libc::iovec], c_int> {
    match (iov.is_null(), usize::try_from(count)) {
        (_, Ok(0)) => Ok(&[]),
        (false, Ok(n)) if n <= libc::UIO_MAXIOV as usize => {
            // SAFETY: `count` iovecs (caller).
            Ok(unsafe { std::slice::from_raw_parts(iov, n) })
        }
        _ => Err(libc::EINVAL),
    }
}

/// # Safety
/// `buf` is null with `len` 0, or readable for `len` bytes.
unsafe fn program_bytes<'a>(buf: *const c_void, len: usize) -> &'a [u8] {
    match buf.is_null() || len == 0 {
        true => &[],
        // SAFETY: as the contract says.
        false => unsafe { std::slice::from_raw_parts(buf.cast(), len) },
    }
}

/// # Safety
/// `buf` is null with `len` 0, or writable for `len` bytes.
unsafe fn program_bytes_mut<'a>(buf: *mut c_void, len: usize) -> &'a mut [u8] {
    match buf.is_null() || len == 0 {
        true => &mut [],
        // SAFETY: as the contract says.
        false => unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) },
    }
}

/// # Safety
/// `addr` and `len` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetpeername(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    guard("rgetpeername", || {
        let socket = match lookup("rgetpeername", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let s = lock(&socket);
        if s.state != State::Connected {
            return fail("rgetpeername", libc::ENOTCONN, "not connected");
        }
        // SAFETY: forwarded contract.
        match unsafe { give_address(s.address(true), addr, len) } {
            0 => 0,
            e => fail("rgetpeername", e, "NULL length"),
        }
    })
}

/// # Safety
/// `addr` and `len` are null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockname(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    guard("rgetsockname", || {
        let socket = match lookup("rgetsockname", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        // SAFETY: forwarded contract.
        match unsafe { give_address(lock(&socket).address(false), addr, len) } {
            0 => 0,
            e => fail("rgetsockname", e, "NULL length"),
        }
    })
}

/// # Safety
/// `value` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    guard("rsetsockopt", || {
        let socket = match lookup("rsetsockopt", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        // SAFETY: readable (caller).
        let bytes = unsafe { program_bytes(value, len as usize) };
        match lock(&socket).options.set(level, name, bytes) {
            Ok(()) => 0,
            Err(e) => fail("rsetsockopt", e, format!("level {level:#x} option {name}")),
        }
    })
}

/// # Safety
/// `value` and `len` are writable (`*len` bytes at `value`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    guard("rgetsockopt", || {
        const VERB: &str = "rgetsockopt";
        let socket = match lookup(VERB, fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        if value.is_null() || len.is_null() {
            return fail(VERB, libc::EFAULT, "NULL value or length");
        }
        let mut s = lock(&socket);
        let answer = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_ERROR) => Ok(Value::Int(std::mem::take(&mut s.error))),
            (libc::SOL_SOCKET, libc::SO_TYPE) => Ok(Value::Int(libc::SOCK_STREAM)),
            (libc::SOL_SOCKET, libc::SO_ACCEPTCONN) => Ok(Value::Int((s.state == State::Listening).into())),
            _ => s.options.get(level, name),
        };
        let bytes: Vec<u8> = match answer {
            Ok(Value::Int(v)) => v.to_ne_bytes().to_vec(),
            Ok(Value::Linger(l)) => [l.l_onoff.to_ne_bytes(), l.l_linger.to_ne_bytes()].concat(),
            Err(e) => return fail(VERB, e, format!("level {level:#x} option {name}")),
        };
        // SAFETY: writable for `*len` bytes (caller).
        unsafe {
            let n = bytes.len().min(*len as usize);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), value.cast::<u8>(), n);
            *len = n as libc::socklen_t;
        }
        0
    })
}

/// `rfcntl(socket, cmd, ...)`: `F_GETFL` and `F_SETFL` (`O_NONBLOCK`).
/// The third argument is read as a `long`, where the x86-64 and AArch64
/// calling conventions put a variadic integer (Rust cannot define a C
/// variadic function; `librspreload` passes an integer for these two).
#[unsafe(no_mangle)]
pub extern "C" fn rfcntl(fd: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    guard("rfcntl", || {
        let socket = match lookup("rfcntl", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let mut s = lock(&socket);
        match cmd {
            libc::F_GETFL => libc::O_RDWR | if s.options.nonblocking { libc::O_NONBLOCK } else { 0 },
            libc::F_SETFL => {
                s.options.nonblocking = arg as c_int & libc::O_NONBLOCK != 0;
                0
            }
            _ => fail("rfcntl", libc::ENOSYS, format!("command {cmd}: rsockets take F_GETFL and F_SETFL")),
        }
    })
}

/// # Safety
/// `buf` is readable and writable for `len` bytes and stays so until
/// `riounmap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    guard("riomap", || {
        const VERB: &str = "riomap";
        let socket = match lookup(VERB, fd) {
            Ok(s) => s,
            Err(rc) => return rc.into(),
        };
        if prot != libc::PROT_WRITE || buf.is_null() || len == 0 || offset < -1 {
            return fail(VERB, libc::EINVAL, "maps a buffer the peer writes: PROT_WRITE, an offset or -1").into();
        }
        let wanted = (offset != -1).then_some(offset as u64);
        let mapped = until_done(&socket, Waits::Always, None, |s| s.map(buf as u64, len as u64, wanted));
        match mapped {
            Ok(offset) => offset as libc::off_t,
            Err(libc::ENOMEM) => fail(VERB, libc::ENOMEM, "as many buffers mapped as RDMA_IOMAPSIZE allows").into(),
            Err(e) => fail(VERB, e, "cannot map").into(),
        }
    })
}

/// # Safety
/// `buf` was mapped by [`riomap`] on this socket.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn riounmap(fd: c_int, buf: *mut c_void, _len: usize) -> c_int {
    guard("riounmap", || {
        let socket = match lookup("riounmap", fd) {
            Ok(s) => s,
            Err(rc) => return rc,
        };
        let unmapped = until_done(&socket, Waits::Always, None, |s| s.unmap(buf as u64));
        match unmapped {
            Ok(()) => 0,
            Err(e) => fail("riounmap", e, "not a mapped buffer of this socket"),
        }
    })
}

/// Writes `count` bytes into the peer's mapped buffer at `offset`: how
/// many were sent (as rdma-core's, a `size_t`; -1 as `SIZE_MAX` with
/// `errno` on failure).
///
/// # Safety
/// `buf` is readable for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn riowrite(
    fd: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    guard("riowrite", || {
        const VERB: &str = "riowrite";
        let socket = match lookup(VERB, fd) {
            Ok(s) => s,
            Err(rc) => return rc as isize as usize,
        };
        // SAFETY: readable (caller).
        let bytes = unsafe { program_bytes(buf, count) };
        let mut sent = 0;
        while sent < bytes.len() {
            let at = offset as u64 + sent as u64;
            let wrote = until_done(&socket, as_the_socket(flags), None, |s| s.write(&bytes[sent..], at));
            match wrote {
                Ok(n) => sent += n,
                Err(libc::EAGAIN) if sent > 0 => break,
                Err(e) => return returned(VERB, Err(e)) as usize,
            }
            if dontwait(flags) || lock(&socket).options.nonblocking {
                break;
            }
        }
        sent
    })
}

/// # Safety
/// `fds` holds `nfds` pollfds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    guard("rpoll", || {
        let fds = match (fds.is_null(), nfds) {
            (_, 0) => &mut [][..],
            // SAFETY: `nfds` pollfds (caller).
            (false, n) => unsafe { std::slice::from_raw_parts_mut(fds, n as usize) },
            (true, _) => return fail("rpoll", libc::EFAULT, "NULL pollfds"),
        };
        poll::poll(fds, timeout)
    })
}

/// # Safety
/// The sets are null or valid `fd_set`s; `timeout` null or readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rselect(
    nfds: c_int,
    read: *mut libc::fd_set,
    write: *mut libc::fd_set,
    except: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    guard("rselect", || {
        // SAFETY: forwarded contract.
        unsafe { poll::select(nfds, read, write, except, timeout) }
    })
}
