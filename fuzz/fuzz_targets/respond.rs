//! Feeds arbitrary packets to a device with live QPs: an RC QP in RTS with
//! work outstanding and receives posted, and a UD QP or a UC QP, over
//! registered memory. The parser target stops at the headers; this one
//! reaches the responder, the completer and the UD and UC receive paths,
//! because every packet
//! is addressed to one of the QPs, comes from its peer and carries a valid
//! ICRC (sealed here), so only its headers and payload are the fuzzer's.
//!
//! The property: a hostile peer touches no memory it has no key and right
//! for. Only the remotely writable region may change; the guard bytes
//! around it and a region registered for local access only never do.
//!
//! Input: a mode byte, whose low bit makes the RC connection
//! selective-repeat (then SEND and WRITE packets carry an SRETH, whose
//! address and key sit where a RETH's would when no other header precedes
//! it) and whose next two bits pick the device's congestion control (none,
//! DCQCN, HPCC with INT accepted, TIMELY), so that CE marks, CNPs and INT
//! echoes reach the notification and reaction points, and whose fourth bit
//! makes the RC connection authenticate its packets (no fuzzer forges a
//! MAC: what it reaches then is the opening of every packet), and whose
//! fifth bit puts a UC QP (connected to the same peer, receives posted)
//! where the UD QP is, whose sixth bit opens the remote region to the
//! peer through a type 2 memory window bound on the RC QP (the key handed
//! to RETH fields is then the window's; SEND with invalidate may shut
//! it), and whose seventh attaches the UD QP to a multicast group, to
//! which the frames for it are then sent (QP 0xFFFFFF, the ICRC sealed for
//! the group); then frames of a
//! selector byte (which QP, which peer, whether time passes, whether a
//! RETH-shaped field gets one of the device's real keys and addresses,
//! whether the datagram arrives CE-marked, with an INT record, or over a
//! same-host ring with no ICRC and none checked: then, if the packet's
//! last byte is odd, marked as carrying its payload by reference, which
//! the device resolves against one peer file it can map, 8 KiB named
//! pid 1, descriptor 3, inode 7), a length byte and that many bytes of
//! packet, BTH first.
//! The keys are handed over because no fuzzer guesses a 32-bit key and an
//! address at once: what is under test is what the device does with a
//! valid key used where its rights do not reach.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use softrnic_cc::IntHop;
use softrnic_transport::{
    Access, AuthKey, Choice, CongestionConfig, CqId, Device, DmaBuffer, Entropy, Instant, IntRecords, MAX_DATAGRAM_LEN,
    Mtu, Payload, PeerMemory, Psn, QpCaps, QpInitAttr, QpType, RcConnection, RecvMeta, RecvWorkRequest, Registration,
    RemoteAddr, SendOp, SendWorkRequest, Sge, SharedFile, TransportConfig, WindowBind, WindowType, smallvec, ud_steps,
};
use softrnic_wire::ROCEV2_UDP_PORT;
use softrnic_wire::bth::MULTICAST_QPN;
use softrnic_wire::icrc::UdpFlow;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const GUARD: usize = 256;
const REGION: usize = 8192;
/// Layout: guard, remotely writable region, guard, local-only region, guard.
const REMOTE_AT: usize = GUARD;
const LOCAL_AT: usize = 2 * GUARD + REGION;
const LEN: usize = 3 * GUARD + 2 * REGION;
const IOVA: u64 = 0x1000_0000;
const LOCAL_IOVA: u64 = 0x1010_0000;
/// Where a RETH (and an AtomicETH) sits: right after the 12-byte BTH.
const RETH_VA: std::ops::Range<usize> = 12..20;
const RETH_RKEY: std::ops::Range<usize> = 20..24;
/// The group the UD QP joins with the mode's seventh bit.
const GROUP: IpAddr = IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3));

/// The one file of a same-host peer the device can map.
struct PeerFile(Arc<DmaBuffer>);

impl PeerMemory for PeerFile {
    fn map(&mut self, file: &SharedFile) -> Option<Arc<DmaBuffer>> {
        (*file == SharedFile { pid: 1, fd: 3, inode: 7 }).then(|| self.0.clone())
    }
}

struct Target {
    device: Device,
    buffer: Arc<DmaBuffer>,
    cq: CqId,
    /// The rkeys of the remote region and of the local-only one.
    rkeys: [u32; 2],
    rc: u32,
    /// The UD QP, or with the mode's fifth bit the UC QP.
    other: u32,
    /// The group the UD QP joined, if it did.
    group: Option<IpAddr>,
    now: Instant,
}

