//! Two softrnic devices on this machine; one writes into the other's memory
//! with RDMA WRITE, then reads it back with RDMA READ.
//!
//!     cargo run -p softrnic --example rdma_write
use softrnic::{Access, ConnectOptions, Context, QpCaps, SendOp, SendWorkRequest, WcStatusExt};

fn main() -> Result<(), softrnic::Error> {
    let writer = Context::open("127.0.4.2".parse()?)?;
    let target = Context::open("127.0.4.3".parse()?)?;
    let (wpd, tpd) = (writer.alloc_pd()?, target.alloc_pd()?);
    let local = wpd.register(1 << 20, Access::LOCAL_WRITE)?;
    let remote = tpd.register(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)?;
    let (wcq, tcq) = (writer.create_cq(16)?, target.create_cq(16)?);
    let wqp = wpd.create_rc_qp(&wcq, &wcq, QpCaps::default())?;
    let tqp = tpd.create_rc_qp(&tcq, &tcq, QpCaps::default())?;
    // In two processes these endpoints would travel through softrnic::exchange.
    wqp.connect(&tqp.endpoint(&remote), &ConnectOptions::default())?;
    tqp.connect(&wqp.endpoint(&local), &ConnectOptions::default())?;

    let message = b"RDMA without an RDMA NIC";
    local.write(0, message);
    let write = SendOp::Write { remote: remote.remote(4096), imm: None };
    wqp.post_send(SendWorkRequest::new(1, write, local.gather(0, message.len() as u32)))?;
    let done = wcq.wait_one()?;
    println!("WRITE of {} bytes: {}", done.byte_len, done.status.as_str());

    // The target's application did nothing; its engine placed the bytes.
    let read = SendOp::Read { remote: remote.remote(4096) };
    wqp.post_send(SendWorkRequest::new(2, read, local.gather(8192, message.len() as u32)))?;
    let done = wcq.wait_one()?;
    let mut back = vec![0u8; message.len()];
    local.read(8192, &mut back);
    assert!(done.status.is_success());
    println!("READ back: {:?}", String::from_utf8_lossy(&back));
    Ok(())
}
