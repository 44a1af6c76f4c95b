//! softrnic's drop-in `librdmacm.so.1`.

pub mod protocol;
