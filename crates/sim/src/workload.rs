//! Random workloads over pairs of RC queue pairs, and their oracle.
//!
//! A plan is pure data: for each endpoint, the work requests it posts, the
//! receives it posts, the completions it must see, and the exact image its
//! memory must hold at the end. Every operation gets bytes of its own, so
//! the result does not depend on timing; atomics share a few words per
//! direction, so their order (PSN order at the responder) is checked too.
//! Comparing each whole buffer with its image checks the data of SEND,
//! WRITE, READ and ATOMIC, and that nothing else was touched.

use softrnic_transport::{Mtu, Payload, RecvWorkRequest, RemoteAddr, SendOp, SendWorkRequest, Sge, WcOpcode};

/// Bytes of unregistered memory around each region, which must never change.
pub const GUARD: usize = 64;
/// Where each endpoint's region starts in its address space.
pub const IOVA_BASE: u64 = 0x7f00_0000_0000;
/// Words each direction's atomics share.
const ATOMIC_WORDS: usize = 4;

/// The kinds of operation a workload mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CompareSwap,
    FetchAdd,
}

impl Kind {
    const ALL: [Kind; 7] =
        [Kind::Send, Kind::SendImm, Kind::Write, Kind::WriteImm, Kind::Read, Kind::CompareSwap, Kind::FetchAdd];
}

/// A local buffer, as offsets into the endpoint's region, or inline data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalData {
    Pieces(Vec<(u64, u32)>),
    Inline(Vec<u8>),
}

/// One send work request, with region offsets where addresses will go.
#[derive(Debug, Clone)]
pub struct PlannedOp {
    pub wr_id: u64,
    pub kind: Kind,
    pub len: u32,
    pub local: LocalData,
    /// Offset in the peer's region (WRITE, READ, ATOMIC).
    pub remote_offset: u64,
    pub imm: Option<u32>,
    pub compare: u64,
    pub swap_or_add: u64,
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
}

/// Where a registered region lives, for turning offsets into addresses.
#[derive(Debug, Clone, Copy)]
pub struct RegionKeys {
    pub iova: u64,
    pub lkey: u32,
    pub rkey: u32,
}

impl PlannedOp {
    /// The work request, with `local` and `remote` regions resolved.
    pub fn work_request(&self, local: RegionKeys, remote: RegionKeys) -> SendWorkRequest {
        let remote_addr = RemoteAddr { addr: remote.iova + self.remote_offset, rkey: remote.rkey };
        let op = match self.kind {
            Kind::Send => SendOp::Send { imm: None },
            Kind::SendImm => SendOp::Send { imm: self.imm },
            Kind::Write => SendOp::Write { remote: remote_addr, imm: None },
            Kind::WriteImm => SendOp::Write { remote: remote_addr, imm: self.imm },
            Kind::Read => SendOp::Read { remote: remote_addr },
            Kind::CompareSwap => {
                SendOp::CompareSwap { remote: remote_addr, compare: self.compare, swap: self.swap_or_add }
            }
            Kind::FetchAdd => SendOp::FetchAdd { remote: remote_addr, add: self.swap_or_add },
        };
        let payload = match &self.local {
            LocalData::Inline(bytes) => Payload::Inline(bytes.as_slice().into()),
            LocalData::Pieces(pieces) => Payload::Gather(sges(pieces, local).into()),
        };
        SendWorkRequest {
            wr_id: self.wr_id,
            op,
            payload,
            signaled: self.signaled,
            fence: self.fence,
            solicited: self.solicited,
            ud: None,
        }
    }

    /// The completion this request must produce, if signalled.
    pub fn expected_completion(&self) -> Option<ExpectedCompletion> {
        let opcode = match self.kind {
            Kind::Send | Kind::SendImm => WcOpcode::Send,
            Kind::Write | Kind::WriteImm => WcOpcode::RdmaWrite,
            Kind::Read => WcOpcode::RdmaRead,
            Kind::CompareSwap => WcOpcode::CompSwap,
            Kind::FetchAdd => WcOpcode::FetchAdd,
        };
        self.signaled.then_some(ExpectedCompletion { wr_id: self.wr_id, opcode, byte_len: self.len, imm: None })
    }
}

fn sges(pieces: &[(u64, u32)], region: RegionKeys) -> Vec<Sge> {
    pieces.iter().map(|&(offset, length)| Sge { addr: region.iova + offset, length, lkey: region.lkey }).collect()
}

