//! `libibverbs.so.1` for softrnic: the verbs C API, ABI-compatible with
//! rdma-core 44, so that unmodified RDMA programs (perftest,
//! `ibv_rc_pingpong`, anything linked to libibverbs) run over softrnic
//! with no RDMA hardware, kernel module or privilege:
//!
//! ```text
//! scripts/build-libibverbs.sh                      # target/softrnic/lib/libibverbs.so.1
//! SOFTRNIC_ADDR=127.0.0.2 LD_LIBRARY_PATH=target/softrnic/lib ibv_rc_pingpong -g 0
//! ```
//!
//! The crate builds a static library; the script links it into the shared
//! object with `libibverbs.map`, which gives every symbol the version node
//! the real library gives it (a Rust `cdylib` cannot carry version nodes).
//!
//! The map to the C API:
//! - [`abi`]: the structures of `<infiniband/verbs.h>` (the
//!   `softrnic-verbs-abi` crate, which checks them against the real header).
//! - [`device`] and [`context`]: `softrnic0`, its port and GID table, and
//!   an open device, which is a running softrnic NIC.
//! - [`memory`], [`cq`], [`qp`], [`qp_ex`], [`srq`], [`ah`]: the objects,
//!   each a `#[repr(C)]` struct whose first field is the program's view.
//! - [`strings`], [`sysfs`], [`unsupported`]: the rest of the exports.
//!
//! Every exported function is an FFI edge: its safety contract is the one
//! its verbs man page states (live objects from this library, buffers of
//! the sizes given), so the functions do not repeat it one by one.

#![allow(clippy::missing_safety_doc)]

pub use softrnic_verbs_abi as abi;
mod acks;
pub mod ah;
mod c_view;
pub mod context;
pub mod cq;
pub mod cq_ex;
pub mod device;
pub mod ece;
pub mod engines;
mod ffi;
pub mod memory;
pub mod multicast;
pub mod qp;
pub mod qp_ex;
pub mod srq;
pub mod strings;
pub mod sysfs;
pub mod unsupported;
pub mod window;
