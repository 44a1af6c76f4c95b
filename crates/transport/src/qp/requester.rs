//! The requester: send work requests become request packets.
//!
//! Each request gets a contiguous run of PSNs the first time it is sent.
//! Retransmission is go-back-N, as RoCE NICs do it: the completer moves the
//! send cursor back to a PSN and the requester sends everything from there
//! again, with the same PSNs. A READ retransmitted from its k-th response
//! asks only for the rest of the data, from PSN first + k (IBTA 9.4.4).
//!
//! Under selective repeat the repairs the scoreboard queues go first, and
//! a go-back (after a timeout or an RNR NAK) skips what the responder has
//! reported holding.

use softrnic_wire::aeth;
use softrnic_wire::packet::{Extensions, Headers, packet_len};
use softrnic_wire::{Opcode, Psn, atomic_eth, bth, reth, sreth};

use super::completer::response_missing;
use super::credits::{Admission, Credits};
use super::rto::{Retransmission, RtoEstimator};
use super::scoreboard::{self, Resend, Scoreboard};
use super::{Ctx, QpAttributes, QpState, QpType, QueuePair, Transmit};
use crate::by_reference;
use crate::completion::WcStatus;
use crate::memory::{Access, gather, validate_list};
use crate::time::{Instant, ack_timeout};
use crate::work_request::{Payload, RemoteAddr, SendOp};

/// The requester's position and timers.
#[derive(Debug, Default)]
pub(super) struct Requester {
    /// The PSN the next request not yet started will take.
    pub next_psn: Psn,
    /// The oldest PSN not yet acknowledged (or, for READ and ATOMIC,
    /// answered).
    pub una: Psn,
    /// One past the highest PSN ever sent.
    pub sent_end: Psn,
    /// Index in the send queue of the request being sent.
    pub cursor: usize,
    /// Packet (or READ response) index within that request.
    pub cursor_pkt: u32,
    pub retries_left: u8,
    pub rnr_retries_left: u8,
    /// When to retransmit if no progress is made.
    pub retry_deadline: Option<Instant>,
    /// The adaptive timer's estimate of the path.
    pub rto: RtoEstimator,
    /// When the flight last made progress (or began): a retry is spent
    /// once the QP's `timeout` has passed since, or since the last retry
    /// spent after it.
    pub progress_at: Instant,
    /// When a retry was last spent.
    pub retry_spent_at: Option<Instant>,
    /// Sending waits until then after an RNR NAK.
    pub rnr_until: Option<Instant>,
    /// READ and ATOMIC requests started and not yet completed.
    pub rd_atomic_outstanding: u32,
    /// The PSN the requester last went back to on a NAK or a missing
    /// response. Until `una` passes it, further evidence of the same gap
    /// (responses of the old stream, duplicated NAKs) is ignored: one
    /// retransmission per gap, and the timer for a lost one.
    pub recovering_from: Option<Psn>,
    /// Go-back-N: the highest response of the READ awaited that arrived
    /// beyond its hole since `una` last moved (`beyond_the_hole`).
    pub past_the_hole: Option<Psn>,
    /// End-to-end credits: the receives the responder holds, as far as
    /// its acknowledgements have said.
    pub credits: Credits,
    /// The request at the cursor waits for credits (counted once).
    pub waiting_for_credits: bool,
    /// Selective repeat: the number the next message that consumes a
    /// receive at the responder takes.
    pub receive_number: u32,
    /// Selective repeat: what the responder holds, what to send again.
    pub scoreboard: Scoreboard,
    /// Selective repeat: when a repaired READ response or ATOMIC result
    /// is due (`Scoreboard::on_response_repair_timer`).
    pub repair_deadline: Option<Instant>,
}

impl Requester {
    pub fn start(&mut self, attrs: &QpAttributes) {
        *self = Requester {
            next_psn: attrs.sq_psn,
            una: attrs.sq_psn,
            sent_end: attrs.sq_psn,
            retries_left: attrs.retry_cnt,
            rnr_retries_left: attrs.rnr_retry,
            ..Requester::default()
        };
    }

    pub fn stop(&mut self) {
        self.retry_deadline = None;
        self.rnr_until = None;
        self.repair_deadline = None;
    }

    /// Are packets in flight that nobody has acknowledged yet?
    pub fn outstanding(&self) -> bool {
        self.una != self.sent_end
    }

    pub fn deadline(&self) -> Option<Instant> {
        crate::time::earliest([self.retry_deadline, self.rnr_until, self.repair_deadline])
    }
}

