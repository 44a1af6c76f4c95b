//! The Communication Manager's protocol, sans I/O: one agent's side of
//! every connection it takes part in (IBTA vol. 1 section 12.9's state
//! machines, reduced to what rdma_cm uses).
//!
//! Calls in ([`Cm::connect`], [`Cm::accept`], [`Cm::handle_mad`],
//! [`Cm::handle_timeout`], ...), MADs and events out ([`Cm::poll_transmit`],
//! [`Cm::poll_event`]), time passed in; the agent ([`crate::agent`]) moves
//! the MADs over QP1 and the library turns events into rdma_cm's.
//!
//! Active side: REQ → (REP) → the library moves its QP to RTS →
//! [`Cm::confirm`] sends the RTU. Passive side: (REQ) → the library asks
//! the program → [`Cm::accept`] sends the REP → (RTU) → established. Either
//! side: [`Cm::disconnect`] sends a DREQ, the other answers with a DREP.
//! A REQ, REP or DREQ unanswered within [`RESPONSE_TIMEOUT`] is sent again,
//! up to [`MAX_RETRIES`] times; a duplicate that arrives gets the answer it
//! missed sent again. Messages for no connection are dropped (REQs for no
//! listener are rejected), so a hostile MAD changes nothing it does not
//! name.
//!
//! Anyone on the network can send a MAD to QP1, so nothing in one is
//! believed that the connection does not confirm: a reply counts only from
//! the connection's peer, naming both sides' communication IDs (drawn at
//! random, so a stranger cannot guess them); a REQ waits for the program
//! at most as long as its sender waits for the answer, and no more of them
//! than the listener's backlog; MADs to send are bounded too.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softrnic_wire::cm::{
    self, Answered, CLASS_VERSION, Dreq, Ids, Message, PrivateData, Rej, Rep, Req, SidrRep, SidrReq, reject_reason,
};
use softrnic_wire::mad::{self, MAD_LEN};

/// The CM response timeout softrnic advertises and waits, as the IBTA's
/// exponent of 4.096 µs: 2^16 × 4.096 µs ≈ 268 ms.
pub const RESPONSE_TIMEOUT_EXP: u8 = 16;
pub const RESPONSE_TIMEOUT: Duration = Duration::from_nanos(4096 << RESPONSE_TIMEOUT_EXP);
/// How often a REQ, REP or DREQ is sent again before the other side is
/// taken for gone (the REQ field is four bits).
pub const MAX_RETRIES: u8 = 15;

/// How long a connection that went down is remembered, to answer a late
/// duplicate DREQ (the IBTA's time wait), before it is forgotten.
pub const TIME_WAIT: Duration = Duration::from_secs(2);

/// How many refused-once requests an agent remembers.
const MAX_UNCLAIMED: usize = 1024;

/// How long a REQ waits for the program to accept or reject it: as long as
/// its sender waits for an answer (every retry's response timeout), after
/// which the sender has given up anyway.
pub const REQ_PATIENCE: Duration = RESPONSE_TIMEOUT.saturating_mul(MAX_RETRIES as u32 + 1);

/// A listener's backlog when the program asks for none or for more: the
/// Linux default of `net.rdma_ucm.max_backlog`.
pub const MAX_BACKLOG: usize = 1024;

/// How many MADs may wait to be sent: a flood of requests that each earn
/// an answer (a REJ, a DREP) must not grow the queue without end. Those
/// beyond are dropped, as a full MAD queue drops, and sent again where
/// the protocol sends again.
pub const MAX_TRANSMITS: usize = 1024;

/// A connection, by this side's communication ID.
pub type ConnId = u32;
/// A listener, by its service ID.
pub type ServiceId = u64;

/// A MAD to send, to the CM agent at `dst` (its QP1).
#[derive(Clone, Copy)]
pub struct Transmit {
    pub dst: IpAddr,
    pub mad: [u8; MAD_LEN],
}

/// What the program must hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A REQ for a listened-to service: a new connection, waiting for
    /// [`Cm::accept`] or [`Cm::reject`].
    ConnectRequest { service: ServiceId, conn: ConnId, peer: IpAddr, req: Req },
    /// The REP to this side's REQ: move the QP to RTS, then [`Cm::confirm`].
    Reply { conn: ConnId, rep: Rep },
    /// The peer refused (or a REQ found no listener).
    Rejected { conn: ConnId, reason: u16, private_data: PrivateData },
    /// The RTU arrived: the passive side's connection is up.
    Established { conn: ConnId },
    /// The connection is down: a DREQ arrived (and was answered), or this
    /// side's DREQ was answered or went unanswered.
    Disconnected { conn: ConnId },
    /// A REQ or REP went unanswered [`MAX_RETRIES`] times.
    Unreachable { conn: ConnId },
    /// A SIDR_REQ for a listened-to service: answer with
    /// [`Cm::sidr_reply`].
    SidrRequest { service: ServiceId, conn: ConnId, peer: IpAddr, req: SidrReq },
    /// The answer to this side's SIDR_REQ.
    SidrReply { conn: ConnId, rep: SidrRep },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP or REJ.
    ReqSent,
    /// Active: REP received, the program moves its QP before the RTU.
    RepReceived,
    /// Passive: REQ received, the program decides.
    ReqReceived,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// Down; kept [`TIME_WAIT`] to answer a late duplicate DREQ.
    TimeWait,
    /// SIDR_REQ sent.
    SidrSent,
    /// SIDR_REQ received, the program decides.
    SidrReceived,
}

