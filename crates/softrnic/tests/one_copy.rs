//! One copy between devices on one host (issue 32): a payload moves by
//! reference, straight from the sender's region into the receiver's, and
//! everything that guards a payload on the wire guards it here too: the
//! rkey, the PD, a region deregistered under the transfer, and a reference
//! the receiver cannot resolve.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use softrnic::{
    Access, CompletionQueue, ConnectOptions, Context, DatapathKind, EngineConfig, MemoryRegion, ProtectionDomain,
    QpAttr, QpCaps, QpState, QueuePair, RecvWorkRequest, SendOp, SendWorkRequest, WcStatus,
};
use softrnic_engine::shm::{NO_ICRC_PORT, Peers, Scope, Sent};
use softrnic_transport::TransportConfig;
use softrnic_transport::by_reference::MAX_SPAN_BYTES;
use softrnic_wire::{Opcode, Psn};

/// Each test takes its own addresses so tests can run in parallel.
static NEXT: AtomicU8 = AtomicU8::new(10);

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

const LEN: usize = 1 << 20;

fn side_with(addr: IpAddr, transport: TransportConfig) -> Side {
    let config = EngineConfig { datapath: DatapathKind::Shm, transport, ..EngineConfig::new(addr) };
    let ctx = Context::with_config(config).expect("open");
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(4 * LEN, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    Side { ctx, pd, mr, cq, qp }
}

/// Two devices on this host, connected.
fn pair() -> (Side, Side) {
    pair_with(TransportConfig::default(), false)
}

/// Two devices on this host with `transport`'s settings, connected with
/// selective repeat or go-back-N.
fn pair_with(transport: TransportConfig, selective_repeat: bool) -> (Side, Side) {
    let n = NEXT.fetch_add(2, Ordering::Relaxed);
    let a = side_with(IpAddr::from([127, 0, 41, n]), transport.clone());
    let b = side_with(IpAddr::from([127, 0, 41, n + 1]), transport);
    connect_with(&a, &b, selective_repeat);
    (a, b)
}

/// Connects (or connects again, from any state) the two QPs.
fn connect(a: &Side, b: &Side) {
    connect_with(a, b, false)
}

fn connect_with(a: &Side, b: &Side, selective_repeat: bool) {
    let reset = QpAttr { state: Some(QpState::Reset), ..Default::default() };
    for side in [a, b] {
        side.qp.modify(&reset).unwrap();
    }
    // The default timer (67 ms) and retries: these tests run beside
    // others on two cores, where a shorter timer fires on a peer that
    // was merely descheduled.
    let options = ConnectOptions { selective_repeat, ..ConnectOptions::default() };
    a.qp.connect(&b.qp.endpoint(&b.mr), &options).unwrap();
    b.qp.connect(&a.qp.endpoint(&a.mr), &options).unwrap();
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt) ^ (i >> 9) as u8).collect()
}

fn wait(cq: &CompletionQueue) -> softrnic::Completion {
    cq.wait(Duration::from_secs(30)).expect("a completion")
}

fn counters(side: &Side) -> softrnic_transport::Counters {
    side.ctx.counters().transport
}

#[test]
fn every_payload_is_copied_once_straight_between_regions() {
    let (a, b) = pair();
    send_write_and_read_a_mib(&a, &b);
    // 256 MTUs of 4 KiB a MiB, 16 to a packet by reference: the SEND's
    // and the WRITE's from a, the READ's responses from b, none through
    // the ring.
    let (ca, cb) = (counters(&a), counters(&b));
    let spans = (LEN / MAX_SPAN_BYTES) as u64;
    assert_eq!((ca.tx_by_reference, cb.rx_by_reference), (2 * spans, 2 * spans), "{ca:?}\n{cb:?}");
    assert_eq!((cb.tx_by_reference, ca.rx_by_reference), (spans, spans), "{ca:?}\n{cb:?}");
    assert_eq!(ca.rx_unresolved_references + cb.rx_unresolved_references, 0);
    assert_eq!(ca.retransmitted_packets + cb.retransmitted_packets, 0);
}

