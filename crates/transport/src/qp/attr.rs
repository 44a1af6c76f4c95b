//! Queue pair states and the attributes `ibv_modify_qp` carries, with the
//! rules for which attributes each state transition needs (IBTA vol. 1
//! section 10.3, and the table in `ibv_modify_qp(3)`).

use std::net::IpAddr;

use softrnic_wire::Psn;

use crate::completion::CqId;
use crate::error::{Result, VerbsError};
use crate::memory::{Access, PdId};
use crate::srq::SrqId;

/// The verbs QP state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpState {
    Reset,
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained: no new requests start.
    Sqd,
    /// Send queue error (UD only): sends flush, receives go on.
    Sqe,
    Error,
}

impl QpState {
    /// The state `self as u8` gave (any other number reads as ERROR).
    pub fn from_u8(n: u8) -> QpState {
        [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe]
            .into_iter()
            .find(|s| *s as u8 == n)
            .unwrap_or(QpState::Error)
    }
}

/// The transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected: SENDs and WRITEs to one peer QP, no
    /// acknowledgement; a message that loses a packet is dropped whole.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// Path MTU, with the values of `enum ibv_mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// The MTU of exactly `bytes` bytes, if it is one of the five.
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [Mtu::Mtu256, Mtu::Mtu512, Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096].into_iter().find(|m| m.bytes() == bytes)
    }
}

/// Sizes fixed when a QP is created (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 16, max_recv_sge: 16, max_inline_data: 256 }
    }
}

/// What `ibv_create_qp` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpInitAttr {
    pub qp_type: QpType,
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub caps: QpCaps,
    /// Every send request generates a completion (else only signalled ones).
    pub sq_sig_all: bool,
    /// Take receives from this shared receive queue instead of the QP's own.
    pub srq: Option<SrqId>,
}

/// Attributes to change in `modify_qp`; `None` leaves one as it is (the
/// `attr_mask` of `ibv_modify_qp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpAttr {
    pub state: Option<QpState>,
    pub access: Option<Access>,
    pub pkey_index: Option<u16>,
    pub port: Option<u8>,
    pub qkey: Option<u32>,
    pub path_mtu: Option<Mtu>,
    pub dest_qpn: Option<u32>,
    /// The remote GID (an IP address in RoCEv2), from the address vector.
    pub remote_addr: Option<IpAddr>,
    pub rq_psn: Option<Psn>,
    pub sq_psn: Option<Psn>,
    pub max_dest_rd_atomic: Option<u8>,
    pub max_rd_atomic: Option<u8>,
    pub min_rnr_timer: Option<u8>,
    pub timeout: Option<u8>,
    pub retry_cnt: Option<u8>,
    pub rnr_retry: Option<u8>,
    /// Recover from loss by selective repeat (`scoreboard.rs`,
    /// `placement.rs`) rather than
    /// go-back-N. Both ends must agree, so it is set from what they
    /// negotiated (ECE, or the Rust API's connect options), before the QP
    /// receives: up to INIT -> RTR.
    pub selective_repeat: Option<bool>,
    /// Authenticate every packet with the connection's key
    /// ([`crate::auth`]). Both ends must agree, as on selective repeat, and
    /// the device must have the shared secret.
    pub authenticate: Option<bool>,
}

/// The attributes in force (`ibv_query_qp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpAttributes {
    pub access: Access,
    pub pkey_index: u16,
    pub port: u8,
    pub qkey: u32,
    pub path_mtu: Mtu,
    pub dest_qpn: u32,
    pub remote_addr: Option<IpAddr>,
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub selective_repeat: bool,
    pub authenticate: bool,
}

impl Default for QpAttributes {
    fn default() -> Self {
        QpAttributes {
            access: Access::empty(),
            pkey_index: 0,
            port: 1,
            qkey: 0,
            path_mtu: Mtu::Mtu1024,
            dest_qpn: 0,
            remote_addr: None,
            rq_psn: Psn::new(0),
            sq_psn: Psn::new(0),
            max_dest_rd_atomic: 1,
            max_rd_atomic: 1,
            min_rnr_timer: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            selective_repeat: false,
            authenticate: false,
        }
    }
}

