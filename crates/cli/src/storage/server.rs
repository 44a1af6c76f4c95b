//! The storage server: one in-memory store (a registered region), a
//! thread per client connection, serving the design the connection names
//! in its first line (`crc-copy 16`: the design and its requests in
//! flight).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrnic::block::{Ack, AckStatus, BLOCK_LEN, BlockKind, BlockRepr, HEADER_LEN, crc32};
use softrnic::{
    Access, BlockOutcome, Completion, ConnectOptions, Context, Endpoint, MemoryRegion, ProtectionDomain, QpCaps,
    RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};

use super::{Design, MESSAGE, tcp};

/// The server's shared parts: the device, and the store every
/// connection writes into and reads from.
struct Shared {
    ctx: Context,
    pd: ProtectionDomain,
    store: MemoryRegion,
}

impl Shared {
    /// Whether `[offset, offset + length)` lies in the store.
    fn holds(&self, repr: &BlockRepr) -> bool {
        repr.offset.checked_add(u64::from(repr.length)).is_some_and(|end| end <= self.store.len() as u64)
    }
}

pub fn serve(addr: IpAddr, port: u16, store_len: usize) -> Result<(), String> {
    let ctx = Context::open(addr).map_err(|e| format!("cannot open the device at {addr}: {e}"))?;
    let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
    let store = pd.register(store_len, Access::LOCAL_WRITE).map_err(|e| format!("cannot register the store: {e}"))?;
    let listener = TcpListener::bind((addr, port)).map_err(|e| format!("cannot listen on {addr}:{port}: {e}"))?;
    eprintln!(
        "storage server on {addr}:{port}: a store of {} MiB{}",
        store_len >> 20,
        if ctx.through_daemon_now() { ", through softrnicd" } else { "" }
    );
    let shared = Arc::new(Shared { ctx, pd, store });
    for stream in listener.incoming() {
        let stream = stream.map_err(|e| e.to_string())?;
        let shared = shared.clone();
        std::thread::spawn(move || {
            if let Err(e) = connection(stream, &shared) {
                eprintln!("storage server: a connection ended: {e}");
            }
        });
    }
    Ok(())
}

/// Serves one client connection, as its first line asks.
fn connection(stream: TcpStream, shared: &Shared) -> Result<(), String> {
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let mut words = line.split_whitespace();
    let design = words.next().and_then(Design::from_name);
    let depth = words.next().and_then(|d| d.parse::<u32>().ok()).filter(|d| (1..=256).contains(d));
    let (Some(design), Some(depth)) = (design, depth) else {
        return Err(format!("a client's first line {:?} names no design and depth", line.trim()));
    };
    match design {
        Design::Tcp => serve_tcp(reader, stream, shared),
        _ => Rdma::connect(reader, stream, shared, design, depth)?.serve(),
    }
}

/// What the server answers a request whose payload it holds itself
/// (the CPU-only design and TCP): the application checks the CRC and
/// copies the block into or out of the store.
fn answer_in_software(shared: &Shared, request: &[u8], payload_out: &mut [u8; BLOCK_LEN]) -> Result<BlockRepr, Ack> {
    let malformed = Ack { sequence: 0, status: AckStatus::Malformed };
    let repr = BlockRepr::parse_bytes(request).map_err(|_| malformed)?;
    let ack = |status| Ack { sequence: repr.sequence as u32, status };
    if repr.kind == BlockKind::ReadData || request.len() != repr.message_len() {
        return Err(ack(AckStatus::Malformed));
    }
    if !shared.holds(&repr) {
        return Err(ack(AckStatus::OutOfRange));
    }
    let length = repr.length as usize;
    match repr.kind {
        BlockKind::Write => {
            let payload = &request[HEADER_LEN..];
            if !repr.crc_set || crc32(payload) != repr.crc {
                return Err(ack(AckStatus::CrcMismatch));
            }
            shared.store.write(repr.offset as usize, payload);
            Err(ack(AckStatus::Done))
        }
        _ => {
            shared.store.read(repr.offset as usize, &mut payload_out[..length]);
            let crc = crc32(&payload_out[..length]);
            Ok(BlockRepr { kind: BlockKind::ReadData, crc_set: true, crc, ..repr })
        }
    }
}

