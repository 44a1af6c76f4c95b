//! The pipeline's behaviour, driven as a driver would: packets in, time
//! advanced to each deadline, packets out.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use softrnic_switch::{
    Classified, Ecn, Frame, LinkFaults, PfcConfig, PfcSignal, PortConfig, Prefix, RedConfig, Routes, Switch,
    SwitchConfig, Time,
};
use softrnic_wire::int::{self, Hop, Stamp};

#[derive(Debug, Clone)]
struct TestFrame {
    id: u64,
    len: usize,
    dst: IpAddr,
    flow: u64,
    ecn: Ecn,
    dscp: u8,
    control: bool,
    int: Option<[u8; int::HEADER_LEN]>,
    /// An aggregation packet's UDP payload, and its source.
    aggregation: Option<Vec<u8>>,
    src: IpAddr,
}

impl TestFrame {
    fn data(id: u64, len: usize, dst: IpAddr) -> TestFrame {
        TestFrame {
            id,
            len,
            dst,
            flow: id,
            ecn: Ecn::Ect0,
            dscp: 0,
            control: false,
            int: None,
            aggregation: None,
            src: host(200),
        }
    }
}

impl Frame for TestFrame {
    fn wire_len(&self) -> usize {
        self.len
    }
    fn classify(&self) -> Option<Classified> {
        Some(Classified {
            src: self.src,
            dst: self.dst,
            flow: self.flow,
            ecn: self.ecn,
            dscp: self.dscp,
            control: self.control,
            int: self.int.is_some(),
        })
    }
    fn mark_ce(&mut self) {
        self.ecn = Ecn::Ce;
    }
    fn stamp_int(&mut self, hop: Hop) -> Option<Stamp> {
        let bytes = self.int.as_mut()?;
        Some(int::Header::new_unchecked(&mut bytes[..]).push(hop))
    }
    fn aggregation_payload(&mut self) -> Option<&mut [u8]> {
        self.aggregation.as_deref_mut()
    }
    fn copy_to(&self, dst: IpAddr) -> TestFrame {
        TestFrame { dst, ..self.clone() }
    }
}

fn host(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
}

/// A star: port i leads to host i.
fn star(ports: usize, port: PortConfig, buffer: u64) -> Switch<TestFrame> {
    let mut routes = Routes::default();
    for i in 0..ports {
        routes.add(Prefix::host(host(i as u8)), vec![i]);
    }
    Switch::new(SwitchConfig::uniform(ports, port, buffer, 42), routes)
}

/// Everything the switch sends by `until`, advancing time to each deadline.
fn drain(switch: &mut Switch<TestFrame>, now: &mut Time, until: Time) -> Vec<(usize, TestFrame, Time)> {
    let mut out = Vec::new();
    loop {
        while let Some((port, frame)) = switch.poll_transmit(*now) {
            out.push((port, frame, *now));
        }
        match switch.poll_timeout() {
            Some(t) if t <= until => *now = t.max(*now),
            _ => return out,
        }
    }
}

const GBPS: u64 = 1_000_000_000;

/// With the queue held at each depth across Kmin..Kmax, the fraction
/// marked matches RED's probability within four standard deviations.
#[test]
fn red_marks_with_the_configured_probability_across_kmin_to_kmax() {
    let red = RedConfig { kmin: 20_000, kmax: 80_000, pmax: 0.5 };
    for depth in [10_000u64, 30_000, 50_000, 70_000, 80_000, 90_000] {
        let mut port = PortConfig::new(10 * GBPS, 1 << 20);
        port.red = Some(red);
        let mut switch = star(2, port, 1 << 24);
        let (mut now, mut id) = (Time::ZERO, 0);
        let packets = depth / 1000;
        for _ in 0..packets {
            id += 1;
            switch.handle_packet(now, 0, TestFrame::data(id, 1000, host(1)));
        }
        let (trials, mut marked) = (20_000u64, 0u64);
        for _ in 0..trials {
            now = now.max(switch.poll_timeout().unwrap());
            let (_, frame) = switch.poll_transmit(now).expect("the port is ready");
            marked += u64::from(frame.ecn == Ecn::Ce);
            id += 1;
            switch.handle_packet(now, 0, TestFrame::data(id, 1000, host(1)));
        }
        let p = red.probability(depth);
        let sigma = (p * (1.0 - p) / trials as f64).sqrt();
        let got = marked as f64 / trials as f64;
        assert!((got - p).abs() <= 4.0 * sigma + 1e-9, "depth {depth}: marked {got:.4}, RED says {p:.4}");
        assert_eq!(switch.queue_counters(1, 1).marked, marked);
    }
}

