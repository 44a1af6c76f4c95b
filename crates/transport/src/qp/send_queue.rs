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
    /// response packets it asks for; at least one, but none for a local
    /// operation.
    pub npsn: u32,
    /// The PSN of its first packet, fixed the first time it is sent.
    pub first_psn: Option<Psn>,
    /// Set once the request is finished, successfully or not; it completes
    /// when it reaches the head of the queue.
    pub status: Option<WcStatus>,
    /// READ: response packets placed in local memory, in order, so far.
    pub responses: u32,
    /// READ under selective repeat: responses placed beyond `responses`,
    /// a bit per response (empty until one arrives out of order).
    pub ahead: Vec<u64>,
    /// Selective repeat: the number of the receive the message consumes
    /// at the responder (SEND, WRITE with immediate), or that the next
    /// such message will.
    pub receive_number: u32,
}

impl SendWqe {
    pub fn new(wr: SendWorkRequest, mtu: u32) -> SendWqe {
        let len = wr.payload.len();
        let npsn = match wr.op {
            op if op.is_local() => 0,
            op if op.is_atomic() => 1,
            _ => len.div_ceil(u64::from(mtu)).max(1) as u32,
        };
        SendWqe { wr, len, npsn, first_psn: None, status: None, responses: 0, ahead: Vec::new(), receive_number: 0 }
    }

    /// Does the message consume a receive work request at the responder?
    pub fn consumes_receive(&self) -> bool {
        matches!(
            self.wr.op,
            SendOp::Send { .. } | SendOp::SendWithInvalidate { .. } | SendOp::Write { imm: Some(_), .. }
        )
    }

    /// READ: has response `k` been placed?
    pub fn has_response(&self, k: u32) -> bool {
        k < self.responses || self.ahead.get((k / 64) as usize).is_some_and(|w| w & (1 << (k % 64)) != 0)
    }

    /// READ: response `k` was placed; the in-order count moves past every
    /// response placed.
    pub fn record_response(&mut self, k: u32) {
        if k == self.responses {
            // In order: no bitmap needed (go-back-N never allocates one).
            self.responses += 1;
        } else if k > self.responses {
            if self.ahead.is_empty() {
                self.ahead = vec![0; self.npsn.div_ceil(64) as usize];
            }
            self.ahead[(k / 64) as usize] |= 1 << (k % 64);
        }
        while self.responses < self.npsn && self.has_response(self.responses) {
            self.responses += 1;
        }
    }

    pub fn is_read_or_atomic(&self) -> bool {
        self.wr.op.awaits_response()
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
            SendOp::Send { .. } | SendOp::SendWithInvalidate { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
            SendOp::BindWindow(_) => WcOpcode::BindMw,
            SendOp::LocalInvalidate { .. } => WcOpcode::LocalInv,
        }
    }
}