/// A receive work request and the completion it must get.
#[derive(Debug, Clone)]
pub struct PlannedRecv {
    pub wr_id: u64,
    pub pieces: Vec<(u64, u32)>,
    pub expect: ExpectedCompletion,
}

impl PlannedRecv {
    pub fn work_request(&self, local: RegionKeys) -> RecvWorkRequest {
        RecvWorkRequest { wr_id: self.wr_id, sges: sges(&self.pieces, local).into() }
    }
}

/// What a successful completion must say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedCompletion {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
}

/// One QP's side of a pair.
#[derive(Debug, Clone)]
pub struct EndpointPlan {
    /// The whole buffer: guard, region, guard.
    pub initial: Vec<u8>,
    pub expected: Vec<u8>,
    pub ops: Vec<PlannedOp>,
    pub recvs: Vec<PlannedRecv>,
}

impl EndpointPlan {
    pub fn region_len(&self) -> usize {
        self.initial.len() - 2 * GUARD
    }

    pub fn expected_send_completions(&self) -> Vec<ExpectedCompletion> {
        self.ops.iter().filter_map(PlannedOp::expected_completion).collect()
    }
}

/// The knobs of a generated workload.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub ops_per_direction: usize,
    /// Largest message; a few operations get close to it.
    pub max_len: usize,
    pub mtu: Mtu,
}

/// A pair of endpoints, each posting to the other.
#[derive(Debug, Clone)]
pub struct PairPlan {
    pub ends: [EndpointPlan; 2],
}

/// The size of one area of a region, grown as operations are planned.
#[derive(Debug, Default, Clone, Copy)]
struct Areas {
    src: usize,
    read_src: usize,
    write: usize,
    read_dst: usize,
    atomic_result: usize,
    recv: usize,
}

/// Where each area starts in the region.
#[derive(Debug, Clone, Copy)]
struct Layout {
    src: usize,
    read_src: usize,
    atomic_words: usize,
    write: usize,
    read_dst: usize,
    atomic_result: usize,
    recv: usize,
    len: usize,
}

impl Layout {
    fn new(a: Areas) -> Layout {
        let align = |x: usize| x.next_multiple_of(64);
        let src = 0;
        let read_src = align(src + a.src);
        let atomic_words = align(read_src + a.read_src);
        let write = align(atomic_words + ATOMIC_WORDS * 8);
        let read_dst = align(write + a.write);
        let atomic_result = align(read_dst + a.read_dst);
        let recv = align(atomic_result + a.atomic_result);
        let len = align(recv + a.recv).max(64);
        Layout { src, read_src, atomic_words, write, read_dst, atomic_result, recv, len }
    }
}

/// A message size: mostly small, some around the MTU, a few large.
fn message_len(rng: &mut fastrand::Rng, shape: &Shape) -> usize {
    let mtu = shape.mtu.bytes() as usize;
    match rng.u32(0..100) {
        0..=14 => 0,
        15..=54 => rng.usize(1..=64),
        55..=74 => rng.usize(mtu - 4..=mtu + 4),
        75..=94 => rng.usize(1..=4 * mtu),
        _ => rng.usize(1..=shape.max_len.max(1)),
    }
    .min(shape.max_len)
}

/// Splits `len` bytes into 1 to 3 pieces (some may be empty).
fn split(rng: &mut fastrand::Rng, len: usize) -> Vec<usize> {
    match rng.u8(0..3) {
        0 => vec![len],
        1 => {
            let a = rng.usize(0..=len);
            vec![a, len - a]
        }
        _ => {
            let a = rng.usize(0..=len);
            let b = rng.usize(0..=len - a);
            vec![a, b, len - a - b]
        }
    }
}

/// Work request ids encode who posted what, so a stray completion says
/// where it came from.
fn wr_id(pair: usize, end: usize, index: usize, recv: bool) -> u64 {
    ((pair as u64) << 40) | ((end as u64) << 32) | ((recv as u64) << 31) | index as u64
}

/// One direction's operations, before any offset is known.
struct Draft {
    kind: Kind,
    len: usize,
    local_split: Vec<usize>,
    recv_capacity: usize,
    recv_split: Vec<usize>,
    inline: bool,
    signaled: bool,
    fence: bool,
    solicited: bool,
    imm: u32,
    compare_hits: bool,
    operand: u64,
}