/// TCP: every block through the kernel's socket, CRCs and copies in the
/// application.
fn serve_tcp(mut reader: BufReader<TcpStream>, mut stream: TcpStream, shared: &Shared) -> Result<(), String> {
    let (mut request, mut payload) = (Box::new([0u8; MESSAGE]), Box::new([0u8; BLOCK_LEN]));
    let mut work = Work::new(Design::Tcp);
    loop {
        let len = match tcp::receive(&mut reader, &mut request) {
            Ok(len) => len,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        let began = Instant::now();
        let sent = match answer_in_software(shared, &request[..len], &mut payload) {
            Ok(data) => tcp::send(&mut stream, &[&data.to_bytes(), &payload[..data.length as usize]]),
            Err(ack) => tcp::send(&mut stream, &[&ack.to_bytes()]),
        };
        work.add(began);
        sent.map_err(|e| e.to_string())?;
    }
}

/// The time the application spends answering requests (parsing, the
/// CRCs and copies its design leaves it, posting or writing the answer),
/// said when the connection ends: what an offload saves it per block.
struct Work {
    design: Design,
    requests: u64,
    spent: Duration,
}

impl Work {
    fn new(design: Design) -> Work {
        Work { design, requests: 0, spent: Duration::ZERO }
    }

    fn add(&mut self, began: Instant) {
        (self.requests, self.spent) = (self.requests + 1, self.spent + began.elapsed());
    }
}

/// How [`Work`]'s line starts (`softrnic exp e7` reads it back).
pub(crate) const WORK_LINE: &str = "server: connection done:";

impl Drop for Work {
    fn drop(&mut self) {
        let per = self.spent.as_secs_f64() * 1e6 / self.requests.max(1) as f64;
        println!(
            "{WORK_LINE} {} requests, {per:.3} us of application work per request ({})",
            self.requests, self.design
        );
    }
}

/// One connection over softrnic: a QP (offloading blocks as the design
/// asks), a receive slot per request in flight and twice as many send
/// slots (an answer's slot is busy until its send completes).
struct Rdma<'a> {
    shared: &'a Shared,
    design: Design,
    cq: softrnic::CompletionQueue,
    qp: softrnic::QueuePair,
    /// Receive slots `0..depth`, then send slots.
    slots: MemoryRegion,
    free_sends: Vec<usize>,
    /// Requests waiting for a free send slot (their receive slots).
    waiting: std::collections::VecDeque<(usize, Completion)>,
    control: TcpStream,
    work: Work,
}

impl<'a> Rdma<'a> {
    fn connect(
        mut reader: BufReader<TcpStream>,
        mut control: TcpStream,
        shared: &'a Shared,
        design: Design,
        depth: u32,
    ) -> Result<Rdma<'a>, String> {
        let depth = depth as usize;
        let e = |e: softrnic::Error| e.to_string();
        let cq = shared.ctx.create_cq(4 * depth + 8).map_err(e)?;
        let slots = shared.pd.register(3 * depth * MESSAGE, Access::LOCAL_WRITE).map_err(e)?;
        let caps = QpCaps {
            max_send_wr: 2 * depth as u32,
            max_recv_wr: depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = match design {
            Design::Cpu => shared.pd.create_rc_qp(&cq, &cq, caps),
            Design::Crc => shared.pd.create_block_qp(&cq, &cq, caps, None),
            _ => shared.pd.create_block_qp(&cq, &cq, caps, Some(&shared.store)),
        }
        .map_err(e)?;
        let rdma = Rdma {
            shared,
            design,
            cq,
            qp,
            slots,
            free_sends: (depth..3 * depth).collect(),
            waiting: Default::default(),
            control: control.try_clone().map_err(|e| e.to_string())?,
            work: Work::new(design),
        };
        control.write_all(rdma.qp.endpoint(&rdma.slots).to_line().as_bytes()).map_err(|e| e.to_string())?;
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let peer = Endpoint::parse(&line).map_err(e)?;
        rdma.qp.connect(&peer, &ConnectOptions::default()).map_err(e)?;
        // Receives go to a QP past RESET, and are there before the client
        // hears it may send.
        for slot in 0..depth {
            rdma.post_receive(slot)?;
        }
        control.write_all(b"ready\n").map_err(|e| e.to_string())?;
        Ok(rdma)
    }

    /// A receive into `slot`: a whole block, or with the payload placed
    /// by softrnicd, the header alone.
    fn post_receive(&self, slot: usize) -> Result<(), String> {
        let len = if self.design == Design::CrcCopy { HEADER_LEN } else { MESSAGE };
        let sges = [self.slots.sge(slot * MESSAGE, len as u32)].into_iter().collect();
        self.qp.post_recv(RecvWorkRequest { wr_id: slot as u64, sges }).map_err(|e| e.to_string())
    }

    fn send(&mut self, slot: usize, len: usize) -> Result<(), String> {
        let payload = self.slots.gather(slot * MESSAGE, len as u32);
        let wr = SendWorkRequest::new(slot as u64, SendOp::Send { imm: None }, payload);
        self.qp.post_send(wr).map_err(|e| e.to_string())
    }

