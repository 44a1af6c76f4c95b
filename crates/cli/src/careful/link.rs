//! The transports the careful method runs over, both ends of each: the
//! client sends a round and waits for the server's "done"; the server
//! takes the round and answers; and single-byte pings for the round trip.
//! The control connection (`mod.rs`) says what comes next, so none of this
//! guesses.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrnic::exchange::Exchange;
use softrnic::{
    Access, Completion, CompletionQueue, ConnectOptions, Context, Endpoint, MemoryRegion, ProtectionDomain, QpCaps,
    QueuePair, RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};

use super::Transport;

pub enum Link {
    Tcp(TcpStream),
    Rdma(Box<Rdma>),
}

/// The largest message an RDMA link carries (the method's top size).
pub const MAX_MESSAGE: usize = 256 * 1024;

impl Link {
    /// The server's end, once the client has named the transport.
    pub fn serve(
        t: Transport,
        addr: IpAddr,
        port: u16,
        control: &mut Exchange,
        timeout: Duration,
    ) -> Result<Link, String> {
        match t {
            Transport::Tcp => {
                let listener = TcpListener::bind((addr, port + 1))
                    .map_err(|e| format!("cannot listen on {addr}:{} for TCP data ({e})", port + 1))?;
                control.send_text("listening").map_err(|e| e.to_string())?;
                let (stream, _) = listener.accept().map_err(|e| format!("accepting the TCP data connection: {e}"))?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                Ok(Link::Tcp(stream))
            }
            Transport::Send | Transport::Write => {
                let rdma = Rdma::open(addr, control, true, timeout)?;
                Ok(Link::Rdma(Box::new(Rdma { write_rounds: t == Transport::Write, ..rdma })))
            }
        }
    }

    /// The client's end.
    pub fn connect(
        t: Transport,
        addr: IpAddr,
        server: SocketAddr,
        control: &mut Exchange,
        timeout: Duration,
    ) -> Result<Link, String> {
        match t {
            Transport::Tcp => {
                match control.read_line().map_err(|e| e.to_string())?.as_str() {
                    "listening" => {}
                    other => return Err(format!("the server said {other:?} instead of listening")),
                }
                let data = SocketAddr::new(server.ip(), server.port() + 1);
                let stream = TcpStream::connect_timeout(&data, timeout)
                    .map_err(|e| format!("TCP data connection to {data}: {e}"))?;
                // Each message leaves when written; Linux still coalesces
                // writes behind a busy queue (autocorking), as a plain
                // socket program gets.
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                Ok(Link::Tcp(stream))
            }
            Transport::Send | Transport::Write => {
                let rdma = Rdma::open(addr, control, false, timeout)?;
                Ok(Link::Rdma(Box::new(Rdma { write: t == Transport::Write, ..rdma })))
            }
        }
    }

    /// Client: one byte there and back; returns the round trip.
    pub fn ping(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        match self {
            Link::Tcp(s) => {
                s.write_all(b"p").map_err(io)?;
                s.read_exact(&mut [0u8; 1]).map_err(io)?;
            }
            Link::Rdma(r) => {
                r.post_recv(0, DONE_SLOT, 1)?;
                r.post(SendOp::Send { imm: None }, 0, 1)?;
                r.wait(2)?;
            }
        }
        Ok(start.elapsed())
    }

    /// Server: ready for `n` pings (the client announces them one by one).
    pub fn arm_pings(&mut self, n: usize) -> Result<(), String> {
        match self {
            Link::Tcp(_) => Ok(()),
            Link::Rdma(r) => (0..n.min(RECV_SLOTS)).try_for_each(|i| r.post_recv(i as u64, i, 1)),
        }
    }

