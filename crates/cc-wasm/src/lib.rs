//! User congestion-control algorithms, loaded at run time as WebAssembly
//! and run in a sandbox (`--cc ./algo.wasm`, `SOFTRNIC_CC=./algo.wasm`).
//!
//! A module is compiled once, when it is chosen ([`WasmAlgorithm::load`]),
//! and instantiated once per QP: each QP's state is its own instance's
//! memory, which no other QP's code can reach. The sandbox gives a module
//! nothing to call (a module that imports anything is refused), at most
//! [`MEMORY_LIMIT`] bytes of memory (all the address space an instance
//! reserves), [`TABLE_LIMIT`] table entries and [`FUEL_PER_EVENT`] units
//! of fuel per event, compiles nothing larger than [`MODULE_LIMIT`] nor
//! any proposal such a module does not need (threads, SIMD, GC, ...), and
//! checks every answer ([`Control::check`]). A module that
//! traps, runs out of fuel or answers nonsense is unloaded for that QP,
//! with one line on stderr; the QP carries on under the native DCQCN from
//! the last rate the module set, so traffic continues and nothing is lost.
//! The interface is `softrnic_cc::guest`'s.

mod build;
mod sandbox;

pub use build::{TARGET, build_module, target_installed};
pub use sandbox::{FUEL_FOR_INIT, FUEL_PER_EVENT, MEMORY_LIMIT, MODULE_LIMIT, Sandboxed, TABLE_LIMIT, WasmAlgorithm};
