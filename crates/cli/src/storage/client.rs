//! The storage client: threads that each write a range of the server's
//! store and read it back, pass after pass, keeping `--depth` requests in
//! flight, checking every answer: a write's acknowledgement, a read's CRC
//! and every byte against what that pass wrote.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use softrnic::block::{ACK_LEN, Ack, AckStatus, BLOCK_LEN, BlockKind, BlockRepr, HEADER_LEN, crc32};
use softrnic::{
    Access, BlockOutcome, Completion, CompletionQueue, ConnectOptions, Context, Endpoint, MemoryRegion, QpCaps,
    QueuePair, RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};

use super::{Design, MESSAGE, StorageArgs, content, cpu_seconds, tcp};

/// What one thread did in the measured time.
#[derive(Debug, Default, Clone, Copy)]
struct Done {
    written: u64,
    read: u64,
}

/// One request: a block of the thread's range, written or read back.
#[derive(Debug, Clone, Copy)]
struct Request {
    kind: BlockKind,
    offset: u64,
    /// The pass that wrote what a read expects, or that this write is.
    generation: u64,
    sequence: u64,
}

/// A thread's requests in order: a pass writing its range, a pass
/// reading it back, and again with new contents.
struct Schedule {
    first: u64,
    blocks: u64,
    /// Requests made so far.
    made: u64,
}

impl Schedule {
    fn next(&mut self) -> Request {
        let (pass, block) = (self.made / self.blocks, self.made % self.blocks);
        self.made += 1;
        Request {
            kind: if pass % 2 == 0 { BlockKind::Write } else { BlockKind::Read },
            offset: self.first + block * BLOCK_LEN as u64,
            generation: pass / 2 + 1,
            sequence: self.made,
        }
    }
}

/// The request's bytes: its header and, for a write, the pass's content
/// (with the CRC computed here unless softrnicd computes it).
fn request_bytes(request: &Request, crc_here: bool, out: &mut [u8; MESSAGE]) -> usize {
    let mut repr = BlockRepr {
        kind: request.kind,
        crc_set: false,
        volume: 1,
        offset: request.offset,
        sequence: request.sequence,
        length: BLOCK_LEN as u32,
        crc: 0,
    };
    if request.kind == BlockKind::Write {
        content(request.offset, request.generation, &mut out[HEADER_LEN..]);
        if crc_here {
            (repr.crc_set, repr.crc) = (true, crc32(&out[HEADER_LEN..]));
        }
    }
    repr.emit(&mut out[..HEADER_LEN]);
    repr.message_len()
}

/// Checks an answer to `request`: `Ok(())` for one that did what was
/// asked, with every CRC and byte right; else what is wrong.
fn check_answer(request: &Request, answer: &[u8], crc: Crc) -> Result<(), String> {
    let expected = |status: AckStatus| match Ack::parse(answer) {
        Ok(ack) if ack.status == status && ack.sequence == request.sequence as u32 => Ok(()),
        other => Err(format!("request {} at {:#x}: answered {other:?}", request.sequence, request.offset)),
    };
    match request.kind {
        BlockKind::Write => expected(AckStatus::Done),
        _ if answer.len() == ACK_LEN => expected(AckStatus::Done).and(Err("a read answered without data".into())),
        _ => {
            let repr = BlockRepr::parse_bytes(answer).map_err(|e| format!("a read's answer: {e}"))?;
            let payload = &answer[HEADER_LEN..];
            let crc_fine = match crc {
                Crc::Here => repr.crc_set && crc32(payload) == repr.crc,
                Crc::Offloaded(outcome) => outcome == Some(BlockOutcome::Verified),
            };
            if !crc_fine || repr.sequence != request.sequence || payload.len() != BLOCK_LEN {
                return Err(format!(
                    "read {} at {:#x}: bad CRC or answer ({repr:?})",
                    request.sequence, request.offset
                ));
            }
            let mut want = [0u8; BLOCK_LEN];
            content(request.offset, request.generation, &mut want);
            match payload == want {
                true => Ok(()),
                false => Err(format!(
                    "read {} at {:#x}: the bytes differ from those written",
                    request.sequence, request.offset
                )),
            }
        }
    }
}

/// Who checks a read's CRC: the application, or softrnicd (what its
/// completion says).
#[derive(Debug, Clone, Copy)]
enum Crc {
    Here,
    Offloaded(Option<BlockOutcome>),
}

