//! `rdma_getaddrinfo`: names and ports to the addresses an endpoint
//! binds or connects to, as `getaddrinfo(3)` does for sockets. softrnic
//! routes over IP, so there is no path record to look up.

use std::ffi::{CStr, c_char, c_int};
use std::net::{SocketAddr, ToSocketAddrs};

use softrnic_verbs_abi::IBV_QPT_RC;
use softrnic_verbs_abi::ffi::{guard, refuse, set_errno};

use crate::abi::*;
use crate::id::{read_sockaddr, write_sockaddr};

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
        // SAFETY: readable or null (caller).
        let hints = unsafe { hints.as_ref() };
        // SAFETY: sockaddrs of the hints' own lengths (caller).
        let (hint_src, hint_dst) =
            hints.map_or((None, None), |h| unsafe { (read_sockaddr(h.ai_src_addr), read_sockaddr(h.ai_dst_addr)) });
        if res.is_null() || (node.is_null() && service.is_null() && hint_src.is_none() && hint_dst.is_none()) {
            set_errno(refuse(VERB, libc::EINVAL, "needs a node, a service or addresses in the hints"));
            return -1;
        }
        // SAFETY: C strings or null (caller).
        let text =
            |p: *const c_char| (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned());
        let (node, service) = (text(node), text(service));
        let flags = hints.map_or(0, |h| h.ai_flags);
        // What node and service name, else the hints' own addresses (as
        // libfabric passes them).
        let (src, dst) = if node.is_none() && service.is_none() {
            (hint_src, hint_dst)
        } else {
            let addr = match resolve(node.as_deref(), service.as_deref()) {
                Ok(a) => a,
                Err(why) => {
                    set_errno(refuse(VERB, libc::EADDRNOTAVAIL, why));
                    return -1;
                }
            };
            match flags & RAI_PASSIVE != 0 {
                true => (Some(addr), None),
                false => (hint_src, Some(addr)),
            }
        };
        // SAFETY: all-zero is valid for the C structure.
        let mut ai: Box<rdma_addrinfo> = Box::new(unsafe { std::mem::zeroed() });
        ai.ai_flags = flags;
        ai.ai_family = match dst.or(src) {
            Some(a) if a.is_ipv6() => libc::AF_INET6,
            _ => libc::AF_INET,
        };
        ai.ai_qp_type = hints.map_or(IBV_QPT_RC, |h| if h.ai_qp_type != 0 { h.ai_qp_type } else { IBV_QPT_RC });
        ai.ai_port_space =
            hints.map_or(RDMA_PS_TCP, |h| if h.ai_port_space != 0 { h.ai_port_space } else { RDMA_PS_TCP });
        if let Some(src) = src {
            (ai.ai_src_addr, ai.ai_src_len) = boxed_sockaddr(src);
        }
        if let Some(dst) = dst {
            (ai.ai_dst_addr, ai.ai_dst_len) = boxed_sockaddr(dst);
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