impl PairPlan {
    /// A random pair workload from `rng`.
    pub fn generate(rng: &mut fastrand::Rng, pair: usize, shape: &Shape) -> PairPlan {
        let drafts: [Vec<Draft>; 2] = [0, 1].map(|_| {
            let n = rng.usize(1..=shape.ops_per_direction.max(1));
            (0..n)
                .map(|i| {
                    let kind = Kind::ALL[rng.usize(..Kind::ALL.len())];
                    let len = match kind {
                        Kind::CompareSwap | Kind::FetchAdd => 8,
                        _ => message_len(rng, shape),
                    };
                    let recv_capacity = len + if rng.bool() { 0 } else { rng.usize(1..=64) };
                    Draft {
                        kind,
                        len,
                        local_split: split(rng, len),
                        recv_capacity,
                        recv_split: split(rng, recv_capacity),
                        inline: len <= 64
                            && matches!(kind, Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm)
                            && rng.bool(),
                        // The last request is signalled so that its completion marks the end.
                        signaled: i + 1 == n || rng.u8(0..10) < 8,
                        fence: rng.u8(0..10) == 0,
                        solicited: rng.bool(),
                        imm: rng.u32(..),
                        compare_hits: rng.bool(),
                        operand: rng.u64(..),
                    }
                })
                .collect()
        });

        // Size each endpoint's areas: as requester for its own drafts, as
        // target for its peer's.
        let mut areas = [Areas::default(); 2];
        for x in 0..2 {
            let y = 1 - x;
            for d in &drafts[x] {
                let slack = 8;
                match d.kind {
                    Kind::Send | Kind::SendImm => {
                        areas[x].src = areas[x].src.max(d.len + slack);
                        areas[y].recv += d.recv_capacity + slack;
                    }
                    Kind::Write | Kind::WriteImm => {
                        areas[x].src = areas[x].src.max(d.len + slack);
                        areas[y].write += d.len + slack;
                        if d.kind == Kind::WriteImm {
                            areas[y].recv += slack;
                        }
                    }
                    Kind::Read => {
                        areas[y].read_src = areas[y].read_src.max(d.len + slack);
                        areas[x].read_dst += d.len + slack;
                    }
                    Kind::CompareSwap | Kind::FetchAdd => areas[x].atomic_result += 8,
                }
            }
        }
        let layouts = areas.map(Layout::new);
        let mut images: [Vec<u8>; 2] = layouts.map(|l| {
            let mut bytes = vec![0u8; l.len + 2 * GUARD];
            rng.fill(&mut bytes);
            bytes
        });
        let initial = images.clone();
        // The atomic model: each direction's words, as the responder will
        // hold them after each operation.
        let mut words: [[u64; ATOMIC_WORDS]; 2] = [0, 1].map(|y| {
            std::array::from_fn(|w| {
                let at = GUARD + layouts[y].atomic_words + w * 8;
                u64::from_ne_bytes(images[y][at..at + 8].try_into().unwrap())
            })
        });

        let mut ops: [Vec<PlannedOp>; 2] = [Vec::new(), Vec::new()];
        let mut recvs: [Vec<PlannedRecv>; 2] = [Vec::new(), Vec::new()];
        for x in 0..2 {
            let y = 1 - x;
            let (lx, ly) = (layouts[x], layouts[y]);
            let mut bump = [(0usize, 0usize, 0usize, 0usize); 2]; // write, read_dst, atomic_result, recv
            for (i, d) in drafts[x].iter().enumerate() {
                let mut op = PlannedOp {
                    wr_id: wr_id(pair, x, i, false),
                    kind: d.kind,
                    len: d.len as u32,
                    local: LocalData::Pieces(Vec::new()),
                    remote_offset: 0,
                    imm: matches!(d.kind, Kind::SendImm | Kind::WriteImm).then_some(d.imm),
                    compare: 0,
                    swap_or_add: d.operand,
                    signaled: d.signaled,
                    fence: d.fence,
                    solicited: d.solicited,
                };
                // Source pieces come from anywhere in the sender's src area.
                let mut data = Vec::with_capacity(d.len);
                if matches!(d.kind, Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm) {
                    let mut pieces = Vec::new();
                    for &piece in &d.local_split {
                        let offset = lx.src + rng.usize(0..=areas[x].src - piece);
                        data.extend_from_slice(&initial[x][GUARD + offset..GUARD + offset + piece]);
                        pieces.push((offset as u64, piece as u32));
                    }
                    op.local = if d.inline { LocalData::Inline(data.clone()) } else { LocalData::Pieces(pieces) };
                }
                match d.kind {
                    Kind::Send | Kind::SendImm => {
                        let start = ly.recv + bump[y].3;
                        bump[y].3 += d.recv_capacity + 8;
                        images[y][GUARD + start..GUARD + start + d.len].copy_from_slice(&data);
                        recvs[y].push(PlannedRecv {
                            wr_id: wr_id(pair, y, recvs[y].len(), true),
                            pieces: pieces_at(start, &d.recv_split),
                            expect: ExpectedCompletion {
                                wr_id: 0,
                                opcode: WcOpcode::Recv,
                                byte_len: d.len as u32,
                                imm: op.imm,
                            },
                        });
                    }
                    Kind::Write | Kind::WriteImm => {
                        let start = ly.write + bump[y].0;
                        bump[y].0 += d.len + 8;
                        op.remote_offset = start as u64;
                        images[y][GUARD + start..GUARD + start + d.len].copy_from_slice(&data);
                        if d.kind == Kind::WriteImm {
                            let start = ly.recv + bump[y].3;
                            bump[y].3 += 8;
                            recvs[y].push(PlannedRecv {
                                wr_id: wr_id(pair, y, recvs[y].len(), true),
                                pieces: pieces_at(start, &split(rng, 8)),
                                expect: ExpectedCompletion {
                                    wr_id: 0,
                                    opcode: WcOpcode::RecvRdmaWithImm,
                                    byte_len: d.len as u32,
                                    imm: op.imm,
                                },
                            });
                        }
                    }
                    Kind::Read => {
                        let source = ly.read_src + rng.usize(0..=areas[y].read_src - d.len);
                        op.remote_offset = source as u64;
                        let start = lx.read_dst + bump[x].1;
                        bump[x].1 += d.len + 8;
                        op.local = LocalData::Pieces(pieces_at(start, &d.local_split));
                        let bytes = initial[y][GUARD + source..GUARD + source + d.len].to_vec();
                        images[x][GUARD + start..GUARD + start + d.len].copy_from_slice(&bytes);
                    }
                    Kind::CompareSwap | Kind::FetchAdd => {
                        let w = rng.usize(..ATOMIC_WORDS);
                        op.remote_offset = (ly.atomic_words + w * 8) as u64;
                        let original = words[y][w];
                        words[y][w] = if d.kind == Kind::FetchAdd {
                            original.wrapping_add(d.operand)
                        } else {
                            op.compare = if d.compare_hits { original } else { original ^ 1 };
                            if op.compare == original { d.operand } else { original }
                        };
                        let start = lx.atomic_result + bump[x].2;
                        bump[x].2 += 8;
                        op.local = LocalData::Pieces(vec![(start as u64, 8)]);
                        images[x][GUARD + start..GUARD + start + 8].copy_from_slice(&original.to_ne_bytes());
                    }
                }
                ops[x].push(op);
            }
        }
        for y in 0..2 {
            for (w, value) in words[y].iter().enumerate() {
                let at = GUARD + layouts[y].atomic_words + w * 8;
                images[y][at..at + 8].copy_from_slice(&value.to_ne_bytes());
            }
            for recv in &mut recvs[y] {
                recv.expect.wr_id = recv.wr_id;
            }
        }
        let [i0, i1] = initial;
        let [e0, e1] = images;
        let [o0, o1] = ops;
        let [r0, r1] = recvs;
        PairPlan {
            ends: [
                EndpointPlan { initial: i0, expected: e0, ops: o0, recvs: r0 },
                EndpointPlan { initial: i1, expected: e1, ops: o1, recvs: r1 },
            ],
        }
    }
}

/// Consecutive pieces of the given sizes starting at `start`.
fn pieces_at(start: usize, sizes: &[usize]) -> Vec<(u64, u32)> {
    let mut at = start;
    sizes
        .iter()
        .map(|&size| {
            let piece = (at as u64, size as u32);
            at += size;
            piece
        })
        .collect()
}

/// The first byte where two images differ, described for a failure message.
pub fn first_difference(actual: &[u8], expected: &[u8]) -> Option<String> {
    // Nearly always equal: one vectorised comparison (a byte-by-byte
    // search for the first difference was a tenth of the simulator's time).
    if actual == expected {
        return None;
    }
    let at = actual.iter().zip(expected).position(|(a, e)| a != e)?;
    let zone = if at < GUARD || at >= expected.len() - GUARD { "guard (unregistered)" } else { "region" };
    let differing = actual.iter().zip(expected).filter(|(a, e)| a != e).count();
    Some(format!(
        "byte {at} ({zone}, region offset {}) is {:#04x}, expected {:#04x}; {differing} bytes differ",
        at as i64 - GUARD as i64,
        actual[at],
        expected[at]
    ))
}
