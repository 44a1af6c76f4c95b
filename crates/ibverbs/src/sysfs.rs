//! The sysfs reads of libibverbs (`ibv_read_sysfs_file`), which tools use
//! for a device's attributes and counters. softrnic0 has no sysfs
//! directory, so its files are served from here: attributes from the
//! device, counters from those the running engine publishes (the same
//! numbers `softrnic devinfo` shows). Other paths read the real file.

use std::ffi::{CStr, c_char, c_int};
use std::net::IpAddr;

use softrnic_wire::DEFAULT_PKEY;

use crate::device::{DEVICE_NAME, IBDEV_PATH, SoftDevice, device};
use crate::ffi::set_errno;

/// The network interface that holds the device's address: what the
/// kernel names the RoCE port's netdev (`parent`, the GID's `ndevs`,
/// `device/net/`).
fn netdev(d: &SoftDevice) -> Option<&str> {
    d.interface.as_ref().map(|(name, _)| name.as_str())
}

/// InfiniBand's port counter names, mapped onto softrnic's.
const PORT_COUNTERS: [(&str, &str); 4] = [
    ("port_xmit_packets", "tx_packets"),
    ("port_rcv_packets", "rx_packets"),
    ("port_xmit_data", "tx_bytes"),
    ("port_rcv_data", "rx_bytes"),
];

/// The contents of `file` under softrnic0's directory.
fn virtual_file(file: &str) -> Option<String> {
    device_file(device().ok()?, file)
}

/// The files of the device's directory, as the kernel lays them out for a
/// RoCE port: what `ibstat`, `ibstatus` (libibumad) and UCX read.
const DEVICE_FILES: &[&str] = &[
    "node_type",
    "fw_ver",
    "hw_rev",
    "board_id",
    "hca_type",
    "node_guid",
    "sys_image_guid",
    "node_desc",
    "parent",
    "ports/1/state",
    "ports/1/phys_state",
    "ports/1/rate",
    "ports/1/lid",
    "ports/1/sm_lid",
    "ports/1/sm_sl",
    "ports/1/lid_mask_count",
    "ports/1/cap_mask",
    "ports/1/link_layer",
    "ports/1/gids/0",
    "ports/1/gid_attrs/types/0",
    "ports/1/gid_attrs/ndevs/0",
    "ports/1/pkeys/0",
];

/// `file` of device `d`'s directory.
fn device_file(d: &SoftDevice, file: &str) -> Option<String> {
    let hex_words =
        |bytes: &[u8]| bytes.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":");
    let port = crate::context::port_attr(d);
    match file {
        "node_type" => Some("1: CA".into()),
        "fw_ver" => Some(env!("CARGO_PKG_VERSION").into()),
        "hw_rev" => Some("1".into()),
        "board_id" | "hca_type" => Some("softrnic".into()),
        "node_guid" | "sys_image_guid" => Some(hex_words(&d.guid)),
        "node_desc" => Some(format!("softrnic0 on {}", d.addr)),
        // rxe's name for the interface it rides on.
        "parent" => netdev(d).map(str::to_string),
        "ports/1/state" => Some("4: ACTIVE".into()),
        "ports/1/phys_state" => Some("5: LinkUp".into()),
        // The width and speed `ibv_query_port` reports: 4X at 25 Gb/s.
        "ports/1/rate" => Some("100 Gb/sec (4X EDR)".into()),
        "ports/1/lid" | "ports/1/sm_lid" => Some("0x0".into()),
        "ports/1/sm_sl" | "ports/1/lid_mask_count" => Some("0".into()),
        "ports/1/cap_mask" => Some(format!("{:#010x}", port.port_cap_flags)),
        "ports/1/link_layer" => Some("Ethernet".into()),
        "ports/1/gids/0" => Some(hex_words(&crate::device::gid_of(d.addr))),
        "ports/1/gid_attrs/types/0" => Some("RoCE v2".into()),
        "ports/1/gid_attrs/ndevs/0" => netdev(d).map(str::to_string),
        "ports/1/pkeys/0" => Some(format!("{:#06x}", DEFAULT_PKEY)),
        _ => {
            let published = std::fs::read_to_string(softrnic_engine::counters_file::path(d.addr)).unwrap_or_default();
            counter_file(&published, file)
        }
    }
}

/// A counter file (`ports/1/counters/...` or `ports/1/hw_counters/...`)
/// from the counters the engine `published`: zero before it publishes.
fn counter_file(published: &str, file: &str) -> Option<String> {
    let counter = file.strip_prefix("ports/1/hw_counters/").or_else(|| {
        let name = file.strip_prefix("ports/1/counters/")?;
        PORT_COUNTERS.iter().find(|(ib, _)| *ib == name).map(|(_, ours)| *ours)
    })?;
    let value: u64 =
        published.lines().find_map(|l| l.strip_prefix(counter)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0);
    // port_*_data counts 4-byte words.
    let value = if file.ends_with("_data") { value / 4 } else { value };
    Some(value.to_string())
}

