//! The responder: executes incoming requests and answers them.
//!
//! It expects one PSN at a time (`epsn`). A request at `epsn` executes; one
//! beyond it means packets were lost, answered by a single PSN-sequence NAK
//! per gap; one before it is a duplicate: SEND and WRITE are acknowledged
//! again without executing twice, READ is executed again within what the
//! original READ asked (the responder keeps its last [`MAX_RD_ATOMIC`], as
//! a NIC keeps its responder resources), and ATOMIC is answered from a
//! replay cache so it never executes twice (IBTA 9.7.5.1). A repeated READ
//! that no kept READ covers is dropped: otherwise one forged packet with a
//! PSN from the last half window could make the responder send up to 2^23
//! packets from any region its key names.
//!
//! Answers leave in PSN order through one queue, so an ACK never overtakes
//! the READ response it follows; consecutive ACKs coalesce into one.

use std::collections::VecDeque;

use softrnic_wire::aeth::{self, NakCode, Syndrome};
use softrnic_wire::opcode::Position;
use softrnic_wire::packet::{Extensions, Headers, packet_len};
use softrnic_wire::{Opcode, Psn, bth};

use super::placement::Ahead;
use super::{Ctx, MAX_RD_ATOMIC, QpState, QueuePair, Transmit};
use crate::by_reference::{self, Body, Packet};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::event::AsyncEvent;
use crate::memory::{Access, AccessFault, scatter, validate_list};
use crate::work_request::RecvWorkRequest;

/// A message whose first packet has executed and whose last has not.
#[derive(Debug)]
enum Message {
    Send { recv: RecvWorkRequest, capacity: u64, offset: u64 },
    Write { va: u64, rkey: u32, len: u64, offset: u64 },
}

/// A READ being answered, one response packet at a time.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadResponse {
    first_psn: Psn,
    va: u64,
    rkey: u32,
    len: u64,
    next: u32,
    count: u32,
    /// Answers a duplicate request: it reuses the original's resource and
    /// does not count against `max_dest_rd_atomic`.
    replay: bool,
}

/// A READ that executed, kept so that a repeat of it (its responses were
/// lost) can be told from a forged one, and held to what it asked.
#[derive(Debug, Clone, Copy)]
struct ExecutedRead {
    first_psn: Psn,
    count: u32,
    va: u64,
    rkey: u32,
    len: u64,
}

impl ExecutedRead {
    /// Whether a repeat from `psn` asking `reth` stays within this READ:
    /// the same key, and bytes and PSNs that are its own.
    fn allows(&self, psn: Psn, reth: &softrnic_wire::reth::Repr, count: u32) -> bool {
        let offset = psn.distance_from(self.first_psn);
        let within_psns = offset >= 0 && i64::from(offset) + i64::from(count) <= i64::from(self.count);
        let within_bytes = self.va <= reth.virtual_address
            && reth.virtual_address.saturating_add(u64::from(reth.dma_length)) <= self.va.saturating_add(self.len);
        reth.rkey == self.rkey && within_bytes && within_psns
    }
}

/// An answer waiting to be sent.
#[derive(Debug, Clone, Copy)]
pub(super) enum Answer {
    Ack {
        psn: Psn,
        msn: u32,
    },
    SequenceNak {
        psn: Psn,
        msn: u32,
    },
    RnrNak {
        psn: Psn,
        msn: u32,
    },
    /// An ATOMIC's result, or (`original` `None`) an ATOMIC WRITE's
    /// acknowledgement, a READ RESPONSE ONLY without data.
    AtomicAck {
        psn: Psn,
        msn: u32,
        original: Option<u64>,
        replay: bool,
    },
    Read(ReadResponse),
    /// The NAK of a fatal error: the last answer the QP sends.
    FatalNak {
        psn: Psn,
        code: NakCode,
        msn: u32,
    },
    /// Selective repeat: the first missing PSN and what arrived beyond
    /// it, both as they are when the answer leaves.
    SelectiveNak,
}

/// Why a request did not execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No receive work request is posted: the requester should retry.
    ReceiverNotReady,
    /// None is posted, and the driver was asked for the program's: the
    /// shard holds the request and hands it over again with the answer.
    AwaitingReceives,
    /// A fatal error: NAK with this code, and complete the current receive
    /// (if any) with this status.
    Fatal(NakCode, Option<WcStatus>),
}