fn setup(mode: u8) -> Target {
    let selective_repeat = mode & 1 != 0;
    // With authentication the fuzzer cannot forge a MAC, so what it
    // reaches is the opening of every packet: short, changed, forged.
    let authenticate = mode & 8 != 0;
    let algorithm = [None, Some("dcqcn"), Some("hpcc"), Some("timely")][usize::from(mode >> 1 & 3)];
    let congestion = CongestionConfig {
        algorithm: algorithm.map(|name| Choice::builtin(name, "").expect("a built-in")),
        int: algorithm == Some("hpcc"),
        ..CongestionConfig::default()
    };
    // Keys and QP numbers from a fixed seed: the same input replays.
    let auth_key = Some(AuthKey::from_secret("the fuzzer's shared secret").expect("16 bytes"));
    let config = TransportConfig { local_addr: LOCAL, congestion, auth_key, ..TransportConfig::default() };
    let mut device = Device::new(config, Entropy::from_u64(0));
    device.set_peer_memory(Box::new(PeerFile(Arc::new(DmaBuffer::from_bytes(&[0xc3; 8192])))));
    let buffer = Arc::new(DmaBuffer::from_bytes(&vec![0x5a; LEN]));
    let pd = device.alloc_pd();
    let remote = device
        .register_memory(Registration {
            pd,
            buffer: buffer.clone(),
            offset: REMOTE_AT,
            len: REGION,
            iova: IOVA,
            access: Access::LOCAL_WRITE | Access::REMOTE | Access::MW_BIND,
        })
        .expect("register");
    // Registered, but for local access only: no packet may reach it.
    let local = device
        .register_memory(Registration {
            pd,
            buffer: buffer.clone(),
            offset: LOCAL_AT,
            len: REGION,
            iova: LOCAL_IOVA,
            access: Access::LOCAL_WRITE,
        })
        .expect("register");
    let sge = |offset: usize, length: u32| Sge { addr: IOVA + offset as u64, length, lkey: remote.lkey };
    let cq = device.create_cq(1 << 16);
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, ..QpCaps::default() };
    let init = |qp_type| QpInitAttr { qp_type, pd, send_cq: cq, recv_cq: cq, caps, sq_sig_all: true, srq: None };
    let rc = device.create_qp(init(QpType::Rc)).expect("create rc");
    let ud = device.create_qp(init(QpType::Ud)).expect("create ud");
    let now = Instant::ZERO;
    let connection = RcConnection {
        access: Access::REMOTE,
        remote_addr: PEER,
        dest_qpn: 0x11,
        rq_psn: Psn::new(0),
        sq_psn: Psn::new(0),
        mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        selective_repeat,
        authenticate,
    };
    for attr in connection.steps() {
        device.modify_qp(now, rc, &attr).expect("modify rc");
    }
    for attr in ud_steps(0x1111_1111, Psn::new(0)) {
        device.modify_qp(now, ud, &attr).expect("modify ud");
    }
    let uc = device.create_qp(init(QpType::Uc)).expect("create uc");
    let uc_connection = RcConnection { dest_qpn: 0x12, selective_repeat: false, authenticate: false, ..connection };
    for attr in uc_connection.steps() {
        device.modify_qp(now, uc, &attr).expect("modify uc");
    }
    let other = if mode & 16 != 0 { uc } else { ud };
    let group = (mode & 64 != 0 && other == ud).then(|| {
        device.attach_multicast(ud, GROUP).expect("attach");
        GROUP
    });
    // Receives into the remotely writable region, for SENDs.
    for (qpn, i) in [(rc, 0u64), (rc, 1), (other, 2), (other, 3)] {
        let wr = RecvWorkRequest { wr_id: i, sges: smallvec![sge(i as usize * 2048, 2048)] };
        device.post_recv(now, qpn, wr).expect("post_recv");
    }
    // Work outstanding at the peer, so that responses have something to
    // complete: a WRITE, a READ into the remote region, an ATOMIC.
    let peer_region = RemoteAddr { addr: 0x2000_0000, rkey: 0x77 };
    let ops = [
        SendOp::Write { remote: peer_region, imm: None },
        SendOp::Read { remote: peer_region },
        SendOp::FetchAdd { remote: peer_region, add: 1 },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let len = if matches!(op, SendOp::FetchAdd { .. }) { 8 } else { 3000 };
        let wr = SendWorkRequest::new(10 + i as u64, op, Payload::Gather(smallvec![sge(4096, len)]));
        device.post_send(now, rc, wr).expect("post_send");
    }
    // The remote region's key, or a window's over it, bound on the RC QP.
    let mut remote_rkey = remote.rkey;
    if mode & 32 != 0 {
        let window = device.alloc_window(pd, WindowType::Two).expect("alloc_window");
        let access = Access::REMOTE;
        let bind = WindowBind { window, new_rkey: 1, region_lkey: remote.lkey, addr: IOVA, len: REGION as u64, access };
        let wr = SendWorkRequest::new(9, SendOp::BindWindow(bind), Payload::Gather(smallvec![]));
        device.post_send(now, rc, wr).expect("post the bind");
        remote_rkey = (window & !0xff) | 1;
    }
    Target { device, buffer, cq, rkeys: [remote_rkey, local.rkey], rc, other, group, now }
}