/// What connecting an RC QP to its peer takes: the attributes of the three
/// `modify_qp` calls that bring it from RESET to RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnection {
    /// What remote peers may do through this QP.
    pub access: Access,
    /// The peer's GID (an IP address in RoCEv2) and QP number.
    pub remote_addr: IpAddr,
    pub dest_qpn: u32,
    /// The PSN the peer starts sending with, and ours.
    pub rq_psn: Psn,
    pub sq_psn: Psn,
    pub mtu: Mtu,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// Both ends agreed on selective repeat.
    pub selective_repeat: bool,
    /// Both ends agreed to authenticate packets.
    pub authenticate: bool,
}

impl RcConnection {
    /// RESET -> INIT, INIT -> RTR, RTR -> RTS.
    pub fn steps(&self) -> [QpAttr; 3] {
        [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(self.access),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                remote_addr: Some(self.remote_addr),
                path_mtu: Some(self.mtu),
                dest_qpn: Some(self.dest_qpn),
                rq_psn: Some(self.rq_psn),
                max_dest_rd_atomic: Some(self.max_dest_rd_atomic),
                min_rnr_timer: Some(self.min_rnr_timer),
                selective_repeat: Some(self.selective_repeat),
                authenticate: Some(self.authenticate),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.sq_psn),
                timeout: Some(self.timeout),
                retry_cnt: Some(self.retry_cnt),
                rnr_retry: Some(self.rnr_retry),
                max_rd_atomic: Some(self.max_rd_atomic),
                ..QpAttr::default()
            },
        ]
    }
}

/// The three `modify_qp` steps of a UD QP with Q_Key `qkey`.
pub fn ud_steps(qkey: u32, sq_psn: Psn) -> [QpAttr; 3] {
    [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(qkey),
            ..QpAttr::default()
        },
        QpAttr { state: Some(QpState::Rtr), ..QpAttr::default() },
        QpAttr { state: Some(QpState::Rts), sq_psn: Some(sq_psn), ..QpAttr::default() },
    ]
}

/// Most outstanding READ/ATOMIC requests a QP may allow in either direction.
pub use crate::limits::MAX_RD_ATOMIC;

macro_rules! require {
    ($attr:expr, $from:expr, $to:expr, $($field:ident),+) => {{
        $(if $attr.$field.is_none() {
            return Err(VerbsError::invalid(format!(
                "{:?} -> {:?} needs the attribute `{}`", $from, $to, stringify!($field)
            )));
        })+
    }};
}

