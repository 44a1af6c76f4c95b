//! Queue pairs. An RC queue pair is three cooperating state machines, split
//! the way the IBTA and the Linux rxe driver split them:
//!
//! - the [requester](requester) turns send work requests into request
//!   packets, assigns PSNs and retransmits from a PSN when told to;
//! - the [completer](completer) consumes ACKs, NAKs, READ responses and
//!   ATOMIC acknowledgements, decides what is done, and completes send
//!   work requests in order;
//! - the [responder](responder) executes incoming requests against local
//!   memory and receive work requests, and answers them.
//!
//! Loss is repaired by go-back-N, as RoCE does, or on a connection that
//! negotiated it by selective repeat: the responder places what arrives
//! beyond a gap ([placement]) and the requester sends only the holes its
//! selective NAKs show ([scoreboard]).
//!
//! A UD queue pair ([ud]) sends and receives single-packet datagrams.
//!
//! None of them reads a clock or touches a socket: they are driven through
//! [`QueuePair::handle_packet`], [`QueuePair::poll_transmit`] and
//! [`QueuePair::handle_timeout`], with time and memory passed in a [`Ctx`].

mod attr;
mod completer;
mod congestion;
mod credits;
mod pacing;
mod placement;
mod post_queues;
mod requester;
mod responder;
mod rto;
mod scoreboard;
mod send_queue;
mod uc;
mod ud;

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;

pub use attr::{MAX_RD_ATOMIC, Mtu, QpAttr, QpAttributes, QpCaps, QpInitAttr, QpState, QpType, RcConnection, ud_steps};
pub use pacing::Pacer;
pub use post_queues::{PostQueues, Posted, SendPoster, check_recv, check_send};
pub use rto::Retransmission;

use crate::auth::PacketAuth;
use crate::by_reference::Packet;
use crate::completion::{Completion, CompletionQueue, CqId, Pushed, WcOpcode, WcStatus};
use crate::config::TransportConfig;
use crate::congestion::{Choice, IntMark, RecvMeta};
use crate::counters::Counters;
use crate::error::{Result, VerbsError};
use crate::event::AsyncEvent;
use crate::fetch_on_demand::ReceivesWanted;
use crate::memory::MemoryTable;
use crate::srq::{SharedReceiveQueue, SrqId};
use crate::time::Instant;
use crate::work_request::{RecvWorkRequest, SendWorkRequest};
use congestion::{NotificationPoint, ReactionPoint};
use requester::Requester;
use responder::{Refusal, Responder};
use send_queue::SendWqe;

/// Everything a queue pair needs from its device for one event.
pub(crate) struct Ctx<'a> {
    pub now: Instant,
    pub memory: &'a MemoryTable,
    /// Asynchronous events raised, for the device to hand on.
    pub events: &'a mut VecDeque<AsyncEvent>,
    /// Completion queues whose armed notification fired.
    pub fired_cqs: &'a mut VecDeque<CqId>,
    pub counters: &'a mut Counters,
    pub config: &'a TransportConfig,
    /// Receives asked of the driver ([`crate::fetch_on_demand`]).
    pub wanted: &'a mut VecDeque<ReceivesWanted>,
    /// Whether a request that finds no receive may ask for them: not the
    /// one handled again after its question was answered.
    pub may_ask: bool,
    /// Set when the request handled asked, and was not consumed: the
    /// shard holds it until the answer.
    pub held: bool,
    /// Whether the packet being built may carry references to shared
    /// memory in place of its payload: it goes to a device on this host
    /// ([`crate::by_reference`]).
    pub by_reference: bool,
    /// Set when the packet built does: the length it would have had with
    /// its payload, which pacing and congestion control count.
    pub referenced: Option<usize>,
}

/// A packet a queue pair wants sent: `len` bytes written to the caller's
/// buffer, for the given address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub dst: IpAddr,
    pub len: usize,
    /// Whether it travels with an INT header, and which.
    pub int: IntMark,
    /// The DSCP it asks for (0: the socket's).
    pub dscp: u8,
}

impl Transmit {
    /// Plain RoCEv2 data or answers.
    pub fn new(dst: IpAddr, len: usize) -> Transmit {
        Transmit { dst, len, int: IntMark::None, dscp: 0 }
    }
}

