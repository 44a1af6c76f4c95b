//! Multicast in the transport: a datagram the datapath took from a group
//! it joined (`RecvMeta::multicast_group`) reaches every UD QP attached to
//! the group, its ICRC checked against the group's address and the group
//! in the GRH; a QP not attached (or no longer) takes nothing.

use std::net::IpAddr;

use softrnic_sim::harness::{Pair, PairOptions, QKEY};
use softrnic_transport::multicast::MULTICAST_QPN;
use softrnic_transport::{MAX_DATAGRAM_LEN, QpType, RecvMeta, SendOp, SendWorkRequest, UdDestination, WcStatus};

const GROUP: [u8; 4] = [239, 1, 2, 3];

fn ud_pair() -> Pair {
    Pair::new(PairOptions { qp_type: QpType::Ud, ..PairOptions::default() })
}

/// Host 0 sends `text` to the group; returns the datagrams it made.
fn send_to_group(pair: &mut Pair, text: &[u8]) -> Vec<Vec<u8>> {
    pair.a.buffer.write(0, text);
    let to = UdDestination { addr: IpAddr::from(GROUP), qpn: MULTICAST_QPN, qkey: QKEY };
    let wr = SendWorkRequest {
        ud: Some(to),
        ..SendWorkRequest::new(1, SendOp::Send { imm: None }, pair.a.gather(0, text.len() as u32))
    };
    pair.post_wr(0, wr);
    let (now, mut buf, mut out) = (pair.world.now, vec![0; MAX_DATAGRAM_LEN], Vec::new());
    while let Some(t) = pair.world.device(0).poll_transmit(now, &mut buf) {
        assert_eq!(t.dst, IpAddr::from(GROUP), "sent to the group's address");
        out.push(buf[..t.len].to_vec());
    }
    out
}

fn deliver(pair: &mut Pair, datagrams: &[Vec<u8>], group: Option<IpAddr>) {
    let (now, from) = (pair.world.now, pair.world.hosts[0].addr);
    for datagram in datagrams {
        let meta = RecvMeta { multicast_group: group, ..RecvMeta::default() };
        pair.world.device(1).handle_datagram(now, from, meta, datagram);
    }
}

#[test]
fn every_attached_qp_takes_a_copy_with_the_group_in_its_grh() {
    let mut pair = ud_pair();
    let qpn = pair.b.qpn;
    pair.world.device(1).attach_multicast(qpn, IpAddr::from(GROUP)).unwrap();
    pair.post_recv(1, 70, 0, 256);
    let datagrams = send_to_group(&mut pair, b"to the group");
    assert_eq!(datagrams.len(), 1);
    deliver(&mut pair, &datagrams, Some(IpAddr::from(GROUP)));
    let got = pair.wait(1, 1);
    assert_eq!((got[0].wr_id, got[0].status, got[0].byte_len), (70, WcStatus::Success, 40 + 12));
    let grh = pair.b.buffer.to_vec();
    assert_eq!(grh[36..40], GROUP, "the GRH's destination");
    assert_eq!(&grh[40..52], b"to the group");
}

#[test]
fn nothing_reaches_a_qp_not_attached() {
    let mut pair = ud_pair();
    let qpn = pair.b.qpn;
    pair.post_recv(1, 70, 0, 256);
    let datagrams = send_to_group(&mut pair, b"x");
    // Not attached: dropped.
    deliver(&mut pair, &datagrams, Some(IpAddr::from(GROUP)));
    // As if sent to the device's own address: its ICRC, sealed for the
    // group, does not hold (and 0xFFFFFF names no QP there).
    deliver(&mut pair, &datagrams, None);
    let counters = pair.world.device(1).counters();
    assert_eq!((counters.rx_unknown_qp, counters.rx_icrc_errors), (1, 1));
    // Attached then detached: dropped again.
    pair.world.device(1).attach_multicast(qpn, IpAddr::from(GROUP)).unwrap();
    pair.world.device(1).detach_multicast(qpn, IpAddr::from(GROUP)).unwrap();
    deliver(&mut pair, &datagrams, Some(IpAddr::from(GROUP)));
    let [_, b] = pair.settle();
    assert!(b.is_empty(), "{b:?}");
    // A datagram sealed for the group fails its ICRC as another group's.
    pair.world.device(1).attach_multicast(qpn, "239.9.9.9".parse().unwrap()).unwrap();
    let errors = pair.world.device(1).counters().rx_icrc_errors;
    deliver(&mut pair, &datagrams, Some("239.9.9.9".parse().unwrap()));
    assert_eq!(pair.world.device(1).counters().rx_icrc_errors, errors + 1);
}

#[test]
fn only_ud_qps_attach() {
    let mut pair = Pair::new(PairOptions::default());
    let qpn = pair.b.qpn;
    assert!(pair.world.device(1).attach_multicast(qpn, IpAddr::from(GROUP)).is_err());
}