struct Connection {
    state: State,
    peer: IpAddr,
    /// The service a received request is for, while the program decides
    /// (it counts against the listener's backlog).
    pending_for: Option<ServiceId>,
    remote_comm_id: u32,
    /// The peer's QP (for a DREQ).
    remote_qpn: u32,
    transaction_id: u64,
    /// What this side last sent and may send again.
    last: Option<Message>,
    /// When to send it again, and how many more times.
    deadline: Option<Duration>,
    retries_left: u8,
}

/// One CM agent's connections.
pub struct Cm {
    connections: HashMap<ConnId, Connection>,
    /// Passive connections by (peer, the peer's communication ID): how a
    /// duplicate REQ finds the connection it already made.
    by_peer: HashMap<(IpAddr, u32), ConnId>,
    listeners: HashMap<ServiceId, Listener>,
    /// REQs and SIDR_REQs for no listener, seen once: refused only when
    /// they come again (see [`Cm::handle_mad`]).
    unclaimed: HashSet<(IpAddr, u32)>,
    /// Where communication IDs are drawn from.
    ids: StdRng,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    /// MADs dropped for naming nothing this agent knows, for not coming
    /// from the connection's peer, or for not parsing.
    pub dropped: u64,
    /// REQs dropped because their listener's backlog was full (their
    /// senders send them again).
    pub over_backlog: u64,
    /// MADs not sent because [`MAX_TRANSMITS`] were waiting.
    pub transmits_dropped: u64,
}

/// A listening service.
struct Listener {
    /// How many requests may wait for the program at once.
    backlog: usize,
    /// How many do.
    pending: usize,
}

impl Cm {
    /// An agent whose communication IDs are drawn from a generator seeded
    /// with `seed` (from the operating system: a stranger who guessed one
    /// could forge a DREQ for it).
    pub fn new(seed: [u8; 32]) -> Cm {
        Cm {
            connections: HashMap::new(),
            by_peer: HashMap::new(),
            listeners: HashMap::new(),
            unclaimed: HashSet::new(),
            ids: StdRng::from_seed(seed),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            dropped: 0,
            over_backlog: 0,
            transmits_dropped: 0,
        }
    }

    fn allocate_id(&mut self) -> ConnId {
        loop {
            let id = self.ids.next_u32();
            if id != 0 && !self.connections.contains_key(&id) {
                return id;
            }
        }
    }

