//! What `rdma_bench` prints, as a library: `softrnic bench` prints the
//! same E1 latency block, and the experiment runner reads the lines back.
//! The program itself is `main.rs`.

pub mod report;
