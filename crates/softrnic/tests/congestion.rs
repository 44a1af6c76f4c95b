//! The CNP path end to end over real UDP: data that arrives marked CE
//! (here every datagram leaves marked, `SOFTRNIC_ECN=ce`, as if a switch
//! were congested) makes the receiver's notification point send CNPs, at
//! most one per QP per `min_time_between_cnps`, and the sender's DCQCN
//! cuts its rate. Its own test binary: the ECN setting is the process's.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrnic::{ConnectOptions, Context, DatapathKind, EngineConfig, SendOp, SendWorkRequest, WcStatus};

mod common;

#[test]
fn ce_in_one_cnp_per_interval_out_rate_down() {
    // SAFETY of the environment: set before any device opens, in a test
    // binary with this one test.
    unsafe { std::env::set_var("SOFTRNIC_ECN", "ce") };
    let open = |addr: [u8; 4]| {
        // UDP: the shared-memory wire between devices of one host crosses
        // no switch, and carries no ECN.
        let mut config = EngineConfig { datapath: DatapathKind::Udp, ..EngineConfig::new(IpAddr::from(addr)) };
        config.transport.congestion.line_rate_bps = 10_000_000_000;
        Context::with_config(config).expect("open")
    };
    let (a, b) = (open([127, 0, 3, 1]), open([127, 0, 3, 2]));
    const LEN: usize = 1 << 20;
    let sides = [&a, &b].map(|ctx| common::rc_end(ctx, LEN));
    let (amr, acq, aqp) = &sides[0];
    let (bmr, _, bqp) = &sides[1];
    let dcqcn = softrnic::choose_congestion_control("dcqcn", "").unwrap();
    let options = ConnectOptions { congestion_control: dcqcn, ..ConnectOptions::default() };
    aqp.connect(&bqp.endpoint(bmr), &options).unwrap();
    bqp.connect(&aqp.endpoint(amr), &ConnectOptions::default()).unwrap();
    assert_eq!(aqp.congestion_rate(), Some(10_000_000_000), "DCQCN starts at the line rate");

    let started = Instant::now();
    // The lowest rate seen as each write completes: DCQCN recovers once
    // the CNPs stop, sooner in wall time the longer this thread waits for
    // a core, so the rate after the last write says little.
    let mut lowest = u64::MAX;
    for i in 0..32 {
        let write = SendOp::Write { remote: bmr.remote(0), imm: None };
        aqp.post_send(SendWorkRequest::new(i, write, amr.gather(0, LEN as u32))).unwrap();
        assert_eq!(acq.wait(Duration::from_secs(30)).expect("a completion").status, WcStatus::Success);
        lowest = lowest.min(aqp.congestion_rate().unwrap());
    }
    let elapsed = started.elapsed();

    let (sent, received) = (b.counters().transport.cnps_sent, a.counters().transport.rx_cnps);
    assert!(sent > 0, "every data packet arrived CE, yet no CNP left");
    // One per QP per 4 µs at most (the ACKs b sends are marked too, and a
    // answers them with CNPs of its own, which b may not count here).
    let most = elapsed.as_nanos() / 4_000 + 1;
    assert!(u128::from(sent) <= most, "{sent} CNPs in {elapsed:?}: more than one per 4 µs");
    assert_eq!(received, sent, "loopback loses nothing: every CNP reached the sender");
    assert!(lowest < 10_000_000_000 / 2, "DCQCN cut the rate: at least {lowest} b/s");
}