    /// Server: answers `n` pings.
    pub fn answer_pings(&mut self, n: usize) -> Result<(), String> {
        match self {
            Link::Tcp(s) => (0..n).try_for_each(|_| {
                s.read_exact(&mut [0u8; 1]).map_err(io)?;
                s.write_all(b"p").map_err(io)
            }),
            Link::Rdma(r) => {
                // A ping can arrive before the last answer's completion:
                // completions are told apart by kind, not by order.
                let (mut pinged, mut answered) = (0, 0);
                while answered < n {
                    r.take_completions()?;
                    // Taken out to post while reading it, and put back so
                    // its buffer serves the next poll.
                    let batch = std::mem::take(&mut r.completions);
                    for &c in &batch {
                        if !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                            answered += 1;
                            continue;
                        }
                        r.post(SendOp::Send { imm: None }, DONE_SLOT, 1)?;
                        if pinged + RECV_SLOTS < n {
                            r.post_recv(c.wr_id, c.wr_id as usize, 1)?;
                        }
                        pinged += 1;
                    }
                    r.completions = batch;
                }
                Ok(())
            }
        }
    }

    /// Server: ready for a round of `count` messages of `size` bytes.
    pub fn arm_round(&mut self, size: usize, count: u64) -> Result<(), String> {
        match self {
            Link::Tcp(_) => Ok(()),
            // WRITEs land by themselves; only the last, with immediate
            // data, takes a receive.
            Link::Rdma(r) if r.write_rounds => r.post_recv(0, 0, 0),
            Link::Rdma(r) => {
                check_size(size)?;
                (0..count.min(RECV_SLOTS as u64)).try_for_each(|i| r.post_recv(i, i as usize, size))
            }
        }
    }

    /// Server: takes the round, then says done.
    pub fn take_round(&mut self, size: usize, count: u64) -> Result<(), String> {
        match self {
            Link::Tcp(s) => {
                let mut left = size as u64 * count;
                let mut buf = vec![0u8; 256 * 1024];
                while left > 0 {
                    let want = left.min(buf.len() as u64) as usize;
                    let n = s.read(&mut buf[..want]).map_err(io)?;
                    if n == 0 {
                        return Err("the client closed the data connection mid-round".to_string());
                    }
                    left -= n as u64;
                }
                s.write_all(b"D").map_err(io)
            }
            Link::Rdma(r) => {
                if r.write_rounds {
                    r.wait(1)?;
                } else {
                    let mut posted = count.min(RECV_SLOTS as u64);
                    for _ in 0..count {
                        let c = r.wait_one()?;
                        if posted < count {
                            r.post_recv(posted, c.wr_id as usize % RECV_SLOTS, size)?;
                            posted += 1;
                        }
                    }
                }
                r.post(SendOp::Send { imm: None }, DONE_SLOT, 1)?;
                r.wait(1)
            }
        }
    }

    /// Client: sends the round and waits for done.
    pub fn send_round(&mut self, size: usize, count: u64) -> Result<(), String> {
        match self {
            Link::Tcp(s) => {
                let message = vec![0x5a; size];
                for _ in 0..count {
                    s.write_all(&message).map_err(io)?;
                }
                s.read_exact(&mut [0u8; 1]).map_err(io)
            }
            Link::Rdma(r) => {
                check_size(size)?;
                r.post_recv(0, DONE_SLOT, 1)?;
                let (mut posted, mut done) = (0u64, 0u64);
                // The round's sends, then the server's done.
                while done < count + 1 {
                    // The server's done comes only after every send, so
                    // `done` counts sends while any are left to post.
                    while posted < count && posted - done < WINDOW as u64 {
                        let slot = (posted % WINDOW as u64) as usize;
                        let last = posted + 1 == count;
                        let op = match r.write {
                            true => SendOp::Write { remote: r.remote_slot(slot, size), imm: last.then_some(1) },
                            false => SendOp::Send { imm: None },
                        };
                        r.post_at(op, slot * size, size)?;
                        posted += 1;
                    }
                    done += r.take_completions()? as u64;
                }
                Ok(())
            }
        }
    }
}

/// What a failed completion means for the run: a peer that stopped
/// answering is the usual one (a server stopped or killed mid-sweep).
fn failed(status: WcStatus) -> String {
    match status {
        WcStatus::RetryExcErr => {
            "the peer stopped answering: the transport's retries ran out (RetryExcErr); is its server still running?"
                .to_string()
        }
        status => format!("a work request failed: {status:?}"),
    }
}

fn io(e: std::io::Error) -> String {
    format!("the peer went away: {e}")
}

fn check_size(size: usize) -> Result<(), String> {
    match size <= MAX_MESSAGE {
        true => Ok(()),
        false => Err(format!("--max-size {size} is above what an RDMA link carries ({MAX_MESSAGE})")),
    }
}

/// Sends in flight at once on an RDMA link, and receives a server keeps
/// posted (twice as many, so it never makes the client wait).
const WINDOW: usize = 32;
const RECV_SLOTS: usize = 2 * WINDOW;
/// The slot the one-byte "done" and pings use, past the message slots.
const DONE_SLOT: usize = RECV_SLOTS;