/// The shared objects a queue pair posts to and takes from, resolved from
/// the handles in its [`QpInitAttr`] when it is created.
#[derive(Debug, Clone)]
pub(crate) struct QpQueues {
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    pub srq: Option<Arc<SharedReceiveQueue>>,
}

/// A queue pair: its state, attributes, queues and the RC roles.
#[derive(Debug)]
pub struct QueuePair {
    qpn: u32,
    init: QpInitAttr,
    queues: QpQueues,
    state: QpState,
    attrs: QpAttributes,
    /// The program's end of the queues, where posts wait to be taken.
    posts: Arc<PostQueues>,
    /// Send work requests not yet completed, oldest first.
    sq: VecDeque<SendWqe>,
    /// Receive work requests not yet consumed, oldest first.
    rq: VecDeque<RecvWorkRequest>,
    /// Posts being taken from `posts` (kept to reuse their memory).
    taking: (VecDeque<SendWorkRequest>, VecDeque<RecvWorkRequest>),
    req: Requester,
    resp: Responder,
    /// Which role `poll_transmit` offers the link to first, so that a long
    /// READ response cannot starve this side's own requests.
    responder_first: bool,
    /// The responder's turn came with an ACK, which let one request go
    /// ahead of it: the ACK goes next.
    ack_deferred: bool,
    /// The rate limit the user set (`ibv_modify_qp_rate_limit`).
    rate_limit: Option<u64>,
    /// Paces data: at the lower of the user's limit and congestion
    /// control's rate.
    pacer: Option<Pacer>,
    /// Congestion control, as the sender of data and as its receiver.
    algorithm: Option<Choice>,
    rp: Option<ReactionPoint>,
    np: NotificationPoint,
    /// Set while the pacer, and nothing else, holds a request back: when
    /// it may go.
    paced_until: Option<Instant>,
    /// The connection's key, where both ends authenticate packets
    /// ([`crate::auth`]): made at INIT -> RTR, when the peer is known.
    auth: Option<PacketAuth>,
}

impl QueuePair {
    pub(crate) fn new(qpn: u32, init: QpInitAttr, queues: QpQueues) -> QueuePair {
        let posts = Arc::new(PostQueues::new(qpn, init.qp_type, init.caps, init.srq.is_some()));
        QueuePair {
            qpn,
            init,
            queues,
            state: QpState::Reset,
            attrs: QpAttributes::default(),
            posts,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            taking: (VecDeque::new(), VecDeque::new()),
            req: Requester::default(),
            resp: Responder::default(),
            responder_first: true,
            ack_deferred: false,
            rate_limit: None,
            pacer: None,
            algorithm: None,
            rp: None,
            np: NotificationPoint::default(),
            paced_until: None,
            auth: None,
        }
    }

    /// The key of this QP's connection, if it authenticates packets.
    fn connection_key(&self, ctx: &Ctx) -> Option<PacketAuth> {
        let key = ctx.config.auth_key.as_ref().filter(|_| self.attrs.authenticate)?;
        let remote = (self.attrs.remote_addr?, self.attrs.dest_qpn);
        Some(key.connection((ctx.config.local_addr, self.qpn), remote))
    }

    /// The connection's packet authentication, if both ends agreed on it.
    pub fn authenticator(&self) -> Option<&PacketAuth> {
        self.auth.as_ref()
    }

    /// Limits the rate of this QP's requests, in bits per second; `None`
    /// lifts the limit.
    pub(crate) fn set_rate_limit(&mut self, bits_per_second: Option<u64>) {
        self.rate_limit = bits_per_second;
        self.apply_rate();
    }

