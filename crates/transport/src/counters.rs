//! What a device counts, for `devinfo` and for tests that check that the
//! transport took the path they meant it to.

/// Packet and error counters of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N).
    pub retransmitted_packets: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Datagrams dropped because their ICRC did not match.
    pub rx_icrc_errors: u64,
    /// Datagrams that are not well-formed RoCEv2.
    pub rx_malformed: u64,
    /// Packets for a QP number that does not exist.
    pub rx_unknown_qp: u64,
    /// Packets from a peer or of a kind the QP does not talk to.
    pub rx_dropped_foreign: u64,
    pub rx_out_of_sequence: u64,
    pub rx_duplicate_requests: u64,
    pub rx_duplicate_responses: u64,
    pub rx_stale_responses: u64,
    pub rx_qkey_violations: u64,
    pub rx_no_receive_posted: u64,
    pub rx_cnps: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub fatal_naks_sent: u64,
    pub fatal_naks_received: u64,
}