#[derive(Debug, Default)]
pub(super) struct Responder {
    /// The PSN expected next.
    pub(super) epsn: Psn,
    /// Messages completed, modulo 2^24, reported in every AETH.
    pub(super) msn: u32,
    /// A NAK (sequence or RNR) was sent for `epsn`; stay quiet until it
    /// arrives.
    pub(super) nak_sent: bool,
    current: Option<Message>,
    pub(super) answers: VecDeque<Answer>,
    /// Original values of recent ATOMICs (`None` for an ATOMIC WRITE), by
    /// PSN, to answer duplicates without executing them again.
    atomic_replay: VecDeque<(Psn, Option<u64>)>,
    /// The last READs executed, oldest first, to answer duplicates.
    reads: VecDeque<ExecutedRead>,
    /// After a fatal error the QP is in ERR, but the answers to requests
    /// that executed before it still go out, then the NAK.
    draining: bool,
    /// Selective repeat (`placement.rs`): what arrived at and beyond
    /// `epsn`.
    pub(super) ahead: Ahead,
    /// UC (`uc.rs`): a message is being dropped; its packets are ignored
    /// until one starts a message.
    pub(super) dropping: bool,
    /// UC: the receive of a message dropped part-way, which the next
    /// message takes before the queue's (a UC receive is reused, not
    /// completed, when its message is lost).
    pub(super) spare: Option<RecvWorkRequest>,
}

impl Responder {
    pub fn start(&mut self, epsn: Psn) {
        *self = Responder { epsn, ..Responder::default() };
    }

    /// Is the next answer a plain ACK?
    pub fn next_is_ack(&self) -> bool {
        matches!(self.answers.front(), Some(Answer::Ack { .. }))
    }

    pub fn has_output(&self) -> bool {
        !self.answers.is_empty()
    }

    /// Sending the last answers of a QP that a fatal error stopped?
    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Stops answering (unless draining the answers owed before a fatal
    /// error) and gives back the receive work requests taken for messages
    /// not yet complete, for flushing.
    pub fn abandon(&mut self) -> Vec<RecvWorkRequest> {
        if !self.draining {
            self.answers.clear();
        }
        let mut taken = self.ahead.abandon();
        if let Some(Message::Send { recv, .. }) = self.current.take() {
            taken.insert(0, recv);
        }
        if let Some(spare) = self.spare.take() {
            taken.insert(0, spare);
        }
        taken
    }

    /// UC: drops the message in progress; a receive it had taken is kept
    /// for the next message.
    pub(super) fn drop_message(&mut self) {
        self.dropping = true;
        if let Some(Message::Send { recv, .. }) = self.current.take() {
            debug_assert!(self.spare.is_none(), "a message takes the spare before the queue's");
            self.spare = Some(recv);
        }
    }

    /// Whether a SEND or WRITE has started and not yet ended.
    pub(super) fn message_in_progress(&self) -> bool {
        self.current.is_some()
    }

    /// Takes the receive work request of the message being received, when
    /// it fails.
    pub(super) fn take_current_receive(&mut self) -> Option<RecvWorkRequest> {
        match self.current.take() {
            Some(Message::Send { recv, .. }) => Some(recv),
            _ => self.ahead.take_first_claim(),
        }
    }

    pub(super) fn queue_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Answer::Ack { psn: p, msn: m }) = self.answers.back_mut() {
            *p = psn;
            *m = msn;
        } else {
            self.answers.push_back(Answer::Ack { psn, msn });
        }
    }

    /// Queues `replay`, the responses a repeated READ request asks for
    /// again, beside the response streams already queued.
    ///
    /// Go-back-N asks again for everything from the first response it
    /// misses: a stream still queued for the same READ is replaced, not
    /// sent alongside. Selective repeat asks for a hole, and the rest of a
    /// stream is still wanted; but a request that a queued stream will
    /// answer anyway adds nothing, and one that asks for all a stream has
    /// left to send, and more, takes its place. Queuing each repeat beside
    /// the last made a paced responder's backlog grow with every timeout of
    /// a requester waiting behind it, until the backlog outlasted the
    /// requester's retries (simulator seeds 100037 and 940176).
    fn queue_replay(&mut self, mut replay: ReadResponse, selective_repeat: bool) {
        let (first, end) = (replay.first_psn, replay.first_psn.add(replay.count));
        for answer in self.answers.iter_mut() {
            let Answer::Read(queued) = answer else { continue };
            let (unsent, queued_end) = (queued.first_psn.add(queued.next), queued.first_psn.add(queued.count));
            if !(queued.first_psn.is_at_or_before(first) && first.is_before(queued_end)) {
                continue;
            }
            if selective_repeat && unsent.is_at_or_before(first) && end.is_at_or_before(queued_end) {
                return;
            }
            if !selective_repeat || (first.is_at_or_before(unsent) && queued_end.is_at_or_before(end)) {
                // It takes the queued stream's place, and its resource: an
                // original's still counts against max_dest_rd_atomic.
                replay.replay = queued.replay;
                *queued = replay;
                return;
            }
        }
        // However many repeats arrive, a bounded number wait.
        if self.replays_queued() < usize::from(MAX_RD_ATOMIC) {
            self.answers.push_back(Answer::Read(replay));
        }
    }

    /// Ends the QP's answers with the NAK of a fatal error.
    fn fail(&mut self, psn: Psn, code: NakCode) {
        self.answers.push_back(Answer::FatalNak { psn, code, msn: self.msn });
        self.draining = true;
    }

    /// READ responses queued to answer repeats.
    fn replays_queued(&self) -> usize {
        self.answers.iter().filter(|a| matches!(a, Answer::Read(ReadResponse { replay: true, .. }))).count()
    }

    /// READ and ATOMIC requests still holding a responder resource.
    fn reads_and_atomics_pending(&self) -> usize {
        self.answers
            .iter()
            .filter(|a| {
                matches!(a, Answer::Read(ReadResponse { replay: false, .. }) | Answer::AtomicAck { replay: false, .. })
            })
            .count()
    }
}

