//! The block offload (E7) through softrnicd: blocks sent get their CRC,
//! blocks received are checked, and with a store a write's payload lands
//! there at its offset while the program's receive gets the header alone;
//! a read's answer posted as a header alone gets its payload from there.
//! A corrupt block is reported and stores nothing; the engine in the
//! process refuses the offload.

use std::net::IpAddr;

use softrnic::block::{BLOCK_LEN, BlockKind, BlockRepr, HEADER_LEN, crc32};
use softrnic::{
    Access, BlockOutcome, Completion, CompletionQueue, ConnectOptions, Context, MemoryRegion, QpCaps, QueuePair,
    RecvWorkRequest, SendOp, SendWorkRequest, WcOpcode, WcStatus,
};

fn daemon(name: &str) -> softrnic_daemon::server::Running {
    use softrnic_daemon::server::{Daemon, DaemonOptions};
    let socket = std::env::temp_dir().join(format!("softrnicd-blocks-{}-{name}.sock", std::process::id()));
    Daemon::bind(DaemonOptions::at(socket)).unwrap().start().unwrap()
}

/// One end: its device, its buffers (`mr`: a message slot per request,
/// `store`: a volume), a CQ and its block QP.
struct End {
    ctx: Context,
    mr: MemoryRegion,
    store: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

const SLOT: usize = HEADER_LEN + BLOCK_LEN;
const SLOTS: usize = 16;
const STORE: usize = 8 * BLOCK_LEN;

fn end(daemon: &softrnic_daemon::server::Running, addr: [u8; 4], placing: bool) -> End {
    let ctx = Context::through_daemon(daemon.socket(), IpAddr::from(addr)).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(SLOTS * SLOT, Access::LOCAL_WRITE).unwrap();
    let store = pd.register(STORE, Access::LOCAL_WRITE).unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let caps = QpCaps { max_send_sge: 1, max_recv_sge: 1, ..QpCaps::default() };
    let qp = pd.create_block_qp(&cq, &cq, caps, placing.then_some(&store)).unwrap();
    End { ctx, mr, store, cq, qp }
}

/// A client that offloads CRCs (at 127.0.7.`n`) and a server that places
/// into its store (at `n` + 1).
fn connected(daemon: &softrnic_daemon::server::Running, n: u8) -> (End, End) {
    let (client, server) = (end(daemon, [127, 0, 7, n], false), end(daemon, [127, 0, 7, n + 1], true));
    let options = ConnectOptions { timeout: 10, ..ConnectOptions::default() };
    client.qp.connect(&server.qp.endpoint(&server.mr), &options).unwrap();
    server.qp.connect(&client.qp.endpoint(&client.mr), &options).unwrap();
    (client, server)
}

fn header(kind: BlockKind, offset: u64, sequence: u64) -> BlockRepr {
    BlockRepr { kind, crc_set: false, volume: 1, offset, sequence, length: BLOCK_LEN as u32, crc: 0 }
}

fn payload(salt: u8) -> Vec<u8> {
    (0..BLOCK_LEN).map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt)).collect()
}

impl End {
    fn receive(&self, slot: usize, len: usize) {
        let sges = [self.mr.sge(slot * SLOT, len as u32)].into_iter().collect();
        self.qp.post_recv(RecvWorkRequest { wr_id: slot as u64, sges }).unwrap();
    }

    fn send(&self, slot: usize, bytes: &[u8]) {
        self.mr.write(slot * SLOT, bytes);
        let wr = SendWorkRequest::new(
            slot as u64,
            SendOp::Send { imm: None },
            self.mr.gather(slot * SLOT, bytes.len() as u32),
        );
        self.qp.post_send(wr).unwrap();
    }

    /// The next completion of `opcode`, the others (sends) checked.
    fn next(&self, opcode: WcOpcode) -> Completion {
        loop {
            let c = self.cq.wait(std::time::Duration::from_secs(20)).unwrap();
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            if c.opcode == opcode {
                return c;
            }
        }
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut bytes = vec![0; len];
        self.mr.read(offset, &mut bytes);
        bytes
    }
}

#[test]
fn blocks_are_checksummed_checked_and_placed_by_the_daemon() {
    let daemon = daemon("offload");
    let (client, server) = connected(&daemon, 20);

    // A write of block 3: the client's payload with no CRC of its own.
    server.receive(0, HEADER_LEN);
    let block = payload(7);
    let write = [&header(BlockKind::Write, 3 * BLOCK_LEN as u64, 1).to_bytes()[..], &block].concat();
    client.send(0, &write);
    let got = server.next(WcOpcode::Recv);
    assert_eq!((got.block, got.byte_len), (Some(BlockOutcome::Placed), HEADER_LEN as u32), "the header alone");
    let mut stored = vec![0; BLOCK_LEN];
    server.store.read(3 * BLOCK_LEN, &mut stored);
    assert_eq!(stored, block, "placed at its offset");
    let arrived = BlockRepr::parse_bytes(&server.read(0, HEADER_LEN)).unwrap();
    assert!(arrived.crc_set && arrived.crc == crc32(&block), "the daemon computed the CRC: {arrived:?}");
    assert_eq!(client.read(0, HEADER_LEN)[1], 0, "the program's own header is left as it was");

    // A read of it: the server answers with a header alone; the daemon
    // gathers the payload from the store and checksums it, and the
    // client's daemon checks it.
    client.receive(1, SLOT);
    server.send(1, &header(BlockKind::ReadData, 3 * BLOCK_LEN as u64, 2).to_bytes());
    let got = client.next(WcOpcode::Recv);
    assert_eq!((got.block, got.byte_len), (Some(BlockOutcome::Verified), SLOT as u32));
    assert_eq!(client.read(SLOT + HEADER_LEN, BLOCK_LEN), block);

    // A corrupt block (the sender's CRC, wrong): reported, nothing stored.
    server.receive(2, HEADER_LEN);
    let mut bad = header(BlockKind::Write, 5 * BLOCK_LEN as u64, 3);
    (bad.crc_set, bad.crc) = (true, crc32(&block) ^ 1);
    client.send(2, &[&bad.to_bytes()[..], &block].concat());
    assert_eq!(server.next(WcOpcode::Recv).block, Some(BlockOutcome::Corrupt));
    server.store.read(5 * BLOCK_LEN, &mut stored);
    assert_eq!(stored, vec![0; BLOCK_LEN], "nothing stored");

    // Past the store's end: checked, not placed.
    server.receive(3, HEADER_LEN);
    client.send(3, &[&header(BlockKind::Write, STORE as u64, 4).to_bytes()[..], &block].concat());
    assert_eq!(server.next(WcOpcode::Recv).block, Some(BlockOutcome::OutOfRange));

    // What is not a block passes whole: an 8-byte acknowledgement.
    client.receive(4, 8);
    server.send(4, b"ack12345");
    let got = client.next(WcOpcode::Recv);
    assert_eq!((got.block, got.byte_len), (None, 8));
    assert_eq!(client.read(4 * SLOT, 8), b"ack12345");
}