    /// Serves until the client says it is done (or leaves).
    fn serve(mut self) -> Result<(), String> {
        let mut completions = Vec::with_capacity(64);
        let mut idle = 0u32;
        loop {
            completions.clear();
            if self.cq.poll(64, &mut completions) == 0 {
                idle += 1;
                // Now and then, whether the client is done.
                if idle.is_multiple_of(4096) && self.client_done()? {
                    return Ok(());
                }
                std::hint::spin_loop();
                continue;
            }
            idle = 0;
            for c in completions.drain(..) {
                if c.status != WcStatus::Success {
                    return Err(format!("a completion failed: {} ({c:?})", c.status.as_str()));
                }
                match c.opcode {
                    WcOpcode::Send => self.free_sends.push(c.wr_id as usize),
                    _ => self.waiting.push_back((c.wr_id as usize, c)),
                }
            }
            while !self.free_sends.is_empty() {
                let Some((slot, c)) = self.waiting.pop_front() else { break };
                let began = Instant::now();
                self.answer(slot, &c)?;
                self.work.add(began);
            }
        }
    }

    /// Whether the client wrote "done" (or closed the connection).
    fn client_done(&mut self) -> Result<bool, String> {
        self.control.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        let done = match self.control.read(&mut byte) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => return Err(e.to_string()),
        };
        self.control.set_nonblocking(false).map_err(|e| e.to_string())?;
        Ok(done)
    }

    /// Answers the request in receive slot `slot` from a free send slot,
    /// and posts the receive again.
    fn answer(&mut self, slot: usize, c: &Completion) -> Result<(), String> {
        let send = self.free_sends.pop().expect("a free send slot");
        let (at, out) = (slot * MESSAGE, send * MESSAGE);
        let len = c.byte_len as usize;
        let mut request = [0u8; MESSAGE];
        self.slots.read(at, &mut request[..len.min(MESSAGE)]);
        let request = &request[..len.min(MESSAGE)];
        let reply = match self.design {
            Design::Cpu => {
                let mut payload = [0u8; BLOCK_LEN];
                let reply = answer_in_software(self.shared, request, &mut payload);
                if let Ok(data) = &reply {
                    self.slots.write(out + HEADER_LEN, &payload[..data.length as usize]);
                }
                reply
            }
            _ => self.answer_offloaded(request, c.block, out),
        };
        self.post_receive(slot)?;
        match reply {
            Ok(data) => {
                self.slots.write(out, &data.to_bytes());
                // With the copy offloaded, the header alone: softrnicd
                // gathers the payload from the store.
                let len = if self.design == Design::CrcCopy { HEADER_LEN } else { data.message_len() };
                self.send(send, len)
            }
            Err(ack) => {
                self.slots.write(out, &ack.to_bytes());
                self.send(send, softrnic::block::ACK_LEN)
            }
        }
    }

    /// The answer when softrnicd checked the CRC (`outcome`), and with
    /// `crc-copy` placed the payload: the application copies a block only
    /// without the copy offload.
    fn answer_offloaded(&self, request: &[u8], outcome: Option<BlockOutcome>, out: usize) -> Result<BlockRepr, Ack> {
        let repr = BlockRepr::parse_bytes(request).map_err(|_| Ack { sequence: 0, status: AckStatus::Malformed })?;
        let ack = |status| Ack { sequence: repr.sequence as u32, status };
        if !self.shared.holds(&repr) {
            return Err(ack(AckStatus::OutOfRange));
        }
        let (offset, length) = (repr.offset as usize, repr.length as usize);
        match (repr.kind, outcome, self.design) {
            (BlockKind::Write, Some(BlockOutcome::Placed), Design::CrcCopy) => Err(ack(AckStatus::Done)),
            (BlockKind::Write, Some(BlockOutcome::Verified), Design::Crc) if request.len() == repr.message_len() => {
                self.shared.store.write(offset, &request[HEADER_LEN..]);
                Err(ack(AckStatus::Done))
            }
            (BlockKind::Write, Some(BlockOutcome::Corrupt), _) => Err(ack(AckStatus::CrcMismatch)),
            (BlockKind::Write, Some(BlockOutcome::OutOfRange), _) => Err(ack(AckStatus::OutOfRange)),
            (BlockKind::Read, None, _) => {
                if self.design == Design::Crc {
                    let mut payload = [0u8; BLOCK_LEN];
                    self.shared.store.read(offset, &mut payload[..length]);
                    self.slots.write(out + HEADER_LEN, &payload[..length]);
                }
                // No CRC of ours: softrnicd computes it as the block leaves.
                Ok(BlockRepr { kind: BlockKind::ReadData, crc_set: false, crc: 0, ..repr })
            }
            _ => Err(ack(AckStatus::Malformed)),
        }
    }
}
