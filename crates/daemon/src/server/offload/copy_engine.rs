//! The `engine-copy` design's copy engine: a QP of the daemon's own,
//! connected to itself, that pulls each payload from a program's memory
//! into a staging slot with an RDMA READ, as the original's DPU pulls it
//! across PCIe with its RDMA engine. The payload crosses the engine twice
//! (READ request and responses, then the SEND), which is the design's
//! cost.
//!
//! The copy engine has a protection domain of its own. Every region a
//! program registers gets a twin there (the same memory, readable
//! remotely), and so does every staging area; no program holds a key of
//! this domain, and a peer's QP, in another domain, is refused by it. Its
//! QP, connected to itself, is looped back inside its shard: its packets
//! never reach the wire, and the transport drops any from the wire that
//! name it, so no tenant can reach the twins or flush the pulls. A
//! READ whose region went away meanwhile fails, moving the QP to error;
//! the copy engine then brings it back (its pending READs flush, and the
//! sends behind them fall back to the engine's own gather).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use softrnic_engine::Nic;
use softrnic_transport::{
    Access, Completion, CompletionQueue, DmaBuffer, Mtu, Payload, PdId, PostQueues, Psn, QpAttr, QpCaps, QpInitAttr,
    QpState, QpType, RcConnection, Registration, RemoteAddr, Result, SendOp, SendWorkRequest, Sge, SgeList, VerbsError,
    WcStatus,
};

/// READs the copy engine's QP holds at once (every program's together).
const DEPTH: u32 = 4096;
/// READs the engine keeps in flight on the wire, as a NIC's initiator
/// depth.
const READS_IN_FLIGHT: u8 = 16;

/// One device's copy engine.
pub struct CopyEngine {
    pd: PdId,
    cq: Arc<CompletionQueue>,
    qp: Arc<PostQueues>,
    /// RESET to RTS, connected to itself.
    connection: [QpAttr; 3],
    /// A program's lkey, and its region's twin's key here.
    twins: Mutex<HashMap<u32, u32>>,
    next_token: AtomicU64,
    pulls: Mutex<Pulls>,
    scratch: Mutex<Vec<Completion>>,
}

/// The pulls under way and those over.
#[derive(Default)]
struct Pulls {
    in_flight: HashSet<u64>,
    /// Whether each finished pull's READs all went well.
    finished: HashMap<u64, bool>,
}

impl Pulls {
    fn finish(&mut self, token: u64, ok: bool) {
        if self.in_flight.remove(&token) {
            self.finished.insert(token, ok);
        }
    }
}

impl CopyEngine {
    /// Opens the copy engine of the device `nic`, whose port carries `mtu`.
    pub fn open(nic: &Nic, mtu: Mtu) -> Result<CopyEngine> {
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(DEPTH as usize);
        let caps = QpCaps { max_send_wr: DEPTH, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq.id(),
            recv_cq: cq.id(),
            caps,
            sq_sig_all: false,
            srq: None,
        };
        let psn = getrandom::u32()
            .map_err(|e| VerbsError::Device(format!("no random PSN from the operating system: {e}")))?;
        let qp = nic.create_qp(init)?;
        let connection = RcConnection {
            access: Access::REMOTE_READ,
            remote_addr: nic.addr(),
            dest_qpn: qp.qpn(),
            rq_psn: Psn::new(psn),
            sq_psn: Psn::new(psn),
            mtu,
            max_dest_rd_atomic: READS_IN_FLIGHT,
            max_rd_atomic: READS_IN_FLIGHT,
            min_rnr_timer: 1,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            selective_repeat: false,
            // Looped back inside the device: nothing to authenticate.
            authenticate: false,
        }
        .steps();
        let engine = CopyEngine {
            pd,
            cq,
            qp,
            connection,
            twins: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            pulls: Mutex::new(Pulls::default()),
            scratch: Mutex::new(Vec::new()),
        };
        engine.connect(nic)?;
        Ok(engine)
    }

    fn connect(&self, nic: &Nic) -> Result<()> {
        for attr in &self.connection {
            nic.modify_qp(self.qp.qpn(), attr)?;
        }
        Ok(())
    }

    /// Gives the program's region `lkey` (`len` bytes of `buffer` from
    /// `iova`) its twin here.
    pub fn twin(&self, nic: &Nic, lkey: u32, buffer: Arc<DmaBuffer>, len: usize, iova: u64) -> Result<()> {
        let twin = nic.register_memory(Registration {
            pd: self.pd,
            buffer,
            offset: 0,
            len,
            iova,
            access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        })?;
        self.twins.lock().unwrap_or_else(|e| e.into_inner()).insert(lkey, twin.rkey);
        Ok(())
    }