#[test]
fn packets_that_are_not_ect_are_never_marked() {
    let mut port = PortConfig::new(GBPS, 1 << 20);
    port.red = Some(RedConfig { kmin: 0, kmax: 1, pmax: 1.0 });
    let mut switch = star(2, port, 1 << 24);
    for id in 0..100 {
        switch.handle_packet(Time::ZERO, 0, TestFrame { ecn: Ecn::NotEct, ..TestFrame::data(id, 1000, host(1)) });
    }
    let out = drain(&mut switch, &mut Time::ZERO.clone(), Time::from_secs(1));
    assert_eq!(out.len(), 100);
    assert!(out.iter().all(|(_, f, _)| f.ecn == Ecn::NotEct));
}

/// A flooded 1, 10 and 40 Gb/s port sends at its rate within 1 %.
#[test]
fn a_port_sends_at_its_line_rate() {
    for rate in [GBPS, 10 * GBPS, 40 * GBPS] {
        let mut switch = star(2, PortConfig::new(rate, 1 << 30), 1 << 30);
        let window = Duration::from_millis(5);
        // Offer twice the rate, in 1500-byte packets, at once.
        let packets = 2 * rate / 8 / 1500 * window.as_millis() as u64 / 1000;
        for id in 0..packets {
            switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1500, host(1)));
        }
        let mut now = Time::ZERO;
        let sent = drain(&mut switch, &mut now, window);
        let bits = sent.len() as f64 * 1500.0 * 8.0;
        let achieved = bits / window.as_secs_f64();
        assert!((achieved / rate as f64 - 1.0).abs() < 0.01, "{rate}: {achieved:.0} b/s");
        // Packets left in order.
        assert!(sent.windows(2).all(|w| w[0].1.id < w[1].1.id));
    }
}

#[test]
fn control_packets_overtake_queued_data() {
    let mut switch = star(2, PortConfig::new(GBPS, 1 << 20), 1 << 24);
    for id in 0..50 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1500, host(1)));
    }
    let mut ack = TestFrame::data(1000, 64, host(1));
    ack.control = true;
    let mut now = Time::ZERO;
    let first = switch.poll_transmit(now).unwrap().1;
    assert_eq!(first.id, 0);
    switch.handle_packet(now, 0, ack);
    now = switch.poll_timeout().unwrap();
    assert_eq!(switch.poll_transmit(now).unwrap().1.id, 1000, "the ACK goes next, ahead of 49 data packets");
    // DSCP class 1 data goes to the higher data queue, ahead of class 0.
    let mut urgent = TestFrame::data(2000, 1500, host(1));
    urgent.dscp = 8;
    switch.handle_packet(now, 0, urgent);
    now = switch.poll_timeout().unwrap();
    assert_eq!(switch.poll_transmit(now).unwrap().1.id, 2000);
}

#[test]
fn the_queue_is_bounded_by_its_limit_and_the_shared_pool() {
    let mut switch = star(3, PortConfig::new(GBPS, 30_000), 50_000);
    for id in 0..100 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1000, host(1)));
    }
    assert_eq!(switch.queue_bytes(1, 1), 30_000);
    assert_eq!(switch.queue_counters(1, 1).dropped, 70);
    // The pool has 20 000 bytes left for the other port.
    for id in 0..100 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1000, host(2)));
    }
    assert_eq!(switch.queue_bytes(2, 1), 20_000);
    assert_eq!(switch.buffer_used(), 50_000);
    let out = drain(&mut switch, &mut Time::ZERO.clone(), Time::from_secs(1));
    assert_eq!(out.len(), 50);
    assert_eq!(switch.buffer_used(), 0);
}