    /// REQs and SIDR_REQs for `service` now come to this agent's program,
    /// at most `backlog` waiting for it at once (0: [`MAX_BACKLOG`], as is
    /// more than that).
    pub fn listen(&mut self, service: ServiceId, backlog: usize) -> Result<(), &'static str> {
        if self.listeners.contains_key(&service) {
            return Err("another rdma_cm ID listens on this port already");
        }
        let backlog = if backlog == 0 { MAX_BACKLOG } else { backlog.min(MAX_BACKLOG) };
        let pending = self.connections.values().filter(|c| c.pending_for == Some(service)).count();
        self.listeners.insert(service, Listener { backlog, pending });
        Ok(())
    }

    pub fn stop_listening(&mut self, service: ServiceId) {
        self.listeners.remove(&service);
    }

    /// Sends a REQ to `peer`; returns the new connection.
    pub fn connect(&mut self, now: Duration, peer: IpAddr, req: Req) -> ConnId {
        let conn = self.allocate_id();
        let req = Req { local_comm_id: conn, ..req };
        let transaction_id = u64::from(conn) << 32 | u64::from(req.local_qpn);
        self.connections.insert(conn, Connection::new(State::ReqSent, peer, 0, 0, transaction_id));
        self.send_reliably(now, conn, Message::Req(req));
        conn
    }

    /// Sends a SIDR_REQ to `peer`; returns the new request.
    pub fn sidr_request(&mut self, now: Duration, peer: IpAddr, req: SidrReq) -> ConnId {
        let conn = self.allocate_id();
        let transaction_id = u64::from(conn) << 32;
        self.connections.insert(conn, Connection::new(State::SidrSent, peer, 0, 0, transaction_id));
        self.send_reliably(now, conn, Message::SidrReq(SidrReq { request_id: conn, ..req }));
        conn
    }

    /// The passive side accepts with `rep` (its QP and PSN).
    pub fn accept(&mut self, now: Duration, conn: ConnId, rep: Rep) -> Result<(), &'static str> {
        let c = self.connection(conn, State::ReqReceived)?;
        let rep = Rep { local_comm_id: conn, remote_comm_id: c.remote_comm_id, ..rep };
        c.state = State::RepSent;
        self.decided(conn);
        self.send_reliably(now, conn, Message::Rep(rep));
        Ok(())
    }

    /// The program has answered a request: it no longer counts against its
    /// listener's backlog.
    fn decided(&mut self, conn: ConnId) {
        let Some(service) = self.connections.get_mut(&conn).and_then(|c| c.pending_for.take()) else { return };
        if let Some(listener) = self.listeners.get_mut(&service) {
            listener.pending = listener.pending.saturating_sub(1);
        }
    }

    /// Refuses a REQ (or a SIDR_REQ) with the consumer-defined reason.
    pub fn reject(&mut self, conn: ConnId, private_data: PrivateData) -> Result<(), &'static str> {
        let c = self.connections.get(&conn).ok_or("no such connection")?;
        let message = match c.state {
            State::ReqReceived => Message::Rej(Rej {
                local_comm_id: conn,
                remote_comm_id: c.remote_comm_id,
                rejected: Answered::Req,
                reason: reject_reason::CONSUMER_DEFINED,
                private_data,
            }),
            State::SidrReceived => Message::SidrRep(SidrRep {
                request_id: c.remote_comm_id,
                status: cm::sidr_status::REJECTED,
                qpn: 0,
                service_id: 0,
                qkey: 0,
                private_data,
            }),
            _ => return Err("only a connection request can be rejected"),
        };
        let peer = c.peer;
        let tid = c.transaction_id;
        self.send_once(peer, tid, message);
        self.forget(conn);
        Ok(())
    }

    /// Answers a SIDR_REQ.
    pub fn sidr_reply(&mut self, conn: ConnId, rep: SidrRep) -> Result<(), &'static str> {
        let c = self.connection(conn, State::SidrReceived)?;
        let message = Message::SidrRep(SidrRep { request_id: c.remote_comm_id, ..rep });
        let (peer, tid) = (c.peer, c.transaction_id);
        self.send_once(peer, tid, message);
        self.forget(conn);
        Ok(())
    }

    /// The active side's QP is ready: sends the RTU.
    pub fn confirm(&mut self, conn: ConnId, private_data: PrivateData) -> Result<(), &'static str> {
        let c = self.connection(conn, State::RepReceived)?;
        let rtu = Message::Rtu(Ids { local_comm_id: conn, remote_comm_id: c.remote_comm_id, private_data });
        c.state = State::Established;
        c.last = Some(rtu);
        c.deadline = None;
        let (peer, tid) = (c.peer, c.transaction_id);
        self.send_once(peer, tid, rtu);
        Ok(())
    }

    /// Takes the connection down: sends a DREQ (once established), rejects
    /// a request the program never answered, or forgets a connection that
    /// never came up.
    pub fn disconnect(&mut self, now: Duration, conn: ConnId) -> Result<(), &'static str> {
        let c = self.connections.get_mut(&conn).ok_or("no such connection")?;
        match c.state {
            State::Established | State::RepSent | State::RepReceived => {
                let dreq = Message::Dreq(Dreq {
                    local_comm_id: conn,
                    remote_comm_id: c.remote_comm_id,
                    remote_qpn: c.remote_qpn,
                    private_data: PrivateData::EMPTY,
                });
                c.state = State::DreqSent;
                c.retries_left = MAX_RETRIES;
                self.send_reliably(now, conn, dreq);
                Ok(())
            }
            State::DreqSent | State::TimeWait => Err("already disconnected"),
            State::ReqReceived | State::SidrReceived => self.reject(conn, PrivateData::EMPTY),
            _ => {
                self.forget(conn);
                Ok(())
            }
        }
    }

    /// Forgets a connection whose program is done with it.
    pub fn forget(&mut self, conn: ConnId) {
        self.decided(conn);
        if self.connections.remove(&conn).is_some() {
            self.by_peer.retain(|_, id| *id != conn);
        }
    }

    fn connection(&mut self, conn: ConnId, state: State) -> Result<&mut Connection, &'static str> {
        match self.connections.get_mut(&conn) {
            Some(c) if c.state == state => Ok(c),
            Some(_) => Err("the connection is not in the state this call needs"),
            None => Err("no such connection"),
        }
    }

    /// Handles a MAD that arrived on QP1 from `peer`.
    ///
    /// A request for a service nobody listens on is refused (a REJ, or a
    /// SIDR_REP saying so) only when it comes again, a response timeout
    /// later. The IBTA's CM refuses at once, but it is the host's one CM;
    /// softrnic's lives in each process, and a request may arrive between a
    /// server's device opening and its `rdma_listen`, or at the last
    /// moment of the process that served the port before.
    pub fn handle_mad(&mut self, now: Duration, peer: IpAddr, bytes: &[u8]) {
        let parsed = mad::Header::new_checked(bytes).and_then(|h| mad::Repr::parse(&h)).and_then(|header| {
            if header.mgmt_class != mad::class::CM || header.class_version != CLASS_VERSION {
                return Err(softrnic_wire::Error::Reserved);
            }
            Message::parse(header.attribute_id, &bytes[24..]).map(|m| (header, m))
        });
        let Ok((header, message)) = parsed else {
            self.dropped += 1;
            return;
        };
        let handled = match message {
            Message::Req(req) => self.on_req(now, peer, header.transaction_id, req),
            Message::SidrReq(req) => self.on_sidr_req(now, peer, header.transaction_id, req),
            Message::Rep(rep) => self.on_rep(peer, rep),
            Message::Rej(rej) => self.on_rej(peer, rej),
            Message::Rtu(rtu) => self.on_rtu(peer, rtu),
            Message::Dreq(dreq) => self.on_dreq(now, peer, header.transaction_id, dreq),
            Message::Drep(drep) => self.on_drep(now, peer, drep),
            Message::SidrRep(rep) => self.on_sidr_rep(peer, rep),
            // An MRA asks for patience: wait the full retry budget.
            Message::Mra(_) => true,
        };
        if !handled {
            self.dropped += 1;
        }
    }

    /// The connection `conn` names, if `peer` is its peer and (once this
    /// side knows it) `their_id` the peer's communication ID: how a reply
    /// proves it belongs to the connection.
    fn confirmed_by(&mut self, conn: ConnId, peer: IpAddr, their_id: u32) -> Option<&mut Connection> {
        let c = self.connections.get_mut(&conn)?;
        let known = c.remote_comm_id != 0;
        (c.peer == peer && (!known || c.remote_comm_id == their_id)).then_some(c)
    }

    /// Whether `service`'s listener has room for one more request, taking
    /// it if so.
    fn admit(&mut self, service: ServiceId) -> bool {
        let Some(listener) = self.listeners.get_mut(&service) else { return false };
        if listener.pending >= listener.backlog {
            self.over_backlog += 1;
            return false;
        }
        listener.pending += 1;
        true
    }

    fn on_req(&mut self, now: Duration, peer: IpAddr, tid: u64, req: Req) -> bool {
        if let Some(&conn) = self.by_peer.get(&(peer, req.local_comm_id)) {
            // A duplicate: the REP it missed goes again.
            if let Some(c) = self.connections.get(&conn)
                && let (State::RepSent, Some(last)) = (c.state, c.last)
            {
                let (peer, tid) = (c.peer, c.transaction_id);
                self.send_once(peer, tid, last);
            }
            return true;
        }
        if !self.listeners.contains_key(&req.service_id) {
            if self.first_sight(peer, req.local_comm_id) {
                return true;
            }
            let rej = Rej {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                rejected: Answered::Req,
                reason: reject_reason::INVALID_SERVICE_ID,
                private_data: PrivateData::EMPTY,
            };
            self.send_once(peer, tid, Message::Rej(rej));
            return true;
        }
        if !self.admit(req.service_id) {
            return true; // its sender tries again a response timeout later
        }
        let conn = self.allocate_id();
        let mut c = Connection::new(State::ReqReceived, peer, req.local_comm_id, req.local_qpn, tid);
        c.pending_for = Some(req.service_id);
        c.deadline = Some(now + REQ_PATIENCE);
        self.connections.insert(conn, c);
        self.by_peer.insert((peer, req.local_comm_id), conn);
        self.events.push_back(Event::ConnectRequest { service: req.service_id, conn, peer, req });
        true
    }

    /// Notes a request for no listener; whether it is new.
    fn first_sight(&mut self, peer: IpAddr, id: u32) -> bool {
        if self.unclaimed.remove(&(peer, id)) {
            return false;
        }
        if self.unclaimed.len() >= MAX_UNCLAIMED {
            // Hostile or forgotten: the oldest need not be remembered.
            self.unclaimed.clear();
        }
        self.unclaimed.insert((peer, id));
        true
    }

    fn on_sidr_req(&mut self, now: Duration, peer: IpAddr, tid: u64, req: SidrReq) -> bool {
        if !self.listeners.contains_key(&req.service_id) {
            if self.first_sight(peer, req.request_id) {
                return true;
            }
            let rep = SidrRep {
                request_id: req.request_id,
                status: cm::sidr_status::SERVICE_ID_NOT_SUPPORTED,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                private_data: PrivateData::EMPTY,
            };
            self.send_once(peer, tid, Message::SidrRep(rep));
            return true;
        }
        if self.by_peer.contains_key(&(peer, req.request_id)) {
            return true;
        }
        if !self.admit(req.service_id) {
            return true;
        }
        let conn = self.allocate_id();
        let mut c = Connection::new(State::SidrReceived, peer, req.request_id, 0, tid);
        c.pending_for = Some(req.service_id);
        c.deadline = Some(now + REQ_PATIENCE);
        self.connections.insert(conn, c);
        self.by_peer.insert((peer, req.request_id), conn);
        self.events.push_back(Event::SidrRequest { service: req.service_id, conn, peer, req });
        true
    }

    fn on_rep(&mut self, peer: IpAddr, rep: Rep) -> bool {
        let Some(c) = self.confirmed_by(rep.remote_comm_id, peer, rep.local_comm_id) else { return false };
        match c.state {
            State::ReqSent => {
                c.state = State::RepReceived;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.deadline = None;
                c.last = None;
                self.events.push_back(Event::Reply { conn: rep.remote_comm_id, rep });
            }
            // The RTU was lost: send it again.
            State::Established => {
                if let Some(rtu) = c.last {
                    let (peer, tid) = (c.peer, c.transaction_id);
                    self.send_once(peer, tid, rtu);
                }
            }
            _ => {}
        }
        true
    }

    fn on_rej(&mut self, peer: IpAddr, rej: Rej) -> bool {
        // A REJ for no listener names no connection of its sender's (0).
        let Some(c) = self.confirmed_by(rej.remote_comm_id, peer, rej.local_comm_id) else { return false };
        if !matches!(c.state, State::ReqSent | State::RepSent) {
            return false;
        }
        let conn = rej.remote_comm_id;
        self.events.push_back(Event::Rejected { conn, reason: rej.reason, private_data: rej.private_data });
        self.forget(conn);
        true
    }

    fn on_rtu(&mut self, peer: IpAddr, rtu: Ids) -> bool {
        let Some(c) = self.confirmed_by(rtu.remote_comm_id, peer, rtu.local_comm_id) else { return false };
        if c.state != State::RepSent {
            return c.state == State::Established;
        }
        c.state = State::Established;
        c.deadline = None;
        c.last = None;
        self.events.push_back(Event::Established { conn: rtu.remote_comm_id });
        true
    }

    fn on_dreq(&mut self, now: Duration, peer: IpAddr, tid: u64, dreq: Dreq) -> bool {
        let conn = dreq.remote_comm_id;
        if !self.connections.contains_key(&conn) {
            // Forgotten already: answer anyway, so the peer stops asking.
            let drep =
                Ids { local_comm_id: conn, remote_comm_id: dreq.local_comm_id, private_data: PrivateData::EMPTY };
            self.send_once(peer, tid, Message::Drep(drep));
            return true;
        }
        let Some(c) = self.confirmed_by(conn, peer, dreq.local_comm_id) else { return false };
        let drep = Message::Drep(Ids {
            local_comm_id: conn,
            remote_comm_id: c.remote_comm_id,
            private_data: PrivateData::EMPTY,
        });
        let was = c.state;
        c.state = State::TimeWait;
        c.deadline = Some(now + TIME_WAIT);
        c.last = Some(drep);
        self.send_once(peer, tid, drep);
        if matches!(was, State::Established | State::RepSent | State::RepReceived | State::DreqSent) {
            self.events.push_back(Event::Disconnected { conn });
        }
        true
    }

    fn on_drep(&mut self, now: Duration, peer: IpAddr, drep: Ids) -> bool {
        let Some(c) = self.confirmed_by(drep.remote_comm_id, peer, drep.local_comm_id) else { return false };
        if c.state != State::DreqSent {
            return false;
        }
        c.state = State::TimeWait;
        c.deadline = Some(now + TIME_WAIT);
        c.last = None;
        self.events.push_back(Event::Disconnected { conn: drep.remote_comm_id });
        true
    }

    fn on_sidr_rep(&mut self, peer: IpAddr, rep: SidrRep) -> bool {
        let conn = rep.request_id;
        match self.connections.get(&conn) {
            Some(c) if c.state == State::SidrSent && c.peer == peer => {
                self.events.push_back(Event::SidrReply { conn, rep });
                self.forget(conn);
                true
            }
            _ => false,
        }
    }

    /// When [`Cm::handle_timeout`] next has work.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.connections.values().filter_map(|c| c.deadline).min()
    }

    /// Sends again what went unanswered; gives up on what went unanswered
    /// too often; forgets connections whose time wait is over.
    pub fn handle_timeout(&mut self, now: Duration) {
        let due: Vec<ConnId> =
            self.connections.iter().filter(|(_, c)| c.deadline.is_some_and(|d| d <= now)).map(|(&id, _)| id).collect();
        for conn in due {
            let c = self.connections.get_mut(&conn).expect("listed");
            if c.state == State::TimeWait {
                self.forget(conn);
                continue;
            }
            if matches!(c.state, State::ReqReceived | State::SidrReceived) {
                // The program never answered, and the sender has given
                // up: a later accept finds no connection.
                self.forget(conn);
                continue;
            }
            if c.retries_left == 0 {
                c.deadline = None;
                match c.state {
                    State::DreqSent => {
                        c.state = State::TimeWait;
                        c.deadline = Some(now + TIME_WAIT);
                        self.events.push_back(Event::Disconnected { conn });
                    }
                    State::SidrSent | State::ReqSent | State::RepSent => {
                        self.events.push_back(Event::Unreachable { conn });
                        self.forget(conn);
                    }
                    _ => {}
                }
                continue;
            }
            c.retries_left -= 1;
            c.deadline = Some(now + RESPONSE_TIMEOUT);
            if let Some(last) = c.last {
                let (peer, tid) = (c.peer, c.transaction_id);
                self.send_once(peer, tid, last);
            }
        }
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Sends `message` and keeps it to send again until answered.
    fn send_reliably(&mut self, now: Duration, conn: ConnId, message: Message) {
        let c = self.connections.get_mut(&conn).expect("a live connection");
        c.last = Some(message);
        c.deadline = Some(now + RESPONSE_TIMEOUT);
        c.retries_left = MAX_RETRIES;
        let (peer, tid) = (c.peer, c.transaction_id);
        self.send_once(peer, tid, message);
    }

    fn send_once(&mut self, dst: IpAddr, transaction_id: u64, message: Message) {
        let mut mad = [0u8; MAD_LEN];
        let header = mad::Repr {
            mgmt_class: mad::class::CM,
            class_version: CLASS_VERSION,
            method: mad::method::SEND,
            status: 0,
            transaction_id,
            attribute_id: message.attribute_id(),
            attribute_modifier: 0,
        };
        header.emit(&mut mad::Header::new_unchecked(&mut mad[..]));
        if message.emit(&mut mad[24..]).is_err() {
            // The library checks private data lengths before it gets here.
            debug_assert!(false, "private data too long for {message:?}");
            return;
        }
        if self.transmits.len() >= MAX_TRANSMITS {
            self.transmits_dropped += 1;
            return;
        }
        self.transmits.push_back(Transmit { dst, mad });
    }
}

