//! Selective repeat at the responder: packets are placed as they arrive
//! and executed in PSN order.
//!
//! Go-back-N throws away everything after a lost packet. On a connection
//! that negotiated selective repeat, every SEND and WRITE packet carries
//! an SRETH (`softrnic_wire::sreth`) that says where it belongs, so the
//! responder keeps whatever arrives within `WINDOW` PSNs of the one it
//! expects, as IRN does:
//!
//! - a WRITE packet lands in memory at once, at its address and offset,
//!   checked against the region as any WRITE is;
//! - a SEND packet lands at its offset in the receive work request its
//!   receive number names; receives are taken from the queue (or the
//!   SRQ) in order as far as that number;
//! - a READ or ATOMIC request waits in its slot, and executes when its
//!   turn comes, so an ATOMIC executes once and in order, and a READ
//!   sees every WRITE before it.
//!
//! What the rest of the responder sees does not change: when the
//! expected PSN arrives, the slots from it on are retired in PSN order,
//! and a message completes (its receive completion, the MSN) only when
//! its last packet retires, after every packet before it. A packet
//! that would fail fails then, at its turn, as it would in order.
//!
//! A gap is answered by a selective NAK (`softrnic_wire::sack`): the
//! first missing PSN and what has arrived beyond it, built when the
//! answer leaves so it is never stale. Not every packet beyond a gap
//! needs one: the requester calls a hole lost once `DUPLICATE_THRESHOLD`
//! packets above it arrived, so a NAK goes when an arrival makes that
//! true of the hole just below it, when the requester asked for an
//! acknowledgement, and when a packet arrives twice or beyond the window
//! (the requester is probing). The requester's half is `scoreboard.rs`.

use std::collections::VecDeque;

use softrnic_wire::aeth::{NakCode, Syndrome};
use softrnic_wire::packet::Headers;
use softrnic_wire::{Opcode, sack};

use super::responder::{Answer, Refusal};
use super::scoreboard::{DUPLICATE_THRESHOLD, WINDOW};
use super::{Ctx, QueuePair};
use crate::by_reference::{Body, Packet};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::memory::{Access, scatter, validate_list};
use crate::work_request::RecvWorkRequest;

/// What arrived at one PSN at or beyond the expected one.
#[derive(Debug)]
enum Arrived {
    /// A SEND or WRITE packet, already in memory.
    Placed { end: Option<MessageEnd>, ack_request: bool },
    /// A READ or ATOMIC request, to execute at its turn (boxed: rare, and
    /// its headers are large beside the other variants).
    Deferred(Box<Deferred>),
    /// A PSN that a deferred READ's responses will take.
    Spanned,
    /// A packet that fails at its turn.
    Refused(Refusal),
}

/// A request executed at its turn, as it arrived.
#[derive(Debug)]
struct Deferred {
    headers: Headers,
    /// An ATOMIC WRITE's 8 bytes (the only such request with a payload).
    payload: Option<[u8; 8]>,
}

/// What the last packet of a message completes.
#[derive(Debug, Clone, Copy)]
struct MessageEnd {
    /// The receive it consumes (SEND, WRITE with immediate): its number
    /// and the completion's opcode.
    receive: Option<(u32, WcOpcode)>,
    byte_len: u32,
    imm: Option<u32>,
    /// A SEND with invalidate's rkey, invalidated as the message completes.
    invalidate: Option<u32>,
    solicited: bool,
}

/// A receive work request taken for a message that has not completed.
#[derive(Debug)]
struct Claim {
    recv: RecvWorkRequest,
    /// Bytes its scatter list holds; `None` if the list is not writable.
    capacity: Option<u64>,
}

/// The responder's selective-repeat state.
#[derive(Debug, Default)]
pub(super) struct Ahead {
    /// By distance from the expected PSN: what arrived there.
    slots: VecDeque<Option<Arrived>>,
    /// Receives taken for messages not yet complete, numbered from
    /// `first_claim` on.
    claims: VecDeque<Claim>,
    first_claim: u32,
    /// A selective NAK waits in the answer queue.
    nak_queued: bool,
}