    pub fn rate_limit(&self) -> Option<u64> {
        self.rate_limit
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    /// The program's end of this QP's queues, for posting without the
    /// shard's lock.
    pub fn post_queues(&self) -> &Arc<PostQueues> {
        &self.posts
    }

    /// Changes the state, for the QP and for its posters.
    fn set_state(&mut self, state: QpState) {
        self.state = state;
        self.posts.set_state(state);
    }

    pub fn attributes(&self) -> &QpAttributes {
        &self.attrs
    }

    pub fn init_attr(&self) -> &QpInitAttr {
        &self.init
    }

    fn mtu(&self) -> u32 {
        self.attrs.path_mtu.bytes()
    }

    /// Whether one packet by reference may stand for several MTUs' worth
    /// of PSNs ([`crate::by_reference::MAX_SPAN_BYTES`]): on go-back-N RC
    /// connections, whose PSNs are consumed in order. Selective repeat's
    /// bitmaps and UC's message-at-a-time requester keep a packet per PSN.
    fn spans(&self) -> bool {
        self.init.qp_type == QpType::Rc && !self.attrs.selective_repeat
    }

    /// The MTUs a packet may carry to this peer: several by reference
    /// ([`QueuePair::spans`]), else one.
    fn max_span(&self, ctx: &Ctx) -> u32 {
        if ctx.by_reference && self.spans() { crate::by_reference::max_span(self.mtu()) } else { 1 }
    }

    /// Applies `ibv_modify_qp`.
    pub(crate) fn modify(&mut self, ctx: &mut Ctx, attr: &QpAttr) -> Result<()> {
        let to = attr.validate(self.init.qp_type, self.state)?;
        if let Some(qkey) = attr.qkey {
            ud::check_qkey(self.qpn, qkey)?;
        }
        if attr.authenticate == Some(true) && ctx.config.auth_key.is_none() {
            return Err(VerbsError::invalid(
                "packet authentication needs the secret both hosts share: set SOFTRNIC_AUTH_KEY (the same at both ends)",
            ));
        }
        attr.apply(&mut self.attrs);
        let from = self.state;
        match to {
            QpState::Reset => {
                // RESET discards every queued request without completions,
                // and the completions already queued (as mlx5 and rxe do).
                self.queues.send_cq.discard_qp(self.qpn);
                self.queues.recv_cq.discard_qp(self.qpn);
                self.sq.clear();
                self.rq.clear();
                self.posts.reset();
                self.req = Requester::default();
                self.resp = Responder::default();
                self.rp = None;
                self.np = NotificationPoint::default();
                self.auth = None;
                self.set_state(QpState::Reset);
            }
            QpState::Error => self.enter_error(ctx, false),
            _ => {
                self.set_state(to);
                if from == QpState::Init && to == QpState::Rtr {
                    self.resp.start(self.attrs.rq_psn);
                    self.auth = self.connection_key(ctx);
                }
                if from == QpState::Rtr && to == QpState::Rts {
                    self.req.start(&self.attrs);
                    self.start_congestion_control(ctx);
                }
            }
        }
        Ok(())
    }

    /// Applies `ibv_post_send`, for a caller that holds the shard.
    pub(crate) fn post_send(&mut self, ctx: &mut Ctx, wr: SendWorkRequest) -> Result<()> {
        let _ = self.posts.post_send(wr)?;
        self.absorb_posts(ctx);
        Ok(())
    }

    /// Applies `ibv_post_recv`, for a caller that holds the shard.
    pub(crate) fn post_recv(&mut self, ctx: &mut Ctx, wr: RecvWorkRequest) -> Result<()> {
        let _ = self.posts.post_recv(wr)?;
        self.absorb_posts(ctx);
        Ok(())
    }

    /// Takes what the program posted into the QP's queues, in posting
    /// order. A request that met the QP in the error state flushes; one
    /// that raced a RESET (or the INIT and RTR after it) is discarded, as
    /// RESET discards.
    pub(crate) fn absorb_posts(&mut self, ctx: &mut Ctx) {
        let (mut sends, mut recvs) = std::mem::take(&mut self.taking);
        if self.posts.take(&mut sends, &mut recvs) {
            for wr in sends.drain(..) {
                let wqe = SendWqe::new(wr, self.mtu());
                match self.state {
                    QpState::Rts | QpState::Sqd => self.sq.push_back(wqe),
                    QpState::Error | QpState::Sqe => {
                        self.posts.retire_send();
                        self.complete_send(ctx, &wqe, WcStatus::WrFlushErr);
                    }
                    QpState::Reset | QpState::Init | QpState::Rtr => self.posts.retire_send(),
                }
            }
            for wr in recvs.drain(..) {
                match self.state {
                    QpState::Reset => self.posts.retire_recv(),
                    QpState::Error => {
                        self.posts.retire_recv();
                        let flushed = Completion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
                        self.complete_recv(ctx, flushed);
                    }
                    _ => self.rq.push_back(wr),
                }
            }
        }
        self.taking = (sends, recvs);
    }

    /// Consumes one packet addressed to this QP from `src`.
    pub(crate) fn handle_packet(&mut self, ctx: &mut Ctx, src: IpAddr, packet: &Packet, meta: &RecvMeta) {
        match self.init.qp_type {
            QpType::Ud => self.ud_receive(ctx, src, meta.multicast_group, packet),
            QpType::Uc => self.uc_receive(ctx, src, packet),
            QpType::Rc => {
                let opcode = packet.headers.bth.opcode;
                if !opcode.is_ud() && !opcode.is_uc() && Some(src) == self.attrs.remote_addr {
                    if packet.headers.bth.opcode.is_request() {
                        if meta.int.is_some() {
                            self.np.int_to_echo = meta.int;
                        }
                        self.respond(ctx, packet);
                        self.assert_responder();
                    } else {
                        self.complete(ctx, packet);
                        self.assert_requester();
                        if let Some(records) = &meta.int {
                            self.cc_event(ctx, softrnic_cc::Event::Int { hops: records.hops() });
                        }
                    }
                } else {
                    ctx.counters.rx_dropped_foreign += 1;
                }
            }
        }
    }

    /// Writes the next packet this QP wants to send into `buf`.
    pub(crate) fn poll_transmit(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<Transmit> {
        if self.resp.is_draining() {
            // A fatal error stopped the QP: answer what executed before it,
            // then NAK.
            return self.poll_response(ctx, buf);
        }
        match self.init.qp_type {
            QpType::Ud => self.ud_transmit(ctx, buf),
            QpType::Uc => self.uc_transmit(ctx, buf),
            QpType::Rc => {
                // Take turns, so a long READ response cannot starve our own
                // requests (nor they it): whoever sent a packet lets the
                // other go first next time. Turns pass on packets sent, not
                // on calls: a call that finds the pacer closed sends
                // nothing, and turns counted per call handed every open
                // slot to the responder (simulator seed 241505222531: a
                // WRITE stalled for 8 ms behind its QP's READ responses).
                // A bare ACK goes after a request: the pair then forms one
                // GSO run (the shorter datagram last) and crosses the
                // kernel as one buffer. After one request only: the
                // responder keeps its turn, and a requester that always
                // has another packet (a long SEND going back under
                // go-back-N) held its QP's ACKs for 8 ms and the peer's
                // SEND spent its retries (simulator seed 8003009).
                let defer_ack = self.responder_first && !self.ack_deferred && self.resp.next_is_ack();
                let responder_first = self.responder_first && !defer_ack;
                let out = if responder_first {
                    self.poll_response(ctx, buf)
                        .map(|t| (t, true))
                        .or_else(|| self.poll_request(ctx, buf).map(|t| (t, false)))
                } else {
                    self.poll_request(ctx, buf)
                        .map(|t| (t, false))
                        .or_else(|| self.poll_response(ctx, buf).map(|t| (t, true)))
                };
                self.assert_requester();
                let (transmit, by_responder) = out?;
                self.ack_deferred = defer_ack && !by_responder;
                if !self.ack_deferred {
                    self.responder_first = !by_responder;
                }
                Some(transmit)
            }
        }
    }

    /// The requester's position, asserted where it moves (a packet sent,
    /// an answer taken, a timer), as TigerBeetle asserts its invariants:
    /// a seed that breaks one stops at the step that did, not at a hang
    /// or a wrong completion later. In PSN order, nothing is acknowledged
    /// that was not sent, nothing sent that no request was given, and the
    /// send cursor stays within the queue.
    fn assert_requester(&self) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.init.qp_type != QpType::Rc {
            return;
        }
        let r = &self.req;
        assert!(
            r.cursor <= self.sq.len(),
            "QP {}: send cursor {} past its {} requests",
            self.qpn,
            r.cursor,
            self.sq.len()
        );
        assert!(
            !r.sent_end.is_before(r.una),
            "QP {}: una {:?} past the end of what was sent, {:?}",
            self.qpn,
            r.una,
            r.sent_end
        );
        assert!(
            !r.next_psn.is_before(r.sent_end),
            "QP {}: sent up to {:?}, past the next request's PSN {:?}",
            self.qpn,
            r.sent_end,
            r.next_psn
        );
    }

    /// When this QP next needs [`QueuePair::handle_timeout`]: a timer, or
    /// the moment its pacer lets a waiting request go.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        crate::time::earliest([self.req.deadline(), self.paced_until, self.congestion_timer()])
    }