/// A packet stands for several MTUs only where the connection's PSNs go
/// in order, and never past the window: selective repeat sends a packet
/// per MTU; a window of 8 PSNs cuts packets at 8 MTUs (and READs into
/// chunks of 8 responses). Every byte arrives either way.
#[test]
fn packets_span_only_as_far_as_the_connection_allows() {
    let per_mib = (LEN / 4096) as u64;
    let (a, b) = pair_with(TransportConfig::default(), true);
    send_write_and_read_a_mib(&a, &b);
    // No packet spans: at least one by reference per MTU. (A timer on a
    // busy machine may send some again, a READ's responses included,
    // which the requester's retransmission count does not show.)
    let (ca, cb) = (counters(&a), counters(&b));
    assert_eq!(ca.tx_spanning + cb.tx_spanning, 0, "selective repeat: {ca:?}\n{cb:?}");
    assert!(ca.tx_by_reference >= 2 * per_mib && cb.tx_by_reference >= per_mib, "{ca:?}\n{cb:?}");

    let narrow = TransportConfig { max_inflight_packets: 8, ..TransportConfig::default() };
    let (a, b) = pair_with(narrow, false);
    send_write_and_read_a_mib(&a, &b);
    // Packets span, never past 8 MTUs: at least a packet per 8, and far
    // fewer than one per MTU; READs answered 8 responses to a chunk.
    let (ca, cb) = (counters(&a), counters(&b));
    assert!(ca.tx_spanning > 0 && cb.tx_spanning > 0, "a window of 8: {ca:?}\n{cb:?}");
    assert!((2 * per_mib / 8..2 * per_mib / 2).contains(&ca.tx_by_reference), "a window of 8: {ca:?}");
    assert!((per_mib / 8..per_mib / 2).contains(&cb.tx_by_reference), "READ responses, 8 to a chunk: {cb:?}");
}

