//! The device's limits: what `ibv_query_device` reports, what the C library
//! checks verbs against, and what `softrnic devinfo` prints. One place, so
//! the three cannot disagree.

/// Queue pairs a device may hold.
pub const MAX_QP: u32 = 1 << 16;
/// Work requests a send or receive queue may hold.
pub const MAX_QP_WR: u32 = 1 << 14;
/// Scatter/gather entries per work request.
pub const MAX_SGE: u32 = 32;
pub const MAX_CQ: u32 = 1 << 16;
/// Completions a CQ may hold.
pub const MAX_CQE: u32 = 1 << 20;
pub const MAX_MR: u32 = 1 << 24;
pub const MAX_PD: u32 = 1 << 16;
/// Outstanding READ/ATOMIC requests per QP, each way.
pub const MAX_RD_ATOMIC: u8 = 16;
pub const MAX_AH: u32 = 1 << 16;
pub const MAX_SRQ: u32 = 1 << 16;
/// Memory windows a device may hold.
pub const MAX_MW: u32 = 1 << 16;
/// Multicast groups, and UD QPs per group, that each of a device's
/// shards (a device has one unless configured with more) may hold: every
/// group a shard joins takes a socket.
pub const MAX_MCAST_GRP: u32 = 1024;
pub const MAX_MCAST_QP_ATTACH: u32 = 56;
/// Bytes of inline data per send work request.
pub const MAX_INLINE_DATA: u32 = 1024;
/// The largest message.
pub const MAX_MSG_SIZE: u32 = 1 << 31;
/// Entries in the port's GID table: one RoCEv2 GID, the device's address.
pub const GID_TABLE_LEN: u32 = 1;
/// The largest path MTU, in bytes.
pub const MAX_MTU: u32 = 4096;
/// The vendor ID the device reports (`ibv_query_device`, and ECE, where it
/// says whose options these are). softrnic has no IEEE OUI; these are the
/// letters "SRN".
pub const VENDOR_ID: u32 = 0x53_52_4e;
