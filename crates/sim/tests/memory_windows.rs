//! Memory windows end to end: host 1 opens part of a region that grants
//! no remote access itself by binding a window on its send queue, host 0
//! reaches exactly that part under the window's rkey, and an unbind, a
//! local invalidate or host 0's SEND with invalidate shuts it again, the
//! way the IBTA and the rxe driver have it.

use softrnic_sim::harness::{IOVA, Pair, PairOptions};
use softrnic_transport::{
    Access, Payload, QpType, RemoteAddr, SendOp, VerbsError, WcOpcode, WcStatus, WindowBind, WindowType,
};

/// A pair whose regions allow local writes and window binds, and no
/// remote access of their own.
fn pair() -> Pair {
    Pair::new(PairOptions { access: Access::LOCAL_WRITE | Access::MW_BIND, ..PairOptions::default() })
}

fn nothing() -> Payload {
    Payload::Gather(Default::default())
}

/// Host 1's window of `kind`, and the bind that opens `[offset, offset +
/// len)` of its region to remote writes and reads under key byte `key`.
fn window(pair: &mut Pair, kind: WindowType, offset: u64, len: u64, key: u8) -> (u32, WindowBind) {
    let pd = pair.b.pd;
    let rkey = pair.world.device(1).alloc_window(pd, kind).unwrap();
    let bind = WindowBind {
        window: rkey,
        new_rkey: u32::from(key),
        region_lkey: pair.b.mr.lkey,
        addr: IOVA + offset,
        len,
        access: Access::REMOTE_WRITE | Access::REMOTE_READ,
    };
    (rkey, bind)
}

/// The rkey a bind gives its window.
fn bound_key(bind: &WindowBind) -> u32 {
    (bind.window & !0xff) | (bind.new_rkey & 0xff)
}

/// Host 0 writes `bytes` at `addr` under `rkey`; returns the status.
fn write(pair: &mut Pair, wr_id: u64, rkey: u32, addr: u64, bytes: &[u8]) -> WcStatus {
    pair.a.buffer.write(0, bytes);
    let payload = pair.a.gather(0, bytes.len() as u32);
    pair.post(0, wr_id, SendOp::Write { remote: RemoteAddr { addr, rkey }, imm: None }, payload);
    pair.wait(0, 1)[0].status
}