impl Connection {
    fn new(state: State, peer: IpAddr, remote_comm_id: u32, remote_qpn: u32, transaction_id: u64) -> Connection {
        Connection {
            state,
            peer,
            pending_for: None,
            remote_comm_id,
            remote_qpn,
            transaction_id,
            last: None,
            deadline: None,
            retries_left: MAX_RETRIES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVICE: ServiceId = 0x0106_4e21;

    fn req(qpn: u32) -> Req {
        let Message::Req(r) = Message::parse(cm::attribute::REQ, &[0u8; mad::MAD_DATA_LEN]).unwrap() else {
            unreachable!()
        };
        Req { service_id: SERVICE, local_qpn: qpn, starting_psn: 100, ..r }
    }

    fn rep(qpn: u32) -> Rep {
        let Message::Rep(r) = Message::parse(cm::attribute::REP, &[0u8; mad::MAD_DATA_LEN]).unwrap() else {
            unreachable!()
        };
        Rep { local_qpn: qpn, starting_psn: 200, ..r }
    }

    /// Two agents and the link between them, which may drop the next few
    /// MADs it carries.
    struct Pair {
        a: Cm,
        b: Cm,
        now: Duration,
        drop_next: usize,
        carried: Vec<u16>,
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3));

    impl Pair {
        fn new() -> Pair {
            Pair { a: Cm::new([1; 32]), b: Cm::new([2; 32]), now: Duration::ZERO, drop_next: 0, carried: Vec::new() }
        }

        /// Moves every MAD until both are quiet.
        fn settle(&mut self) {
            loop {
                let mut moved = false;
                while let Some(t) = self.a.poll_transmit() {
                    moved = true;
                    assert_eq!(t.dst, B);
                    self.carry(t, true);
                }
                while let Some(t) = self.b.poll_transmit() {
                    moved = true;
                    assert_eq!(t.dst, A);
                    self.carry(t, false);
                }
                if !moved {
                    return;
                }
            }
        }

        fn carry(&mut self, t: Transmit, to_b: bool) {
            self.carried.push(u16::from_be_bytes([t.mad[16], t.mad[17]]));
            if self.drop_next > 0 {
                self.drop_next -= 1;
                return;
            }
            if to_b { self.b.handle_mad(self.now, A, &t.mad) } else { self.a.handle_mad(self.now, B, &t.mad) }
        }

        /// Lets time pass to the next timer of either side.
        fn tick(&mut self) {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()].into_iter().flatten().min();
            self.now = next.expect("a timer is pending");
            self.a.handle_timeout(self.now);
            self.b.handle_timeout(self.now);
            self.settle();
        }

        /// A connects to B, B accepts, A confirms.
        fn connect(&mut self) -> (ConnId, ConnId) {
            let a = self.a.connect(self.now, B, req(0x11));
            self.settle();
            let Some(Event::ConnectRequest { conn: b, req: r, peer, .. }) = self.b.poll_event() else { panic!() };
            assert_eq!((peer, r.local_qpn, r.starting_psn), (A, 0x11, 100));
            self.b.accept(self.now, b, rep(0x22)).unwrap();
            self.settle();
            let Some(Event::Reply { conn, rep }) = self.a.poll_event() else { panic!() };
            assert_eq!((conn, rep.local_qpn, rep.starting_psn), (a, 0x22, 200));
            self.a.confirm(a, PrivateData::EMPTY).unwrap();
            self.settle();
            assert_eq!(self.b.poll_event(), Some(Event::Established { conn: b }));
            (a, b)
        }
    }