impl QueuePair {
    /// The responder's invariants, asserted after every request (TigerBeetle
    /// style: the simulator's seeds run them): READs and ATOMICs hold no
    /// more responder resources than the QP granted (`max_dest_rd_atomic`);
    /// the receive queue, whose depth the AETH's credits advertise, holds
    /// no more than `max_recv_wr`; selective repeat keeps nothing beyond
    /// its window; it keeps no more than [`MAX_RD_ATOMIC`] READs, and as many
    /// repeats of them wait at most.
    pub(super) fn assert_responder(&self) {
        let resources = usize::from(self.attrs.max_dest_rd_atomic.max(1));
        let held = self.resp.reads_and_atomics_pending();
        assert!(held <= resources, "QP {}: {held} READs and ATOMICs held, {resources} granted", self.qpn);
        let depth = self.init.caps.max_recv_wr as usize;
        assert!(self.rq.len() <= depth, "QP {}: {} receives queued, room for {depth}", self.qpn, self.rq.len());
        let (kept, replays) = (self.resp.reads.len(), self.resp.replays_queued());
        assert!(kept <= usize::from(MAX_RD_ATOMIC), "QP {}: {kept} READs kept", self.qpn);
        assert!(replays <= usize::from(MAX_RD_ATOMIC), "QP {}: {replays} repeated READs queued", self.qpn);
        self.resp.ahead.assert_within_window(self.qpn);
    }

