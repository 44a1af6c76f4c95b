//! A send work request as the requester and completer track it.

use softrnic_wire::Psn;

use crate::completion::{WcOpcode, WcStatus};
use crate::work_request::{SendOp, SendWorkRequest};

#[derive(Debug, Clone)]
pub(super) struct SendWqe {
    pub wr: SendWorkRequest,
    /// Message length in bytes.
    pub len: u64,
    /// PSNs the message uses: its request packets, or for a READ the
    /// response packets it asks for; at least one.
    pub npsn: u32,
    /// The PSN of its first packet, fixed the first time it is sent.
    pub first_psn: Option<Psn>,
    /// Set once the request is finished, successfully or not; it completes
    /// when it reaches the head of the queue.
    pub status: Option<WcStatus>,
    /// READ: response packets placed in local memory so far.
    pub responses: u32,
}

impl SendWqe {
    pub fn new(wr: SendWorkRequest, mtu: u32) -> SendWqe {
        let len = wr.payload.len();
        let npsn = if wr.op.is_atomic() { 1 } else { len.div_ceil(u64::from(mtu)).max(1) as u32 };
        SendWqe { wr, len, npsn, first_psn: None, status: None, responses: 0 }
    }

    pub fn is_read_or_atomic(&self) -> bool {
        self.wr.op.writes_locally()
    }

    /// The PSN the completer waits for next: the first response not yet
    /// received for READ and ATOMIC. `None` before the request is sent.
    pub fn expected_response(&self) -> Option<Psn> {
        self.first_psn.map(|f| f.add(self.responses))
    }

    /// The PSN of its last packet.
    pub fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|f| f.add(self.npsn - 1))
    }

    /// Where `psn` falls in this request, if it does.
    pub fn index_of(&self, psn: Psn) -> Option<u32> {
        let first = self.first_psn?;
        let d = psn.distance_from(first);
        (d >= 0 && (d as u32) < self.npsn).then_some(d as u32)
    }

    pub fn wc_opcode(&self) -> WcOpcode {
        match self.wr.op {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }
}
