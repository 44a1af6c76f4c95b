//! In-band telemetry over real UDP: a device whose QPs run HPCC sends its
//! data to the peer's INT port (4792) behind an INT header, the peer
//! (with INT on) echoes the records on its answers to the sender's INT
//! port, and nothing is lost, reordered or sent twice on the way, with two
//! engine threads a device and two application threads at once. A device
//! without INT refuses HPCC for a QP with an error that says how to enable
//! it.

use std::net::IpAddr;
use std::time::Duration;

use softrnic::{ConnectOptions, Context, DatapathKind, EngineConfig, SendOp, SendWorkRequest, WcStatus};

mod common;

/// A device on `addr` over UDP (the shared-memory wire between devices of
/// one host crosses no switch and carries no INT).
fn open(addr: [u8; 4], configure: impl FnOnce(&mut EngineConfig)) -> Context {
    let mut config = EngineConfig { datapath: DatapathKind::Udp, ..EngineConfig::new(IpAddr::from(addr)) };
    configure(&mut config);
    Context::with_config(config).expect("open")
}

/// Two engine threads a device, two connections (one on each shard),
/// each written from an application thread of its own at once.
#[test]
fn hpcc_data_collects_int_and_the_peer_echoes_it() {
    let hpcc = softrnic::choose_congestion_control("hpcc", "").unwrap();
    let a = open([127, 0, 4, 1], |c| {
        c.transport.congestion.algorithm = hpcc.clone();
        c.engine_threads = 2;
    });
    let b = open([127, 0, 4, 2], |c| {
        c.transport.congestion.int = true;
        c.engine_threads = 2;
    });
    const LEN: usize = 1 << 20;
    const WRITES: usize = 8;
    let pairs: Vec<_> = (0..2)
        .map(|_| {
            let (amr, acq, aqp) = common::rc_end(&a, LEN);
            let (bmr, _, bqp) = common::rc_end(&b, LEN);
            aqp.connect(&bqp.endpoint(&bmr), &ConnectOptions::default()).unwrap();
            bqp.connect(&aqp.endpoint(&amr), &ConnectOptions::default()).unwrap();
            (amr, acq, aqp, bmr, bqp)
        })
        .collect();
    std::thread::scope(|scope| {
        for (i, (amr, acq, aqp, bmr, _)) in pairs.iter().enumerate() {
            scope.spawn(move || {
                amr.write(0, &[0xa0 + i as u8; LEN]);
                for w in 0..WRITES as u64 {
                    let write = SendOp::Write { remote: bmr.remote(0), imm: None };
                    aqp.post_send(SendWorkRequest::new(w, write, amr.gather(0, LEN as u32))).unwrap();
                    assert_eq!(acq.wait(Duration::from_secs(30)).expect("a completion").status, WcStatus::Success);
                }
            });
        }
    });
    for (i, (_, _, aqp, bmr, _)) in pairs.iter().enumerate() {
        let mut landed = vec![0u8; LEN];
        bmr.read(0, &mut landed);
        assert!(landed.iter().all(|&b| b == 0xa0 + i as u8), "connection {i}'s data arrived whole");
        assert!(aqp.congestion_rate().is_some_and(|rate| rate > 0), "HPCC paces the QP");
    }

    let (ac, bc) = (a.counters(), b.counters());
    let packets = (2 * WRITES * LEN / 4096) as u64;
    assert!(bc.rx_int_packets >= packets, "the data went to the INT port: {} of {packets}", bc.rx_int_packets);
    assert!(ac.rx_int_packets > 0, "the ACKs echoed the records to the sender's INT port");
    assert_eq!((ac.rx_int_malformed, bc.rx_int_malformed), (0, 0));
    // Steered past the INT header to each QP's own shard, and nothing
    // lost, reordered or sent twice on loopback.
    assert_eq!((ac.rx_missteered, bc.rx_missteered), (0, 0));
    assert_eq!(ac.transport.retransmitted_packets, 0, "loopback loses nothing");
    assert_eq!((bc.transport.rx_out_of_sequence, bc.transport.rx_dropped_foreign), (0, 0));
    assert_eq!((ac.transport.seq_naks_received, bc.transport.seq_naks_sent), (0, 0));
}

#[test]
fn a_device_without_int_refuses_hpcc_for_a_qp() {
    let ctx = open([127, 0, 4, 3], |_| {});
    let peer = open([127, 0, 4, 4], |_| {});
    let [(_, _, qp), (peer_mr, _, peer_qp)] = [&ctx, &peer].map(|ctx| common::rc_end(ctx, 4096));
    let hpcc = softrnic::choose_congestion_control("hpcc", "").unwrap();
    let options = ConnectOptions { congestion_control: hpcc, ..ConnectOptions::default() };
    let refused = qp.connect(&peer_qp.endpoint(&peer_mr), &options).unwrap_err().to_string();
    assert!(refused.contains("in-band telemetry") && refused.contains("SOFTRNIC_INT=on"), "{refused}");
}
