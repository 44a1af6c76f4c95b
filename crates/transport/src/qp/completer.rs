//! The completer: what comes back from the responder decides which send
//! work requests are done.
//!
//! - An ACK for PSN p acknowledges every SEND and WRITE packet up to p.
//! - A READ response or ATOMIC acknowledgement for PSN p implicitly
//!   acknowledges everything before p (IBTA 9.7.5.1.1).
//! - A response, or an ACK, beyond a READ or ATOMIC whose own response has
//!   not arrived means that response was lost: go back to it.
//! - A PSN sequence NAK moves the requester back to the NAK's PSN; an RNR
//!   NAK does too, after the responder's timer; any other NAK fails the
//!   request it names and the QP.
//!
//! Requests complete strictly in order, each once, at the head of the queue.
//!
//! Under selective repeat a selective NAK feeds the scoreboard instead of
//! moving the cursor back, READ responses are placed in any order, and a
//! missing response is asked for again alone (`scoreboard.rs`).

use softrnic_wire::Opcode;
use softrnic_wire::Psn;
use softrnic_wire::aeth::{NakCode, Syndrome};
use softrnic_wire::opcode::Position;
use softrnic_wire::sack;

use std::collections::VecDeque;

use super::requester::rnr_wait;
use super::scoreboard::{DUPLICATE_THRESHOLD, Resend};
use super::send_queue::SendWqe;
use super::{Ctx, QpState, QueuePair};
use crate::by_reference::{self, Body, Packet};
use crate::completion::WcStatus;
use crate::memory::scatter;
use crate::work_request::{Payload, SendOp};

/// Is the READ response or ATOMIC result of `psn` still wanted?
pub(super) fn response_missing(sq: &VecDeque<SendWqe>, psn: Psn) -> bool {
    sq.iter().any(|w| w.status.is_none() && w.index_of(psn).is_some_and(|k| !w.has_response(k)))
}

/// Whether acknowledging up to a PSN found a response missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acknowledged {
    InOrder,
    /// A READ or ATOMIC response before the acknowledged PSN never came.
    ResponseMissing,
}