impl QueuePair {
    /// Most PSNs the requester keeps unacknowledged: the device's window,
    /// within what a selective-repeat responder accepts.
    pub(super) fn window(&self, ctx: &Ctx) -> u32 {
        let device = self.device_window(ctx);
        self.congestion_window_packets().map_or(device, |cc| cc.min(device))
    }

    /// The window without congestion control's: fixed for the QP's life,
    /// so READs are cut into the same chunks however the window moves.
    fn device_window(&self, ctx: &Ctx) -> u32 {
        let window = ctx.config.max_inflight_packets.max(1);
        if self.attrs.selective_repeat { window.min(scoreboard::WINDOW) } else { window }
    }

    /// Builds the next request packet, if the window, the READ/ATOMIC limit
    /// and any fence allow one.
    pub(super) fn poll_request(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return None;
        }
        let repairing = self.req.scoreboard.has_queued();
        if self.pacer.is_some_and(|p| !p.may_send(ctx.now)) {
            if repairing || self.req.cursor < self.sq.len() {
                self.paced(ctx);
            }
            return None;
        }
        let dst = self.attrs.remote_addr?;
        let int = self.request_int(ctx);
        if repairing && let Some(len) = self.poll_repair(ctx, buf) {
            return Some(Transmit { int, ..Transmit::new(dst, len) });
        }
        let (index, psn, is_new) = loop {
            let index = self.req.cursor;
            let wqe = self.sq.get(index)?;
            if wqe.wr.op.is_local() {
                if !self.run_local(ctx, index) {
                    return None;
                }
                continue;
            }
            // A request that failed locally stops the queue: retransmissions
            // of earlier ones may still go out, nothing from it on.
            if wqe.status.is_some() {
                return None;
            }
            if wqe.first_psn.is_none() && !self.may_start(ctx, index) {
                return None;
            }
            let wqe = &self.sq[index];
            let psn = wqe.first_psn?.add(self.req.cursor_pkt);
            let is_new = !psn.is_before(self.req.sent_end);
            // Going back, skip what the responder reported holding, and
            // under selective repeat the READ responses already placed: a
            // READ asked for whole again would be answered whole, and a
            // paced responder resending what arrived holds back what did
            // not (seed 7011119: 442 responses resent ahead of the hole).
            let held = match wqe.wr.op {
                SendOp::Read { .. } => self.attrs.selective_repeat && wqe.has_response(self.req.cursor_pkt),
                _ => !wqe.is_read_or_atomic() && self.req.scoreboard.has_arrived(psn),
            };
            if !is_new && held {
                self.advance_cursor(1);
                continue;
            }
            break (index, psn, is_new);
        };
        let wqe = &self.sq[index];
        if is_new && psn.distance_from(self.req.una) >= self.window(ctx) as i32 {
            return None;
        }
        // The next chunk of a long READ waits until the previous one has
        // been answered in full.
        if is_new && self.req.cursor_pkt > 0 && matches!(wqe.wr.op, SendOp::Read { .. }) && self.req.una != psn {
            return None;
        }