    /// Consumes a request packet.
    pub(super) fn respond(&mut self, ctx: &mut Ctx, packet: &Packet) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return;
        }
        if self.attrs.selective_repeat {
            self.respond_selectively(ctx, packet);
            return;
        }
        let psn = packet.headers.bth.psn;
        let distance = psn.distance_from(self.resp.epsn);
        if distance > 0 {
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                ctx.counters.seq_naks_sent += 1;
                let (epsn, msn) = (self.resp.epsn, self.resp.msn);
                self.resp.answers.push_back(Answer::SequenceNak { psn: epsn, msn });
            }
            ctx.counters.rx_out_of_sequence += 1;
            return;
        }
        if distance < 0 {
            ctx.counters.rx_duplicate_requests += 1;
            self.answer_duplicate(ctx, packet);
            return;
        }
        match self.execute(ctx, packet) {
            Ok(psns) => {
                self.resp.epsn = self.resp.epsn.add(psns);
                self.resp.nak_sent = false;
                let op = packet.headers.bth.opcode;
                if packet.headers.bth.ack_request && (op.is_send() || op.is_write()) {
                    // The last PSN the packet stands for.
                    self.resp.queue_ack(psn.add(psns - 1));
                }
            }
            Err(refusal) => self.refuse(ctx, psn, refusal),
        }
    }

    /// Answers the request at `psn`, which did not execute: an RNR NAK, or
    /// the NAK of a fatal error and the error state.
    pub(super) fn refuse(&mut self, ctx: &mut Ctx, psn: Psn, refusal: Refusal) {
        match refusal {
            // Nothing happened: the same request comes again.
            Refusal::AwaitingReceives => debug_assert!(ctx.held),
            Refusal::ReceiverNotReady => {
                ctx.counters.rnr_naks_sent += 1;
                self.resp.nak_sent = true;
                let msn = self.resp.msn;
                self.resp.answers.push_back(Answer::RnrNak { psn, msn });
            }
            Refusal::Fatal(code, recv_status) => {
                ctx.counters.fatal_naks_sent += 1;
                if let (Some(status), Some(recv)) = (recv_status, self.resp.take_current_receive()) {
                    self.complete_recv(ctx, Completion::new(recv.wr_id, status, WcOpcode::Recv, self.qpn));
                }
                self.resp.fail(psn, code);
                let qpn = self.qpn;
                ctx.events.push_back(match code {
                    NakCode::RemoteAccessError => AsyncEvent::QpAccessError { qpn },
                    NakCode::InvalidRequest => AsyncEvent::QpRequestError { qpn },
                    _ => AsyncEvent::QpFatal { qpn },
                });
                self.enter_error(ctx, false);
            }
        }
    }

    /// Does the QP's own access allow remote requests of `op`?
    pub(super) fn permits(&self, op: Opcode) -> bool {
        match op {
            _ if op.is_write() || op == Opcode::RcAtomicWrite => self.attrs.access.contains(Access::REMOTE_WRITE),
            Opcode::RcReadRequest => self.attrs.access.contains(Access::REMOTE_READ),
            _ if op.is_atomic() => self.attrs.access.contains(Access::REMOTE_ATOMIC),
            _ => true,
        }
    }

    /// The PSNs a SEND or WRITE payload stands for, if it has the length
    /// its position in the message calls for. Every packet but the last
    /// of a message carries exactly one MTU; one by reference, on a
    /// connection where packets span ([`QueuePair::spans`]), a whole
    /// number of them up to [`by_reference::MAX_SPAN_BYTES`], and stands
    /// for as many PSNs (a last one for as many as its bytes begin).
    pub(super) fn span_of(&self, position: Position, body: &Body) -> Option<u32> {
        let (mtu, len) = (self.mtu() as usize, body.len());
        let most = if body.by_reference() && self.spans() { by_reference::MAX_SPAN_BYTES.max(mtu) } else { mtu };
        let fits = match position {
            Position::First | Position::Middle => len > 0 && len.is_multiple_of(mtu) && len <= most,
            Position::Last => (1..=most).contains(&len),
            Position::Only => len <= most,
        };
        fits.then(|| by_reference::span(len, mtu as u32))
    }

    /// Executes the request at `epsn`; returns how many PSNs it used.
    pub(super) fn execute(&mut self, ctx: &mut Ctx, packet: &Packet) -> Result<u32, Refusal> {
        let op = packet.headers.bth.opcode;
        let invalid = Refusal::Fatal(NakCode::InvalidRequest, None);
        let position = op.position().ok_or(invalid)?;
        // Continuation packets must continue the message in progress, and
        // only they may.
        let continues = matches!(
            (&self.resp.current, op.rc_twin()),
            (
                Some(Message::Send { .. }),
                Opcode::RcSendMiddle | Opcode::RcSendLast | Opcode::RcSendLastImm | Opcode::RcSendLastInv
            ) | (Some(Message::Write { .. }), Opcode::RcWriteMiddle | Opcode::RcWriteLast | Opcode::RcWriteLastImm)
        );
        if continues == position.starts_message() {
            return Err(invalid);
        }
        // The QP's own access flags gate each kind of remote operation.
        if !self.permits(op) {
            return Err(invalid);
        }
        match op {
            _ if op.is_send() || op.is_write() => {
                let psns = self.span_of(position, &packet.body).ok_or(invalid)?;
                match op.is_send() {
                    true => self.execute_send(ctx, packet, position),
                    false => self.execute_write(ctx, packet, position),
                }
                .map(|()| psns)
            }
            Opcode::RcReadRequest => self.execute_read(ctx, packet),
            _ if op.is_atomic() => self.execute_atomic(ctx, packet).map(|()| 1),
            Opcode::RcAtomicWrite => self.execute_atomic_write(ctx, packet).map(|()| 1),
            _ => Err(invalid),
        }
    }

    fn execute_send(&mut self, ctx: &mut Ctx, packet: &Packet, position: Position) -> Result<(), Refusal> {
        if position.starts_message() {
            let recv = self.take_recv(ctx)?;
            let capacity = match validate_list(ctx.memory, self.init.pd, &recv.sges, Access::LOCAL_WRITE) {
                Ok(capacity) => capacity,
                Err(_) => {
                    self.resp.current = Some(Message::Send { recv, capacity: 0, offset: 0 });
                    return Err(Refusal::Fatal(NakCode::RemoteOperationalError, Some(WcStatus::LocProtErr)));
                }
            };
            self.resp.current = Some(Message::Send { recv, capacity, offset: 0 });
        }
        let Some(Message::Send { recv, capacity, offset }) = &mut self.resp.current else { unreachable!() };
        let len = packet.body.len() as u64;
        if *offset + len > *capacity {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, Some(WcStatus::LocLenErr)));
        }
        if scatter(ctx.memory, self.init.pd, &recv.sges, *offset, packet.body).is_err() {
            return Err(Refusal::Fatal(NakCode::RemoteOperationalError, Some(WcStatus::LocProtErr)));
        }
        *offset += len;
        if position.ends_message() {
            let ext = &packet.headers.ext;
            if let Some(rkey) = ext.invalidate_rkey {
                self.invalidate_for_peer(ctx, rkey)?;
            }
            let Some(Message::Send { recv, offset, .. }) = self.resp.current.take() else { unreachable!() };
            let mut completion = Completion::new(recv.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
            completion.byte_len = offset as u32;
            completion.imm_data = ext.immediate;
            completion.invalidated_rkey = ext.invalidate_rkey;
            completion.solicited = packet.headers.bth.solicited;
            self.complete_recv(ctx, completion);
            self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        }
        Ok(())
    }

    /// The last packet of a SEND with invalidate: the rkey it names, a
    /// type 2 window's in this QP's protection domain, is invalidated
    /// before the receive completes. One that cannot be is the IBTA's
    /// class J error: the receive completes with `RemInvReqErr`, the
    /// requester is told the request was invalid, and both QPs fail.
    pub(super) fn invalidate_for_peer(&self, ctx: &Ctx, rkey: u32) -> Result<(), Refusal> {
        ctx.memory
            .invalidate(self.init.pd, rkey)
            .map_err(|_| Refusal::Fatal(NakCode::InvalidRequest, Some(WcStatus::RemInvReqErr)))
    }

    fn execute_write(&mut self, ctx: &mut Ctx, packet: &Packet, position: Position) -> Result<(), Refusal> {
        // A WRITE with immediate consumes a receive. It is taken before a
        // byte is written: the retry after an RNR NAK then starts clean,
        // and no other QP of a shared receive queue can take it between a
        // look and its use (one could, and the WRITE was then refused with
        // its bytes already placed). A WRITE refused after taking it leaves
        // it as the QP's spare: the next message takes it (UC), or it is
        // flushed with the QP (RC).
        let recv = match packet.headers.ext.immediate {
            Some(imm) => Some((imm, self.take_recv(ctx)?)),
            None => None,
        };
        let placed = self.place_write(ctx, packet, position);
        match (&placed, recv) {
            (Ok(Some(len)), Some((imm, recv))) => {
                let mut completion =
                    Completion::new(recv.wr_id, WcStatus::Success, WcOpcode::RecvRdmaWithImm, self.qpn);
                completion.byte_len = *len as u32;
                completion.imm_data = Some(imm);
                completion.solicited = packet.headers.bth.solicited;
                self.complete_recv(ctx, completion);
            }
            // Refused, or nothing to complete it with (only a last packet
            // carries an immediate): the receive goes back as the spare,
            // which `take_recv` took first, so none is lost.
            (_, Some((_, recv))) => self.resp.spare = Some(recv),
            (_, None) => {}
        }
        if placed?.is_some() {
            self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        }
        Ok(())
    }

    /// Checks a WRITE packet against its key and places its payload;
    /// returns the message's length once its last packet is placed.
    fn place_write(&mut self, ctx: &mut Ctx, packet: &Packet, position: Position) -> Result<Option<u64>, Refusal> {
        if position.starts_message() {
            let reth = packet.headers.ext.reth.ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
            let len = u64::from(reth.dma_length);
            ctx.memory
                .check_remote(
                    self.init.pd,
                    self.qpn,
                    reth.rkey,
                    reth.virtual_address,
                    len as usize,
                    Access::REMOTE_WRITE,
                )
                .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
            self.resp.current = Some(Message::Write { va: reth.virtual_address, rkey: reth.rkey, len, offset: 0 });
        }
        let Some(Message::Write { va, rkey, len, offset }) = &mut self.resp.current else { unreachable!() };
        let payload_len = packet.body.len() as u64;
        if *offset + payload_len > *len {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        let view = ctx
            .memory
            .check_remote(
                self.init.pd,
                self.qpn,
                *rkey,
                va.wrapping_add(*offset),
                payload_len as usize,
                Access::REMOTE_WRITE,
            )
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
        packet.body.place(0, &view);
        *offset += payload_len;
        if !position.ends_message() {
            return Ok(None);
        }
        let (len, offset) = (*len, *offset);
        self.resp.current = None;
        if offset != len {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        Ok(Some(len))
    }

    fn execute_read(&mut self, ctx: &mut Ctx, packet: &Packet) -> Result<u32, Refusal> {
        let reth = packet.headers.ext.reth.ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
        if self.resp.reads_and_atomics_pending() >= usize::from(self.attrs.max_dest_rd_atomic.max(1)) {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        let response = self.read_response(ctx, packet.headers.bth.psn, reth)?;
        let executed = ExecutedRead {
            first_psn: response.first_psn,
            count: response.count,
            va: response.va,
            rkey: response.rkey,
            len: response.len,
        };
        let reads = &mut self.resp.reads;
        reads.push_back(executed);
        while reads.len() > usize::from(MAX_RD_ATOMIC) {
            reads.pop_front();
        }
        self.resp.answers.push_back(Answer::Read(response));
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        Ok(response.count)
    }

    /// Checks a READ's target and plans its responses.
    fn read_response(&self, ctx: &Ctx, psn: Psn, reth: softrnic_wire::reth::Repr) -> Result<ReadResponse, Refusal> {
        let len = u64::from(reth.dma_length);
        ctx.memory
            .check_remote(self.init.pd, self.qpn, reth.rkey, reth.virtual_address, len as usize, Access::REMOTE_READ)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
        let count = len.div_ceil(u64::from(self.mtu())).max(1) as u32;
        Ok(ReadResponse {
            first_psn: psn,
            va: reth.virtual_address,
            rkey: reth.rkey,
            len,
            next: 0,
            count,
            replay: false,
        })
    }

    fn execute_atomic(&mut self, ctx: &mut Ctx, packet: &Packet) -> Result<(), Refusal> {
        let atomic = packet.headers.ext.atomic_eth.ok_or(Refusal::Fatal(NakCode::InvalidRequest, None))?;
        if self.resp.reads_and_atomics_pending() >= usize::from(self.attrs.max_dest_rd_atomic.max(1)) {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        if atomic.virtual_address % 8 != 0 {
            return Err(Refusal::Fatal(NakCode::InvalidRequest, None));
        }
        let view = ctx
            .memory
            .check_remote(self.init.pd, self.qpn, atomic.rkey, atomic.virtual_address, 8, Access::REMOTE_ATOMIC)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
        let original = if packet.headers.bth.opcode == Opcode::RcCompareSwap {
            view.atomic_update(|v| if v == atomic.compare { atomic.swap_or_add } else { v })
        } else {
            view.atomic_update(|v| v.wrapping_add(atomic.swap_or_add))
        };
        self.answer_atomic(packet.headers.bth.psn, Some(original));
        Ok(())
    }

    /// IBTA 1.5's ATOMIC WRITE: 8 bytes, 8-aligned, stored as one under
    /// the remote write right; answered like an ATOMIC, and holding a
    /// responder resource until answered, as rxe does.
    fn execute_atomic_write(&mut self, ctx: &mut Ctx, packet: &Packet) -> Result<(), Refusal> {
        let invalid = Refusal::Fatal(NakCode::InvalidRequest, None);
        let reth = packet.headers.ext.reth.ok_or(invalid)?;
        if self.resp.reads_and_atomics_pending() >= usize::from(self.attrs.max_dest_rd_atomic.max(1)) {
            return Err(invalid);
        }
        let value: [u8; 8] = packet.body.word().ok_or(invalid)?;
        if reth.dma_length != 8 || reth.virtual_address % 8 != 0 {
            return Err(invalid);
        }
        let view = ctx
            .memory
            .check_remote(self.init.pd, self.qpn, reth.rkey, reth.virtual_address, 8, Access::REMOTE_WRITE)
            .map_err(|_| Refusal::Fatal(NakCode::RemoteAccessError, None))?;
        // The bytes land as they came, all at once.
        view.atomic_update(|_| u64::from_ne_bytes(value));
        self.answer_atomic(packet.headers.bth.psn, None);
        Ok(())
    }

    /// Answers the ATOMIC (or ATOMIC WRITE) at `psn` that executed, and
    /// keeps its answer for a repeat of it.
    fn answer_atomic(&mut self, psn: Psn, original: Option<u64>) {
        let replay = &mut self.resp.atomic_replay;
        replay.push_back((psn, original));
        while replay.len() > usize::from(MAX_RD_ATOMIC) {
            replay.pop_front();
        }
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        let msn = self.resp.msn;
        self.resp.answers.push_back(Answer::AtomicAck { psn, msn, original, replay: false });
    }

    /// Answers a request the responder has already executed.
    pub(super) fn answer_duplicate(&mut self, ctx: &mut Ctx, packet: &Packet) {
        let psn = packet.headers.bth.psn;
        let op = packet.headers.bth.opcode;
        match op {
            Opcode::RcReadRequest => {
                let Some(reth) = packet.headers.ext.reth else {
                    return;
                };
                // A repeat asks for part of a READ this side executed and
                // still keeps, with its key, its bytes and its PSNs only.
                let count = u64::from(reth.dma_length).div_ceil(u64::from(self.mtu())).max(1) as u32;
                let original = self.resp.reads.iter().rev().find(|r| r.allows(psn, &reth, count));
                if original.is_none() || self.resp.epsn.is_before(psn.add(count)) {
                    ctx.counters.rx_malformed += 1;
                    return;
                }
                match self.read_response(ctx, psn, reth) {
                    Ok(response) => {
                        self.resp.queue_replay(ReadResponse { replay: true, ..response }, self.attrs.selective_repeat)
                    }
                    // The region went away since the READ executed (its
                    // responses were lost, or on this host named memory
                    // that was gone when they arrived): the repeat fails
                    // as the READ itself would now, rather than going
                    // unanswered until the requester's retries run out.
                    Err(refusal) => self.refuse(ctx, psn, refusal),
                }
            }
            _ if op.is_atomic() || op == Opcode::RcAtomicWrite => {
                // The same kind of request: an ATOMIC's answer carries a
                // value, an ATOMIC WRITE's none.
                let same = |original: &Option<u64>| original.is_some() == op.is_atomic();
                let replay = self.resp.atomic_replay.iter().find(|(p, original)| *p == psn && same(original));
                if let Some(&(_, original)) = replay {
                    let msn = self.resp.msn;
                    self.resp.answers.push_back(Answer::AtomicAck { psn, msn, original, replay: true });
                }
            }
            // SEND and WRITE: acknowledge everything received so far.
            _ => self.resp.queue_ack(self.resp.epsn.sub(1)),
        }
    }

    pub(super) fn answer_headers(&self, opcode: Opcode, psn: Psn, syndrome: Option<Syndrome>, msn: u32) -> Headers {
        Headers {
            bth: bth::Repr::new(opcode, self.attrs.dest_qpn, psn),
            ext: Extensions { aeth: syndrome.map(|syndrome| aeth::Repr { syndrome, msn }), ..Extensions::default() },
        }
    }

    /// End-to-end credits to advertise: the receives the program has
    /// posted and no message has consumed (those it posted since the
    /// shard's last pass count: a message finds them), or "unlimited" for
    /// a QP on an SRQ, which has no credits of its own, and for one whose
    /// receives are fetched on demand, which the transport cannot count
    /// (softrnicd's ring holds them; a message that finds none asks).
    pub(super) fn credits(&self) -> Syndrome {
        let uncounted = self.init.srq.is_some() || self.posts.fetched_on_demand();
        let credit_code = match uncounted {
            true => aeth::CREDITS_UNLIMITED,
            false => aeth::credit_code(self.posts.receives_held()),
        };
        Syndrome::Ack { credit_code }
    }

    /// Builds the next answer packet.
    pub(super) fn poll_response(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) && !self.resp.draining {
            return None;
        }
        let dst = self.attrs.remote_addr?;
        let answer = *self.resp.answers.front()?;
        // Under congestion control READ responses are this side's data: the
        // pacer spaces them as it spaces requests (the roles of the ends
        // swap). A user's rate limit alone limits requests, as a NIC's
        // send-queue rate limiter does.
        let paces_responses = self.congestion_rate().is_some();
        if paces_responses && matches!(answer, Answer::Read(_)) && self.paced(ctx) {
            return None;
        }
        // PSNs the answer stands for: several for a READ response by
        // reference.
        let mut span = 1;
        let (mut headers, payload_len) = match answer {
            Answer::Ack { psn, msn } => (self.answer_headers(Opcode::RcAck, psn, Some(self.credits()), msn), 0),
            Answer::SequenceNak { psn, msn } => {
                (self.answer_headers(Opcode::RcAck, psn, Some(Syndrome::Nak(NakCode::PsnSequenceError)), msn), 0)
            }
            Answer::RnrNak { psn, msn } => {
                let timer = self.attrs.min_rnr_timer;
                (self.answer_headers(Opcode::RcAck, psn, Some(Syndrome::RnrNak { timer }), msn), 0)
            }
            Answer::AtomicAck { psn, msn, original: Some(original), .. } => {
                let mut headers = self.answer_headers(Opcode::RcAtomicAck, psn, Some(self.credits()), msn);
                headers.ext.atomic_ack = Some(original);
                (headers, 0)
            }
            Answer::AtomicAck { psn, msn, original: None, .. } => {
                (self.answer_headers(Opcode::RcReadResponseOnly, psn, Some(self.credits()), msn), 0)
            }
            Answer::FatalNak { psn, code, msn } => {
                (self.answer_headers(Opcode::RcAck, psn, Some(Syndrome::Nak(code)), msn), 0)
            }
            Answer::SelectiveNak => (self.selective_nak(ctx), 0),
            Answer::Read(read) => match self.read_response_packet(ctx, read, buf) {
                Ok((headers, len, psns)) => {
                    span = psns;
                    (headers, len)
                }
                Err(_) => {
                    // The region went away under a READ in progress: the
                    // READ fails, and nothing after it is answered.
                    self.resp.answers.clear();
                    self.resp.fail(read.first_psn.add(read.next), NakCode::RemoteAccessError);
                    self.enter_error(ctx, false);
                    return self.poll_response(ctx, buf);
                }
            },
        };
        if matches!(answer, Answer::FatalNak { .. }) {
            self.resp.draining = false;
        }
        match self.resp.answers.front_mut() {
            Some(Answer::Read(read)) if read.next + span < read.count => read.next += span,
            _ => {
                self.resp.answers.pop_front();
            }
        }
        let is_data = matches!(answer, Answer::Read(_));
        if !is_data {
            // DCTCP's echo: this ACK says CE arrived since the last one.
            headers.bth.becn = std::mem::take(&mut self.np.ce_unechoed);
        }
        let len = headers.emit_around_payload(buf, payload_len).ok()?;
        if is_data {
            if paces_responses {
                self.on_data_sent(ctx, len);
            }
            return Some(Transmit::new(dst, len));
        }
        Some(Transmit { int: self.answer_int(), ..Transmit::new(dst, len) })
    }

    /// Writes the payload of a READ's next response into `buf`; returns
    /// its headers, the payload's length in the datagram and the PSNs the
    /// response stands for (several by reference, as for requests).
    fn read_response_packet(
        &self,
        ctx: &mut Ctx,
        read: ReadResponse,
        buf: &mut [u8],
    ) -> Result<(Headers, usize, u32), AccessFault> {
        let mtu = u64::from(self.mtu());
        let offset = u64::from(read.next) * mtu;
        let one_mtu = (read.len - offset).min(mtu) as usize;
        // The widest response it may send (one MTU unless by reference),
        // checked once; then its references, which decide how many MTUs
        // it carries, its opcode, and so where its payload starts.
        let most = self.max_span(ctx).min(read.count - read.next);
        let wide = (read.len - offset).min(mtu * u64::from(most)) as usize;
        let view = ctx.memory.check_remote(
            self.init.pd,
            self.qpn,
            read.rkey,
            read.va.wrapping_add(offset),
            wide,
            Access::REMOTE_READ,
        )?;
        let mut references = [0u8; by_reference::MAX_REFERENCES_LEN];
        let referenced = match ctx.by_reference {
            true => by_reference::refer_to_view(&view, mtu as usize, &mut references),
            false => None,
        };
        let payload_len = referenced.map_or(one_mtu, |(_, len)| len);
        let span = by_reference::span(payload_len, mtu as u32);
        let opcode = match (read.next == 0, read.next + span == read.count) {
            (true, true) => Opcode::RcReadResponseOnly,
            (true, false) => Opcode::RcReadResponseFirst,
            (false, false) => Opcode::RcReadResponseMiddle,
            (false, true) => Opcode::RcReadResponseLast,
        };
        let syndrome = (opcode != Opcode::RcReadResponseMiddle).then(|| self.credits());
        let headers = self.answer_headers(opcode, read.first_psn.add(read.next), syndrome, self.resp.msn);
        let start = headers.len();
        if let Some((n, _)) = referenced {
            buf[start..start + n].copy_from_slice(&references[..n]);
            ctx.referenced = Some(packet_len(start, payload_len));
            ctx.counters.tx_spanning += u64::from(span > 1);
            return Ok((headers, n, span));
        }
        view.part(0, one_mtu).read(&mut buf[start..start + one_mtu]);
        Ok((headers, one_mtu, 1))
    }
}