/// A MiB SENT, WRITTEN and READ from `a` to `b`, every byte checked.
fn send_write_and_read_a_mib(a: &Side, b: &Side) {
    let data = pattern(LEN, 5);
    a.mr.write(0, &data);
    b.mr.write(LEN, &data);
    let mut got = vec![0u8; LEN];

    b.qp.post_recv(RecvWorkRequest { wr_id: 1, sges: softrnic_transport::smallvec![b.mr.sge(2 * LEN, LEN as u32)] })
        .unwrap();
    a.qp.post_send(SendWorkRequest::new(1, SendOp::Send { imm: None }, a.mr.gather(0, LEN as u32))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    assert_eq!(wait(&b.cq).byte_len, LEN as u32);
    b.mr.read(2 * LEN, &mut got);
    assert!(got == data, "SEND data differs");

    let write = SendOp::Write { remote: b.mr.remote(3 * LEN), imm: None };
    a.qp.post_send(SendWorkRequest::new(2, write, a.mr.gather(0, LEN as u32))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    b.mr.read(3 * LEN, &mut got);
    assert!(got == data, "WRITE data differs");

    let read = SendOp::Read { remote: b.mr.remote(LEN) };
    a.qp.post_send(SendWorkRequest::new(3, read, a.mr.gather(2 * LEN, LEN as u32))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    a.mr.read(2 * LEN, &mut got);
    assert!(got == data, "READ data differs");
}

/// A WRITE by reference that the responder refuses: the same remote access
/// error as on the wire, and the target untouched.
fn refused_write(a: &Side, target: &MemoryRegion, remote: softrnic_transport::RemoteAddr) {
    let before = counters(a).tx_by_reference;
    a.mr.write(0, &pattern(8192, 9));
    let write = SendOp::Write { remote, imm: None };
    a.qp.post_send(SendWorkRequest::new(7, write, a.mr.gather(0, 8192))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr);
    assert!(counters(a).tx_by_reference > before, "the WRITE went by reference");
    let mut got = vec![1u8; 8192];
    target.read(0, &mut got);
    assert!(got.iter().all(|&b| b == 0), "the target was written");
}

#[test]
fn protection_is_checked_on_the_one_copy_path() {
    // A wrong rkey.
    let (a, b) = pair();
    let remote = softrnic_transport::RemoteAddr { rkey: b.mr.rkey() ^ 0x5a5a, ..b.mr.remote(0) };
    refused_write(&a, &b.mr, remote);

    // A region of another PD than the responder's QP.
    let (a, b) = pair();
    let other = b.ctx.alloc_pd().unwrap().register(8192, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    refused_write(&a, &other, other.remote(0));

    // A region deregistered before the WRITE arrives, and one before a
    // READ of it (its memfd is gone from the responder's table, though
    // the requester's own copy of it could still be mapped).
    let (a, b) = pair();
    let gone = b.pd.register(8192, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let remote = gone.remote(0);
    drop(gone);
    let before = counters(&a).tx_by_reference;
    a.qp.post_send(SendWorkRequest::new(8, SendOp::Write { remote, imm: None }, a.mr.gather(0, 8192))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr);
    assert!(counters(&a).tx_by_reference > before);
    let (a, b) = pair();
    let gone = b.pd.register(8192, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let remote = gone.remote(0);
    drop(gone);
    a.qp.post_send(SendWorkRequest::new(9, SendOp::Read { remote }, a.mr.gather(0, 8192))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr);
}

/// An RC WRITE Only to `qpn` whose payload is `references`, marked as by
/// reference, pushed into `to`'s inbox as a device of this host would.
fn forge(from: IpAddr, to: IpAddr, qpn: u32, references: &[u8]) {
    let reth = softrnic_wire::reth::Repr { virtual_address: 0x1000, rkey: 0, dma_length: references.len() as u32 };
    forge_write(from, to, qpn, Opcode::RcWriteOnly, Psn::new(1), reth, references);
}

/// A WRITE packet `opcode` at `psn` with `reth` whose payload is
/// `references`, pushed into `to`'s inbox as a device of this host would.
fn forge_write(
    from: IpAddr,
    to: IpAddr,
    qpn: u32,
    opcode: Opcode,
    psn: Psn,
    reth: softrnic_wire::reth::Repr,
    references: &[u8],
) {
    let mut datagram = vec![opcode as u8, 0, 0xff, 0xff, 0, (qpn >> 16) as u8, (qpn >> 8) as u8, qpn as u8, 0x80];
    datagram.extend_from_slice(&psn.value().to_be_bytes()[1..]);
    datagram.extend_from_slice(&reth.virtual_address.to_be_bytes());
    datagram.extend_from_slice(&reth.rkey.to_be_bytes());
    datagram.extend_from_slice(&reth.dma_length.to_be_bytes());
    datagram.extend_from_slice(references);
    datagram.extend_from_slice(&softrnic_transport::by_reference::MARK);
    let mut peers = Peers::new(Scope::this_netns().unwrap());
    let sent = peers.send(SocketAddr::new(from, NO_ICRC_PORT), to, &datagram);
    assert!(matches!(sent, Some(Sent::Delivered | Sent::DeliveredRang)), "{sent:?}");
}

fn reference(pid: u32, fd: i32, inode: u64, offset: u64, len: u32) -> Vec<u8> {
    let range =
        softrnic_transport::memory::FileRange { file: softrnic_transport::SharedFile { pid, fd, inode }, offset, len };
    let mut out = vec![0u8; softrnic_transport::by_reference::REFERENCE_LEN];
    softrnic_transport::by_reference::emit(&[range], &mut out);
    out
}

/// A sealed memfd of `len` bytes, as the engine registers memory on.
fn sealed(len: u64) -> (rustix::fd::OwnedFd, u64) {
    let fd = rustix::fs::memfd_create("softrnic-mr", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, len).unwrap();
    rustix::fs::fcntl_add_seals(&fd, rustix::fs::SealFlags::SHRINK).unwrap();
    let inode = rustix::fs::fstat(&fd).unwrap().st_ino;
    (fd, inode)
}

/// A packet by reference stands for several MTUs only as a whole number
/// of them (but the last of a message) and up to `MAX_SPAN_BYTES`; any
/// other length is an invalid request, as a packet of the wrong length is
/// on the wire: the responder NAKs it and its QP fails, nothing placed.
#[test]
fn a_packet_by_reference_of_the_wrong_length_is_an_invalid_request() {
    let pid = std::process::id();
    let (memfd, inode) = sealed(2 * MAX_SPAN_BYTES as u64);
    let fd = memfd.as_raw_fd();
    let cases = [
        ("a first packet of a MTU and a bit", Opcode::RcWriteFirst, 4096 + 100),
        ("an only packet past the most one carries", Opcode::RcWriteOnly, MAX_SPAN_BYTES + 4096),
    ];
    for (what, opcode, len) in cases {
        let (a, b) = pair();
        let psn = a.qp.endpoint(&a.mr).psn;
        let remote = b.mr.remote(0);
        let reth = softrnic_wire::reth::Repr {
            virtual_address: remote.addr,
            rkey: remote.rkey,
            dma_length: 2 * MAX_SPAN_BYTES as u32,
        };
        let references = reference(pid, fd, inode, 0, len as u32);
        forge_write(a.ctx.addr(), b.ctx.addr(), b.qp.qpn(), opcode, psn, reth, &references);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while counters(&b).fatal_naks_sent == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let cb = counters(&b);
        assert_eq!((cb.rx_by_reference, cb.fatal_naks_sent), (1, 1), "{what}: {cb:?}");
        assert_eq!(b.qp.state(), QpState::Error, "{what}");
        let mut target = vec![0u8; 2 * MAX_SPAN_BYTES];
        b.mr.read(0, &mut target);
        assert!(target.iter().all(|&byte| byte == 0), "{what}: bytes were placed");
    }
}

/// References a broken or hostile device of this host could send: each is
/// dropped and counted, nothing is copied, and the connection goes on.
#[test]
fn a_reference_the_receiver_cannot_resolve_is_dropped() {
    let (a, b) = pair();
    let (from, to, qpn) = (a.ctx.addr(), b.ctx.addr(), b.qp.qpn());
    let pid = std::process::id();
    let (memfd, inode) = sealed(4096);
    let unsealed = rustix::fs::memfd_create("softrnic-mr", rustix::fs::MemfdFlags::empty()).unwrap();
    rustix::fs::ftruncate(&unsealed, 4096).unwrap();
    let unsealed_inode = rustix::fs::fstat(&unsealed).unwrap().st_ino;
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let file_inode = file.metadata().unwrap().ino();
    let fd = memfd.as_raw_fd();
    let forgeries: Vec<(&str, Vec<u8>)> = vec![
        ("past the memfd's end", reference(pid, fd, inode, 4000, 200)),
        ("another file under the descriptor", reference(pid, fd, inode + 1, 0, 64)),
        ("a memfd its owner may shrink", reference(pid, unsealed.as_raw_fd(), unsealed_inode, 0, 64)),
        ("a file that is no memfd", reference(pid, file.as_raw_fd(), file_inode, 0, 64)),
        ("a process that is gone", reference(u32::MAX - 7, 3, 1, 0, 64)),
        ("a reference cut short", reference(pid, fd, inode, 0, 64)[..28].to_vec()),
    ];
    for (i, (what, bytes)) in forgeries.iter().enumerate() {
        forge(from, to, qpn, bytes);
        let counted = || counters(&b).rx_unresolved_references == i as u64 + 1;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !counted() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(counted(), "{what}: {:?}", counters(&b));
    }
    // What resolves would be copied (from a file of the same user, as a
    // ring of the same user could carry the bytes themselves); the
    // connection, which saw none of the forgeries, works on.
    let data = pattern(8192, 1);
    a.mr.write(0, &data);
    let write = SendOp::Write { remote: b.mr.remote(0), imm: None };
    a.qp.post_send(SendWorkRequest::new(1, write, a.mr.gather(0, 8192))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; 8192];
    b.mr.read(0, &mut got);
    assert!(got == data);
}

/// Regions deregistered while the peer WRITEs into them and READs them,
/// and source regions deregistered while their WRITEs are in flight: each
/// work request completes, successfully or with the error its side of the
/// race earns, nothing hangs or crashes, and the pair works afterwards.
#[test]
fn regions_deregistered_under_writes_and_reads_fail_cleanly() {
    let (a, b) = pair();
    let mut errors = 0;
    for round in 0..40u32 {
        let target = b.pd.register(LEN, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
        let source = a.pd.register(LEN, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
        for k in 0..16 {
            let remote = target.remote(k * 65536);
            let op = if k % 2 == 0 { SendOp::Write { remote, imm: None } } else { SendOp::Read { remote } };
            let wr = SendWorkRequest::new(u64::from(round) * 16 + k as u64, op, source.gather(k * 65536, 65536));
            a.qp.post_send(wr).unwrap();
        }
        // The target goes away after a moment that moves across the
        // transfer from round to round; every other round the source too.
        std::thread::sleep(Duration::from_micros(u64::from(round % 10) * 150));
        drop(target);
        if round % 2 == 1 {
            drop(source);
        }
        let statuses: Vec<WcStatus> = (0..16).map(|_| wait(&a.cq).status).collect();
        for status in &statuses {
            assert!(
                matches!(
                    status,
                    WcStatus::Success | WcStatus::RemAccessErr | WcStatus::LocProtErr | WcStatus::WrFlushErr
                ),
                "round {round}: {statuses:?}\n{:?}\n{:?}",
                counters(&a),
                counters(&b)
            );
        }
        if statuses.iter().any(|s| *s != WcStatus::Success) {
            errors += 1;
            connect(&a, &b);
        }
    }
    // The race was run, not avoided.
    assert!(errors > 0, "no deregistration landed inside a transfer");
    // And the pair works on.
    let data = pattern(LEN, 3);
    a.mr.write(0, &data);
    let write = SendOp::Write { remote: b.mr.remote(0), imm: None };
    a.qp.post_send(SendWorkRequest::new(1, write, a.mr.gather(0, LEN as u32))).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut got = vec![0u8; LEN];
    b.mr.read(0, &mut got);
    assert!(got == data);
}
