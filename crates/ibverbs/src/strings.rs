//! The verbs that name things (`ibv_wc_status_str`, `ibv_event_type_str`,
//! ...), convert link rates, and configure fork support.

use std::ffi::{CStr, c_char, c_int, c_void};

use crate::abi::IBV_FORK_UNNEEDED;

fn lookup(table: &[&'static CStr], index: c_int) -> *const c_char {
    usize::try_from(index).ok().and_then(|i| table.get(i)).copied().unwrap_or(c"unknown").as_ptr()
}

/// `enum ibv_wc_status`, in order.
const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

#[unsafe(no_mangle)]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    crate::ffi::guard("ibv_wc_status_str", || lookup(&WC_STATUS, status))
}

/// `enum ibv_event_type`, in order.
const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

#[unsafe(no_mangle)]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    crate::ffi::guard("ibv_event_type_str", || lookup(&EVENT_TYPE, event))
}

/// `enum ibv_node_type`, from IBV_NODE_UNKNOWN (-1).
const NODE_TYPE: [&CStr; 9] = [
    c"unknown",
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

#[unsafe(no_mangle)]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    crate::ffi::guard("ibv_node_type_str", || lookup(&NODE_TYPE, node_type.saturating_add(1)))
}

const PORT_STATE: [&CStr; 6] =
    [c"PORT_NOP", c"PORT_DOWN", c"PORT_INIT", c"PORT_ARMED", c"PORT_ACTIVE", c"PORT_ACTIVE_DEFER"];

#[unsafe(no_mangle)]
pub extern "C" fn ibv_port_state_str(state: c_int) -> *const c_char {
    crate::ffi::guard("ibv_port_state_str", || lookup(&PORT_STATE, state))
}

/// `enum ibv_rate` values, their multiples of 2.5 Gb/s (where the IB
/// rates have one) and their Mb/s.
const RATES: [(c_int, c_int, c_int); 21] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 425000),
    (22, -1, 637500),
];

#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    crate::ffi::guard("ibv_rate_to_mult", || RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1))
}

#[unsafe(no_mangle)]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    crate::ffi::guard("mult_to_ibv_rate", || RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(0, |r| r.0))
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    crate::ffi::guard("ibv_rate_to_mbps", || RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2))
}

#[unsafe(no_mangle)]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    crate::ffi::guard("mbps_to_ibv_rate", || RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0))
}

/// Fork safety: softrnic's "DMA" is the process's own memory access, so a
/// child's copy-on-write pages never confuse it.
#[unsafe(no_mangle)]
pub extern "C" fn ibv_fork_init() -> c_int {
    crate::ffi::guard("ibv_fork_init", || 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    crate::ffi::guard("ibv_is_fork_initialized", || IBV_FORK_UNNEEDED)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    crate::ffi::guard("ibv_dontfork_range", || 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    crate::ffi::guard("ibv_dofork_range", || 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: *const c_char) -> &'static str {
        // SAFETY: every pointer these functions return is a static C string.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn names_match_the_enums() {
        assert_eq!(text(ibv_wc_status_str(12)), "transport retry counter exceeded");
        assert_eq!(text(ibv_wc_status_str(5)), "Work Request Flushed Error");
        assert_eq!(text(ibv_wc_status_str(99)), "unknown");
        assert_eq!(text(ibv_wc_status_str(-1)), "unknown");
        assert_eq!(text(ibv_event_type_str(15)), "SRQ limit reached");
        assert_eq!(text(ibv_node_type_str(1)), "InfiniBand channel adapter");
        assert_eq!(text(ibv_node_type_str(-1)), "unknown");
        assert_eq!(text(ibv_port_state_str(4)), "PORT_ACTIVE");
        // The transport's own names agree with the C ones.
        for s in [softrnic_transport::WcStatus::RetryExcErr, softrnic_transport::WcStatus::RemAccessErr] {
            assert_eq!(text(ibv_wc_status_str(s as c_int)), s.as_str());
        }
    }

    #[test]
    fn rates_convert_both_ways() {
        assert_eq!(ibv_rate_to_mult(3), 4);
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(ibv_rate_to_mbps(16), 103125);
        assert_eq!(mbps_to_ibv_rate(103125), 16);
        assert_eq!(ibv_rate_to_mult(16), -1);
        assert_eq!(mult_to_ibv_rate(-1), 0);
        assert_eq!(ibv_rate_to_mbps(0), -1);
    }
}