impl QueuePair {
    /// Consumes an ACK, NAK, READ response or ATOMIC acknowledgement.
    pub(super) fn complete(&mut self, ctx: &mut Ctx, packet: &Packet) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        let bth = &packet.headers.bth;
        let psn = bth.psn;
        if bth.opcode.is_read_response() || bth.opcode == Opcode::RcAtomicAck {
            // Responses still arrive, stale ones too: the flight has not
            // drained, and the repair timer leaves repairs to what the
            // responses show. (When it heard only fresh ones, a paced
            // responder's backlog of answers to earlier repairs had it ask
            // for the same hole every quarter floor, each asking deepening
            // the backlog.)
            self.req.scoreboard.note_response(ctx.now);
        }
        // Only PSNs from the last acknowledged one to the last sent one
        // mean anything; anything else is a stale duplicate.
        let in_window = self.req.una.sub(1).is_at_or_before(psn) && psn.is_before(self.req.sent_end);
        if !in_window {
            ctx.counters.rx_stale_responses += 1;
            self.wait_behind_backlog(ctx, bth.opcode);
            return;
        }
        // Every ACK, and every READ response or ATOMIC result that carries
        // an AETH, says how many receives the responder holds.
        if let Some(aeth) = packet.headers.ext.aeth
            && let Syndrome::Ack { credit_code } = aeth.syndrome
        {
            self.req.credits.on_ack(aeth.msn, credit_code);
        }
        let una_before = self.req.una;
        // A hole was known: what this packet acknowledges may have waited
        // for its repair.
        let gap = self.req.scoreboard.has_report();
        match bth.opcode {
            Opcode::RcAck => {
                let Some(aeth) = packet.headers.ext.aeth else {
                    return;
                };
                self.handle_aeth(ctx, psn, aeth.syndrome, packet.headers.ext.sack);
            }
            Opcode::RcAtomicAck => {
                let original = packet.headers.ext.atomic_ack.unwrap_or(0);
                let in_order = self.acknowledge_through(psn.sub(1)) == Acknowledged::InOrder;
                // Under selective repeat a result lands whatever came
                // before it; the missing ones are asked for alone.
                if in_order || self.attrs.selective_repeat {
                    self.place_atomic_result(ctx, psn, Some(original));
                }
            }
            // An ATOMIC WRITE is answered by a READ RESPONSE ONLY without
            // data (rare among READ responses: only a zero-length READ's
            // looks the same, so only then is the queue searched).
            Opcode::RcReadResponseOnly if packet.body.is_empty() && self.awaits_atomic_write(psn) => {
                let in_order = self.acknowledge_through(psn.sub(1)) == Acknowledged::InOrder;
                if in_order || self.attrs.selective_repeat {
                    self.place_atomic_result(ctx, psn, None);
                }
            }
            op if op.is_read_response() && self.attrs.selective_repeat => self.take_read_response(ctx, psn, packet),
            op if op.is_read_response() => {
                if self.acknowledge_through(psn.sub(1)) == Acknowledged::InOrder {
                    self.place_read_response(ctx, psn, packet);
                } else {
                    self.beyond_the_hole(psn);
                }
            }
            _ => ctx.counters.rx_malformed += 1,
        }
        self.settle_una();
        if self.req.una == una_before {
            self.wait_behind_backlog(ctx, bth.opcode);
        } else {
            if self.req.recovering_from.is_some_and(|p| p.is_before(self.req.una)) {
                self.req.recovering_from = None;
            }
            self.req.past_the_hole = None;
            self.req.retries_left = self.attrs.retry_cnt;
            self.req.rnr_retries_left = self.attrs.rnr_retry;
            self.req.rto.on_progress(self.req.una, ctx.now, gap);
            let acked = self.req.una.distance_from(una_before).max(0) as u64 * u64::from(self.mtu());
            self.on_acknowledged(ctx, acked, bth.becn);
            self.req.scoreboard.on_progress(self.req.una);
            self.req.progress_at = ctx.now;
            self.arm_retry_timer(ctx);
        }
        self.complete_front(ctx);
    }

    /// A READ response that moves nothing on belongs to a stream the
    /// responder began before the requester went back (go-back-N), or fills
    /// a later hole, or answers a repeat (selective repeat); what the
    /// requester waits for is queued behind it. It shows the responder
    /// alive and the path busy, so the retransmission timer counts from it
    /// (without giving back a retry): on a path slower than one READ window
    /// per timeout, timing out behind the backlog sent every request again,
    /// deepened the backlog, and spent the retries without the path ever
    /// going quiet. Under selective repeat a lost response is still found
    /// by the responses after it (`Scoreboard::on_response`) and a lost
    /// repair by the repair timer; the retransmission timer is the last
    /// resort, once the responder falls silent. (Seed 100037 of the
    /// switched simulation timed out 709 times with nothing lost; 29 now.)
    fn wait_behind_backlog(&mut self, ctx: &Ctx, opcode: Opcode) {
        if opcode.is_read_response() && self.req.retry_deadline.is_some() {
            self.arm_retry_timer(ctx);
        }
    }

    /// Go-back-N: a READ response arrived beyond the one awaited, which
    /// the requester has asked for again (`acknowledge_through`), once;
    /// responses of the old stream go on arriving and, as a backlog the
    /// repeat may wait behind, keep the timer from firing. The responder
    /// answers the repeat by starting that READ's stream again at the
    /// hole, so the response just after the hole, once responses up to it
    /// or beyond have arrived, comes from a new stream that has passed the
    /// hole without it: the hole is lost again, and is asked for again
    /// now, not once the stream has ended. (Seed 8000297: its repeat's
    /// answer lost, a READ waited 67 ms behind a stream paced at 15 Mb/s.)
    /// Only that response: any response at or below the highest would
    /// also take one merely duplicated or overtaken on the path for a new
    /// stream, and each such repeat restarts the READ's stream and sends
    /// every later request again (seed 95 of the hostile network spent its
    /// retries so).
    fn beyond_the_hole(&mut self, psn: Psn) {
        let una = self.req.una;
        let head = self.sq.iter().find(|w| w.status.is_none());
        if !head.is_some_and(|w| w.index_of(psn).is_some() && w.index_of(una).is_some()) {
            return;
        }
        match self.req.past_the_hole {
            Some(highest) if psn == una.next() && !highest.is_before(psn) => {
                self.req.past_the_hole = Some(psn);
                self.go_back(una);
            }
            Some(highest) if !highest.is_before(psn) => {}
            _ => self.req.past_the_hole = Some(psn),
        }
    }

    fn handle_aeth(&mut self, ctx: &mut Ctx, psn: Psn, syndrome: Syndrome, sack: Option<sack::Repr>) {
        match syndrome {
            Syndrome::Ack { .. } => {
                self.acknowledge_through(psn);
            }
            Syndrome::RnrNak { timer } => {
                ctx.counters.rnr_naks_received += 1;
                self.acknowledge_through(psn.sub(1));
                if self.req.rnr_retries_left == 0 {
                    self.fail_at(psn, WcStatus::RnrRetryExcErr);
                    return;
                }
                // An rnr_retry of 7 means "retry for ever".
                if self.attrs.rnr_retry != 7 {
                    self.req.rnr_retries_left -= 1;
                }
                self.req.rnr_until = Some(ctx.now + rnr_wait(timer));
                self.req.retry_deadline = None;
                self.go_back(psn);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                let selective = sack.filter(|_| self.attrs.selective_repeat);
                match selective {
                    Some(_) => ctx.counters.selective_naks_received += 1,
                    None => ctx.counters.seq_naks_received += 1,
                }
                self.cc_event(ctx, softrnic_cc::Event::Nak);
                if self.acknowledge_through(psn.sub(1)) == Acknowledged::InOrder {
                    match selective {
                        // A selective NAK overtaken by a later ACK reports
                        // a hole that is filled: its bitmap is stale, and
                        // taken as news it hid the packets still missing.
                        Some(_) if psn.is_before(self.req.una) => ctx.counters.rx_stale_responses += 1,
                        Some(bitmap) => {
                            self.req.scoreboard.on_report(psn, bitmap, self.req.sent_end);
                            if self.req.rto.timed().is_some_and(|timed| self.req.scoreboard.has_arrived(timed)) {
                                self.req.rto.on_timed_arrival(ctx.now);
                            }
                        }
                        None => self.recover_from(psn),
                    }
                }
            }
            Syndrome::Nak(code) => {
                ctx.counters.fatal_naks_received += 1;
                self.acknowledge_through(psn.sub(1));
                let status = match code {
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::RemInvReqErr,
                };
                self.fail_at(psn, status);
                // The responder is in ERR now: READ and ATOMIC responses
                // still missing before the NAK will never come, so those
                // requests are flushed rather than retried.
                for wqe in self.sq.iter_mut().take_while(|w| w.index_of(psn).is_none()) {
                    if wqe.status.is_none() {
                        wqe.status = Some(WcStatus::WrFlushErr);
                    }
                }
            }
        }
    }

    /// Marks SEND and WRITE requests whose last packet is at or before
    /// `psn` done and moves `una` past them. Stops at a READ or ATOMIC that
    /// still waits for its response; if `psn` lies at or beyond that
    /// response, the response was lost and the requester goes back to it.
    fn acknowledge_through(&mut self, psn: Psn) -> Acknowledged {
        for index in 0..self.sq.len() {
            let wqe = &mut self.sq[index];
            if wqe.status.is_some() {
                continue;
            }
            let Some(first) = wqe.first_psn else { break };
            if psn.is_before(first) {
                break;
            }
            if wqe.is_read_or_atomic() {
                let expected = wqe.expected_response().expect("sent");
                if expected.is_at_or_before(psn) {
                    // The responder answers in PSN order: what it sent before
                    // `psn` has gone, or (selective repeat, which tolerates
                    // reordering) has once answers to three PSNs after it
                    // have arrived.
                    if !self.attrs.selective_repeat {
                        self.recover_from(expected);
                    } else if psn.distance_from(expected) + 1 >= DUPLICATE_THRESHOLD as i32 {
                        // Only what was due before `psn`: a READ's later
                        // responses may still be on their way.
                        let below = psn.distance_from(first) as u32;
                        self.lose_responses(index, below, true);
                    }
                    return Acknowledged::ResponseMissing;
                }
                break;
            }
            let last = wqe.last_psn().expect("sent");
            if last.is_at_or_before(psn) {
                wqe.status = Some(WcStatus::Success);
                self.req.una = last.next();
            } else {
                self.req.una = psn.next();
                break;
            }
        }
        Acknowledged::InOrder
    }

    /// Moves `una` up to the oldest request still in progress (and past
    /// the responses it has), since everything before that is done.
    /// Selective repeat can finish a request before an older one, which
    /// leaves `una` behind when the older one finishes.
    fn settle_una(&mut self) {
        let floor = match self.sq.iter().find(|w| w.status.is_none()) {
            Some(wqe) => match wqe.first_psn {
                Some(first) if wqe.is_read_or_atomic() => first.add(wqe.responses),
                Some(first) => first,
                None => self.req.sent_end,
            },
            None => self.req.sent_end,
        };
        if self.req.una.is_before(floor) {
            self.req.una = floor;
        }
    }

    /// The oldest request still waiting, if it is the READ or ATOMIC whose
    /// next response is `psn`.
    fn awaiting_response(&self, psn: Psn) -> Option<usize> {
        let index = self.sq.iter().position(|w| w.status.is_none())?;
        let wqe = &self.sq[index];
        (wqe.is_read_or_atomic() && wqe.expected_response() == Some(psn)).then_some(index)
    }

    fn place_read_response(&mut self, ctx: &mut Ctx, psn: Psn, packet: &Packet) {
        let Some(index) = self.awaiting_response(psn) else {
            ctx.counters.rx_duplicate_responses += 1;
            return;
        };
        let k = self.sq[index].responses;
        if let Some(span) = self.land_read_response(ctx, index, k, psn, packet) {
            self.req.una = psn.add(span);
        }
    }

    /// Checks READ response `k` of the request at `index` (PSN `psn`) and
    /// writes its data into local memory; returns the responses it stands
    /// for (several by reference, [`QueuePair::spans`]), or `None` when it
    /// failed the request.
    fn land_read_response(&mut self, ctx: &mut Ctx, index: usize, k: u32, psn: Psn, packet: &Packet) -> Option<u32> {
        let mtu = self.mtu();
        let wqe = &self.sq[index];
        let offset = u64::from(k) * u64::from(mtu);
        // Never past the responses asked for so far: a longer one fails
        // its length check below.
        let span = match packet.body.by_reference() && self.spans() {
            true => {
                let asked = self.req.sent_end.distance_from(psn).max(1) as u32;
                by_reference::span(packet.body.len(), mtu).min(wqe.npsn - k).min(asked)
            }
            false => 1,
        };
        let expected_len = (wqe.len - offset).min(u64::from(mtu) * u64::from(span)) as usize;
        // A long READ is asked for a window at a time, and a resumed one
        // from response k on, each answered as a READ of its own: FIRST and
        // LAST may appear at any index, but the message must end at its
        // last response, and every response must have its exact length.
        let opcode = packet.headers.bth.opcode;
        let ends = opcode.position().is_some_and(Position::ends_message);
        let is_last = k + span == wqe.npsn;
        if !opcode.is_read_response() || (is_last && !ends) || packet.body.len() != expected_len {
            self.fail_at(psn, WcStatus::BadRespErr);
            return None;
        }
        let Payload::Gather(sges) = &wqe.wr.payload else { unreachable!("READ into inline data") };
        if scatter(ctx.memory, self.init.pd, sges, offset, packet.body).is_err() {
            self.fail_at(psn, WcStatus::LocProtErr);
            return None;
        }
        let wqe = &mut self.sq[index];
        for response in k..k + span {
            wqe.record_response(response);
        }
        if wqe.responses == wqe.npsn {
            wqe.status = Some(WcStatus::Success);
        }
        Some(span)
    }

    /// Selective repeat: places READ response `psn`, whatever arrived
    /// before it.
    fn take_read_response(&mut self, ctx: &mut Ctx, psn: Psn, packet: &Packet) {
        let index = self.sq.iter().position(|w| w.status.is_none() && w.index_of(psn).is_some());
        let Some(index) = index.filter(|&i| matches!(self.sq[i].wr.op, SendOp::Read { .. })) else {
            ctx.counters.rx_duplicate_responses += 1;
            return;
        };
        let wqe = &self.sq[index];
        let first = wqe.first_psn.expect("sent");
        let k = psn.distance_from(first) as u32;
        if wqe.has_response(k) {
            ctx.counters.rx_duplicate_responses += 1;
            return;
        }
        // The READ request that asked for this response has been answered:
        // the path's round trip, however the rest of the READ fares.
        if self.req.rto.timed().is_some_and(|timed| timed.is_at_or_before(psn) && wqe.index_of(timed).is_some()) {
            self.req.rto.on_timed_arrival(ctx.now);
        }
        let settle = self.req.rto.settle_time();
        let sq = &self.sq;
        self.req.scoreboard.on_response(psn, self.req.sent_end, ctx.now, settle, |p| response_missing(sq, p));
        // A READ response acknowledges every request before it, and shows
        // the responses still missing before it lost once it is far enough
        // past them (`una` follows in `settle_una`).
        self.acknowledge_through(psn.sub(1));
        if self.land_read_response(ctx, index, k, psn, packet).is_none() {
            return;
        }
        // A response new to the scoreboard shows the responder alive and
        // the path delivering, even while `una` waits for a repair queued
        // behind the rest of the stream (a paced responder takes a while
        // to reach it): the retransmission timer and the retry count run
        // from here. Timing out instead asked for every hole again,
        // deepened the responder's backlog, and spent the retries while
        // data flowed.
        self.req.progress_at = ctx.now;
        if self.req.retry_deadline.is_some() {
            self.arm_retry_timer(ctx);
        }
        if k > self.sq[index].responses {
            let ends = packet.headers.bth.opcode.position().is_some_and(Position::ends_message);
            // The end of a request's stream means what is missing before
            // it is gone; before that, `DUPLICATE_THRESHOLD` later
            // responses do.
            self.lose_responses(index, k, ends);
        }
    }

    /// Selective repeat: reports the runs of responses missing below
    /// response `below` of the READ at `index` lost, each once
    /// `DUPLICATE_THRESHOLD` responses above it arrived (or at once when
    /// `gone`). An ATOMIC's missing response is lost at once.
    pub(super) fn lose_responses(&mut self, index: usize, below: u32, gone: bool) {
        let wqe = &self.sq[index];
        let Some(first) = wqe.first_psn else { return };
        let sent_end = self.req.sent_end;
        if wqe.wr.op.is_atomic() {
            self.req.scoreboard.lose(Resend::Responses(first), sent_end);
            return;
        }
        // Only responses asked for can be missing.
        let asked = self.req.sent_end.distance_from(first).clamp(1, wqe.npsn as i32) as u32;
        let top = below.min(asked - 1);
        let mut above = 0;
        let mut lost = Vec::new();
        for i in (wqe.responses..=top).rev() {
            if wqe.has_response(i) {
                above += 1;
            } else if (gone || above >= DUPLICATE_THRESHOLD) && (i == wqe.responses || wqe.has_response(i - 1)) {
                lost.push(first.add(i));
            }
        }
        for psn in lost.into_iter().rev() {
            self.req.scoreboard.lose(Resend::Responses(psn), sent_end);
        }
    }

    /// Is the request at `psn` an ATOMIC WRITE still waiting?
    fn awaits_atomic_write(&self, psn: Psn) -> bool {
        self.sq
            .iter()
            .any(|w| w.status.is_none() && matches!(w.wr.op, SendOp::AtomicWrite { .. }) && w.first_psn == Some(psn))
    }

    /// Places the result of the ATOMIC at `psn` (`original`, or `None` for
    /// an ATOMIC WRITE's acknowledgement): the oldest request still
    /// waiting, or under selective repeat any ATOMIC still waiting.
    fn place_atomic_result(&mut self, ctx: &mut Ctx, psn: Psn, original: Option<u64>) {
        let waiting = match self.attrs.selective_repeat {
            true => self.sq.iter().position(|w| w.status.is_none() && w.wr.op.is_atomic() && w.first_psn == Some(psn)),
            false => self.awaiting_response(psn),
        };
        let Some(index) = waiting else {
            ctx.counters.rx_duplicate_responses += 1;
            return;
        };
        let wqe = &self.sq[index];
        // A value answers only a request that returns one.
        if !wqe.wr.op.is_atomic() || wqe.wr.op.writes_locally() != original.is_some() {
            self.fail_at(psn, WcStatus::BadRespErr);
            return;
        }
        if let Some(original) = original {
            let Payload::Gather(sges) = &wqe.wr.payload else { unreachable!("ATOMIC into inline data") };
            // The original value lands in local memory in host byte order.
            if scatter(ctx.memory, self.init.pd, sges, 0, Body::Bytes(&original.to_ne_bytes())).is_err() {
                self.fail_at(psn, WcStatus::LocProtErr);
                return;
            }
        }
        let wqe = &mut self.sq[index];
        wqe.responses = 1;
        wqe.status = Some(WcStatus::Success);
        // `una` moves past it only if nothing before it waits
        // (`settle_una`).
        if self.req.una == psn {
            self.req.una = psn.next();
        }
    }

    /// Fails the request that `psn` belongs to (or, if none does, the
    /// oldest one not finished). A NAK repeated for a request already
    /// finished, one that failed waiting behind an older READ, names
    /// nothing new: failing the oldest instead pinned its error on the
    /// READ (seeds 20007370 and 20009246: an RNR NAK sent twice for one
    /// SEND failed a second request).
    fn fail_at(&mut self, psn: Psn, status: WcStatus) {
        let index = match self.sq.iter().position(|w| w.index_of(psn).is_some()) {
            Some(index) if self.sq[index].status.is_some() => return,
            Some(index) => Some(index),
            None => self.sq.iter().position(|w| w.status.is_none()),
        };
        if let Some(index) = index {
            self.sq[index].status = Some(status);
        }
    }

    /// Completes finished requests at the head of the send queue, in order;
    /// an error there moves the QP to ERR.
    pub(super) fn complete_front(&mut self, ctx: &mut Ctx) {
        while let Some(status) = self.sq.front().and_then(|w| w.status) {
            let wqe = self.sq.pop_front().expect("front exists");
            self.posts.retire_send();
            if self.req.cursor > 0 {
                self.req.cursor -= 1;
            } else {
                self.req.cursor_pkt = 0;
            }
            if wqe.first_psn.is_some() && wqe.is_read_or_atomic() {
                self.req.rd_atomic_outstanding -= 1;
            }
            self.complete_send(ctx, &wqe, status);
            if status != WcStatus::Success {
                self.enter_error(ctx, status != WcStatus::WrFlushErr);
                return;
            }
        }
        if !self.req.outstanding() {
            self.req.retry_deadline = None;
        }
    }
}