impl Ahead {
    /// The window's invariant: nothing is kept, and no receive claimed,
    /// beyond `WINDOW` PSNs of the expected one.
    pub(super) fn assert_within_window(&self, qpn: u32) {
        assert!(self.slots.len() <= WINDOW as usize, "QP {qpn}: {} slots kept past the window", self.slots.len());
        assert!(
            self.claims.len() <= WINDOW as usize,
            "QP {qpn}: {} receives claimed past the window",
            self.claims.len()
        );
    }

    fn holds(&self, at: usize) -> bool {
        self.slots.get(at).is_some_and(Option::is_some)
    }

    fn holds_any(&self) -> bool {
        self.slots.iter().any(Option::is_some)
    }

    /// Records what arrived `at` PSNs beyond the expected one, and the
    /// `span - 1` PSNs after it that it accounts for (a READ's responses).
    fn put(&mut self, at: usize, arrived: Arrived, span: u32) {
        let end = (at + span as usize).min(WINDOW as usize).max(at + 1);
        if self.slots.len() < end {
            self.slots.resize_with(end, || None);
        }
        self.slots[at] = Some(arrived);
        for slot in self.slots.range_mut(at + 1..end) {
            *slot = Some(Arrived::Spanned);
        }
    }

    /// The expected PSN moved `psns` on.
    fn advance(&mut self, psns: u32) {
        let psns = (psns as usize).min(self.slots.len());
        self.slots.drain(..psns);
    }

    /// Does the arrival `at` make the hole just below it known lost: is it
    /// the `DUPLICATE_THRESHOLD`-th arrival above that hole?
    fn reveals_hole(&self, at: usize) -> bool {
        let Some(hole) = (0..at).rev().find(|&i| self.slots[i].is_none()) else {
            return false;
        };
        self.slots.range(hole + 1..).filter(|slot| slot.is_some()).count() == DUPLICATE_THRESHOLD as usize
    }

    /// What has arrived beyond the expected PSN, as a selective NAK says.
    fn bitmap(&self) -> sack::Repr {
        let mut bitmap = sack::Repr::default();
        for (index, slot) in self.slots.iter().enumerate().skip(1) {
            if slot.is_some() {
                bitmap.set_received(index as u32 - 1);
            }
        }
        bitmap
    }

    /// Gives back the first receive taken, the one the message being
    /// received consumes.
    pub fn take_first_claim(&mut self) -> Option<RecvWorkRequest> {
        let claim = self.claims.pop_front()?;
        self.first_claim = self.first_claim.wrapping_add(1);
        Some(claim.recv)
    }

    /// Forgets what arrived and gives back the receives taken.
    pub fn abandon(&mut self) -> Vec<RecvWorkRequest> {
        self.slots.clear();
        self.claims.drain(..).map(|c| c.recv).collect()
    }
}

impl QueuePair {
    /// Consumes a request packet on a selective-repeat connection.
    pub(super) fn respond_selectively(&mut self, ctx: &mut Ctx, packet: &Packet) {
        let psn = packet.headers.bth.psn;
        let distance = psn.distance_from(self.resp.epsn);
        if distance < 0 {
            ctx.counters.rx_duplicate_requests += 1;
            self.answer_duplicate(ctx, packet);
            return;
        }
        let at = distance as usize;
        if at >= WINDOW as usize {
            ctx.counters.rx_beyond_window += 1;
            self.queue_selective_nak();
            return;
        }
        if self.resp.ahead.holds(at) {
            ctx.counters.rx_duplicate_requests += 1;
            self.queue_selective_nak();
            return;
        }
        // After an RNR NAK the requester goes back and sends everything
        // again from the expected PSN: nothing beyond it is worth holding.
        if at > 0 && self.resp.nak_sent {
            ctx.counters.rx_out_of_sequence += 1;
            return;
        }
        let op = packet.headers.bth.opcode;
        let arrived = if op.is_send() || op.is_write() {
            match self.place(ctx, packet) {
                Ok(placed) => placed,
                // Held by the shard until the driver answers.
                Err(Refusal::AwaitingReceives) => return,
                // No receive yet for a message ahead: it goes again when
                // the requester repairs the gap.
                Err(Refusal::ReceiverNotReady) if at > 0 => {
                    ctx.counters.rx_out_of_sequence += 1;
                    self.queue_selective_nak();
                    return;
                }
                Err(refusal) => Arrived::Refused(refusal),
            }
        } else {
            let payload = packet.body.word().filter(|_| op == Opcode::RcAtomicWrite);
            Arrived::Deferred(Box::new(Deferred { headers: packet.headers, payload }))
        };
        // A READ waiting its turn holds the PSNs of its responses too, so
        // the requester does not take them for lost requests.
        let span = match packet.headers.ext.reth {
            Some(reth) if op == Opcode::RcReadRequest => {
                u64::from(reth.dma_length).div_ceil(u64::from(self.mtu())).clamp(1, u64::from(WINDOW)) as u32
            }
            _ => 1,
        };
        self.resp.ahead.put(at, arrived, span);
        if at > 0 {
            ctx.counters.rx_out_of_sequence += 1;
            ctx.counters.rx_placed_out_of_order += 1;
            if self.resp.ahead.reveals_hole(at) || packet.headers.bth.ack_request {
                self.queue_selective_nak();
            }
            return;
        }
        self.retire(ctx);
    }