    /// The program's region `lkey` is deregistered: so is its twin.
    pub fn forget(&self, nic: &Nic, lkey: u32) {
        if let Some(twin) = self.twins.lock().unwrap_or_else(|e| e.into_inner()).remove(&lkey) {
            let _ = nic.deregister_memory(twin);
        }
    }

    /// Registers a staging area here, as the READs' destination.
    pub fn register_staging(&self, nic: &Nic, buffer: Arc<DmaBuffer>, iova: u64) -> Result<u32> {
        let len = buffer.len();
        Ok(nic
            .register_memory(Registration { pd: self.pd, buffer, offset: 0, len, iova, access: Access::LOCAL_WRITE })?
            .lkey)
    }

    /// Posts the READs that pull the gather list `sges` (already checked
    /// against the program's domain) into `dst` onward under `dst_lkey`.
    /// Returns the pull's token, or `None` when a region has no twin (it
    /// is then not pulled).
    pub fn pull(&self, nic: &Nic, sges: &SgeList, dst_lkey: u32, dst: u64) -> Option<u64> {
        let reads: Vec<(Sge, RemoteAddr)> = {
            let twins = self.twins.lock().unwrap_or_else(|e| e.into_inner());
            let mut at = dst;
            sges.iter()
                .map(|sge| {
                    let local = Sge { addr: at, length: sge.length, lkey: dst_lkey };
                    at += u64::from(sge.length);
                    Some((local, RemoteAddr { addr: sge.addr, rkey: *twins.get(&sge.lkey)? }))
                })
                .collect::<Option<_>>()?
        };
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        self.pulls.lock().unwrap_or_else(|e| e.into_inner()).in_flight.insert(token);
        let mut queue = nic.send_queue(&self.qp);
        let last = reads.len() - 1;
        for (i, (local, remote)) in reads.into_iter().enumerate() {
            let mut wr =
                SendWorkRequest::new(token, SendOp::Read { remote }, Payload::Gather(SgeList::from_iter([local])));
            wr.signaled = i == last;
            if queue.post(wr).is_err() {
                // Full: READs already posted for it complete unseen, and
                // the send falls back to the engine's gather.
                self.pulls.lock().unwrap_or_else(|e| e.into_inner()).finish(token, false);
                return Some(token);
            }
        }
        Some(token)
    }

    /// Collects the READs that finished, and brings the QP back if one
    /// failed.
    pub fn poll(&self, nic: &Nic) {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        scratch.clear();
        if nic.poll_cq(&self.cq, 64, &mut scratch) == 0 {
            return;
        }
        let mut failed = false;
        let mut pulls = self.pulls.lock().unwrap_or_else(|e| e.into_inner());
        for c in scratch.iter() {
            let ok = c.status == WcStatus::Success;
            failed |= !ok;
            pulls.finish(c.wr_id, ok);
        }
        drop(pulls);
        if failed {
            self.recover(nic);
        }
    }

    /// Whether pull `token` is over: `Some(true)` when its payload is in
    /// place, `Some(false)` when it failed. Forgets it then.
    pub fn take(&self, token: u64) -> Option<bool> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner()).finished.remove(&token)
    }

    /// Forgets pull `token`, whose send went with its QP.
    pub fn abandon(&self, token: u64) {
        let mut pulls = self.pulls.lock().unwrap_or_else(|e| e.into_inner());
        pulls.in_flight.remove(&token);
        pulls.finished.remove(&token);
    }

    /// After a failed READ: every READ behind it flushes, so every pull
    /// under way has failed; the QP goes back through RESET to RTS (late
    /// flush completions of those pulls are ignored).
    fn recover(&self, nic: &Nic) {
        let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
        let _ = nic.modify_qp(self.qp.qpn(), &error);
        let mut pulls = self.pulls.lock().unwrap_or_else(|e| e.into_inner());
        for token in std::mem::take(&mut pulls.in_flight) {
            pulls.finished.insert(token, false);
        }
        drop(pulls);
        let reset = QpAttr { state: Some(QpState::Reset), ..QpAttr::default() };
        if nic.modify_qp(self.qp.qpn(), &reset).and_then(|_| self.connect(nic)).is_err() {
            eprintln!("softrnicd: the copy engine's QP could not be brought back; sends fall back to the gather");
        }
    }
}
