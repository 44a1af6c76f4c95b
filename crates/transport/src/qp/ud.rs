//! Unreliable datagram queue pairs: one packet per message, no
//! acknowledgement, no retransmission. A receive buffer starts with the
//! 40-byte GRH, which for RoCEv2 over IPv4 holds the IPv4 header in its last
//! 20 bytes, as rdma-core and the Linux drivers lay it out.

use std::net::IpAddr;

use softrnic_wire::mad::GSI_QPN;
use softrnic_wire::packet::{Extensions, Headers};
use softrnic_wire::{Opcode, bth, deth};

use super::responder::Refusal;
use super::{Ctx, QpState, QueuePair, Transmit};
use crate::by_reference::{Body, Packet};
use crate::completion::{Completion, WcOpcode, WcStatus};
use crate::memory::{Access, gather, scatter, validate_list};
use crate::work_request::{Payload, SendOp};
use crate::{Result, VerbsError};

pub use softrnic_wire::GRH_LEN;

/// The high bit of a Q_Key marks a *controlled* Q_Key (IBTA 10.2.4): only
/// a privileged QP may take one (here the GSI QP, whose Q_Key 0x80010000
/// CM MADs carry), and a work request that names one sends with its QP's
/// own Q_Key instead. So no program's UD QP can pose as a CM agent.
const CONTROLLED_QKEY: u32 = 0x8000_0000;

/// Refuses a controlled Q_Key for any QP but the GSI QP, as Linux refuses
/// it to unprivileged programs (EPERM).
pub(super) fn check_qkey(qpn: u32, qkey: u32) -> Result<()> {
    if qkey & CONTROLLED_QKEY != 0 && qpn != GSI_QPN {
        return Err(VerbsError::PermissionDenied(format!(
            "Q_Key {qkey:#x} has its high bit set: a controlled Q_Key, which only the GSI QP (QP1) may take; \
             choose one below 0x80000000"
        )));
    }
    Ok(())
}

impl QueuePair {
    pub(super) fn ud_transmit(&mut self, ctx: &mut Ctx, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let wqe = self.sq.front()?;
        let dest = wqe.wr.ud.expect("checked at post");
        let SendOp::Send { imm } = wqe.wr.op else { unreachable!("checked at post") };
        let qkey = if dest.qkey & CONTROLLED_QKEY != 0 { self.attrs.qkey } else { dest.qkey };
        let opcode = if imm.is_some() { Opcode::UdSendOnlyImm } else { Opcode::UdSendOnly };
        let psn = self.req.next_psn;
        let headers = Headers {
            bth: bth::Repr { solicited: wqe.wr.solicited, ..bth::Repr::new(opcode, dest.qpn, psn) },
            ext: Extensions {
                deth: Some(deth::Repr { qkey, src_qpn: self.qpn }),
                immediate: imm,
                ..Extensions::default()
            },
        };
        let len = wqe.len as usize;
        let start = headers.len();
        let outcome = if len > ctx.config.ud_mtu.bytes() as usize {
            Err(WcStatus::LocLenErr)
        } else {
            match &wqe.wr.payload {
                Payload::Inline(bytes) => {
                    softrnic_account::add(softrnic_account::Cost::BytesCopied, len as u64);
                    buf[start..start + len].copy_from_slice(bytes);
                    Ok(())
                }
                Payload::Gather(sges) => gather(ctx.memory, self.init.pd, sges, 0, &mut buf[start..start + len])
                    .map_err(|_| WcStatus::LocProtErr),
            }
        };
        let wqe = self.sq.pop_front().expect("front exists");
        self.posts.retire_send();
        if let Err(status) = outcome {
            // A local error stops the send queue (SQE) but not receives.
            self.complete_send(ctx, &wqe, status);
            self.set_state(QpState::Sqe);
            while let Some(rest) = self.sq.pop_front() {
                self.posts.retire_send();
                self.complete_send(ctx, &rest, WcStatus::WrFlushErr);
            }
            return None;
        }
        self.req.next_psn = psn.next();
        let len = headers.emit_around_payload(buf, len).ok()?;
        self.complete_send(ctx, &wqe, WcStatus::Success);
        Some(Transmit::new(dest.addr, len))
    }

    /// Takes a datagram from `src`, sent to this QP or (`group`) to a
    /// multicast group it is attached to.
    pub(super) fn ud_receive(&mut self, ctx: &mut Ctx, src: IpAddr, group: Option<IpAddr>, packet: &Packet) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
            return;
        }
        let (Some(deth), true) = (packet.headers.ext.deth, packet.headers.bth.opcode.is_ud()) else {
            ctx.counters.rx_dropped_foreign += 1;
            return;
        };
        if deth.qkey != self.attrs.qkey {
            ctx.counters.rx_qkey_violations += 1;
            return;
        }
        // Datagrams that find no receive posted are dropped, as UD does.
        let recv = match self.take_recv(ctx) {
            Ok(recv) => recv,
            // Held by the shard until the driver answers.
            Err(Refusal::AwaitingReceives) => return,
            Err(_) => {
                ctx.counters.rx_no_receive_posted += 1;
                return;
            }
        };
        let total = GRH_LEN + packet.body.len();
        let mut completion = Completion::new(recv.wr_id, WcStatus::Success, WcOpcode::Recv, self.qpn);
        let status = match validate_list(ctx.memory, self.init.pd, &recv.sges, Access::LOCAL_WRITE) {
            Err(_) => WcStatus::LocProtErr,
            Ok(capacity) if capacity < total as u64 => WcStatus::LocLenErr,
            Ok(_) => {
                let grh = grh(src, group.unwrap_or(ctx.config.local_addr), packet.body.len());
                let placed = scatter(ctx.memory, self.init.pd, &recv.sges, 0, Body::Bytes(&grh))
                    .and_then(|()| scatter(ctx.memory, self.init.pd, &recv.sges, GRH_LEN as u64, packet.body));
                if placed.is_ok() { WcStatus::Success } else { WcStatus::LocProtErr }
            }
        };
        completion.status = status;
        if status == WcStatus::Success {
            completion.byte_len = total as u32;
            completion.imm_data = packet.headers.ext.immediate;
            completion.src_qp = deth.src_qpn;
            completion.source = Some(src);
            completion.grh = true;
            completion.solicited = packet.headers.bth.solicited;
        }
        self.complete_recv(ctx, completion);
    }
}

/// The GRH area of a UD receive: for IPv4, 20 zero bytes then the IPv4
/// header; for IPv6, the IPv6 header.
fn grh(src: IpAddr, dst: IpAddr, payload_len: usize) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    // UDP header, BTH, DETH and ICRC around the payload.
    let udp_len = (8 + 12 + 8 + payload_len + 4) as u16;
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let ip = &mut grh[20..];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            ip[6] = 0x40;
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            grh[0] = 0x60;
            grh[4..6].copy_from_slice(&udp_len.to_be_bytes());
            grh[6] = 17;
            grh[7] = 64;
            grh[8..24].copy_from_slice(&src.octets());
            grh[24..40].copy_from_slice(&dst.octets());
        }
        (IpAddr::V4(src), IpAddr::V6(_)) | (IpAddr::V6(_), IpAddr::V4(src)) => {
            // Mixed families cannot happen on one socket; record the source.
            grh[36..40].copy_from_slice(&src.octets());
        }
    }
    grh
}