        let k = self.req.cursor_pkt;
        let read_chunk = if !is_new && self.attrs.selective_repeat {
            self.missing_responses(ctx, index, k)
        } else {
            self.read_chunk(ctx, index, k)
        };
        // PSNs the packet accounts for: a READ request stands for all the
        // responses it asks for, a payload by reference for the MTUs it
        // carries (within the window).
        let built = match wqe.wr.op {
            SendOp::Read { .. } => self.build_read_request(buf, index, k, read_chunk).map(|len| (len, read_chunk)),
            op if op.is_atomic() => self.build_atomic(buf, index, psn).map(|len| (len, 1)),
            _ => {
                let room = (self.window(ctx) as i32 - psn.distance_from(self.req.una)).max(1) as u32;
                self.build_send_or_write(ctx, buf, index, k, self.max_span(ctx).min(room))
            }
        };
        let (len, span) = match built {
            Ok(built) => built,
            Err(status) => {
                self.fail_locally(ctx, index, status);
                return None;
            }
        };
        let end = psn.add(span);
        if !self.req.outstanding() {
            self.req.progress_at = ctx.now;
        }
        if is_new {
            self.req.rto.on_new_packet(psn, ctx.now);
            if softrnic_wire::bth::Header::new_unchecked(&buf[..len]).ack_request() {
                self.time_for_congestion_control(ctx, psn);
            }
        } else {
            self.req.rto.on_retransmit(psn);
            self.forget_timed_for_congestion_control();
        }
        if self.req.sent_end.is_before(end) {
            self.req.sent_end = end;
        }
        if !is_new {
            ctx.counters.retransmitted_packets += 1;
        }
        self.advance_cursor(span);
        self.on_request_sent(ctx, len);
        Some(Transmit { int, ..Transmit::new(dst, len) })
    }

    /// Moves the cursor `span` PSNs on within its request, or to the next.
    fn advance_cursor(&mut self, span: u32) {
        if self.req.cursor_pkt + span >= self.sq[self.req.cursor].npsn {
            self.req.cursor += 1;
            self.req.cursor_pkt = 0;
        } else {
            self.req.cursor_pkt += span;
        }
    }

    /// A request packet of `len` bytes left: the timer runs, the pacer
    /// and congestion control count it.
    fn on_request_sent(&mut self, ctx: &Ctx, len: usize) {
        if self.req.retry_deadline.is_none() {
            self.arm_retry_timer(ctx);
        }
        self.on_data_sent(ctx, len);
    }

    /// Selective repeat: sends the next repair the scoreboard queued, if
    /// one is still wanted. Returns the packet's length.
    fn poll_repair(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<usize> {
        while let Some(what) = self.req.scoreboard.next(self.req.una) {
            let psn = what.psn();
            let Some((index, k)) = self.sq.iter().enumerate().find_map(|(i, w)| Some((i, w.index_of(psn)?))) else {
                continue;
            };
            let wqe = &self.sq[index];
            if wqe.status.is_some() {
                continue;
            }
            let built = match (what, wqe.wr.op) {
                (_, SendOp::Read { .. }) => {
                    let count = match what {
                        // A lost READ request goes again whole; the PSNs of
                        // its responses are not requests of their own.
                        Resend::Request(_) if k % self.device_window(ctx) != 0 => continue,
                        Resend::Request(_) => self.read_chunk(ctx, index, k),
                        Resend::Responses(_) => self.missing_responses(ctx, index, k),
                    };
                    if count == 0 {
                        continue;
                    }
                    self.build_read_request(buf, index, k, count)
                }
                (_, op) if op.is_atomic() => self.build_atomic(buf, index, psn),
                (Resend::Responses(_), _) => continue,
                (Resend::Request(_), _) => self.build_send_or_write(ctx, buf, index, k, 1).map(|(len, _)| len),
            };
            match built {
                Ok(len) => {
                    ctx.counters.retransmitted_packets += 1;
                    self.req.scoreboard.on_sent(what, ctx.now);
                    self.req.rto.on_repair(psn);
                    self.on_request_sent(ctx, len);
                    self.arm_repair_timer(ctx);
                    return Some(len);
                }
                Err(status) => {
                    self.fail_locally(ctx, index, status);
                    return None;
                }
            }
        }
        None
    }

    /// The run of READ responses missing from response `k` of the request
    /// at `index`, within the chunk that holds it.
    fn missing_responses(&self, ctx: &Ctx, index: usize, k: u32) -> u32 {
        let wqe = &self.sq[index];
        let chunk_end = k + self.read_chunk(ctx, index, k);
        (k..chunk_end).take_while(|&i| !wqe.has_response(i)).count() as u32
    }

    /// Admits the request at `index` into flight: checks the limits that
    /// apply to a new request and its local memory, then gives it PSNs.
    fn may_start(&mut self, ctx: &mut Ctx, index: usize) -> bool {
        if self.state == QpState::Sqd {
            return false;
        }
        if self.req.next_psn.distance_from(self.req.una) >= self.window(ctx) as i32 {
            return false;
        }
        let wqe = &self.sq[index];
        let rd_limit = u32::from(self.attrs.max_rd_atomic.max(1));
        if wqe.is_read_or_atomic() && self.req.rd_atomic_outstanding >= rd_limit {
            return false;
        }
        if wqe.wr.fence && self.req.rd_atomic_outstanding > 0 {
            return false;
        }
        let consumes = wqe.consumes_receive();
        let admission = self.req.credits.admit(consumes, !self.req.outstanding());
        if admission == Admission::Wait {
            if !self.req.waiting_for_credits {
                self.req.waiting_for_credits = true;
                ctx.counters.credit_waits += 1;
            }
            return false;
        }
        if let Payload::Gather(sges) = &wqe.wr.payload {
            let need = if wqe.wr.op.writes_locally() { Access::LOCAL_WRITE } else { Access::empty() };
            if validate_list(ctx.memory, self.init.pd, sges, need).is_err() {
                self.fail_locally(ctx, index, WcStatus::LocProtErr);
                return false;
            }
        }
        self.req.waiting_for_credits = false;
        self.req.credits.on_started(consumes);
        if admission == Admission::Probe {
            ctx.counters.credit_probes += 1;
        }
        let wqe = &mut self.sq[index];
        wqe.first_psn = Some(self.req.next_psn);
        self.req.next_psn = self.req.next_psn.add(wqe.npsn);
        wqe.receive_number = self.req.receive_number;
        if wqe.consumes_receive() {
            self.req.receive_number = self.req.receive_number.wrapping_add(1);
        }
        if wqe.is_read_or_atomic() {
            self.req.rd_atomic_outstanding += 1;
        }
        true
    }

    /// Carries out the local operation at `index` (a bind or a local
    /// invalidate) when the cursor reaches it, after every request before
    /// it has been sent, as rxe does; with the fence flag, after every one
    /// has completed. It completes once those have. Returns whether the
    /// cursor moved past it: not while it waits, nor once it failed (the
    /// queue stops there, and the QP fails as it completes).
    pub(super) fn run_local(&mut self, ctx: &mut Ctx, index: usize) -> bool {
        let wqe = &self.sq[index];
        if wqe.status.is_none() {
            if self.state == QpState::Sqd || (wqe.wr.fence && index > 0) {
                return false;
            }
            let done = match wqe.wr.op {
                SendOp::BindWindow(bind) => {
                    ctx.memory.bind_window(self.init.pd, self.qpn, &bind).map(drop).map_err(|_| WcStatus::MwBindErr)
                }
                SendOp::LocalInvalidate { rkey } => {
                    ctx.memory.invalidate(self.init.pd, rkey).map_err(|_| WcStatus::LocQpOpErr)
                }
                _ => unreachable!("not a local operation"),
            };
            if let Err(status) = done {
                self.fail_locally(ctx, index, status);
                return false;
            }
            self.sq[index].status = Some(WcStatus::Success);
        }
        if self.sq[index].status != Some(WcStatus::Success) {
            return false;
        }
        self.advance_cursor(1);
        self.complete_front(ctx);
        true
    }

    /// A request cannot go on because of a local error: it completes with
    /// `status` once everything before it has, then the QP enters ERR.
    fn fail_locally(&mut self, ctx: &mut Ctx, index: usize, status: WcStatus) {
        self.sq[index].status = Some(status);
        self.complete_front(ctx);
    }

    /// A request's BTH. On a UC QP the opcode is the operation's UC twin,
    /// and no acknowledgement is asked for: none comes.
    fn bth(&self, opcode: Opcode, psn: Psn, ack_request: bool, solicited: bool) -> bth::Repr {
        let (opcode, ack_request) = match self.init.qp_type {
            QpType::Uc => (opcode.uc_twin().expect("UC carries only SENDs and WRITEs (checked at post)"), false),
            QpType::Rc | QpType::Ud => (opcode, ack_request),
        };
        bth::Repr { ack_request, solicited, ..bth::Repr::new(opcode, self.attrs.dest_qpn, psn) }
    }

    /// Builds packet `k` of the SEND or WRITE at `index`, and with it up
    /// to `max_span - 1` more where the payload goes by reference
    /// ([`by_reference::MAX_SPAN_BYTES`]). Returns its length and the
    /// PSNs it stands for.
    pub(super) fn build_send_or_write(
        &self,
        ctx: &mut Ctx,
        buf: &mut [u8],
        index: usize,
        k: u32,
        max_span: u32,
    ) -> Result<(usize, u32), WcStatus> {
        let wqe = &self.sq[index];
        let psn = wqe.first_psn.expect("started").add(k);
        let mtu = u64::from(self.mtu());
        let offset = u64::from(k) * mtu;
        let one_mtu = (wqe.len - offset).min(mtu) as usize;
        // References first: how many MTUs the packet carries decides its
        // opcode, and so where its payload starts.
        let mut references = [0u8; by_reference::MAX_REFERENCES_LEN];
        let referenced = match &wqe.wr.payload {
            Payload::Gather(sges) if ctx.by_reference => {
                let wide = (wqe.len - offset).min(mtu * u64::from(max_span.max(1))) as usize;
                let (pd, unit) = (self.init.pd, mtu as usize);
                by_reference::refer_to_gather(ctx.memory, pd, sges, offset, wide, unit, &mut references)
                    .map_err(|_| WcStatus::LocProtErr)?
            }
            _ => None,
        };
        let payload_len = referenced.map_or(one_mtu, |(_, len)| len);
        let span = by_reference::span(payload_len, mtu as u32);
        let first = k == 0;
        let last = k + span == wqe.npsn;
        let pick = |only, first_op, middle, last_op| match (first, last) {
            (true, true) => only,
            (true, false) => first_op,
            (false, false) => middle,
            (false, true) => last_op,
        };
        let mut ext = Extensions::default();
        let mut sr = sreth::Repr {
            message_length: wqe.len as u32,
            offset: offset as u32,
            receive_number: wqe.receive_number,
            ..sreth::Repr::default()
        };
        let opcode = match wqe.wr.op {
            SendOp::Send { imm: None } => {
                pick(Opcode::RcSendOnly, Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLast)
            }
            SendOp::Send { imm: Some(imm) } => {
                ext.immediate = last.then_some(imm);
                pick(Opcode::RcSendOnlyImm, Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLastImm)
            }
            SendOp::SendWithInvalidate { rkey } => {
                ext.invalidate_rkey = last.then_some(rkey);
                pick(Opcode::RcSendOnlyInv, Opcode::RcSendFirst, Opcode::RcSendMiddle, Opcode::RcSendLastInv)
            }
            SendOp::Write { remote, imm } => {
                (sr.virtual_address, sr.rkey) = (remote.addr, remote.rkey);
                ext.reth = first.then_some(reth::Repr {
                    virtual_address: remote.addr,
                    rkey: remote.rkey,
                    dma_length: wqe.len as u32,
                });
                ext.immediate = if last { imm } else { None };
                match imm {
                    None => pick(Opcode::RcWriteOnly, Opcode::RcWriteFirst, Opcode::RcWriteMiddle, Opcode::RcWriteLast),
                    Some(_) => pick(
                        Opcode::RcWriteOnlyImm,
                        Opcode::RcWriteFirst,
                        Opcode::RcWriteMiddle,
                        Opcode::RcWriteLastImm,
                    ),
                }
            }
            _ => unreachable!("READ and ATOMIC have their own builders"),
        };
        // Ask for an ACK at the end of the message, every few packets of a
        // long one (a packet standing for several asks if one of them
        // would have), when this packet fills the window, and on every
        // packet of a QP paced so slowly that the packets between two ACKs
        // would outlast its timer.
        let interval = ctx.config.ack_request_interval.max(1);
        let window_full = psn.add(span - 1).distance_from(self.req.una) + 1 >= self.window(ctx) as i32;
        let ack_request =
            last || (k + span) / interval != k / interval || window_full || self.paced_past_timer(ctx, interval);
        let mut bth = self.bth(opcode, psn, ack_request, wqe.wr.solicited && last);
        if self.attrs.selective_repeat {
            bth.selective_repeat = true;
            ext.sreth = Some(sr);
        }
        let headers = Headers { bth, ext };
        let start = headers.len();
        if let Some((n, _)) = referenced {
            buf.get_mut(start..start + n).ok_or(WcStatus::LocLenErr)?.copy_from_slice(&references[..n]);
            ctx.referenced = Some(packet_len(start, payload_len));
            ctx.counters.tx_spanning += u64::from(span > 1);
            let len = headers.emit_around_payload(buf, n).map_err(|_| WcStatus::LocLenErr)?;
            return Ok((len, span));
        }
        let body = buf.get_mut(start..start + payload_len).ok_or(WcStatus::LocLenErr)?;
        match &wqe.wr.payload {
            Payload::Inline(bytes) => {
                softrnic_account::add(softrnic_account::Cost::BytesCopied, payload_len as u64);
                body.copy_from_slice(&bytes[offset as usize..offset as usize + payload_len])
            }
            Payload::Gather(sges) => {
                gather(ctx.memory, self.init.pd, sges, offset, body).map_err(|_| WcStatus::LocProtErr)?
            }
        }
        let len = headers.emit_around_payload(buf, payload_len).map_err(|_| WcStatus::LocLenErr)?;
        Ok((len, 1))
    }

    /// Responses a READ request from response `k` of the request at
    /// `index` asks for. A long READ is asked for in chunks of one window,
    /// whose boundaries are fixed (multiples of the window) so that a
    /// resumed request repeats part of exactly one earlier request, as a
    /// duplicate must (its PSNs must all belong to the original).
    fn read_chunk(&self, ctx: &Ctx, index: usize, k: u32) -> u32 {
        let wqe = &self.sq[index];
        let window = self.device_window(ctx);
        let chunk_end = (k / window + 1).saturating_mul(window).min(wqe.npsn);
        chunk_end - k
    }

    /// Builds a READ request for `count` responses from response `k` on.
    fn build_read_request(&self, buf: &mut [u8], index: usize, k: u32, count: u32) -> Result<usize, WcStatus> {
        let wqe = &self.sq[index];
        let SendOp::Read { remote } = wqe.wr.op else { unreachable!() };
        let psn = wqe.first_psn.expect("started").add(k);
        // Resuming at response k asks only for the data not yet received,
        // and a long READ asks for one window of responses at a time.
        let mtu = u64::from(self.mtu());
        let skip = u64::from(k) * mtu;
        let length = (wqe.len - skip).min(u64::from(count) * mtu);
        let ext = Extensions {
            reth: Some(reth::Repr {
                virtual_address: remote.addr.wrapping_add(skip),
                rkey: remote.rkey,
                dma_length: length as u32,
            }),
            ..Extensions::default()
        };
        let headers = Headers { bth: self.bth(Opcode::RcReadRequest, psn, true, false), ext };
        headers.emit_around_payload(buf, 0).map_err(|_| WcStatus::LocLenErr)
    }

    fn build_atomic(&self, buf: &mut [u8], index: usize, psn: Psn) -> Result<usize, WcStatus> {
        let wqe = &self.sq[index];
        let (opcode, remote, swap_or_add, compare) = match wqe.wr.op {
            SendOp::CompareSwap { remote, compare, swap } => (Opcode::RcCompareSwap, remote, swap, compare),
            SendOp::FetchAdd { remote, add } => (Opcode::RcFetchAdd, remote, add, 0),
            SendOp::AtomicWrite { remote, value } => return self.build_atomic_write(buf, psn, remote, value),
            _ => unreachable!(),
        };
        let ext = Extensions {
            atomic_eth: Some(atomic_eth::Repr {
                virtual_address: remote.addr,
                rkey: remote.rkey,
                swap_or_add,
                compare,
            }),
            ..Extensions::default()
        };
        let headers = Headers { bth: self.bth(opcode, psn, true, false), ext };
        headers.emit_around_payload(buf, 0).map_err(|_| WcStatus::LocLenErr)
    }

    /// An ATOMIC WRITE: a RETH for 8 bytes, and the 8 bytes as payload,
    /// the same packet each time it is sent.
    fn build_atomic_write(
        &self,
        buf: &mut [u8],
        psn: Psn,
        remote: RemoteAddr,
        value: [u8; 8],
    ) -> Result<usize, WcStatus> {
        let reth = reth::Repr { virtual_address: remote.addr, rkey: remote.rkey, dma_length: value.len() as u32 };
        let headers = Headers {
            bth: self.bth(Opcode::RcAtomicWrite, psn, true, false),
            ext: Extensions { reth: Some(reth), ..Extensions::default() },
        };
        let start = headers.len();
        buf.get_mut(start..start + value.len()).ok_or(WcStatus::LocLenErr)?.copy_from_slice(&value);
        headers.emit_around_payload(buf, value.len()).map_err(|_| WcStatus::LocLenErr)
    }

    /// Arms the retransmission timer if packets are in flight: the QP's
    /// `timeout`, or the adaptive timer's estimate (`rto.rs`).
    pub(super) fn arm_retry_timer(&mut self, ctx: &Ctx) {
        let from = self.held_by_pacer_until(ctx).unwrap_or(ctx.now);
        self.req.retry_deadline = match ack_timeout(self.attrs.timeout) {
            Some(timeout) if self.req.outstanding() => Some(from + self.retry_wait(ctx, timeout)),
            _ => None,
        };
    }

    /// Would `interval` full-size packets at the pacer's rate take longer
    /// than the timer waits? Then every packet asks for its ACK: the timer,
    /// armed as the first left, would otherwise expire before the ACK
    /// that answers the last was asked for.
    fn paced_past_timer(&self, ctx: &Ctx, interval: u32) -> bool {
        let (Some(pacer), Some(timeout)) = (self.pacer, ack_timeout(self.attrs.timeout)) else { return false };
        pacer.gap(self.mtu() as usize) * interval >= self.retry_wait(ctx, timeout)
    }

    /// When the pacer lets go the next packet that waits to be sent (new,
    /// or sent again after going back), if it holds one back. A packet
    /// that waits its turn is not lost, so a timer armed meanwhile (on an
    /// acknowledgement, or at an expiry) is not due until a wait after it
    /// may leave: a timer shorter than the pacer's gap fired before each
    /// packet left, sent the last one again as a probe in the slot, and
    /// kept the QP's congestion control at its floor (seed 22012789:
    /// go-back-N at one 256 B packet per 139 µs under a 100 µs timer, a
    /// READ answered behind it waiting 17 ms).
    fn held_by_pacer_until(&self, ctx: &Ctx) -> Option<Instant> {
        let waiting = self.req.cursor < self.sq.len() || self.req.scoreboard.has_queued();
        let ready = self.pacer?.ready_at();
        (waiting && ctx.now < ready).then_some(ready)
    }

    fn retry_wait(&self, ctx: &Ctx, timeout: std::time::Duration) -> std::time::Duration {
        match self.retransmission(ctx) {
            Retransmission::Fixed => timeout,
            Retransmission::Adaptive { floor } if !self.req.rto.probed => self.req.rto.probe_timeout(floor, timeout),
            Retransmission::Adaptive { floor } => self.req.rto.timeout(floor, timeout),
        }
    }

    /// How this QP times retransmissions: as the device says, but always
    /// adaptively under selective repeat, whose lost repairs only the
    /// timer recovers (67 ms each at perftest's fixed timeout).
    fn retransmission(&self, ctx: &Ctx) -> Retransmission {
        match ctx.config.retransmission {
            Retransmission::Fixed if self.attrs.selective_repeat => Retransmission::ADAPTIVE,
            chosen => chosen,
        }
    }

    /// Goes back to `psn` because of a NAK or a missing response, once
    /// per gap.
    pub(super) fn recover_from(&mut self, psn: Psn) {
        if self.req.recovering_from != Some(psn) {
            self.req.recovering_from = Some(psn);
            self.go_back(psn);
        }
    }

    /// Moves the send cursor back so that sending resumes at `psn`, or at
    /// the start of the first request after it if no request holds it.
    pub(super) fn go_back(&mut self, psn: Psn) {
        for (index, wqe) in self.sq.iter().enumerate() {
            // A local operation done sends nothing again.
            if wqe.wr.op.is_local() && wqe.status.is_some() {
                continue;
            }
            if let Some(k) = wqe.index_of(psn) {
                self.req.cursor = index;
                self.req.cursor_pkt = k;
                return;
            }
            if wqe.first_psn.is_none_or(|first| psn.is_before(first)) {
                self.req.cursor = index;
                self.req.cursor_pkt = 0;
                return;
            }
        }
        self.req.cursor = self.sq.len();
        self.req.cursor_pkt = 0;
    }

    /// How long a repaired READ response or ATOMIC result may take once
    /// the flight has drained: two of the path's shortest round trips (at
    /// least a quarter of the timer's floor). The smoothed RTT would be
    /// the wrong measure: it includes the queue of responses that the
    /// READ limit then no longer feeds, and waiting it out (milliseconds)
    /// stalled lossy READs.
    fn repair_wait(&self, ctx: &Ctx) -> Option<std::time::Duration> {
        let Retransmission::Adaptive { floor } = self.retransmission(ctx) else {
            return None;
        };
        Some((self.req.rto.min_rtt()? * 2).max(floor / 4))
    }

    fn arm_repair_timer(&mut self, ctx: &Ctx) {
        self.req.repair_deadline = self.repair_wait(ctx).and_then(|wait| self.req.scoreboard.response_repair_due(wait));
    }

    /// The repair timer ran out: repaired responses overdue on a drained
    /// flight go again; while responses still arrive it looks again later.
    fn repair_timeout(&mut self, ctx: &mut Ctx) {
        let Some(wait) = self.repair_wait(ctx) else {
            self.req.repair_deadline = None;
            return;
        };
        let sq = &self.sq;
        self.req.scoreboard.on_response_repair_timer(ctx.now, wait, |psn| response_missing(sq, psn));
        self.arm_repair_timer(ctx);
        if self.req.repair_deadline.is_some_and(|due| due <= ctx.now) {
            self.req.repair_deadline = Some(ctx.now + wait);
        }
    }

    /// The retransmission timer, the repair timer or the RNR wait ran out.
    pub(super) fn requester_timeout(&mut self, ctx: &mut Ctx) {
        if self.req.repair_deadline.is_some_and(|t| t <= ctx.now) {
            self.repair_timeout(ctx);
        }
        if self.req.rnr_until.is_some_and(|t| t <= ctx.now) {
            self.req.rnr_until = None;
            self.arm_retry_timer(ctx);
        }
        if self.req.retry_deadline.is_none_or(|t| t > ctx.now) {
            return;
        }
        self.req.retry_deadline = None;
        if !self.req.outstanding() || !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        ctx.counters.timeouts += 1;
        self.cc_event(ctx, softrnic_cc::Event::Timeout);
        self.req.scoreboard.on_timeout();
        // A retry is spent each time the QP's full `timeout` passes without
        // progress; the adaptive timer's earlier expiries are free.
        let timeout = ack_timeout(self.attrs.timeout).unwrap_or_default();
        let adaptive = matches!(self.retransmission(ctx), Retransmission::Adaptive { .. });
        let waiting_since = self.req.retry_spent_at.map_or(self.req.progress_at, |at| at.max(self.req.progress_at));
        if !adaptive || ctx.now - waiting_since >= timeout {
            if self.req.retries_left == 0 {
                self.fail_oldest(ctx, WcStatus::RetryExcErr);
                return;
            }
            self.req.retries_left -= 1;
            // The next retry is spent a whole timeout after this one fell
            // due, not after the expiry that noticed it: counted from the
            // expiry, each retry cost up to a timeout and an RTO (9.7 ms
            // for 8.4 at the RTO's 1.9 ms), and a QP with a dead peer
            // outlived its retries by a sixth (simulator seed 12019469).
            // A clock that jumped past several timeouts spends one, and
            // counts afresh from now.
            // (The fixed timer's expiries are the timeouts themselves.)
            let due = waiting_since + timeout;
            let spent = if adaptive && ctx.now - due < timeout { due } else { ctx.now };
            self.req.retry_spent_at = Some(spent);
        }
        self.req.rto.on_expiry();
        self.req.recovering_from = None;
        // The last packet the responder has not reported holding.
        let mut last = self.req.sent_end.sub(1);
        while last != self.req.una && self.req.scoreboard.has_arrived(last) {
            last = last.sub(1);
        }
        if adaptive && !self.req.rto.probed && last != self.req.una {
            // The tail-loss probe: the last packet alone, which is what a
            // lost tail needs and what makes a lost ACK be repeated.
            self.req.rto.probed = true;
            ctx.counters.tail_loss_probes += 1;
            self.go_back(last);
            // Selective repeat probes the head of the queue too: a flight
            // that stalls behind a lost repair (no later packet shows it
            // lost) sends the oldest request's holes again.
            if self.attrs.selective_repeat {
                self.repair_head();
            }
        } else {
            // Go back; selective repeat skips what the responder holds.
            self.go_back(self.req.una);
        }
        // The timer runs until the flight is acknowledged, whatever the
        // cursor finds to send.
        self.arm_retry_timer(ctx);
    }

    /// Queues the holes of the oldest request still in progress: its
    /// missing READ responses or ATOMIC result, or the oldest packet not
    /// acknowledged when a selective NAK has reported it missing (without
    /// one, the probe of the last packet brings the news).
    fn repair_head(&mut self) {
        let Some(index) = self.sq.iter().position(|w| w.status.is_none() && w.first_psn.is_some()) else {
            return;
        };
        if self.sq[index].is_read_or_atomic() {
            self.lose_responses(index, u32::MAX, true);
        } else if self.req.scoreboard.has_report() {
            self.req.scoreboard.lose(Resend::Request(self.req.una), self.req.sent_end);
        }
    }

    /// Fails the oldest request still in progress with `status`.
    pub(super) fn fail_oldest(&mut self, ctx: &mut Ctx, status: WcStatus) {
        if let Some(wqe) = self.sq.iter_mut().find(|w| w.status.is_none()) {
            wqe.status = Some(status);
        }
        self.complete_front(ctx);
    }
}

/// The RNR wait an AETH timer code asks for.
pub(super) fn rnr_wait(code: u8) -> std::time::Duration {
    std::time::Duration::from_nanos(aeth::rnr_timer_nanos(code))
}
