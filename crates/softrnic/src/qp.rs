use std::net::IpAddr;
use std::sync::Arc;

use softrnic_transport::{
    Access, Choice, Mtu, Psn, QpAttr, QpState, QpType, RcConnection, RecvWorkRequest, SendWorkRequest, ud_steps,
};

use crate::cq::CqHandle;
use crate::{Endpoint, Error, MemoryRegion, PostListError, ProtectionDomain};
use softrnic_provider::provider::DeviceQp;

/// Connection settings, with perftest's defaults where it has them.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The path MTU; lowered to the device's [`Context::active_mtu`] when
    /// larger, as perftest takes the smaller of its `-m` and the port's.
    ///
    /// [`Context::active_mtu`]: crate::Context::active_mtu
    pub mtu: Mtu,
    /// Local ACK timeout, 4.096 µs × 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    /// 7 retries for ever.
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub access: Access,
    /// The Q_Key of a UD QP.
    pub qkey: u32,
    /// Recover from loss by selective repeat rather than go-back-N: only
    /// what was lost is sent again. Used when the peer's endpoint offers it
    /// too; both ends must ask for it, as both ends of a perftest run pass
    /// the same flags (a go-back-N requester's packets are refused by a
    /// selective-repeat responder). `SOFTRNIC_SELECTIVE_REPEAT=1` turns it
    /// on by default.
    pub selective_repeat: bool,
    /// Authenticate every packet with a keyed MAC (`softrnic_transport::auth`):
    /// used when the peer's endpoint offers it too, and both devices hold
    /// the same `SOFTRNIC_AUTH_KEY`, whose presence turns it on by default.
    pub authenticate: bool,
    /// The congestion control this QP runs, in place of the device's
    /// (`SOFTRNIC_CC`, none by default): [`choose_congestion_control`]
    /// names one as `--cc` does.
    ///
    /// [`choose_congestion_control`]: crate::choose_congestion_control
    pub congestion_control: Option<Choice>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            access: Access::REMOTE,
            qkey: 0x1111_1111,
            // A bad value is reported when the device opens.
            selective_repeat: crate::environment::selective_repeat().unwrap_or(false),
            authenticate: auth_offered(),
            congestion_control: None,
        }
    }
}

/// A queue pair. Posting a send rings the doorbell: the packets leave from
/// the calling thread (inline progress) or the QP's engine thread
/// (dedicated progress).
pub struct QueuePair {
    pd: ProtectionDomain,
    qpn: u32,
    /// The program's end of the QP's queues: posts go there without
    /// waiting for the engine.
    posts: DeviceQp,
    qp_type: QpType,
    psn: Psn,
    // Keeps the CQs alive while the QP uses them.
    _cqs: [Arc<CqHandle>; 2],
}