    /// Places a SEND or WRITE packet where its SRETH says it belongs.
    fn place(&mut self, ctx: &mut Ctx, packet: &Packet) -> Result<Arrived, Refusal> {
        let invalid = Refusal::Fatal(NakCode::InvalidRequest, None);
        let (bth, ext) = (&packet.headers.bth, &packet.headers.ext);
        let op = bth.opcode;
        let position = op.position().ok_or(invalid)?;
        // Every SEND and WRITE of the connection says where it belongs.
        let sr = ext.sreth.ok_or(invalid)?;
        if !self.permits(op) || self.span_of(position, &packet.body) != Some(1) {
            return Err(invalid);
        }
        let len = packet.body.len() as u64;
        let (offset, total) = (u64::from(sr.offset), u64::from(sr.message_length));
        let consistent = offset.is_multiple_of(u64::from(self.mtu()))
            && offset + len <= total
            && position.starts_message() == (offset == 0)
            && position.ends_message() == (offset + len == total);
        if !consistent {
            return Err(invalid);
        }
        let receive = if op.is_send() {
            let index = self.claim(ctx, sr.receive_number)?;
            let claim = &self.resp.ahead.claims[index];
            let capacity =
                claim.capacity.ok_or(Refusal::Fatal(NakCode::RemoteOperationalError, Some(WcStatus::LocProtErr)))?;
            if offset + len > capacity {
                return Err(Refusal::Fatal(NakCode::InvalidRequest, Some(WcStatus::LocLenErr)));
            }
            scatter(ctx.memory, self.init.pd, &claim.recv.sges, offset, packet.body)
                .map_err(|_| Refusal::Fatal(NakCode::RemoteOperationalError, Some(WcStatus::LocProtErr)))?;
            Some(WcOpcode::Recv)
        } else {
            let fault = Refusal::Fatal(NakCode::RemoteAccessError, None);
            if position.starts_message() {
                let reth = ext.reth.ok_or(invalid)?;
                if (reth.virtual_address, reth.rkey, reth.dma_length)
                    != (sr.virtual_address, sr.rkey, sr.message_length)
                {
                    return Err(invalid);
                }
                ctx.memory
                    .check_remote(
                        self.init.pd,
                        self.qpn,
                        sr.rkey,
                        sr.virtual_address,
                        total as usize,
                        Access::REMOTE_WRITE,
                    )
                    .map_err(|_| fault)?;
            }
            // Take the receive before touching memory, so that the retry
            // after an RNR NAK starts clean.
            if ext.immediate.is_some() {
                self.claim(ctx, sr.receive_number)?;
            }
            let at = sr.virtual_address.wrapping_add(offset);
            let view = ctx
                .memory
                .check_remote(self.init.pd, self.qpn, sr.rkey, at, len as usize, Access::REMOTE_WRITE)
                .map_err(|_| fault)?;
            packet.body.place(0, &view);
            ext.immediate.map(|_| WcOpcode::RecvRdmaWithImm)
        };
        let end = position.ends_message().then_some(MessageEnd {
            receive: receive.map(|opcode| (sr.receive_number, opcode)),
            byte_len: sr.message_length,
            imm: ext.immediate,
            invalidate: ext.invalidate_rkey,
            solicited: bth.solicited,
        });
        Ok(Arrived::Placed { end, ack_request: bth.ack_request })
    }

