//! `rdma_getaddrinfo`: names and ports to the addresses an endpoint
//! binds or connects to, as `getaddrinfo(3)` does for sockets. softrnic
//! routes over IP, so there is no path record to look up.

use std::ffi::{CStr, c_char, c_int};
use std::net::{SocketAddr, ToSocketAddrs};

use softrnic_verbs_abi::IBV_QPT_RC;
use softrnic_verbs_abi::ffi::{guard, refuse, set_errno};

use crate::abi::*;
use crate::id::write_sockaddr;

/// Resolves `node` (a name or a numeric address; absent for a passive
/// endpoint, which then binds every address) and `service` (a port).
fn resolve(node: Option<&str>, service: Option<&str>) -> Result<SocketAddr, String> {
    let port: u16 = match service {
        None => 0,
        Some(s) => s.parse().map_err(|_| format!("service `{s}` is not a port number"))?,
    };
    match node {
        None => Ok(SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port)),
        Some(n) => {
            let all: Vec<SocketAddr> =
                (n, port).to_socket_addrs().map_err(|e| format!("cannot resolve `{n}`: {e}"))?.collect();
            // IPv4 first: softrnic's device has an IPv4 address unless told
            // otherwise.
            all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().ok_or_else(|| format!("`{n}` has no address"))
        }
    }
}

fn boxed_sockaddr(addr: SocketAddr) -> (*mut libc::sockaddr, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    write_sockaddr(&mut storage, addr);
    let len = match addr {
        SocketAddr::V4(_) => size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => size_of::<libc::sockaddr_in6>(),
    };
    (Box::into_raw(storage).cast(), len as libc::socklen_t)
}

/// # Safety
/// As `rdma_getaddrinfo(3)`: `node` and `service` are null or C strings,
/// `hints` is null or readable, `res` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", || {
        const VERB: &str = "rdma_getaddrinfo";
        if res.is_null() || (node.is_null() && service.is_null()) {
            set_errno(refuse(VERB, libc::EINVAL, "needs a node or a service, and somewhere to put the result"));
            return -1;
        }
        // SAFETY: C strings or null (caller).
        let text =
            |p: *const c_char| (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        let (node, service) = (text(node), text(service));
        // SAFETY: readable or null (caller).
        let hints = unsafe { hints.as_ref() };
        let flags = hints.map_or(0, |h| h.ai_flags);
        let addr = match resolve(node.as_deref(), service.as_deref()) {
            Ok(a) => a,
            Err(why) => {
                set_errno(refuse(VERB, libc::EADDRNOTAVAIL, why));
                return -1;
            }
        };
        // SAFETY: all-zero is valid for the C structure.
        let mut ai: Box<rdma_addrinfo> = Box::new(unsafe { std::mem::zeroed() });
        ai.ai_flags = flags;
        ai.ai_family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
        ai.ai_qp_type = hints.map_or(IBV_QPT_RC, |h| if h.ai_qp_type != 0 { h.ai_qp_type } else { IBV_QPT_RC });
        ai.ai_port_space =
            hints.map_or(RDMA_PS_TCP, |h| if h.ai_port_space != 0 { h.ai_port_space } else { RDMA_PS_TCP });
        let (sockaddr, len) = boxed_sockaddr(addr);
        if flags & RAI_PASSIVE != 0 {
            (ai.ai_src_addr, ai.ai_src_len) = (sockaddr, len);
        } else {
            (ai.ai_dst_addr, ai.ai_dst_len) = (sockaddr, len);
            // A source the hints name.
            // SAFETY: a sockaddr of the hints' own length (caller).
            if let Some(src) = hints.and_then(|h| unsafe { crate::id::read_sockaddr(h.ai_src_addr) }) {
                (ai.ai_src_addr, ai.ai_src_len) = boxed_sockaddr(src);
            }
        }
        // SAFETY: writable (caller).
        unsafe { *res = Box::into_raw(ai) };
        0
    })
}

/// # Safety
/// `res` came from [`rdma_getaddrinfo`] (or is null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard("rdma_freeaddrinfo", || {
        let mut next = res;
        while !next.is_null() {
            // SAFETY: made by rdma_getaddrinfo, freed once.
            let ai = unsafe { Box::from_raw(next) };
            for addr in [ai.ai_src_addr, ai.ai_dst_addr] {
                if !addr.is_null() {
                    // SAFETY: boxed by `boxed_sockaddr`.
                    drop(unsafe { Box::from_raw(addr.cast::<libc::sockaddr_storage>()) });
                }
            }
            next = ai.ai_next;
        }
    })
}