#[test]
fn a_type_2_window_grants_what_it_binds_and_nothing_else() {
    // Neither the region's own rkey nor the window's, unbound, reaches
    // anything (each refusal fails the QP, so each gets a pair).
    for use_window in [false, true] {
        let mut pair = pair();
        let (first, _) = window(&mut pair, WindowType::Two, 4096, 256, 0x5a);
        let rkey = if use_window { first } else { pair.b.mr.rkey };
        assert_eq!(write(&mut pair, 1, rkey, IOVA + 4096, b"x"), WcStatus::RemAccessErr, "window: {use_window}");
    }
    let mut pair = self::pair();
    let (_, bind) = window(&mut pair, WindowType::Two, 4096, 256, 0x5a);
    pair.post(1, 9, SendOp::BindWindow(bind), nothing());
    let bound = pair.wait(1, 1);
    assert_eq!((bound[0].wr_id, bound[0].opcode, bound[0].status), (9, WcOpcode::BindMw, WcStatus::Success));
    let rkey = bound_key(&bind);
    assert_eq!(rkey & 0xff, 0x5a, "the consumer's key byte");
    assert_eq!(write(&mut pair, 2, rkey, IOVA + 4096 + 200, b"through the window"), WcStatus::Success);
    assert_eq!(&pair.b.buffer.to_vec()[4296..4314], b"through the window");
    // READ through it too.
    pair.post(0, 3, SendOp::Read { remote: RemoteAddr { addr: IOVA + 4296, rkey } }, pair.a.gather(1024, 18));
    assert_eq!(pair.wait(0, 1)[0].status, WcStatus::Success);
    assert_eq!(&pair.a.buffer.to_vec()[1024..1042], b"through the window");
    // One byte past its end is the peer's error, and the QP's.
    assert_eq!(write(&mut pair, 4, rkey, IOVA + 4096 + 250, b"overflowing"), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_shuts_the_window_as_its_receive_completes() {
    send_with_invalidate(pair());
}

#[test]
fn send_with_invalidate_under_selective_repeat() {
    send_with_invalidate(Pair::new(PairOptions {
        access: Access::LOCAL_WRITE | Access::MW_BIND,
        selective_repeat: true,
        ..PairOptions::default()
    }));
}

fn send_with_invalidate(mut pair: Pair) {
    let (_, bind) = window(&mut pair, WindowType::Two, 0, 1024, 1);
    pair.post(1, 9, SendOp::BindWindow(bind), nothing());
    assert_eq!(pair.wait(1, 1)[0].status, WcStatus::Success);
    let rkey = bound_key(&bind);
    assert_eq!(write(&mut pair, 1, rkey, IOVA, b"before"), WcStatus::Success);

    pair.post_recv(1, 70, 8192, 64);
    pair.a.buffer.write(512, b"done with it");
    pair.post(0, 2, SendOp::SendWithInvalidate { rkey }, pair.a.gather(512, 12));
    assert_eq!(pair.wait(0, 1)[0].status, WcStatus::Success);
    let received = pair.wait(1, 1);
    assert_eq!(
        (received[0].wr_id, received[0].status, received[0].byte_len, received[0].invalidated_rkey),
        (70, WcStatus::Success, 12, Some(rkey))
    );
    assert_eq!(&pair.b.buffer.to_vec()[8192..8204], b"done with it");
    assert_eq!(write(&mut pair, 3, rkey, IOVA, b"after"), WcStatus::RemAccessErr, "the key reaches nothing now");
}

#[test]
fn invalidating_a_key_that_is_not_a_bound_window_fails_both_sides() {
    let mut pair = pair();
    pair.post_recv(1, 70, 0, 64);
    let stranger = pair.b.mr.lkey;
    pair.post(0, 1, SendOp::SendWithInvalidate { rkey: stranger }, pair.a.gather(0, 8));
    let [a, b] = pair.settle();
    assert_eq!(a[0].status, WcStatus::RemInvReqErr);
    assert_eq!((b[0].wr_id, b[0].status), (70, WcStatus::RemInvReqErr), "the IBTA's class J error");
}

#[test]
fn a_local_invalidate_frees_the_window_for_a_bind_under_a_new_key() {
    let mut pair = pair();
    let (_, bind) = window(&mut pair, WindowType::Two, 0, 512, 1);
    let old = bound_key(&bind);
    let rebind = WindowBind { new_rkey: 2, addr: IOVA + 1024, ..bind };
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    pair.post(1, 2, SendOp::BindWindow(rebind), nothing());
    let [_, b] = pair.settle();
    // A type 2 window is never rebound in place.
    assert_eq!((b[0].status, b[1].status), (WcStatus::Success, WcStatus::MwBindErr));

    let mut pair = self::pair();
    let (_, bind) = window(&mut pair, WindowType::Two, 0, 512, 1);
    let rebind = WindowBind { new_rkey: 2, addr: IOVA + 1024, ..bind };
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    pair.post(1, 2, SendOp::LocalInvalidate { rkey: old }, nothing());
    pair.post(1, 3, SendOp::BindWindow(rebind), nothing());
    let done = pair.wait(1, 3);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect::<Vec<_>>(),
        [
            (1, WcOpcode::BindMw, WcStatus::Success),
            (2, WcOpcode::LocalInv, WcStatus::Success),
            (3, WcOpcode::BindMw, WcStatus::Success)
        ]
    );
    let new = bound_key(&rebind);
    assert_ne!(new, old);
    assert_eq!(write(&mut pair, 1, new, IOVA + 1024, b"new"), WcStatus::Success);
    assert_eq!(write(&mut pair, 2, old, IOVA, b"old"), WcStatus::RemAccessErr, "the old key reaches nothing");
}

#[test]
fn a_type_1_window_rebinds_in_place_unbinds_at_length_0_and_is_never_invalidated() {
    let mut pair = pair();
    let (_, bind) = window(&mut pair, WindowType::One, 0, 64, 1);
    let moved = WindowBind { new_rkey: 2, addr: IOVA + 64, ..bind };
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    pair.post(1, 2, SendOp::BindWindow(moved), nothing());
    assert!(pair.wait(1, 2).iter().all(|c| c.status == WcStatus::Success));
    let key = bound_key(&moved);
    assert_eq!(write(&mut pair, 1, key, IOVA + 64, b"moved"), WcStatus::Success);
    let closed = WindowBind { new_rkey: 3, len: 0, ..moved };
    pair.post(1, 3, SendOp::BindWindow(closed), nothing());
    assert_eq!(pair.wait(1, 1)[0].status, WcStatus::Success);
    assert_eq!(write(&mut pair, 2, bound_key(&closed), IOVA + 64, b"x"), WcStatus::RemAccessErr, "unbound");

    let mut pair = self::pair();
    let (_, bind) = window(&mut pair, WindowType::One, 0, 64, 1);
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    pair.post(1, 2, SendOp::LocalInvalidate { rkey: bound_key(&bind) }, nothing());
    let done = pair.wait(1, 2);
    assert_eq!((done[0].status, done[1].status), (WcStatus::Success, WcStatus::LocQpOpErr));
}

#[test]
fn a_zero_based_window_is_addressed_from_0() {
    let mut pair = pair();
    let (_, bind) = window(&mut pair, WindowType::Two, 2048, 128, 7);
    let bind = WindowBind { access: bind.access | Access::ZERO_BASED, ..bind };
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    assert_eq!(pair.wait(1, 1)[0].status, WcStatus::Success);
    assert_eq!(write(&mut pair, 1, bound_key(&bind), 16, b"at 16"), WcStatus::Success);
    assert_eq!(&pair.b.buffer.to_vec()[2064..2069], b"at 16");
}

#[test]
fn binds_the_rules_refuse_fail_the_qp_with_a_bind_error() {
    // A region registered without MW_BIND takes no window.
    let mut pair = Pair::new(PairOptions { access: Access::LOCAL_WRITE | Access::REMOTE, ..PairOptions::default() });
    let (_, bind) = window(&mut pair, WindowType::Two, 0, 64, 1);
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    pair.post(1, 2, SendOp::Send { imm: None }, nothing());
    let [_, b] = pair.settle();
    assert_eq!((b[0].status, b[1].status), (WcStatus::MwBindErr, WcStatus::WrFlushErr));
    // Beyond the region, or a zero-based type 1 window.
    for (kind, len, access) in [
        (WindowType::Two, 1 << 20, Access::REMOTE_READ),
        (WindowType::One, 64, Access::REMOTE_READ | Access::ZERO_BASED),
        (WindowType::Two, 0, Access::REMOTE_READ),
    ] {
        let mut pair = self::pair();
        let (_, bind) = window(&mut pair, kind, 0, len, 1);
        pair.post(1, 1, SendOp::BindWindow(WindowBind { access, ..bind }), nothing());
        assert_eq!(pair.wait(1, 1)[0].status, WcStatus::MwBindErr, "{kind:?} {len} {access:?}");
    }
}

#[test]
fn a_bound_window_keeps_its_region_registered_until_it_lets_go() {
    let mut pair = pair();
    let (rkey, bind) = window(&mut pair, WindowType::Two, 0, 64, 1);
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    assert_eq!(pair.wait(1, 1)[0].status, WcStatus::Success);
    let lkey = pair.b.mr.lkey;
    assert!(matches!(pair.world.device(1).deregister_memory(lkey), Err(VerbsError::Busy(_))));
    pair.world.device(1).dealloc_window(rkey).unwrap();
    assert_eq!(write(&mut pair, 1, bound_key(&bind), IOVA, b"x"), WcStatus::RemAccessErr, "freed");
    pair.world.device(1).deregister_memory(lkey).unwrap();
    assert!(pair.world.device(1).dealloc_window(rkey).is_err(), "freed once");
}

#[test]
fn a_uc_qp_binds_windows_in_order_with_its_sends() {
    let mut pair = Pair::new(PairOptions {
        qp_type: QpType::Uc,
        access: Access::LOCAL_WRITE | Access::MW_BIND,
        ..PairOptions::default()
    });
    let (_, bind) = window(&mut pair, WindowType::Two, 0, 64, 1);
    pair.post(1, 1, SendOp::BindWindow(bind), nothing());
    assert_eq!(pair.wait(1, 1)[0].status, WcStatus::Success);
    assert_eq!(write(&mut pair, 1, bound_key(&bind), IOVA, b"uc"), WcStatus::Success);
    pair.settle();
    assert_eq!(&pair.b.buffer.to_vec()[..2], b"uc");
}
