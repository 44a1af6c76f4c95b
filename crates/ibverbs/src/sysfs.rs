//! The sysfs reads of libibverbs (`ibv_read_sysfs_file`), which tools use
//! for a device's attributes and counters. softrnic0 has no sysfs
//! directory, so its files are served from here: attributes from the
//! device, counters from those the running engine publishes (the same
//! numbers `softrnic devinfo` shows). Other paths read the real file.

use std::ffi::{CStr, c_char, c_int};

use crate::device::{IBDEV_PATH, device};
use crate::ffi::set_errno;

/// InfiniBand's port counter names, mapped onto softrnic's.
const PORT_COUNTERS: [(&str, &str); 4] = [
    ("port_xmit_packets", "tx_packets"),
    ("port_rcv_packets", "rx_packets"),
    ("port_xmit_data", "tx_bytes"),
    ("port_rcv_data", "rx_bytes"),
];

/// The contents of `file` under softrnic0's directory.
fn virtual_file(file: &str) -> Option<String> {
    let d = device().ok()?;
    let guid = d.guid.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect::<Vec<_>>().join(":");
    match file {
        "node_type" => Some("1: CA".into()),
        "fw_ver" => Some(env!("CARGO_PKG_VERSION").into()),
        "hw_rev" => Some("1".into()),
        "board_id" => Some("softrnic".into()),
        "node_guid" | "sys_image_guid" => Some(guid),
        "node_desc" => Some(format!("softrnic0 on {}", d.addr)),
        _ => {
            let counter = file.strip_prefix("ports/1/hw_counters/").or_else(|| {
                let name = file.strip_prefix("ports/1/counters/")?;
                PORT_COUNTERS.iter().find(|(ib, _)| *ib == name).map(|(_, ours)| *ours)
            })?;
            let published = std::fs::read_to_string(softrnic_engine::counters_file::path(d.addr)).unwrap_or_default();
            let value: u64 = published
                .lines()
                .find_map(|l| l.strip_prefix(counter)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0);
            // port_*_data counts 4-byte words.
            let value = if file.ends_with("_data") { value / 4 } else { value };
            Some(value.to_string())
        }
    }
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
}