    #[test]
    fn connect_and_disconnect() {
        let mut p = Pair::new();
        p.b.listen(SERVICE, 0).unwrap();
        let (a, b) = p.connect();
        assert_eq!(p.carried, [cm::attribute::REQ, cm::attribute::REP, cm::attribute::RTU]);
        p.a.disconnect(p.now, a).unwrap();
        p.settle();
        assert_eq!(p.b.poll_event(), Some(Event::Disconnected { conn: b }));
        assert_eq!(p.a.poll_event(), Some(Event::Disconnected { conn: a }));
        assert_eq!((p.a.dropped, p.b.dropped), (0, 0));
        // A late duplicate DREQ is answered while the time wait lasts...
        let dreq = Dreq { local_comm_id: a, remote_comm_id: b, remote_qpn: 0x22, private_data: PrivateData::EMPTY };
        p.a.send_once(B, 1, Message::Dreq(dreq));
        let late = p.a.poll_transmit().unwrap();
        p.b.handle_mad(p.now, A, &late.mad);
        assert!(p.b.poll_transmit().is_some(), "the DREP again");
        assert_eq!(p.b.poll_event(), None, "not a second disconnect");
        // ... and then both sides forget the connection.
        p.tick();
        assert!(p.a.connections.is_empty() && p.b.connections.is_empty());
        assert_eq!(p.a.poll_timeout(), None, "nothing left to do");
    }

