//! What `rdma_bench` takes and prints, as a library: `softrnic bench`
//! prints the same E1 latency block, the experiment runner reads the
//! lines back, and `softrnic manuals` writes its manual page from its
//! flags. The program itself is `main.rs`.

pub mod args;
pub mod report;