impl QueuePair {
    pub(crate) fn new(
        pd: ProtectionDomain,
        posts: DeviceQp,
        qp_type: QpType,
        psn: Psn,
        cqs: [Arc<CqHandle>; 2],
    ) -> QueuePair {
        QueuePair { pd, qpn: posts.qpn(), posts, qp_type, psn, _cqs: cqs }
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The initial send PSN this side will use.
    pub fn initial_psn(&self) -> Psn {
        self.psn
    }

    /// What the peer needs to know to talk to this QP and `mr`.
    pub fn endpoint(&self, mr: &MemoryRegion) -> Endpoint {
        Endpoint {
            gid: self.pd.ctx.addr(),
            qpn: self.qpn,
            psn: self.psn,
            rkey: mr.rkey(),
            addr: mr.iova(),
            len: mr.len() as u64,
            selective_repeat: self.qp_type == QpType::Rc,
            authenticate: self.qp_type == QpType::Rc && auth_offered(),
        }
    }

    pub fn state(&self) -> QpState {
        let qpn = self.qpn;
        self.pd.ctx.provider.query_qp(qpn).map_or(QpState::Error, |(state, _)| state)
    }

    /// Whether the connection authenticates its packets (both ends asked
    /// for it and offered it).
    pub fn authenticates(&self) -> bool {
        let qpn = self.qpn;
        self.pd.ctx.provider.query_qp(qpn).is_some_and(|(_, attrs)| attrs.authenticate)
    }

    /// Whether the connection recovers from loss by selective repeat (both
    /// ends asked for it and offered it).
    pub fn selective_repeat(&self) -> bool {
        let qpn = self.qpn;
        self.pd.ctx.provider.query_qp(qpn).is_some_and(|(_, attrs)| attrs.selective_repeat)
    }

    pub fn modify(&self, attr: &QpAttr) -> Result<(), Error> {
        self.pd.ctx.provider.modify_qp(&self.posts, attr)?;
        Ok(())
    }

    /// Takes the QP from RESET to RTS, connected to `remote` (for UD, just
    /// to RTS; a UC QP takes only the attributes UC has).
    pub fn connect(&self, remote: &Endpoint, o: &ConnectOptions) -> Result<(), Error> {
        // UC connects as RC does, with RC's recoveries left out.
        let reliable = self.qp_type == QpType::Rc;
        let steps = match self.qp_type {
            QpType::Rc | QpType::Uc => RcConnection {
                access: o.access,
                remote_addr: remote.gid,
                dest_qpn: remote.qpn,
                rq_psn: remote.psn,
                sq_psn: self.psn,
                mtu: o.mtu.min(self.pd.ctx.active_mtu()),
                max_dest_rd_atomic: o.max_rd_atomic,
                max_rd_atomic: o.max_rd_atomic,
                min_rnr_timer: o.min_rnr_timer,
                timeout: o.timeout,
                retry_cnt: o.retry_cnt,
                rnr_retry: o.rnr_retry,
                selective_repeat: reliable && o.selective_repeat && remote.selective_repeat,
                authenticate: reliable && o.authenticate && remote.authenticate,
            }
            .steps(),
            QpType::Ud => ud_steps(o.qkey, self.psn),
        };
        for attr in &steps {
            self.modify(attr)?;
        }
        if let Some(algorithm) = &o.congestion_control {
            self.pd.ctx.provider.set_qp_congestion_control(self.qpn, Some(algorithm.clone()))?;
        }
        Ok(())
    }

    /// Limits the rate of this QP's requests in bits per second (the
    /// pacing hook congestion control drives), or lifts it with `None`.
    pub fn set_rate_limit(&self, bits_per_second: Option<u64>) -> Result<(), Error> {
        let qpn = self.qpn;
        Ok(self.pd.ctx.provider.set_qp_rate_limit(qpn, bits_per_second)?)
    }

    /// The rate congestion control sets this QP, bits per second, if it
    /// runs an algorithm.
    pub fn congestion_rate(&self) -> Option<u64> {
        self.pd.ctx.provider.qp_congestion_rate(self.qpn)
    }

    /// Attaches this UD QP to multicast `group` (an IP multicast address):
    /// what is sent to the group's QP number, 0xFFFFFF, reaches it.
    pub fn attach_multicast(&self, group: IpAddr) -> Result<(), Error> {
        Ok(self.pd.ctx.provider.attach_multicast(self.qpn, group)?)
    }

    pub fn detach_multicast(&self, group: IpAddr) -> Result<(), Error> {
        Ok(self.pd.ctx.provider.detach_multicast(self.qpn, group)?)
    }

    pub fn post_send(&self, wr: SendWorkRequest) -> Result<(), Error> {
        Ok(self.pd.ctx.provider.post_send(&self.posts, wr)?)
    }

    /// Posts several send requests, in order, as one post (`ibv_post_send`
    /// with a list, perftest's `-l`): with the engine in this process they
    /// take the send queue's lock once and ring the doorbell once, so the
    /// packets they make leave together (over UDP, a run of equal datagrams
    /// in one system call) where one post at a time pays a call each.
    /// On a refusal the requests before it stay posted ([`PostListError`]).
    pub fn post_send_list(&self, wrs: impl IntoIterator<Item = SendWorkRequest>) -> Result<(), PostListError> {
        let mut queue = self.pd.ctx.provider.send_chain(&self.posts);
        for (posted, wr) in wrs.into_iter().enumerate() {
            queue.post(wr).map_err(|e| PostListError { posted, error: e.into() })?;
        }
        Ok(())
    }

    pub fn post_recv(&self, wr: RecvWorkRequest) -> Result<(), Error> {
        Ok(self.pd.ctx.provider.post_recv(&self.posts, wr)?)
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let qpn = self.qpn;
        let _ = self.pd.ctx.provider.destroy_qp(qpn);
    }
}

/// Whether this process offers packet authentication: it has the shared
/// secret (`SOFTRNIC_AUTH_KEY`; a bad value is reported when the device
/// opens).
fn auth_offered() -> bool {
    crate::environment::auth_key().is_ok_and(|key| key.is_some())
}