/// The counter files of the device on `addr`, as `(path, contents)`
/// relative to `/sys/class`, from what its engine last published: the
/// port's InfiniBand counters and every softrnic counter under
/// `hw_counters`, as a RoCE driver lays them out.
pub fn counters_tree(addr: IpAddr) -> Vec<(String, String)> {
    let published = std::fs::read_to_string(softrnic_engine::counters_file::path(addr)).unwrap_or_default();
    let every = softrnic_engine::counters_file::render(&Default::default());
    let names = every.lines().filter_map(|l| l.split_whitespace().next());
    let files = PORT_COUNTERS
        .iter()
        .map(|(ib, _)| format!("ports/1/counters/{ib}"))
        .chain(names.map(|name| format!("ports/1/hw_counters/{name}")));
    files
        .filter_map(|file| Some((format!("infiniband/{DEVICE_NAME}/{file}"), counter_file(&published, &file)?)))
        .collect()
}

/// The `/sys/class` entries of the device on `addr`, as `(path, contents)`
/// relative to `/sys/class`: the device's directory, its uverbs node's
/// and the ABI versions libibverbs and libibumad check, and the counters
/// as they stand ([`counters_tree`], which `softrnic run` keeps current).
/// `softrnic run` shows them to programs that read sysfs themselves
/// (`ibv_read_sysfs_file` serves the same files).
pub fn class_tree(addr: IpAddr) -> Vec<(String, String)> {
    let d = SoftDevice::new(addr);
    let mut tree: Vec<(String, String)> = DEVICE_FILES
        .iter()
        .filter_map(|f| Some((format!("infiniband/{DEVICE_NAME}/{f}"), device_file(&d, f)?)))
        .collect();
    tree.extend(counters_tree(addr));
    let uverbs = "infiniband_verbs/uverbs-softrnic0";
    tree.push((format!("{uverbs}/ibdev"), DEVICE_NAME.into()));
    tree.push((format!("{uverbs}/abi_version"), "6".into()));
    tree.push(("infiniband_verbs/abi_version".into(), "6".into()));
    tree.push(("infiniband_mad/abi_version".into(), "5".into()));
    tree
}

/// The links of the device on `addr` into the rest of `/sys/class`, as
/// `(path relative to /sys/class, target)`: `device/net/IFACE`, where
/// tools that map an RDMA device to its network interface look (a PCI
/// NIC's `device` holds its netdevs), to the interface's own directory.
pub fn class_links(addr: IpAddr) -> Vec<(String, String)> {
    let d = SoftDevice::new(addr);
    let Some(name) = netdev(&d) else { return Vec::new() };
    vec![(format!("infiniband/{DEVICE_NAME}/device/net/{name}"), format!("/sys/class/net/{name}"))]
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    crate::ffi::guard("ibv_get_sysfs_path", || c"/sys".as_ptr())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    crate::ffi::guard("ibv_read_sysfs_file", || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NUL-terminated strings (caller).
        let (dir, file) = unsafe { (CStr::from_ptr(dir).to_string_lossy(), CStr::from_ptr(file).to_string_lossy()) };
        let contents = if dir.trim_end_matches('/') == IBDEV_PATH {
            virtual_file(&file)
        } else {
            std::fs::read_to_string(format!("{dir}/{file}")).ok()
        };
        let Some(contents) = contents else {
            set_errno(libc::ENOENT);
            return -1;
        };
        let text = contents.trim_end_matches('\n').as_bytes();
        let n = text.len().min(size - 1);
        // SAFETY: `buf` has `size` writable bytes (caller) and `n < size`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
        n as c_int
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_attributes_and_unknown_files() {
        assert_eq!(virtual_file("board_id").as_deref(), Some("softrnic"));
        assert_eq!(virtual_file("node_guid").unwrap().len(), 19);
        assert!(virtual_file("ports/1/hw_counters/tx_packets").unwrap().parse::<u64>().is_ok());
        assert!(virtual_file("ports/1/counters/port_xmit_data").is_some());
        assert!(virtual_file("no_such_file").is_none());
    }

    #[test]
    fn the_port_names_the_interface_that_holds_its_address() {
        let lo = "127.0.0.9".parse().unwrap();
        let d = SoftDevice::new(lo);
        assert_eq!(device_file(&d, "parent").as_deref(), Some("lo"));
        assert_eq!(device_file(&d, "ports/1/gid_attrs/ndevs/0").as_deref(), Some("lo"));
        let links = class_links(lo);
        assert_eq!(links, [("infiniband/softrnic0/device/net/lo".to_string(), "/sys/class/net/lo".to_string())]);
        // A device on no interface has no netdev to name.
        let nowhere = SoftDevice { interface: None, ..d };
        assert!(device_file(&nowhere, "parent").is_none());
    }
}