/// One end of a softrnic connection for the method.
pub struct Rdma {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    _pd: ProtectionDomain,
    remote: Endpoint,
    /// Client: rounds go as RDMA WRITEs rather than SENDs.
    write: bool,
    /// Server: the client's rounds are WRITEs (told at connect).
    write_rounds: bool,
    timeout: Duration,
    completions: Vec<Completion>,
}

impl Rdma {
    fn open(addr: IpAddr, control: &mut Exchange, server: bool, timeout: Duration) -> Result<Rdma, String> {
        let e = |e: softrnic::Error| e.to_string();
        let ctx = Context::open(addr).map_err(e)?;
        let pd = ctx.alloc_pd().map_err(e)?;
        let mr = pd.register((RECV_SLOTS + 1) * MAX_MESSAGE, Access::LOCAL_WRITE | Access::REMOTE).map_err(e)?;
        let cq = ctx.create_cq(4 * RECV_SLOTS).map_err(e)?;
        let caps =
            QpCaps { max_send_wr: (WINDOW + 2) as u32, max_recv_wr: (RECV_SLOTS + 2) as u32, ..QpCaps::default() };
        let qp = pd.create_rc_qp(&cq, &cq, caps).map_err(e)?;
        let local = qp.endpoint(&mr);
        let remote = if server {
            let remote = control.receive().map_err(e)?;
            control.send(&local).map_err(e)?;
            remote
        } else {
            control.send(&local).map_err(e)?;
            control.receive().map_err(e)?
        };
        qp.connect(&remote, &ConnectOptions::default()).map_err(e)?;
        control.barrier().map_err(e)?;
        Ok(Rdma {
            ctx,
            cq,
            qp,
            mr,
            _pd: pd,
            remote,
            write: false,
            write_rounds: false,
            timeout,
            completions: Vec::new(),
        })
    }

    fn remote_slot(&self, slot: usize, size: usize) -> softrnic::RemoteAddr {
        softrnic::RemoteAddr { addr: self.remote.addr + (slot * size) as u64, rkey: self.remote.rkey }
    }

    /// Posts a receive of `len` bytes into slot `slot` (slots are
    /// `MAX_MESSAGE` apart).
    fn post_recv(&self, wr_id: u64, slot: usize, len: usize) -> Result<(), String> {
        let sge = self.mr.sge(slot * MAX_MESSAGE, len as u32);
        let sges = softrnic_transport::smallvec![sge];
        self.qp.post_recv(RecvWorkRequest { wr_id, sges }).map_err(|e| e.to_string())
    }

    fn post(&self, op: SendOp, slot: usize, len: usize) -> Result<(), String> {
        self.post_at(op, slot * MAX_MESSAGE, len)
    }

    fn post_at(&self, op: SendOp, offset: usize, len: usize) -> Result<(), String> {
        let wr = SendWorkRequest::new(0, op, self.mr.gather(offset, len as u32));
        self.qp.post_send(wr).map_err(|e| e.to_string())
    }

    /// Takes what completions there are, failing on an unsuccessful one
    /// or on `timeout` of silence.
    fn take_completions(&mut self) -> Result<usize, String> {
        self.completions.clear();
        let start = Instant::now();
        while self.cq.poll(64, &mut self.completions) == 0 {
            if start.elapsed() > self.timeout {
                let t = self.ctx.counters().transport;
                return Err(format!("the peer went quiet for {:?} (rx {} packets)", self.timeout, t.rx_packets));
            }
            std::hint::spin_loop();
        }
        match self.completions.iter().find(|c| c.status != WcStatus::Success) {
            Some(c) => Err(failed(c.status)),
            None => Ok(self.completions.len()),
        }
    }

    fn wait(&mut self, n: usize) -> Result<(), String> {
        let mut got = 0;
        while got < n {
            got += self.take_completions()?;
        }
        Ok(())
    }

    fn wait_one(&mut self) -> Result<Completion, String> {
        self.completions.clear();
        let start = Instant::now();
        while self.cq.poll(1, &mut self.completions) == 0 {
            if start.elapsed() > self.timeout {
                return Err(format!("the peer went quiet for {:?}", self.timeout));
            }
            std::hint::spin_loop();
        }
        let c = self.completions[0];
        match c.status {
            WcStatus::Success => Ok(c),
            status => Err(failed(status)),
        }
    }
}