impl QpAttr {
    /// Checks that the transition `from -> self.state` is allowed for a QP
    /// of `qp_type` and carries every attribute it needs, and that each
    /// value is in range.
    pub fn validate(&self, qp_type: QpType, from: QpState) -> Result<QpState> {
        use QpState::*;
        let to = self.state.unwrap_or(from);
        let allowed = matches!(
            (from, to),
            (_, Reset)
                | (_, Error)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Sqd)
                | (Sqd, Rts)
                | (Sqe, Rts)
        );
        if !allowed {
            return Err(VerbsError::invalid(format!("a QP cannot move from {from:?} to {to:?}")));
        }
        match (qp_type, from, to) {
            (QpType::Rc | QpType::Uc, Reset, Init) => require!(self, from, to, pkey_index, port, access),
            (QpType::Ud, Reset, Init) => require!(self, from, to, pkey_index, port, qkey),
            (QpType::Rc, Init, Rtr) => {
                require!(self, from, to, remote_addr, path_mtu, dest_qpn, rq_psn, max_dest_rd_atomic, min_rnr_timer)
            }
            (QpType::Uc, Init, Rtr) => require!(self, from, to, remote_addr, path_mtu, dest_qpn, rq_psn),
            (QpType::Rc, Rtr, Rts) => require!(self, from, to, sq_psn, timeout, retry_cnt, rnr_retry, max_rd_atomic),
            (QpType::Uc | QpType::Ud, Rtr, Rts) => require!(self, from, to, sq_psn),
            _ => {}
        }
        let range = |name: &str, value: Option<u32>, max: u32| match value {
            Some(v) if v > max => Err(VerbsError::invalid(format!("{name} = {v} is out of range 0..={max}"))),
            _ => Ok(()),
        };
        range("retry_cnt", self.retry_cnt.map(u32::from), 7)?;
        range("rnr_retry", self.rnr_retry.map(u32::from), 7)?;
        range("timeout", self.timeout.map(u32::from), 31)?;
        range("min_rnr_timer", self.min_rnr_timer.map(u32::from), 31)?;
        range("dest_qp_num", self.dest_qpn, (1 << 24) - 1)?;
        range("max_rd_atomic", self.max_rd_atomic.map(u32::from), u32::from(MAX_RD_ATOMIC))?;
        range("max_dest_rd_atomic", self.max_dest_rd_atomic.map(u32::from), u32::from(MAX_RD_ATOMIC))?;
        range("port_num", self.port.map(u32::from), 1)?;
        if self.port == Some(0) {
            return Err(VerbsError::invalid("port_num must be 1"));
        }
        range("pkey_index", self.pkey_index.map(u32::from), 0)?;
        if self.selective_repeat.is_some() && !matches!((from, to), (Reset | Init, Init) | (Init, Rtr)) {
            return Err(VerbsError::invalid(
                "selective repeat is chosen before the QP receives: set it up to INIT -> RTR",
            ));
        }
        if self.selective_repeat == Some(true) && qp_type != QpType::Rc {
            return Err(VerbsError::invalid(format!(
                "selective repeat is a reliable-connection recovery; a {qp_type:?} QP has none"
            )));
        }
        if self.authenticate.is_some() && !matches!((from, to), (Reset | Init, Init) | (Init, Rtr)) {
            return Err(VerbsError::invalid(
                "packet authentication is agreed before the QP receives: set it up to INIT -> RTR",
            ));
        }
        if self.authenticate == Some(true) && qp_type != QpType::Rc {
            return Err(VerbsError::invalid(format!(
                "packet authentication is for reliable connections, not {qp_type:?}"
            )));
        }
        Ok(to)
    }

    /// Writes every set attribute into `attrs`.
    pub(crate) fn apply(&self, attrs: &mut QpAttributes) {
        macro_rules! copy {
            ($($field:ident),+) => { $(if let Some(v) = self.$field { attrs.$field = v; })+ };
        }
        copy!(access, pkey_index, port, qkey, path_mtu, dest_qpn, rq_psn, sq_psn);
        copy!(max_dest_rd_atomic, max_rd_atomic, min_rnr_timer, timeout, retry_cnt, rnr_retry, selective_repeat);
        copy!(authenticate);
        if self.remote_addr.is_some() {
            attrs.remote_addr = self.remote_addr;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_values() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes(1024), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(1500), None);
    }

    #[test]
    fn transitions_need_their_attributes() {
        let to_init = QpAttr { state: Some(QpState::Init), pkey_index: Some(0), port: Some(1), ..QpAttr::default() };
        let err = to_init.validate(QpType::Rc, QpState::Reset).unwrap_err();
        assert!(err.to_string().contains("`access`"), "{err}");
        let ok = QpAttr { access: Some(Access::empty()), ..to_init };
        assert_eq!(ok.validate(QpType::Rc, QpState::Reset), Ok(QpState::Init));
        assert!(ok.validate(QpType::Ud, QpState::Reset).is_err(), "UD needs a qkey");

        let to_rts = QpAttr { state: Some(QpState::Rts), ..QpAttr::default() };
        assert!(to_rts.validate(QpType::Rc, QpState::Init).is_err(), "INIT cannot go straight to RTS");
        assert!(to_rts.validate(QpType::Rc, QpState::Rtr).is_err(), "RTS needs timeouts");
        assert_eq!(
            QpAttr { state: Some(QpState::Error), ..QpAttr::default() }.validate(QpType::Rc, QpState::Rts),
            Ok(QpState::Error)
        );
    }

    #[test]
    fn values_are_range_checked() {
        let attr = QpAttr { retry_cnt: Some(8), ..QpAttr::default() };
        assert!(attr.validate(QpType::Rc, QpState::Rts).is_err());
        let attr = QpAttr { dest_qpn: Some(1 << 24), ..QpAttr::default() };
        assert!(attr.validate(QpType::Rc, QpState::Init).is_err());
        let attr = QpAttr { max_rd_atomic: Some(MAX_RD_ATOMIC + 1), ..QpAttr::default() };
        assert!(attr.validate(QpType::Rc, QpState::Rts).is_err());
    }
}