    /// Takes receives in order up to the one numbered `number`; returns
    /// its index among those taken.
    fn claim(&mut self, ctx: &mut Ctx, number: u32) -> Result<usize, Refusal> {
        let index = number.wrapping_sub(self.resp.ahead.first_claim) as usize;
        // No message can be a window ahead (nor behind: that one completed).
        if index >= WINDOW as usize {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        while self.resp.ahead.claims.len() <= index {
            let recv = self.take_recv(ctx)?;
            let capacity = validate_list(ctx.memory, self.init.pd, &recv.sges, Access::LOCAL_WRITE).ok();
            self.resp.ahead.claims.push_back(Claim { recv, capacity });
        }
        Ok(index)
    }

    /// Retires what arrived from the expected PSN on, in PSN order.
    fn retire(&mut self, ctx: &mut Ctx) {
        // Slots retired: more than one means a gap closed.
        let mut retired = 0;
        let mut ack = false;
        while let Some(arrived) = self.resp.ahead.slots.front_mut().and_then(Option::take) {
            let psn = self.resp.epsn;
            let psns = match arrived {
                Arrived::Placed { end, ack_request } => {
                    if let Some(Err(refusal)) = end.map(|end| self.finish_message(ctx, end)) {
                        self.refuse(ctx, psn, refusal);
                        return;
                    }
                    ack |= ack_request;
                    1
                }
                Arrived::Deferred(deferred) => {
                    let payload = deferred.payload.as_ref().map_or(&[][..], |bytes| &bytes[..]);
                    match self.execute(ctx, &Packet { headers: deferred.headers, body: Body::Bytes(payload) }) {
                        Ok(psns) => psns,
                        Err(refusal) => {
                            self.refuse(ctx, psn, refusal);
                            return;
                        }
                    }
                }
                Arrived::Spanned => 1,
                Arrived::Refused(refusal) => {
                    self.refuse(ctx, psn, refusal);
                    return;
                }
            };
            self.resp.epsn = psn.add(psns);
            self.resp.ahead.advance(psns);
            self.resp.nak_sent = false;
            retired += 1;
        }
        if self.resp.ahead.holds_any() {
            // Part of the gap closed: say what is still missing.
            if retired > 0 {
                self.queue_selective_nak();
            }
        } else if ack || retired > 1 {
            // A closed gap is acknowledged at once.
            self.resp.queue_ack(self.resp.epsn.sub(1));
        }
    }

    /// The last packet of a message retired: it completes.
    fn finish_message(&mut self, ctx: &mut Ctx, end: MessageEnd) -> Result<(), Refusal> {
        if let Some((number, opcode)) = end.receive {
            // Messages finish in order, so theirs is the first receive taken.
            if number != self.resp.ahead.first_claim {
                return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
            }
            if let Some(rkey) = end.invalidate {
                self.invalidate_for_peer(ctx, rkey)?;
            }
            let recv = self.resp.ahead.take_first_claim().ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
            let mut completion = Completion::new(recv.wr_id, WcStatus::Success, opcode, self.qpn);
            completion.byte_len = end.byte_len;
            completion.imm_data = end.imm;
            completion.invalidated_rkey = end.invalidate;
            completion.solicited = end.solicited;
            self.complete_recv(ctx, completion);
        }
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        Ok(())
    }

    fn queue_selective_nak(&mut self) {
        // After an RNR NAK the requester goes back by itself.
        if !self.resp.ahead.nak_queued && !self.resp.nak_sent {
            self.resp.ahead.nak_queued = true;
            self.resp.answers.push_back(Answer::SelectiveNak);
        }
    }

    /// The headers of a selective NAK as things stand now: a plain ACK if
    /// the gap has closed since it was queued.
    pub(super) fn selective_nak(&mut self, ctx: &mut Ctx) -> Headers {
        self.resp.ahead.nak_queued = false;
        let (epsn, msn) = (self.resp.epsn, self.resp.msn);
        let bitmap = self.resp.ahead.bitmap();
        if bitmap.highest().is_none() {
            return self.answer_headers(Opcode::RcAck, epsn.sub(1), Some(self.credits()), msn);
        }
        ctx.counters.selective_naks_sent += 1;
        let nak = Syndrome::Nak(NakCode::PsnSequenceError);
        let mut headers = self.answer_headers(Opcode::RcAck, epsn, Some(nak), msn);
        headers.bth.selective_repeat = true;
        headers.ext.sack = Some(bitmap);
        headers
    }
}