    pub(crate) fn handle_timeout(&mut self, ctx: &mut Ctx) {
        if self.paced_until.is_some_and(|t| t <= ctx.now) {
            self.paced_until = None;
        }
        self.congestion_timeout(ctx);
        self.requester_timeout(ctx);
        self.assert_requester();
    }

    /// Could `poll_transmit` produce something now? (Cheap, may say yes
    /// when the answer turns out to be no.)
    pub(crate) fn wants_to_transmit(&self) -> bool {
        self.resp.has_output()
            || (!self.sq.is_empty() && self.req.cursor < self.sq.len())
            || self.req.scoreboard.has_queued()
    }

    /// Moves the QP to the error state: every outstanding work request
    /// completes with `WR_FLUSH_ERR` (but the first one in error, unless
    /// `cause_reported` says a completion already named the error) and
    /// nothing more is sent but a final NAK.
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx, cause_reported: bool) {
        if self.state == QpState::Error {
            return;
        }
        self.set_state(QpState::Error);
        self.req.stop();
        // Completions leave in order, so a request still queued here has
        // one before it that never succeeded: it flushes even if its own
        // acknowledgement came (selective repeat takes them out of order;
        // simulator seed 636, a crashed peer: a READ reported success
        // after the SEND before it failed). One error names the cause,
        // the first that is not a flush (a READ flushed ahead of the
        // WRITE whose fatal NAK ended it leaves the WRITE to say why);
        // after it a queue reports flushes only, even for a request that
        // failed too while it waited (seeds 20007370 and 20009246: two
        // SENDs spent their RNR retries behind a READ, and both said so).
        let mut cause_reported = cause_reported;
        while let Some(wqe) = self.sq.pop_front() {
            self.posts.retire_send();
            let status = match wqe.status {
                Some(status) if !cause_reported && !matches!(status, WcStatus::Success | WcStatus::WrFlushErr) => {
                    cause_reported = true;
                    status
                }
                _ => WcStatus::WrFlushErr,
            };
            self.complete_send(ctx, &wqe, status);
        }
        for _ in 0..self.rq.len() {
            self.posts.retire_recv();
        }
        for recv in self.resp.abandon().into_iter().chain(self.rq.drain(..).collect::<Vec<_>>()) {
            let flushed = Completion::new(recv.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            self.complete_recv(ctx, flushed);
        }
        // The SRQ's own requests stay for its other QPs.
        if self.init.srq.is_some() {
            ctx.events.push_back(AsyncEvent::QpLastWqeReached { qpn: self.qpn });
        }
        // Requests posted but not yet taken flush too, and so do the
        // receives the program wrote that the QP was not given, as a NIC
        // flushes the WQEs in the program's ring: the driver is asked for
        // them, and they flush as they arrive.
        if self.queues.srq.is_none() && self.posts.fetched_on_demand() {
            ctx.wanted.push_back(ReceivesWanted { qpn: self.qpn, srq: None });
        }
        self.absorb_posts(ctx);
    }

    /// Takes the next receive work request: from the SRQ if the QP has one.
    /// None posted: the driver is asked, if it holds the program's
    /// receives, and the request waits for them
    /// ([`Refusal::AwaitingReceives`]); else the receiver is not ready.
    fn take_recv(&mut self, ctx: &mut Ctx) -> std::result::Result<RecvWorkRequest, Refusal> {
        if let Some(spare) = self.resp.spare.take() {
            return Ok(spare);
        }
        match &self.queues.srq {
            Some(srq) => {
                let Some((recv, low)) = srq.take() else {
                    let (id, on_demand) = (srq.id(), srq.fetched_on_demand());
                    return Err(self.ask_for_receives(ctx, on_demand, Some(id)));
                };
                if low {
                    // The receives not yet given to the SRQ count against
                    // its limit: the shard checks it once they are.
                    match srq.fetched_on_demand() {
                        true => ctx.wanted.push_back(ReceivesWanted { qpn: self.qpn, srq: Some(srq.id()) }),
                        false => srq.check_limit(ctx.events),
                    }
                }
                Ok(recv)
            }
            None => match self.rq.pop_front() {
                Some(recv) => {
                    self.posts.retire_recv();
                    Ok(recv)
                }
                None => Err(self.ask_for_receives(ctx, self.posts.fetched_on_demand(), None)),
            },
        }
    }

    /// A request found no receive: asks the driver for the program's, if
    /// it holds them and may be asked, and the request waits.
    fn ask_for_receives(&mut self, ctx: &mut Ctx, on_demand: bool, srq: Option<SrqId>) -> Refusal {
        if !(on_demand && ctx.may_ask) {
            return Refusal::ReceiverNotReady;
        }
        ctx.counters.receive_fetches += 1;
        ctx.wanted.push_back(ReceivesWanted { qpn: self.qpn, srq });
        ctx.held = true;
        Refusal::AwaitingReceives
    }

    /// Emits the completion of a send work request, if it generates one.
    fn complete_send(&self, ctx: &mut Ctx, wqe: &SendWqe, status: WcStatus) {
        if status == WcStatus::Success && !(wqe.wr.signaled || self.init.sq_sig_all) {
            return;
        }
        let mut completion = Completion::new(wqe.wr.wr_id, status, wqe.wc_opcode(), self.qpn);
        if status == WcStatus::Success {
            completion.byte_len = wqe.len as u32;
        }
        deliver(ctx, &self.queues.send_cq, completion);
    }

    fn complete_recv(&self, ctx: &mut Ctx, completion: Completion) {
        deliver(ctx, &self.queues.recv_cq, completion);
    }

    /// The SRQ the QP takes its receives from, if any.
    pub(crate) fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.queues.srq.as_ref()
    }

    /// When the requester last made progress: an acknowledgement that
    /// moved it on, a READ response it had not had, or the start of a
    /// flight.
    pub fn last_progress(&self) -> Instant {
        self.req.progress_at
    }

    /// How long the pacer holds a full-size packet before the next may
    /// leave (zero if the QP is not paced): the time each retry may spend
    /// waiting to send before its timer runs.
    pub fn pacing_gap(&self) -> std::time::Duration {
        self.pacer.map_or(std::time::Duration::ZERO, |pacer| pacer.gap(self.mtu() as usize))
    }

    /// End-to-end credits: the receives the peer's responder holds beyond
    /// the messages this requester has started, as far as it has said;
    /// `None` if it does not count them, -1 while a probe is out.
    pub fn credits_available(&self) -> Option<i32> {
        self.req.credits.available()
    }

    /// The PSN the responder expects next.
    pub fn expected_psn(&self) -> softrnic_wire::Psn {
        self.resp.epsn
    }

    /// Where the QP stands, in one line: what its requester has in flight
    /// and left to try, what its responder expects and owes. For the
    /// report of a run that did not finish.
    pub fn progress(&self) -> String {
        let (req, resp) = (&self.req, &self.resp);
        format!(
            "requester: {} requests, una {:?}, sent to {:?}, {} retries and {} RNR retries left, credits {:?}, \
             next deadline {:?}; responder: expects {:?}, {} answers queued",
            self.sq.len(),
            req.una,
            req.sent_end,
            req.retries_left,
            req.rnr_retries_left,
            req.credits.available(),
            req.deadline(),
            resp.epsn,
            resp.answers.len()
        )
    }

    /// Number of send work requests not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// Number of receive work requests not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }
}

/// Puts a completion in its queue and records what the device must say
/// about it: a fired notification, or an overflow (`IBV_EVENT_CQ_ERR`).
fn deliver(ctx: &mut Ctx, cq: &CompletionQueue, completion: Completion) {
    match cq.push(Completion { timestamp: ctx.now, ..completion }) {
        Pushed::Stored | Pushed::Dropped => {}
        Pushed::Notify => ctx.fired_cqs.push_back(cq.id()),
        Pushed::Overflowed => ctx.events.push_back(AsyncEvent::CqError { cq: cq.id() }),
    }
}
