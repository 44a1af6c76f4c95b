//! Device-wide transport settings.

use std::net::{IpAddr, Ipv4Addr};

use crate::auth::AuthKey;
use crate::congestion::CongestionConfig;
use crate::qp::{Mtu, Retransmission};

/// How a device's queue pairs behave beyond what verbs attributes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// The device's address: its GID and the source of every packet.
    pub local_addr: IpAddr,
    /// Most PSNs a QP keeps unacknowledged: the go-back-N window.
    pub max_inflight_packets: u32,
    /// A long message asks for an ACK at least this often (in packets).
    pub ack_request_interval: u32,
    /// The MTU of unreliable datagrams (the port's active MTU).
    pub ud_mtu: Mtu,
    /// How RC requesters time retransmissions: the IBTA's fixed timeout
    /// (the default) or the adaptive timer. Selective-repeat QPs always
    /// time adaptively.
    pub retransmission: Retransmission,
    /// Congestion control: the algorithm, the notification point, INT.
    pub congestion: CongestionConfig,
    /// The secret the hosts share for packet authentication
    /// (`SOFTRNIC_AUTH_KEY`); without it no QP may authenticate.
    pub auth_key: Option<AuthKey>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            local_addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            max_inflight_packets: 512,
            ack_request_interval: 32,
            ud_mtu: Mtu::Mtu4096,
            retransmission: Retransmission::Fixed,
            congestion: CongestionConfig::default(),
            auth_key: None,
        }
    }
}