#[test]
fn pfc_pauses_the_upstream_above_xoff_and_resumes_below_xon() {
    let mut port = PortConfig::new(GBPS, 1 << 20);
    port.pfc = Some(PfcConfig { xoff: 20_000, xon: 10_000 });
    let mut switch = star(2, port, 1 << 24);
    for id in 0..20 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1000, host(1)));
    }
    assert_eq!(switch.poll_pfc(), None, "20 000 bytes is not above XOFF");
    switch.handle_packet(Time::ZERO, 0, TestFrame::data(20, 1000, host(1)));
    assert_eq!(switch.poll_pfc(), Some(PfcSignal { port: 0, queue: 1, pause: true }));
    assert_eq!(switch.poll_pfc(), None);
    // Draining to 10 000 bytes resumes, once.
    let mut now = Time::ZERO;
    let mut sent = 0;
    while switch.queue_bytes(1, 1) > 10_000 {
        now = now.max(switch.poll_timeout().unwrap());
        if switch.poll_transmit(now).is_some() {
            sent += 1;
        }
        if sent < 11 {
            assert_eq!(switch.poll_pfc(), None);
        }
    }
    assert_eq!(switch.poll_pfc(), Some(PfcSignal { port: 0, queue: 1, pause: false }));
    assert_eq!(switch.port_counters(0).pause_sent, 1);
    assert_eq!(switch.port_counters(0).resume_sent, 1);

    // A pause from downstream stops the data queue but not control.
    switch.handle_pfc(now, 1, 1, true);
    let mut ack = TestFrame::data(99, 64, host(1));
    ack.control = true;
    switch.handle_packet(now, 0, ack);
    let until = now + Duration::from_secs(1);
    let out = drain(&mut switch, &mut now, until);
    assert_eq!(out.iter().map(|(_, f, _)| f.id).collect::<Vec<_>>(), [99]);
    assert_eq!(switch.queue_bytes(1, 1), 10_000);
    switch.handle_pfc(now, 1, 1, false);
    let until = now + Duration::from_secs(1);
    assert_eq!(drain(&mut switch, &mut now, until).len(), 10);
}

#[test]
fn int_records_each_hops_rate_time_bytes_and_queue() {
    let mut switch = star(2, PortConfig::new(25 * GBPS, 1 << 20), 1 << 24);
    let mut header = [0u8; int::HEADER_LEN];
    int::Repr::default().emit(&mut header).unwrap();
    for id in 0..3 {
        let frame = TestFrame { int: Some(header), ..TestFrame::data(id, 1000, host(1)) };
        switch.handle_packet(Time::ZERO, 0, frame);
    }
    let mut now = Time::from_micros(7);
    let out = drain(&mut switch, &mut now, Time::from_secs(1));
    let hops: Vec<Hop> = out.iter().map(|(_, f, _)| int::Repr::parse(&f.int.unwrap()).unwrap().hops[0]).collect();
    assert_eq!(hops[0], Hop { rate_mbps: 25_000, timestamp_ns: 7_000, tx_bytes: 1000, queue_bytes: 2000 });
    assert_eq!(hops[1].tx_bytes, 2000);
    assert_eq!(hops[1].queue_bytes, 1000);
    assert_eq!(hops[1].timestamp_ns, 7_000 + 320, "1000 bytes at 25 Gb/s take 320 ns");
    assert_eq!(hops[2].queue_bytes, 0);
    // A packet without INT is left alone.
    switch.handle_packet(now, 0, TestFrame::data(9, 1000, host(1)));
    let plain = drain(&mut switch, &mut now, Time::from_secs(1));
    assert!(plain[0].1.int.is_none());
}

#[test]
fn ecmp_spreads_flows_over_equal_paths() {
    let mut routes = Routes::default();
    routes.add(Prefix { addr: host(0), len: 8 }, vec![1, 2, 3, 4]);
    let mut switch: Switch<TestFrame> =
        Switch::new(SwitchConfig::uniform(5, PortConfig::new(100 * GBPS, 1 << 30), 1 << 30, 3), routes);
    let mut rng = fastrand::Rng::with_seed(1);
    for id in 0..8000 {
        let frame = TestFrame { flow: rng.u64(..), ..TestFrame::data(id, 100, host(9)) };
        switch.handle_packet(Time::ZERO, 0, frame);
    }
    for port in 1..=4 {
        let enqueued = switch.queue_counters(port, 1).enqueued;
        assert!((1800..=2200).contains(&enqueued), "port {port}: {enqueued} of 8000");
    }
}

#[test]
fn link_faults_lose_and_delay_packets() {
    let mut port = PortConfig::new(10 * GBPS, 1 << 30);
    port.faults = LinkFaults { loss: 0.1, delay: Duration::from_micros(100), ..LinkFaults::NONE };
    let mut switch = star(2, port, 1 << 30);
    for id in 0..10_000 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 100, host(1)));
    }
    let out = drain(&mut switch, &mut Time::ZERO.clone(), Time::from_secs(1));
    let lost = switch.port_counters(1).link_lost;
    assert_eq!(out.len() as u64 + lost, 10_000);
    assert!((850..=1150).contains(&lost), "{lost} of 10 000 lost at 10 %");
    assert!(out.iter().all(|(_, _, at)| *at >= Time::from_micros(100)));
}