/// Four pairs at once through one softrnicd (its two command processors
/// checksumming and placing for all of them): every block placed, the
/// store holding each block's last write, and no retransmission, NAK or
/// out-of-sequence packet on any device.
#[test]
fn pairs_at_once_place_every_block_with_nothing_resent() {
    const BLOCKS: usize = 128;
    let daemon = daemon("concurrent");
    let pairs: Vec<(End, End)> = (0..4).map(|p| connected(&daemon, 60 + 2 * p)).collect();
    std::thread::scope(|scope| {
        for (p, (client, server)) in pairs.iter().enumerate() {
            // Every receive is posted before the first block leaves.
            for i in 0..BLOCKS {
                server.receive(i % SLOTS, HEADER_LEN);
            }
            scope.spawn(move || {
                for window in (0..BLOCKS).collect::<Vec<_>>().chunks(SLOTS) {
                    for &i in window {
                        let offset = ((i % (STORE / BLOCK_LEN)) * BLOCK_LEN) as u64;
                        let block = payload((p * BLOCKS + i) as u8);
                        client.send(
                            i % SLOTS,
                            &[&header(BlockKind::Write, offset, i as u64).to_bytes()[..], &block].concat(),
                        );
                    }
                    for _ in window {
                        client.next(WcOpcode::Send);
                    }
                }
            });
            scope.spawn(move || {
                for i in 0..BLOCKS {
                    assert_eq!(server.next(WcOpcode::Recv).block, Some(BlockOutcome::Placed), "pair {p} block {i}");
                }
            });
        }
    });
    for (p, (client, server)) in pairs.iter().enumerate() {
        for b in 0..STORE / BLOCK_LEN {
            let last = (0..BLOCKS).filter(|i| i % (STORE / BLOCK_LEN) == b).max().unwrap();
            let mut stored = vec![0; BLOCK_LEN];
            server.store.read(b * BLOCK_LEN, &mut stored);
            assert_eq!(stored, payload((p * BLOCKS + last) as u8), "pair {p} block {b}");
        }
        let (sent, got) = (client.ctx.counters().transport, server.ctx.counters().transport);
        assert_eq!(
            (sent.retransmitted_packets, sent.seq_naks_received, sent.rnr_naks_received, got.rx_out_of_sequence),
            (0, 0, 0, 0),
            "pair {p}: nothing resent, NAKed or out of order"
        );
    }
}

#[test]
fn the_engine_in_the_process_refuses_the_offload() {
    let ctx = Context::open(IpAddr::from([127, 0, 7, 40])).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let refused = pd.create_block_qp(&cq, &cq, QpCaps::default(), None).err().expect("refused").to_string();
    assert!(refused.contains("softrnicd"), "{refused}");
}

#[test]
fn the_daemon_refuses_a_store_it_cannot_place_into() {
    let daemon = daemon("refusals");
    let ctx = Context::through_daemon(daemon.socket(), IpAddr::from([127, 0, 7, 50])).unwrap();
    let (pd, other) = (ctx.alloc_pd().unwrap(), ctx.alloc_pd().unwrap());
    let cq = ctx.create_cq(8).unwrap();
    let caps = QpCaps::default();
    let foreign = other.register(BLOCK_LEN, Access::LOCAL_WRITE).unwrap();
    let refused = pd.create_block_qp(&cq, &cq, caps, Some(&foreign)).err().expect("refused").to_string();
    assert!(refused.contains("protection domain"), "{refused}");
    let read_only = pd.register(BLOCK_LEN, Access::empty()).unwrap();
    let refused = pd.create_block_qp(&cq, &cq, caps, Some(&read_only)).err().expect("refused").to_string();
    assert!(refused.contains("local write"), "{refused}");
    // The gather entry the offload keeps for a header is one of the
    // device's 32.
    let all = QpCaps { max_send_sge: 32, ..caps };
    let refused = pd.create_block_qp(&cq, &cq, all, None).err().expect("refused").to_string();
    assert!(refused.contains("capabilities"), "{refused}");
    assert!(pd.create_block_qp(&cq, &cq, caps, None).is_ok(), "and then a good one");
}
