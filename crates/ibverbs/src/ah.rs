//! Address handles for UD sends (`ibv_create_ah`, `ibv_create_ah_from_wc`).

use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi::*;
use crate::c_view::CView;
use crate::device::gid_of;
use crate::ffi::{refuse, refuse_null};
use crate::qp::destination_of;

#[repr(C)]
pub struct Ah {
    pub ibv: CView<ibv_ah>,
    /// The peer's address: its GID.
    pub dest: IpAddr,
}

impl Ah {
    /// # Safety
    /// `ah` must come from [`ibv_create_ah`] and not be destroyed.
    pub unsafe fn from_ibv<'a>(ah: *mut ibv_ah) -> &'a Ah {
        // SAFETY: `ibv` is the first field of a boxed `Ah` (caller).
        unsafe { &*(ah as *const Ah) }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    crate::ffi::guard("ibv_create_ah", || {
        if pd.is_null() || attr.is_null() {
            return refuse_null("ibv_create_ah", libc::EINVAL, "NULL PD or attributes");
        }
        // SAFETY: readable attributes and a live PD (caller).
        let (dest, context) = match destination_of("ibv_create_ah", unsafe { &*attr }) {
            Ok(d) => (d, unsafe { (*pd).context }),
            Err(e) => return refuse_null("ibv_create_ah", e, "bad address vector"),
        };
        Box::into_raw(Box::new(Ah { ibv: CView::new(ibv_ah { context, pd, handle: 0 }), dest })) as *mut ibv_ah
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    crate::ffi::guard("ibv_destroy_ah", || {
        if ah.is_null() {
            return refuse("ibv_destroy_ah", libc::EINVAL, "NULL address handle");
        }
        // SAFETY: boxed in `ibv_create_ah`, freed once here (caller).
        drop(unsafe { Box::from_raw(ah as *mut Ah) });
        0
    })
}

/// The sender's address in the GRH area of a UD receive: an IPv4 header in
/// its last 20 bytes (RoCEv2 over IPv4), or an IPv6 header.
fn source_of_grh(grh: &[u8; 40]) -> IpAddr {
    if grh[0] >> 4 == 6 {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(&grh[8..24]).expect("16 bytes")))
    } else {
        IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(&grh[32..36]).expect("4 bytes")))
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    _context: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    attr: *mut ibv_ah_attr,
) -> c_int {
    crate::ffi::guard("ibv_init_ah_from_wc", || {
        if wc.is_null() || attr.is_null() {
            return refuse("ibv_init_ah_from_wc", libc::EINVAL, "NULL completion or attributes");
        }
        // SAFETY: a readable completion (caller).
        let wc = unsafe { &*wc };
        if wc.wc_flags & IBV_WC_GRH == 0 || grh.is_null() {
            return refuse("ibv_init_ah_from_wc", libc::EINVAL, "RoCE completions carry a GRH; none was given");
        }
        // SAFETY: `grh` points at the 40 bytes before the payload (caller).
        let source = source_of_grh(unsafe { &*(grh as *const [u8; 40]) });
        // SAFETY: all-zero is a valid `ibv_ah_attr`; `attr` is writable.
        unsafe {
            let mut a: ibv_ah_attr = std::mem::zeroed();
            a.grh.dgid = ibv_gid { raw: gid_of(source) };
            a.grh.hop_limit = 0xff;
            a.is_global = 1;
            a.port_num = port;
            *attr = a;
        }
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    crate::ffi::guard("ibv_create_ah_from_wc", || {
        if pd.is_null() {
            return refuse_null("ibv_create_ah_from_wc", libc::EINVAL, "NULL PD");
        }
        // SAFETY: all-zero is a valid `ibv_ah_attr`.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: forwarded contract; a live PD.
        unsafe {
            let rc = ibv_init_ah_from_wc((*pd).context, port, wc, grh, &mut attr);
            if rc != 0 {
                return refuse_null("ibv_create_ah_from_wc", rc, "no usable GRH");
            }
            ibv_create_ah(pd, &mut attr)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_comes_from_the_ipv4_header_in_the_grh_tail() {
        let mut grh = [0u8; 40];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[10, 0, 0, 7]);
        assert_eq!(source_of_grh(&grh), "10.0.0.7".parse::<IpAddr>().unwrap());
        let mut grh6 = [0u8; 40];
        grh6[0] = 0x60;
        grh6[8..24].copy_from_slice(&"fd00::7".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(source_of_grh(&grh6), "fd00::7".parse::<IpAddr>().unwrap());
    }
}