#[test]
fn reordering_lets_later_packets_overtake() {
    let mut port = PortConfig::new(10 * GBPS, 1 << 30);
    port.faults = LinkFaults { reorder: 0.2, reorder_by: Duration::from_micros(20), ..LinkFaults::NONE };
    let mut switch = star(2, port, 1 << 30);
    for id in 0..1000 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1000, host(1)));
    }
    let out = drain(&mut switch, &mut Time::ZERO.clone(), Time::from_secs(1));
    assert_eq!(out.len(), 1000);
    let overtaken = out.windows(2).filter(|w| w[0].1.id > w[1].1.id).count();
    assert!(overtaken > 50, "{overtaken}");
}

#[test]
fn unroutable_packets_are_counted_on_their_ingress_port() {
    let mut switch = star(2, PortConfig::new(GBPS, 1 << 20), 1 << 20);
    switch.handle_packet(Time::ZERO, 1, TestFrame::data(0, 100, IpAddr::V4(Ipv4Addr::new(192, 168, 0, 1))));
    assert_eq!(switch.port_counters(1).no_route, 1);
    assert_eq!(switch.poll_transmit(Time::from_secs(1)).map(|(p, _)| p), None);
}

/// Depth samples report the peak between samples, not only the moment.
#[test]
fn samples_keep_the_peak_between_them() {
    let mut switch = star(2, PortConfig::new(GBPS, 1 << 20), 1 << 24);
    for id in 0..10 {
        switch.handle_packet(Time::ZERO, 0, TestFrame::data(id, 1000, host(1)));
    }
    drain(&mut switch, &mut Time::ZERO.clone(), Time::from_secs(1));
    let sample = switch.take_samples(Time::from_secs(1)).into_iter().find(|s| s.port == 1 && s.queue == 1).unwrap();
    assert_eq!((sample.bytes, sample.peak_bytes), (0, 10_000));
    let again = switch.take_samples(Time::from_secs(2)).into_iter().find(|s| s.port == 1 && s.queue == 1).unwrap();
    assert_eq!(again.peak_bytes, 0);
}

/// The aggregation stage inside the pipeline: three workers' chunks become
/// one packet to the server's port, and the server's one ACK leaves by
/// every worker's port.
#[test]
fn aggregation_consumes_chunks_and_replicates_the_answer() {
    use softrnic_switch::AggregationConfig;
    use softrnic_wire::aggregation::{ALL_WORKERS, FLAG_ACK, NO_SLOT, Repr};
    let mut routes = Routes::default();
    for i in 0..4 {
        routes.add(Prefix::host(host(i as u8)), vec![i]);
    }
    let config = SwitchConfig {
        aggregation: Some(AggregationConfig::new(64)),
        ..SwitchConfig::uniform(4, PortConfig::new(10_000_000_000, 1 << 20), 1 << 22, 1)
    };
    let mut switch: Switch<TestFrame> = Switch::new(config, routes);
    let mut now = Time::ZERO;
    let server = host(3);
    for w in 0..3u8 {
        let chunk = Repr {
            job: 1,
            sequence: 0,
            workers: 3,
            worker: w,
            slot: NO_SLOT,
            values: vec![i32::from(w) + 1; 4],
            ..Repr::default()
        };
        let frame = TestFrame {
            src: host(w),
            aggregation: Some(chunk.to_bytes()),
            ..TestFrame::data(u64::from(w), 100, server)
        };
        switch.handle_packet(now, usize::from(w), frame);
    }
    let out = drain(&mut switch, &mut now, Time::from_millis(1));
    assert_eq!(out.len(), 1, "three chunks in, one sum out");
    let (port, frame, _) = &out[0];
    let sum = Repr::parse(frame.aggregation.as_ref().unwrap()).unwrap();
    assert_eq!((*port, sum.values.clone(), sum.bitmap), (3, vec![6; 4], 0b111));

    let ack = Repr { flags: FLAG_ACK, worker: ALL_WORKERS, ..sum };
    let frame = TestFrame { src: server, aggregation: Some(ack.to_bytes()), ..TestFrame::data(9, 100, host(0)) };
    switch.handle_packet(now, 3, frame);
    let mut ports: Vec<usize> = drain(&mut switch, &mut now, Time::from_millis(2)).iter().map(|o| o.0).collect();
    ports.sort();
    assert_eq!(ports, vec![0, 1, 2], "the answer reaches every worker");
    let stage = switch.aggregation().unwrap();
    assert_eq!((stage.held(), stage.jobs()[&1].completed, stage.unknown_members), (0, 1, 0));
}