pub fn measure(addr: IpAddr, server: SocketAddr, args: &StorageArgs) -> Result<(), String> {
    let ctx = match args.design {
        Design::Tcp => None,
        _ => Some(Context::open(addr).map_err(|e| format!("cannot open the device at {addr}: {e}"))?),
    };
    let threads = args.threads as usize;
    // Everyone connected before the clock starts.
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (ctx, args, start) = (ctx.clone(), args.clone(), start.clone());
            std::thread::spawn(move || thread(t, server, ctx, &args, &start))
        })
        .collect();
    start.wait();
    let (began, cpu) = (Instant::now(), cpu_seconds(None));
    let mut total = Done::default();
    let mut failure = None;
    for handle in handles {
        match handle.join().map_err(|_| "a client thread panicked".to_string()).and_then(|r| r) {
            Ok(done) => (total.written, total.read) = (total.written + done.written, total.read + done.read),
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let (seconds, cpu) = (args.seconds, cpu_seconds(None) - cpu);
    let blocks = total.written + total.read;
    let mops = blocks as f64 / seconds / 1e6;
    println!("Total Speed: {mops:.6} Mops");
    println!(
        "storage: design {}, {threads} thread(s), {blocks} blocks ({} written, {} read, every CRC and byte checked) \
         in {seconds:.2} s: {:.3} Gb/s; client CPU {:.2} us per block (over {:.2} s)",
        args.design,
        total.written,
        total.read,
        blocks as f64 * (BLOCK_LEN * 8) as f64 / seconds / 1e9,
        cpu * 1e6 / blocks.max(1) as f64,
        began.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// One thread: its connection, the optional corrupt block, and its share
/// of the measurement.
fn thread(
    t: usize,
    server: SocketAddr,
    ctx: Option<Context>,
    args: &StorageArgs,
    start: &Barrier,
) -> Result<Done, String> {
    let result = connect(server, ctx, args).and_then(|mut link| {
        if args.corrupt && t == 0 {
            corrupt_block_is_refused(&mut *link, args)?;
        }
        Ok(link)
    });
    // The barrier is passed whatever happened, so no one waits for ever.
    start.wait();
    let mut link = result?;
    let blocks = u64::from(args.blocks);
    let mut schedule = Schedule { first: t as u64 * blocks * BLOCK_LEN as u64, blocks, made: 0 };
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let done = link.run(&mut schedule, args, deadline)?;
    link.finish()?;
    Ok(done)
}

/// Before measuring: a block with a wrong CRC is refused with a CRC
/// error, and what the store held there is what it holds after.
fn corrupt_block_is_refused(link: &mut dyn Link, args: &StorageArgs) -> Result<(), String> {
    let offset = u64::from(args.blocks - 1) * BLOCK_LEN as u64;
    let read = Request { kind: BlockKind::Read, offset, generation: 0, sequence: 1 << 40 };
    let before = link.call(&read)?;
    let mut bytes = Box::new([0u8; MESSAGE]);
    let write = Request { kind: BlockKind::Write, offset, generation: 99, sequence: (1 << 40) + 1 };
    let len = request_bytes(&write, true, &mut bytes);
    bytes[HEADER_LEN + 7] ^= 0x20; // one bit flipped after the CRC
    let answer = link.call_raw(&bytes[..len])?;
    let ack = Ack::parse(&answer).map_err(|e| format!("the corrupt block's answer: {e}"))?;
    if ack.status != AckStatus::CrcMismatch {
        return Err(format!("a corrupt block was answered {:?}, not with a CRC error", ack.status));
    }
    let after = link.call(&Request { sequence: read.sequence + 2, ..read })?;
    if before[HEADER_LEN..] != after[HEADER_LEN..] {
        return Err("the corrupt block changed the store".into());
    }
    println!("corrupt block: refused with a CRC error ({}), nothing stored", args.design);
    Ok(())
}

/// A connection to the server, over softrnic or TCP.
trait Link {
    /// Runs the schedule with requests in flight until `deadline`; what
    /// completed by then.
    fn run(&mut self, schedule: &mut Schedule, args: &StorageArgs, deadline: Instant) -> Result<Done, String>;
    /// One request's bytes, sent alone; the answer's bytes.
    fn call_raw(&mut self, request: &[u8]) -> Result<Vec<u8>, String>;
    /// One request alone, its answer checked for form (not content).
    fn call(&mut self, request: &Request) -> Result<Vec<u8>, String> {
        let mut bytes = Box::new([0u8; MESSAGE]);
        let len = request_bytes(request, true, &mut bytes);
        self.call_raw(&bytes[..len])
    }
    /// Tells the server this connection is done.
    fn finish(&mut self) -> Result<(), String>;
}

fn connect(server: SocketAddr, ctx: Option<Context>, args: &StorageArgs) -> Result<Box<dyn Link>, String> {
    let mut control = TcpStream::connect(server).map_err(|e| format!("cannot reach the server at {server}: {e}"))?;
    control.set_nodelay(true).map_err(|e| e.to_string())?;
    writeln!(control, "{} {}", args.design, args.depth).map_err(|e| e.to_string())?;
    match ctx {
        None => Ok(Box::new(TcpLink { stream: control })),
        Some(ctx) => Ok(Box::new(RdmaLink::connect(&ctx, control, args.design, args.depth as usize)?)),
    }
}

/// The RPC over kernel TCP.
struct TcpLink {
    stream: TcpStream,
}

impl Link for TcpLink {
    fn run(&mut self, schedule: &mut Schedule, args: &StorageArgs, deadline: Instant) -> Result<Done, String> {
        let e = |e: std::io::Error| e.to_string();
        let mut reader = BufReader::new(self.stream.try_clone().map_err(e)?);
        let (mut bytes, mut answer) = (Box::new([0u8; MESSAGE]), Box::new([0u8; MESSAGE]));
        let mut in_flight = std::collections::VecDeque::new();
        let mut done = Done::default();
        loop {
            let open = Instant::now() < deadline;
            while open && in_flight.len() < args.depth as usize {
                let request = schedule.next();
                let len = request_bytes(&request, true, &mut bytes);
                tcp::send(&mut self.stream, &[&bytes[..len]]).map_err(e)?;
                in_flight.push_back(request);
            }
            let Some(request) = in_flight.pop_front() else { return Ok(done) };
            let len = tcp::receive(&mut reader, &mut answer).map_err(e)?;
            check_answer(&request, &answer[..len], Crc::Here)?;
            count(&mut done, &request, open);
        }
    }

    fn call_raw(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        tcp::send(&mut self.stream, &[request]).map_err(|e| e.to_string())?;
        let mut answer = Box::new([0u8; MESSAGE]);
        let len = tcp::receive(&mut self.stream, &mut answer).map_err(|e| e.to_string())?;
        Ok(answer[..len].to_vec())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.stream.shutdown(std::net::Shutdown::Write).map_err(|e| e.to_string())
    }
}

/// Counts a completed request, if it completed while the clock ran.
fn count(done: &mut Done, request: &Request, in_time: bool) {
    if in_time {
        match request.kind {
            BlockKind::Write => done.written += 1,
            _ => done.read += 1,
        }
    }
}

/// The RPC over softrnic SENDs: receive slots `0..depth`, then a send
/// slot per request in flight (a request's slot is busy until its send
/// completes and its answer has come).
struct RdmaLink {
    design: Design,
    depth: usize,
    cq: CompletionQueue,
    qp: QueuePair,
    slots: MemoryRegion,
    control: TcpStream,
    _ctx: Context,
}

impl RdmaLink {
    fn connect(ctx: &Context, mut control: TcpStream, design: Design, depth: usize) -> Result<RdmaLink, String> {
        let e = |e: softrnic::Error| e.to_string();
        let pd = ctx.alloc_pd().map_err(e)?;
        let cq = ctx.create_cq(4 * depth + 8).map_err(e)?;
        let slots = pd.register(2 * depth * MESSAGE, Access::LOCAL_WRITE).map_err(e)?;
        let caps = QpCaps {
            max_send_wr: depth as u32,
            max_recv_wr: depth as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        // The client's QP offloads CRCs in both offloaded designs; only
        // the server has a store to place into.
        let qp = match design.offloads_crc() {
            true => pd.create_block_qp(&cq, &cq, caps, None),
            false => pd.create_rc_qp(&cq, &cq, caps),
        }
        .map_err(e)?;
        let link = RdmaLink {
            design,
            depth,
            cq,
            qp,
            slots,
            control: control.try_clone().map_err(|e| e.to_string())?,
            _ctx: ctx.clone(),
        };
        let mut reader = BufReader::new(control.try_clone().map_err(|e| e.to_string())?);
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        let peer = Endpoint::parse(&line).map_err(e)?;
        link.qp.connect(&peer, &ConnectOptions::default()).map_err(e)?;
        for slot in 0..depth {
            link.post_receive(slot)?;
        }
        control.write_all(link.qp.endpoint(&link.slots).to_line().as_bytes()).map_err(|e| e.to_string())?;
        line.clear();
        reader.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("the server did not get ready: {:?}", line.trim()));
        }
        Ok(link)
    }

    fn post_receive(&self, slot: usize) -> Result<(), String> {
        let sges = [self.slots.sge(slot * MESSAGE, MESSAGE as u32)].into_iter().collect();
        self.qp.post_recv(RecvWorkRequest { wr_id: slot as u64, sges }).map_err(|e| e.to_string())
    }

    /// Sends `len` bytes of send slot `slot` (numbered from 0).
    fn send(&self, slot: usize, len: usize) -> Result<(), String> {
        let at = (self.depth + slot) * MESSAGE;
        let wr = SendWorkRequest::new(slot as u64, SendOp::Send { imm: None }, self.slots.gather(at, len as u32));
        self.qp.post_send(wr).map_err(|e| e.to_string())
    }

    /// The next completions (waiting up to a few seconds for one).
    fn completions(&self, out: &mut Vec<Completion>) -> Result<(), String> {
        out.clear();
        let give_up = Instant::now() + Duration::from_secs(20);
        while self.cq.poll(32, out) == 0 {
            if Instant::now() > give_up {
                return Err("the server did not answer for 20 s".into());
            }
            std::hint::spin_loop();
        }
        match out.iter().find(|c| c.status != WcStatus::Success) {
            Some(c) => Err(format!("a completion failed: {} ({c:?})", c.status.as_str())),
            None => Ok(()),
        }
    }

    /// The answer in receive slot `c.wr_id`, and its slot posted again.
    fn take_answer(&self, c: &Completion, answer: &mut [u8; MESSAGE]) -> Result<usize, String> {
        let (slot, len) = (c.wr_id as usize, (c.byte_len as usize).min(MESSAGE));
        self.slots.read(slot * MESSAGE, &mut answer[..len]);
        self.post_receive(slot)?;
        Ok(len)
    }

    /// The sequence an answer is for: a block's, or an acknowledgement's
    /// (its low 32 bits).
    fn sequence_of(answer: &[u8]) -> Option<u32> {
        match answer.len() {
            ACK_LEN => Ack::parse(answer).ok().map(|a| a.sequence),
            _ => BlockRepr::parse_bytes(answer).ok().map(|r| r.sequence as u32),
        }
    }

    fn crc(&self, c: &Completion) -> Crc {
        match self.design.offloads_crc() {
            true => Crc::Offloaded(c.block),
            false => Crc::Here,
        }
    }
}

impl Link for RdmaLink {
    fn run(&mut self, schedule: &mut Schedule, _args: &StorageArgs, deadline: Instant) -> Result<Done, String> {
        let crc_here = !self.design.offloads_crc();
        let mut bytes = Box::new([0u8; MESSAGE]);
        let mut answer = Box::new([0u8; MESSAGE]);
        // Requests in flight by sequence (low 32 bits), and their slots.
        let mut in_flight: HashMap<u32, (Request, usize)> = HashMap::new();
        let mut free: Vec<usize> = (0..self.depth).collect();
        // A slot is free once its send completed and its answer came.
        let mut sent = vec![true; self.depth];
        let mut answered = vec![true; self.depth];
        let mut done = Done::default();
        let mut completions = Vec::with_capacity(32);
        loop {
            let open = Instant::now() < deadline;
            while open && let Some(slot) = free.pop() {
                let request = schedule.next();
                let len = request_bytes(&request, crc_here, &mut bytes);
                self.slots.write((self.depth + slot) * MESSAGE, &bytes[..len]);
                (sent[slot], answered[slot]) = (false, false);
                in_flight.insert(request.sequence as u32, (request, slot));
                self.send(slot, len)?;
            }
            if in_flight.is_empty() && sent.iter().all(|&s| s) {
                return Ok(done);
            }
            self.completions(&mut completions)?;
            for c in completions.iter() {
                let slot = match c.opcode {
                    WcOpcode::Send => {
                        sent[c.wr_id as usize] = true;
                        c.wr_id as usize
                    }
                    _ => {
                        let len = self.take_answer(c, &mut answer)?;
                        let sequence = Self::sequence_of(&answer[..len]);
                        let Some((request, slot)) = sequence.and_then(|s| in_flight.remove(&s)) else {
                            return Err(format!("an answer to no request in flight: {:?}", &answer[..len.min(16)]));
                        };
                        check_answer(&request, &answer[..len], self.crc(c))?;
                        count(&mut done, &request, Instant::now() < deadline);
                        answered[slot] = true;
                        slot
                    }
                };
                if sent[slot] && answered[slot] && !free.contains(&slot) {
                    free.push(slot);
                }
            }
        }
    }

    fn call_raw(&mut self, request: &[u8]) -> Result<Vec<u8>, String> {
        self.slots.write(self.depth * MESSAGE, request);
        self.send(0, request.len())?;
        let (mut answer, mut completions) = (Box::new([0u8; MESSAGE]), Vec::new());
        let (mut sent, mut got) = (false, None);
        while !sent || got.is_none() {
            self.completions(&mut completions)?;
            for c in &completions {
                match c.opcode {
                    WcOpcode::Send => sent = true,
                    _ => got = Some(self.take_answer(c, &mut answer)?),
                }
            }
        }
        Ok(answer[..got.expect("answered")].to_vec())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.control.write_all(b"done\n").map_err(|e| e.to_string())
    }
}
