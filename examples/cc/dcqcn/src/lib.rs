//! DCQCN as a user module. The algorithm is softrnic's own
//! (`softrnic_cc::Dcqcn`), so the sandbox can be checked against the
//! native code event for event; a user's algorithm is exported the same
//! way.

#![no_std]

softrnic_cc::export_algorithm!(softrnic_cc::Dcqcn);