    /// Refused when it comes again: a listener has a response timeout to
    /// appear.
    #[test]
    fn a_req_for_no_listener_is_rejected() {
        let mut p = Pair::new();
        let a = p.a.connect(p.now, B, req(0x11));
        p.settle();
        assert_eq!(p.a.poll_event(), None);
        p.tick();
        let Some(Event::Rejected { conn, reason, .. }) = p.a.poll_event() else { panic!() };
        assert_eq!((conn, reason), (a, reject_reason::INVALID_SERVICE_ID));
        assert_eq!(p.a.poll_timeout(), None);
    }

    #[test]
    fn a_listener_that_appears_in_time_gets_the_request() {
        let mut p = Pair::new();
        p.a.connect(p.now, B, req(0x11));
        p.settle();
        p.b.listen(SERVICE, 0).unwrap();
        p.tick();
        assert!(matches!(p.b.poll_event(), Some(Event::ConnectRequest { .. })));
        assert_eq!(p.a.poll_event(), None);
    }

    #[test]
    fn a_consumer_reject_carries_private_data() {
        let mut p = Pair::new();
        p.b.listen(SERVICE, 0).unwrap();
        p.a.connect(p.now, B, req(0x11));
        p.settle();
        let Some(Event::ConnectRequest { conn, .. }) = p.b.poll_event() else { panic!() };
        p.b.reject(conn, PrivateData::new(b"busy").unwrap()).unwrap();
        p.settle();
        let Some(Event::Rejected { reason, private_data, .. }) = p.a.poll_event() else { panic!() };
        assert_eq!(reason, reject_reason::CONSUMER_DEFINED);
        assert_eq!(&private_data.as_slice()[..4], b"busy");
    }