impl Target {
    /// Sends everything the device wants to send (to nobody).
    fn drain(&mut self) {
        let mut out = vec![0u8; MAX_DATAGRAM_LEN];
        while self.device.poll_transmit(self.now, &mut out).is_some() {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let mut t = setup(mode);
    let snapshot = t.buffer.to_vec();
    t.drain();
    while rest.len() >= 2 {
        let (selector, len) = (rest[0], usize::from(rest[1]) * 8);
        rest = &rest[2..];
        let body = &rest[..len.min(rest.len())];
        rest = &rest[body.len()..];
        if body.len() < 12 {
            continue;
        }
        // The fuzzer's headers and payload, with room for the ICRC, to one
        // of the QPs, from the RC QP's peer (or another host).
        let mut packet = body.to_vec();
        let by_reference = selector & 128 != 0 && body[body.len() - 1] & 1 == 1;
        packet.extend_from_slice(if by_reference { &softrnic_transport::by_reference::MARK } else { &[0; 4] });
        let qpn = if selector & 1 == 0 { t.rc } else { t.other };
        // To the UD QP's group, if it joined one.
        let group = t.group.filter(|_| qpn == t.other);
        let qpn = if group.is_some() { MULTICAST_QPN } else { qpn };
        packet[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        let from = if selector & 2 == 0 { PEER } else { IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)) };
        if selector & 8 != 0 && packet.len() >= RETH_RKEY.end {
            let target = usize::from(selector & 16 != 0);
            let base = [IOVA, LOCAL_IOVA][target];
            let offset = u64::from_be_bytes(packet[RETH_VA].try_into().expect("8 bytes")) % (2 * REGION as u64);
            packet[RETH_VA].copy_from_slice(&(base + offset).to_be_bytes());
            packet[RETH_RKEY].copy_from_slice(&t.rkeys[target].to_be_bytes());
        }
        // Arrived over a same-host ring: no ICRC, none checked, so the
        // bytes reach the responder unsealed.
        let same_host = selector & 128 != 0;
        let dst = group.unwrap_or(LOCAL);
        let flow = UdpFlow { src: from, dst, src_port: ROCEV2_UDP_PORT, dst_port: ROCEV2_UDP_PORT };
        if !same_host && flow.seal(&mut packet).is_err() {
            continue;
        }
        let int = (selector & 64 != 0).then(|| {
            let hop = IntHop {
                rate_bps: 100_000_000_000,
                queue_bytes: u32::from(rest.len() as u16) << 8,
                ..IntHop::default()
            };
            IntRecords::new(&[hop])
        });
        let meta = RecvMeta { ce: selector & 32 != 0, int, same_host, multicast_group: group };
        t.device.handle_datagram(t.now, SocketAddr::new(from, ROCEV2_UDP_PORT), meta, &packet);
        t.drain();
        if selector & 4 != 0 {
            t.now = t.now + Duration::from_millis(10);
            t.device.handle_timeout(t.now);
            t.drain();
        }
        let mut completions = Vec::new();
        while t.device.poll_cq(t.cq, 64, &mut completions) > 0 {
            completions.clear();
        }
    }
    let after = t.buffer.to_vec();
    let untouchable = [0..REMOTE_AT, REMOTE_AT + REGION..LOCAL_AT, LOCAL_AT..LOCAL_AT + REGION, LOCAL_AT + REGION..LEN];
    for range in untouchable {
        assert_eq!(after[range.clone()], snapshot[range.clone()], "bytes {range:?} changed without a key");
    }
});
