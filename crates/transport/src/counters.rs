//! What a device counts, for `devinfo` and for tests that check that the
//! transport took the path they meant it to.

/// Packet and error counters of one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Counters {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N, or the holes selective
    /// repeat found).
    pub retransmitted_packets: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Expiries that sent only the last packet (adaptive timer).
    pub tail_loss_probes: u64,
    /// Datagrams dropped because their ICRC did not match.
    pub rx_icrc_errors: u64,
    /// Datagrams that are not well-formed RoCEv2.
    pub rx_malformed: u64,
    /// Same-host packets whose payload references could not be resolved
    /// ([`crate::by_reference`]): dropped, as if lost.
    pub rx_unresolved_references: u64,
    /// Packets sent with their payload by reference, and those received.
    pub tx_by_reference: u64,
    pub rx_by_reference: u64,
    /// Of those sent, the packets that carried several MTUs, each
    /// standing for as many PSNs ([`crate::by_reference::MAX_SPAN_BYTES`]).
    pub tx_spanning: u64,
    /// Packets for a QP number that does not exist.
    pub rx_unknown_qp: u64,
    /// Packets from a peer or of a kind the QP does not talk to.
    pub rx_dropped_foreign: u64,
    /// Packets for an authenticating QP whose MAC did not verify: forged,
    /// replayed into another connection, or changed on the way.
    pub rx_auth_failures: u64,
    pub rx_out_of_sequence: u64,
    pub rx_duplicate_requests: u64,
    pub rx_duplicate_responses: u64,
    pub rx_stale_responses: u64,
    pub rx_qkey_violations: u64,
    pub rx_no_receive_posted: u64,
    /// UC messages the responder dropped: a packet of theirs lost, no
    /// receive posted, or a request it could not carry out.
    pub uc_messages_dropped: u64,
    /// Requests held while the driver fetched the program's receives
    /// ([`crate::fetch_on_demand`]).
    pub receive_fetches: u64,
    /// Requests dropped because their QP held as many as it may.
    pub rx_held_overflow: u64,
    /// CNPs received: the reaction point's signal (`rp_cnp_handled`).
    pub rx_cnps: u64,
    /// CNPs sent for CE-marked packets (`np_cnp_sent`).
    pub cnps_sent: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    /// Messages that needed a receive and waited for the responder's
    /// end-to-end credits (IBTA 9.7.7.2), each counted once.
    pub credit_waits: u64,
    /// Messages sent beyond the credits, alone, to learn of new receives.
    pub credit_probes: u64,
    pub fatal_naks_sent: u64,
    pub fatal_naks_received: u64,
    /// Selective repeat: request packets placed before the ones ahead of
    /// them had arrived.
    pub rx_placed_out_of_order: u64,
    /// Selective repeat: request packets dropped beyond the responder's
    /// window.
    pub rx_beyond_window: u64,
    /// Selective NAKs (a gap and what arrived beyond it).
    pub selective_naks_sent: u64,
    pub selective_naks_received: u64,
}

impl std::ops::AddAssign<&Counters> for Counters {
    /// Adds another shard's counts.
    fn add_assign(&mut self, other: &Counters) {
        self.tx_packets += other.tx_packets;
        self.tx_bytes += other.tx_bytes;
        self.rx_packets += other.rx_packets;
        self.rx_bytes += other.rx_bytes;
        self.retransmitted_packets += other.retransmitted_packets;
        self.timeouts += other.timeouts;
        self.tail_loss_probes += other.tail_loss_probes;
        self.rx_icrc_errors += other.rx_icrc_errors;
        self.rx_malformed += other.rx_malformed;
        self.rx_unresolved_references += other.rx_unresolved_references;
        self.tx_by_reference += other.tx_by_reference;
        self.rx_by_reference += other.rx_by_reference;
        self.tx_spanning += other.tx_spanning;
        self.rx_unknown_qp += other.rx_unknown_qp;
        self.rx_dropped_foreign += other.rx_dropped_foreign;
        self.rx_auth_failures += other.rx_auth_failures;
        self.rx_out_of_sequence += other.rx_out_of_sequence;
        self.rx_duplicate_requests += other.rx_duplicate_requests;
        self.rx_duplicate_responses += other.rx_duplicate_responses;
        self.rx_stale_responses += other.rx_stale_responses;
        self.rx_qkey_violations += other.rx_qkey_violations;
        self.rx_no_receive_posted += other.rx_no_receive_posted;
        self.uc_messages_dropped += other.uc_messages_dropped;
        self.receive_fetches += other.receive_fetches;
        self.rx_held_overflow += other.rx_held_overflow;
        self.rx_cnps += other.rx_cnps;
        self.cnps_sent += other.cnps_sent;
        self.seq_naks_sent += other.seq_naks_sent;
        self.seq_naks_received += other.seq_naks_received;
        self.rnr_naks_sent += other.rnr_naks_sent;
        self.rnr_naks_received += other.rnr_naks_received;
        self.credit_waits += other.credit_waits;
        self.credit_probes += other.credit_probes;
        self.fatal_naks_sent += other.fatal_naks_sent;
        self.fatal_naks_received += other.fatal_naks_received;
        self.rx_placed_out_of_order += other.rx_placed_out_of_order;
        self.rx_beyond_window += other.rx_beyond_window;
        self.selective_naks_sent += other.selective_naks_sent;
        self.selective_naks_received += other.selective_naks_received;
    }
}
