//! The one device softrnic offers: `softrnic0`, bound to the address in
//! `SOFTRNIC_ADDR` (or the host's), with one Ethernet port whose GID table
//! holds that address as a RoCEv2 GID.

use std::ffi::{c_char, c_int, c_void};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use softrnic_engine::interface;
use softrnic_transport::Mtu;

use crate::abi::{self, ibv_device, ibv_gid};
use crate::ffi::{copy_c_string, refuse, refuse_null, set_errno};

pub const DEVICE_NAME: &str = "softrnic0";
/// Where sysfs would keep the device; `ibv_read_sysfs_file` serves the
/// few attributes tools read from here (see [`crate::sysfs`]).
pub const IBDEV_PATH: &str = "/sys/class/infiniband/softrnic0";

/// The device and what its port looks like, fixed at first use.
pub struct SoftDevice {
    /// What `ibv_get_device_list` hands out; must stay first and pinned.
    pub ibv: ibv_device,
    pub addr: IpAddr,
    /// The network interface the address lives on, if any.
    pub interface: Option<(String, u32)>,
    /// The largest IB MTU whose packets fit the interface's MTU.
    pub active_mtu: Mtu,
    /// `node_guid`, as the bytes go on the wire.
    pub guid: [u8; 8],
}

// SAFETY: after construction the device is read-only; its raw pointers
// (inside `ibv_device`) are null.
unsafe impl Sync for SoftDevice {}
// SAFETY: as above.
unsafe impl Send for SoftDevice {}

impl SoftDevice {
    pub(crate) fn new(addr: IpAddr) -> SoftDevice {
        let interface = interface::interface_of(addr);
        let active_mtu = interface::active_mtu(addr);
        let mut ibv = ibv_device {
            _ops: abi::ibv_device_ops { _dummy1: std::ptr::null_mut(), _dummy2: std::ptr::null_mut() },
            node_type: abi::IBV_NODE_CA,
            transport_type: abi::IBV_TRANSPORT_IB,
            name: [0; abi::IBV_SYSFS_NAME_MAX],
            dev_name: [0; abi::IBV_SYSFS_NAME_MAX],
            dev_path: [0; abi::IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; abi::IBV_SYSFS_PATH_MAX],
        };
        copy_c_string(&mut ibv.name, DEVICE_NAME);
        copy_c_string(&mut ibv.dev_name, "uverbs-softrnic0");
        copy_c_string(&mut ibv.dev_path, "/sys/class/infiniband_verbs/uverbs-softrnic0");
        copy_c_string(&mut ibv.ibdev_path, IBDEV_PATH);
        let tail = match addr {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(a) => a.octets()[12..].try_into().expect("four bytes"),
        };
        let guid = [0x02, b's', b'r', 0x00, tail[0], tail[1], tail[2], tail[3]];
        SoftDevice { ibv, addr, interface, active_mtu, guid }
    }

    /// The port's only GID: the address as RoCEv2 writes it (IPv4 mapped
    /// into IPv6).
    pub fn gid(&self) -> ibv_gid {
        ibv_gid { raw: gid_of(self.addr) }
    }

    /// `node_guid` as a `__be64`.
    pub fn guid_be(&self) -> u64 {
        u64::from_ne_bytes(self.guid)
    }
}

/// The RoCEv2 GID of an address.
pub fn gid_of(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The address a RoCEv2 GID names.
pub fn addr_of_gid(raw: [u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The device, or why there is none (a bad `SOFTRNIC_ADDR`).
pub fn device() -> Result<&'static SoftDevice, &'static str> {
    static DEVICE: OnceLock<Result<SoftDevice, String>> = OnceLock::new();
    DEVICE.get_or_init(|| device_addr().map(SoftDevice::new)).as_ref().map_err(|e| e.as_str())
}

/// `SOFTRNIC_ADDR`, else the host's first non-loopback IPv4 address, else
/// 127.0.0.1.
fn device_addr() -> Result<IpAddr, String> {
    if let Some(value) = std::env::var_os("SOFTRNIC_ADDR") {
        let value = value.to_string_lossy();
        return value.trim().parse().map_err(|_| {
            format!(
                "SOFTRNIC_ADDR={value:?} is not an IP address: set it to the address this program's device \
                 uses, for example SOFTRNIC_ADDR=127.0.0.2"
            )
        });
    }
    let interfaces = if_addrs::get_if_addrs().unwrap_or_default();
    let host = interfaces.iter().find(|i| !i.is_loopback() && i.ip().is_ipv4()).map(|i| i.ip());
    Ok(host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// Reports a bad `SOFTRNIC_ADDR` once, on stderr: programs only say they
/// found no device, which would not tell the user why.
fn report_config_error(why: &str) {
    static REPORTED: OnceLock<()> = OnceLock::new();
    REPORTED.get_or_init(|| eprintln!("softrnic: {why}"));
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    crate::ffi::guard("ibv_get_device_list", || {
        let device = match device() {
            Ok(d) => d,
            Err(why) => {
                report_config_error(why);
                return refuse_null("ibv_get_device_list", libc::EINVAL, why);
            }
        };
        // The list is the C array of `ibv_free_device_list`: malloc'ed, NULL
        // terminated.
        // SAFETY: calloc has no preconditions; the result is checked.
        let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) } as *mut *mut ibv_device;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list;
        }
        // SAFETY: `list` has room for two pointers; the second stays NULL. The
        // device is a static that is never written after construction.
        unsafe { *list = &device.ibv as *const ibv_device as *mut ibv_device };
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid pointer or NULL.
            unsafe { *num_devices = 1 };
        }
        list
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    crate::ffi::guard("ibv_free_device_list", || {
        // SAFETY: `list` came from `ibv_get_device_list`'s calloc (or is NULL).
        unsafe { libc::free(list as *mut c_void) };
    })
}

/// The `SoftDevice` an `ibv_device` pointer belongs to.
fn soft_device(device: *mut ibv_device) -> Option<&'static SoftDevice> {
    let d = self::device().ok()?;
    std::ptr::eq(device, &d.ibv).then_some(d)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    crate::ffi::guard("ibv_get_device_name", || match soft_device(device) {
        Some(d) => d.ibv.name.as_ptr(),
        None => refuse_null::<c_char>("ibv_get_device_name", libc::EINVAL, "not a softrnic device"),
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    crate::ffi::guard("ibv_get_device_guid", || match soft_device(device) {
        Some(d) => d.guid_be(),
        None => {
            set_errno(refuse("ibv_get_device_guid", libc::EINVAL, "not a softrnic device"));
            0
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    crate::ffi::guard("ibv_get_device_index", || match soft_device(device) {
        Some(_) => 0,
        None => -1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gids_round_trip_both_families() {
        for addr in ["10.1.2.3", "127.0.1.2", "fd00::1", "::1"] {
            let addr: IpAddr = addr.parse().unwrap();
            assert_eq!(addr_of_gid(gid_of(addr)), addr);
        }
        assert_eq!(&gid_of("10.1.2.3".parse().unwrap())[10..], &[0xff, 0xff, 10, 1, 2, 3]);
    }

    #[test]
    fn a_loopback_device_is_on_lo_with_4096_byte_packets() {
        let device = SoftDevice::new("127.0.9.9".parse().unwrap());
        assert_eq!(device.interface.expect("lo holds 127/8").0, "lo");
        assert_eq!(device.active_mtu, Mtu::Mtu4096);
    }
}
