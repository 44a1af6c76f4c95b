//! Asynchronous events (`ibv_get_async_event`): what happens to a device's
//! objects that no completion reports.

use crate::completion::CqId;
use crate::srq::SrqId;

/// An asynchronous event, named as `enum ibv_event_type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum AsyncEvent {
    /// A QP's responder failed a request for a reason other than the two
    /// below, and moved the QP to the error state (`IBV_EVENT_QP_FATAL`).
    QpFatal { qpn: u32 },
    /// A QP's responder refused an invalid request and moved the QP to the
    /// error state (`IBV_EVENT_QP_REQ_ERR`).
    QpRequestError { qpn: u32 },
    /// A QP's responder refused an access its keys or rights do not allow
    /// and moved the QP to the error state (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError { qpn: u32 },
    /// A QP that takes receives from an SRQ entered the error state: no
    /// more of the SRQ's requests will complete on it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    QpLastWqeReached { qpn: u32 },
    /// Fewer receives remain in an SRQ than its armed limit
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached { srq: SrqId },
    /// A completion queue overflowed and lost completions
    /// (`IBV_EVENT_CQ_ERR`).
    CqError { cq: CqId },
}
