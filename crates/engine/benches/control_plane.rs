//! What the control verbs cost on a device that already holds `held`
//! regions and QPs: registering and deregistering a memory region, and
//! creating and destroying a QP. Each registration copies the key table
//! the shards read (copy on write), so its cost grows with the regions
//! held; keys and QP numbers are drawn from a cryptographic generator
//! (issue 31), which must cost no more than counting them did.
//!
//! `cargo bench -p softrnic-engine --bench control_plane`

use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use softrnic_engine::{DatapathKind, EngineConfig, Nic};
use softrnic_transport::{Access, DmaBuffer, PdId, QpCaps, QpInitAttr, QpType, Registration};

/// Regions and QPs the device holds while each verb is measured.
const HELD: [usize; 2] = [16, 4096];

fn device(addr: &str) -> Nic {
    let addr: IpAddr = addr.parse().expect("an address");
    Nic::open(EngineConfig { datapath: DatapathKind::Udp, ..EngineConfig::new(addr) }).expect("a device on loopback")
}

fn region(pd: PdId, buffer: &Arc<DmaBuffer>) -> Registration {
    let len = buffer.len();
    Registration {
        pd,
        buffer: buffer.clone(),
        offset: 0,
        len,
        iova: 0x1000,
        access: Access::LOCAL_WRITE | Access::REMOTE,
    }
}

fn control_plane(c: &mut Criterion) {
    let mut group = c.benchmark_group("control_plane");
    for (i, held) in HELD.into_iter().enumerate() {
        let nic = device(&format!("127.0.31.{}", i + 1));
        let pd = nic.alloc_pd();
        let buffer = Arc::new(DmaBuffer::new(4096));
        let cq = nic.create_cq(16);
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq.id(),
            recv_cq: cq.id(),
            caps: QpCaps::default(),
            sq_sig_all: false,
            srq: None,
        };
        let _regions: Vec<_> = (0..held).map(|_| nic.register_memory(region(pd, &buffer)).unwrap()).collect();
        let _qps: Vec<_> = (0..held).map(|_| nic.create_qp(init).unwrap()).collect();
        group.bench_function(BenchmarkId::new("register_and_deregister", held), |b| {
            b.iter(|| {
                let keys = nic.register_memory(region(pd, &buffer)).unwrap();
                nic.deregister_memory(black_box(keys).lkey).unwrap();
            })
        });
        group.bench_function(BenchmarkId::new("create_and_destroy_qp", held), |b| {
            b.iter(|| {
                let qp = nic.create_qp(init).unwrap();
                nic.destroy_qp(black_box(qp.qpn())).unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, control_plane);
criterion_main!(benches);