    /// Every message of the exchange lost once: each is sent again, or
    /// its duplicate answered again, and both sides end up connected once.
    #[test]
    fn each_lost_message_is_recovered() {
        for lost in 0..3 {
            let mut p = Pair::new();
            p.b.listen(SERVICE, 0).unwrap();
            let a = p.a.connect(p.now, B, req(0x11));
            if lost == 0 {
                p.drop_next = 1;
            }
            p.settle();
            if lost == 0 {
                assert_eq!(p.b.poll_event(), None);
                p.tick();
            }
            let Some(Event::ConnectRequest { conn: b, .. }) = p.b.poll_event() else { panic!("lost {lost}") };
            if lost == 1 {
                p.drop_next = 1;
            }
            p.b.accept(p.now, b, rep(0x22)).unwrap();
            p.settle();
            if lost == 1 {
                p.tick();
            }
            let Some(Event::Reply { .. }) = p.a.poll_event() else { panic!("lost {lost}") };
            if lost == 2 {
                p.drop_next = 1;
            }
            p.a.confirm(a, PrivateData::EMPTY).unwrap();
            p.settle();
            if lost == 2 {
                // The REP goes again; the duplicate brings the RTU again.
                p.tick();
            }
            assert_eq!(p.b.poll_event(), Some(Event::Established { conn: b }), "lost {lost}");
            assert_eq!(p.b.poll_event(), None, "one connection, not two");
            assert_eq!(p.a.poll_event(), None);
        }
    }

    #[test]
    fn an_unanswered_req_makes_the_peer_unreachable() {
        let mut p = Pair::new();
        let a = p.a.connect(p.now, B, req(0x11));
        p.drop_next = usize::MAX;
        p.settle();
        for _ in 0..MAX_RETRIES {
            assert_eq!(p.a.poll_event(), None);
            p.tick();
        }
        p.tick();
        assert_eq!(p.a.poll_event(), Some(Event::Unreachable { conn: a }));
        assert_eq!(p.carried.len(), 1 + MAX_RETRIES as usize);
        assert!(p.now >= RESPONSE_TIMEOUT * 16);
    }

