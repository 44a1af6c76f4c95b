//! Attacks a peer can make on a softrnic device, each made here and each
//! failing (SECURITY.md's threat model, issue 31). ReDMArk (USENIX
//! Security 2021) broke real RNICs with them: keys and QP numbers that
//! count up let a peer that holds one key reach every region of the same
//! protection domain.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use softrnic::{
    Access, CompletionQueue, ConnectOptions, Context, EngineConfig, MemoryRegion, QpCaps, QueuePair, RemoteAddr,
    SendOp, SendWorkRequest, WcStatus,
};

/// Each test takes its own addresses so tests can run in parallel.
static NEXT: AtomicU8 = AtomicU8::new(10);

fn context() -> Context {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Context::with_config(EngineConfig::new(IpAddr::from([127, 0, 31, n]))).expect("open")
}

/// A server's region and a client's QP connected to it: what a client of
/// a storage service that hands out one rkey per client holds.
struct Client {
    mr: MemoryRegion,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn connect(client: &Context, server_qp: &QueuePair, server_mr: &MemoryRegion) -> Client {
    let pd = client.alloc_pd().unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let cq = client.create_cq(16).unwrap();
    let qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
    // The default timeout and retries: a test run beside many others
    // must not time out before the server's NAK arrives.
    let options = ConnectOptions::default();
    qp.connect(&server_qp.endpoint(server_mr), &options).unwrap();
    server_qp.connect(&qp.endpoint(&mr), &options).unwrap();
    Client { mr, cq, qp }
}

/// The server registers the region it gives this client and then another
/// client's, in the same PD, both remotely writable. The client knows its
/// own region's keys and the other region's address, and guesses the
/// other's rkey from its own the way counting keys give it away: the next
/// and previous slot, the neighbouring generations, its own lkey. Every
/// guess fails with a remote access error and the other region is
/// untouched. (With the keys of before, `slot << 8 | generation` and lkey
/// equal to rkey, the first guess wrote into it.)
#[test]
fn a_client_cannot_guess_another_clients_rkey() {
    let (server, attacker) = (context(), context());
    let pd = server.alloc_pd().unwrap();
    let cq = server.create_cq(64).unwrap();
    let given = pd.register(64, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    let secret = pd.register(64, Access::LOCAL_WRITE | Access::REMOTE).unwrap();
    assert_ne!(given.lkey(), given.rkey(), "a region's lkey and rkey differ");
    let (rkey, lkey) = (given.rkey(), given.lkey());
    let guesses = [
        rkey.wrapping_add(0x100),
        rkey.wrapping_sub(0x100),
        rkey.wrapping_add(1),
        rkey.wrapping_sub(1),
        rkey ^ 1,
        lkey,
        lkey.wrapping_add(0x100),
    ];
    for guess in guesses {
        // A QP that met a remote access error is in the error state: one
        // connection per guess.
        let server_qp = pd.create_rc_qp(&cq, &cq, QpCaps::default()).unwrap();
        let client = connect(&attacker, &server_qp, &given);
        client.mr.write(0, &[0xee; 8]);
        let remote = RemoteAddr { addr: secret.iova(), rkey: guess };
        let write = SendWorkRequest::new(1, SendOp::Write { remote, imm: None }, client.mr.gather(0, 8));
        client.qp.post_send(write).unwrap();
        let done = client.cq.wait(Duration::from_secs(10)).expect("the WRITE completes");
        assert_eq!(done.status, WcStatus::RemAccessErr, "guess {guess:#x} (given rkey {rkey:#x})");
    }
    let mut bytes = [0u8; 64];
    secret.read(0, &mut bytes);
    assert_eq!(bytes, [0; 64], "the other client's region is untouched");
}
