//! Unreliable connected queue pairs: RC's SENDs and WRITEs to one peer QP,
//! with none of its reliability. The requester sends each message once and
//! completes it when its last packet leaves; nothing is acknowledged or
//! sent again. The responder takes packets in PSN order, and a message
//! that cannot be taken whole is dropped whole, as the rxe driver and the
//! IBTA's UC rules have it:
//!
//! - a gap in the PSNs (a packet lost) drops the message in progress, and
//!   every packet after it until one starts a message, from whose PSN the
//!   responder goes on; a packet behind the expected PSN (a duplicate, or
//!   one overtaken) is ignored, so no message arrives twice;
//! - a message that finds no receive posted is dropped (no RNR NAK: the
//!   requester has long completed it);
//! - a WRITE outside its key's bounds or rights is dropped;
//! - a SEND longer than its receive completes that receive with
//!   `LocLenErr`, and the rest of the message is dropped.
//!
//! The receive of a message dropped part-way is not completed: the next
//! message takes it (`Responder::spare`). A WRITE's bytes placed before a
//! loss stay where they landed; UC promises nothing about them.

use std::net::IpAddr;

use super::responder::Refusal;
use super::{Ctx, QpState, QueuePair, Transmit};
use crate::by_reference::Packet;
use crate::completion::{Completion, WcOpcode, WcStatus};

impl QueuePair {
    /// Sends the next packet of the oldest request; completes the request
    /// with its last packet.
    pub(super) fn uc_transmit(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.pacer.is_some_and(|p| !p.may_send(ctx.now)) {
            if !self.sq.is_empty() {
                self.paced(ctx);
            }
            return None;
        }
        let dst = self.attrs.remote_addr?;
        // A bind or local invalidate at the front has nothing to wait for:
        // everything before it has left and completed.
        while self.sq.front()?.wr.op.is_local() {
            if !self.run_local(ctx, 0) {
                return None;
            }
        }
        let wqe = self.sq.front_mut()?;
        if wqe.first_psn.is_none() {
            wqe.first_psn = Some(self.req.next_psn);
            self.req.next_psn = self.req.next_psn.add(wqe.npsn);
        }
        let k = self.req.cursor_pkt;
        let len = match self.build_send_or_write(ctx, buf, 0, k, 1) {
            Ok((len, _)) => len,
            Err(status) => {
                self.fail_uc_send(ctx, status);
                return None;
            }
        };
        self.req.cursor_pkt += 1;
        if self.req.cursor_pkt == self.sq[0].npsn {
            self.req.cursor_pkt = 0;
            let wqe = self.sq.pop_front().expect("front exists");
            self.posts.retire_send();
            self.complete_send(ctx, &wqe, WcStatus::Success);
        }
        // Nothing is outstanding: `una` and `sent_end`, RC's window, stay
        // put, so no retry timer ever runs.
        self.on_data_sent(ctx, len);
        Some(Transmit::new(dst, len))
    }

    /// A request failed locally (its memory): it completes with `status`,
    /// the send queue stops (SQE) and what waits behind it flushes, as for
    /// UD. The packets of it already sent make a message the responder
    /// drops when the next one starts.
    fn fail_uc_send(&mut self, ctx: &mut Ctx, status: WcStatus) {
        self.req.cursor_pkt = 0;
        let wqe = self.sq.pop_front().expect("front exists");
        self.posts.retire_send();
        self.complete_send(ctx, &wqe, status);
        self.set_state(QpState::Sqe);
        while let Some(rest) = self.sq.pop_front() {
            self.posts.retire_send();
            self.complete_send(ctx, &rest, WcStatus::WrFlushErr);
        }
    }

    /// Takes one packet from the connected peer.
    pub(super) fn uc_receive(&mut self, ctx: &mut Ctx, src: IpAddr, packet: &Packet) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            return;
        }
        let bth = &packet.headers.bth;
        if !bth.opcode.is_uc() || Some(src) != self.attrs.remote_addr {
            ctx.counters.rx_dropped_foreign += 1;
            return;
        }
        let position = bth.opcode.position().expect("a UC opcode is a SEND's or a WRITE's");
        if bth.psn.distance_from(self.resp.epsn) < 0 {
            // Behind the expected PSN: a duplicate (or a packet overtaken
            // by a loss already handled). It changes nothing.
            ctx.counters.rx_duplicate_requests += 1;
            return;
        }
        if bth.psn != self.resp.epsn || self.resp.dropping {
            let in_progress = self.resp.message_in_progress();
            if bth.psn != self.resp.epsn {
                ctx.counters.rx_out_of_sequence += 1;
            }
            if !position.starts_message() {
                // Nothing to go on from: the message this packet belongs
                // to lost its start (or is being dropped already).
                if !self.resp.dropping {
                    ctx.counters.uc_messages_dropped += 1;
                }
                self.resp.drop_message();
                self.resp.epsn = bth.psn.next();
                return;
            }
            // A message starts: the one in progress lost its end.
            if in_progress && !self.resp.dropping {
                ctx.counters.uc_messages_dropped += 1;
            }
            self.resp.drop_message();
            self.resp.dropping = false;
            self.resp.epsn = bth.psn;
        }
        let refusal = match self.execute(ctx, packet) {
            Ok(psns) => {
                self.resp.epsn = self.resp.epsn.add(psns);
                return;
            }
            // Held by the shard, and handed over again with the answer.
            Err(Refusal::AwaitingReceives) => return,
            Err(refusal) => refusal,
        };
        ctx.counters.uc_messages_dropped += 1;
        match refusal {
            Refusal::ReceiverNotReady => ctx.counters.rx_no_receive_posted += 1,
            Refusal::Fatal(_, Some(status)) => {
                if let Some(recv) = self.resp.take_current_receive() {
                    self.complete_recv(ctx, Completion::new(recv.wr_id, status, WcOpcode::Recv, self.qpn));
                }
            }
            Refusal::Fatal(_, None) | Refusal::AwaitingReceives => {}
        }
        self.resp.drop_message();
        self.resp.epsn = bth.psn.next();
    }
}
