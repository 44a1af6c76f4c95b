//! Memory the NIC may touch: buffers shared with the application, memory
//! regions that grant access to parts of them, and the table of keys that
//! every access, local or remote, goes through.

mod buffer;
mod domains;
mod region;
mod scatter_gather;
mod shared;
mod table;
mod window;

pub use buffer::DmaBuffer;
pub use domains::ProtectionDomains;
pub use region::{Access, MemoryRegion, MrKeys, PdId, Registration};
pub(crate) use scatter_gather::{gather, scatter, shared_ranges, validate_list};
pub use shared::{FileRange, FileRanges, PeerMemory, SharedFile, SharedPart};
pub use table::{AccessFault, MemoryTable, MemoryView};
pub use window::{MemoryWindow, WindowBind, WindowFault, WindowType, window_handle, with_key};