    #[test]
    fn hostile_mads_change_nothing() {
        let mut p = Pair::new();
        p.b.listen(SERVICE, 0).unwrap();
        let (a, _) = p.connect();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut mad = [0u8; MAD_LEN];
            for byte in mad.iter_mut() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                *byte = rng as u8;
            }
            // Some pass the header checks and name random connections.
            mad[0] = 1;
            mad[1] = mad::class::CM;
            mad[2] = CLASS_VERSION;
            p.a.handle_mad(p.now, B, &mad);
            p.a.handle_mad(p.now, B, &mad[..mad.len() / 2]);
        }
        assert!(p.a.dropped >= 2000);
        while let Some(t) = p.a.poll_transmit() {
            // Only REJs and DREPs for what the junk named.
            let attribute = u16::from_be_bytes([t.mad[16], t.mad[17]]);
            assert!([cm::attribute::REJ, cm::attribute::DREP, cm::attribute::SIDR_REP].contains(&attribute));
        }
        // The real connection still works.
        p.a.disconnect(p.now, a).unwrap();
        p.settle();
        assert_eq!(p.a.poll_event(), Some(Event::Disconnected { conn: a }));
    }

    #[test]
    fn sidr_resolves_a_service() {
        let mut p = Pair::new();
        p.b.listen(SERVICE, 0).unwrap();
        let sidr = SidrReq { request_id: 0, pkey: 0xffff, service_id: SERVICE, private_data: PrivateData::EMPTY };
        let a = p.a.sidr_request(p.now, B, sidr);
        p.settle();
        let Some(Event::SidrRequest { conn, .. }) = p.b.poll_event() else { panic!() };
        let rep = SidrRep {
            request_id: 0,
            status: cm::sidr_status::VALID,
            qpn: 0x33,
            service_id: SERVICE,
            qkey: 0x0123_4567,
            private_data: PrivateData::EMPTY,
        };
        p.b.sidr_reply(conn, rep).unwrap();
        p.settle();
        let Some(Event::SidrReply { conn, rep }) = p.a.poll_event() else { panic!() };
        assert_eq!((conn, rep.qpn, rep.qkey), (a, 0x33, 0x0123_4567));
        assert_eq!(p.a.poll_timeout(), None);
    }

    const C: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 4));

    /// A MAD with `message`, as an agent would send it.
    fn mad(message: Message) -> [u8; MAD_LEN] {
        let mut forger = Cm::new([9; 32]);
        forger.send_once(A, 7, message);
        forger.poll_transmit().unwrap().mad
    }

    /// A stranger (C) who knows both sides' communication IDs, and the peer
    /// itself naming the wrong ID, try to tear down, confirm or refuse
    /// connections: nothing happens but the count of dropped MADs. Before,
    /// a DREQ from anyone that named a connection took it down.
    #[test]
    fn replies_count_only_from_the_peer_naming_both_ids() {
        let mut p = Pair::new();
        p.b.listen(SERVICE, 0).unwrap();
        let (a, b) = p.connect();
        let ids =
            |local, remote| Ids { local_comm_id: local, remote_comm_id: remote, private_data: PrivateData::EMPTY };
        let dreq = |local| Dreq {
            local_comm_id: local,
            remote_comm_id: a,
            remote_qpn: 0x11,
            private_data: PrivateData::EMPTY,
        };
        p.a.handle_mad(p.now, C, &mad(Message::Dreq(dreq(b))));
        p.a.handle_mad(p.now, B, &mad(Message::Dreq(dreq(b ^ 1))));
        p.a.handle_mad(p.now, C, &mad(Message::Drep(ids(b, a))));
        let rej = Rej {
            local_comm_id: b,
            remote_comm_id: a,
            rejected: Answered::Rep,
            reason: 1,
            private_data: PrivateData::EMPTY,
        };
        p.a.handle_mad(p.now, C, &mad(Message::Rej(rej)));
        assert_eq!((p.a.dropped, p.a.poll_event()), (4, None), "the connection stands");
        assert!(p.a.poll_transmit().is_none(), "nothing answered");

        // A REQ in flight: a stranger's REP or REJ does not answer it.
        p.b.listen(SERVICE + 1, 0).unwrap();
        let pending = p.a.connect(p.now, B, Req { service_id: SERVICE + 1, ..req(0x12) });
        let forged = Rep { local_comm_id: 77, remote_comm_id: pending, ..rep(0x66) };
        p.a.handle_mad(p.now, C, &mad(Message::Rep(forged)));
        p.a.handle_mad(p.now, C, &mad(Message::Rej(Rej { remote_comm_id: pending, local_comm_id: 0, ..rej })));
        assert_eq!((p.a.dropped, p.a.poll_event()), (6, None));
        p.settle();
        let Some(Event::ConnectRequest { conn, .. }) = p.b.poll_event() else { panic!("the real REQ arrives") };
        p.b.accept(p.now, conn, rep(0x23)).unwrap();
        p.settle();
        let Some(Event::Reply { conn, rep }) = p.a.poll_event() else { panic!("the real REP arrives") };
        assert_eq!((conn, rep.local_qpn), (pending, 0x23));
    }

    /// Communication IDs are drawn: neither consecutive nor the same for
    /// two agents (one that counted up told a stranger every ID to come).
    #[test]
    fn communication_ids_are_drawn_not_counted() {
        let (mut one, mut two) = (Cm::new([3; 32]), Cm::new([4; 32]));
        let a: Vec<ConnId> = (0..64).map(|_| one.connect(Duration::ZERO, B, req(0x11))).collect();
        let b: Vec<ConnId> = (0..64).map(|_| two.connect(Duration::ZERO, B, req(0x11))).collect();
        assert!(a.windows(2).all(|w| w[1].wrapping_sub(w[0]) != 1), "{a:x?}");
        assert!(a.iter().all(|id| *id != 0 && !b.contains(id)));
    }

    /// A flood of REQs from one address, each with its own communication
    /// ID, at a listener whose backlog is 4: four reach the program, the
    /// rest are dropped (their senders try again), and requests the
    /// program never answers are forgotten once their senders have given
    /// up, making room again. Before, each REQ made state that stayed.
    #[test]
    fn a_flood_of_reqs_is_held_to_the_backlog_and_forgotten_in_time() {
        let mut b = Cm::new([5; 32]);
        b.listen(SERVICE, 4).unwrap();
        for id in 1..=100u32 {
            b.handle_mad(Duration::ZERO, C, &mad(Message::Req(Req { local_comm_id: id, ..req(0x11) })));
        }
        let requests: Vec<ConnId> = std::iter::from_fn(|| b.poll_event())
            .map(|e| match e {
                Event::ConnectRequest { conn, .. } => conn,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!((requests.len(), b.over_backlog), (4, 96));
        // The program accepts one; that makes room for one more.
        b.accept(Duration::ZERO, requests[0], rep(0x22)).unwrap();
        b.handle_mad(Duration::ZERO, C, &mad(Message::Req(Req { local_comm_id: 101, ..req(0x11) })));
        assert!(matches!(b.poll_event(), Some(Event::ConnectRequest { .. })));
        assert_eq!(b.over_backlog, 96);
        // The rest are never answered.
        b.handle_timeout(REQ_PATIENCE);
        assert_eq!(b.accept(REQ_PATIENCE, requests[1], rep(0x22)), Err("no such connection"));
        for id in 200..204u32 {
            b.handle_mad(REQ_PATIENCE, C, &mad(Message::Req(Req { local_comm_id: id, ..req(0x11) })));
        }
        assert_eq!(std::iter::from_fn(|| b.poll_event()).count(), 4, "room for a whole backlog again");
        assert_eq!(b.listen(SERVICE + 1, 1 << 20), Ok(()), "a larger backlog is taken as the most");
        assert_eq!(b.listeners[&(SERVICE + 1)].backlog, MAX_BACKLOG);
    }

    /// DREQs for connections long gone, each of which earns a DREP, from a
    /// sender faster than the agent sends: the queue of MADs stays bounded.
    #[test]
    fn the_queue_of_mads_to_send_is_bounded() {
        let mut a = Cm::new([6; 32]);
        for id in 1..=3000u32 {
            let dreq = Dreq { local_comm_id: id, remote_comm_id: id, remote_qpn: 0, private_data: PrivateData::EMPTY };
            a.handle_mad(Duration::ZERO, C, &mad(Message::Dreq(dreq)));
        }
        assert_eq!(std::iter::from_fn(|| a.poll_transmit()).count(), MAX_TRANSMITS);
        assert_eq!(a.transmits_dropped, 3000 - MAX_TRANSMITS as u64);
    }
}
