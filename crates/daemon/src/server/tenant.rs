//! One tenant: a program's connection, the objects it created, and the
//! control verbs it may run on them.
//!
//! Isolation is by ownership. A tenant names objects by the engine's own
//! numbers (PD, CQ, QPN, lkey), but every request is checked against the
//! tenant's own tables first, so another tenant's numbers are refused as
//! unknown. Against remote peers the engine's protection domains do the
//! work: each tenant's PDs are its own, and a region answers an rkey only on
//! a QP of its PD (a guessed rkey of another tenant fails with a remote
//! access error).
//!
//! When the connection ends, whatever the reason (exit, crash, `SIGKILL`),
//! everything the tenant held is taken down in the order the verbs
//! require: its queues leave the command processor, its QPs move to error
//! (their requests flush) and are destroyed, then CQs, regions and PDs.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use softrnic_engine::{Nic, ProgressMode};
use softrnic_transport::limits::{MAX_CQE, MAX_INLINE_DATA, MAX_QP_WR, MAX_SGE};
use softrnic_transport::{
    AlgorithmSpec, Choice, CqId, DmaBuffer, PdId, PostQueues, QpAttr, QpCaps, QpInitAttr, QpState, QpType,
    Registration, SrqAttr, SrqId, VerbsError, window_handle,
};
use softrnic_wire::mad::GSI_QPN;

use super::device::{Device, Devices, Element, NetNs};
use super::offload::Stages;
use super::processor::{Processors, Registry, ServedCq, ServedQp, ServedSrq};
use crate::limits::{Accounts, Resource, Usage};
use softrnic_daemon_protocol::block::BlockOffload;
use softrnic_daemon_protocol::doorbell::DoorbellPage;
use softrnic_daemon_protocol::peer::Peer;
use softrnic_daemon_protocol::protocol::{
    self, CqLayout, MAX_MODULE, Opened, PROTOCOL_VERSION, QpLayout, RemoteAlgorithm, RemoteError, Request, Response,
    SrqLayout, Translation,
};
use softrnic_daemon_protocol::queue::SharedQueue;
use softrnic_daemon_protocol::shared_memory::SharedMapping;
use softrnic_daemon_protocol::wqe::{self, CQE_LEN};

pub struct Tenant {
    id: u64,
    /// The user its program runs as.
    uid: u32,
    /// The tenant forwards its data commands over the socket: its queues
    /// are not the processor's.
    forward: bool,
    device: Arc<Device>,
    /// What it holds against its limits, shared with the other programs
    /// of its container.
    usage: Arc<Usage>,
    /// Each of its QPs' rate limit.
    rate: Option<u64>,
    registry: Arc<Registry>,
    doorbell: Arc<DoorbellPage>,
    /// The daemon's end of the program's `async_fd`: the device's
    /// asynchronous events about this tenant's objects.
    events: Arc<OwnedFd>,
    pds: HashSet<PdId>,
    /// Registered regions' lengths, by lkey.
    regions: HashMap<u32, u64>,
    /// Memory windows, by handle (an rkey with its low 8 bits clear).
    windows: HashSet<u32>,
    channels: HashMap<u32, Arc<OwnedFd>>,
    next_channel: u32,
    cqs: HashMap<CqId, Arc<ServedCq>>,
    srqs: HashMap<SrqId, Arc<ServedSrq>>,
    qps: HashMap<u32, Arc<ServedQp>>,
}

/// What an answer carries besides the message.
type Answer = Result<(Response, Vec<OwnedFd>), RemoteError>;

/// Serves one connection, whose program the kernel says is `peer`, until
/// it closes.
pub fn serve(id: u64, socket: OwnedFd, peer: Peer, devices: &Devices, processors: &Processors, accounts: &Accounts) {
    let mut tenant = match open(id, peer, &socket, devices, processors, accounts) {
        Ok(tenant) => tenant,
        Err(e) => {
            let _ = protocol::send(socket.as_fd(), &Response::Error(e), &[]);
            return;
        }
    };
    // 0 where the kernel cannot say (the tenant lies outside this pid
    // namespace).
    let pid = peer.pid.unwrap_or(0);
    eprintln!("softrnicd: tenant {id} (pid {pid}) opened the device on {}", tenant.device.nic.addr());
    loop {
        let (request, fds) = match protocol::receive::<Request>(socket.as_fd()) {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(e) => {
                // A malformed message ends the connection: its sender no
                // longer speaks the protocol, and nothing it says can be
                // trusted to mean what it meant.
                eprintln!("softrnicd: tenant {id}: {e}; closing its connection");
                break;
            }
        };
        let (response, out) = tenant.handle(request, fds).unwrap_or_else(|e| (Response::Error(e), Vec::new()));
        let out: Vec<BorrowedFd<'_>> = out.iter().map(|fd| fd.as_fd()).collect();
        if protocol::send(socket.as_fd(), &response, &out).is_err() {
            break;
        }
    }
    eprintln!("softrnicd: tenant {id} (pid {pid}) left; freeing what it held");
}

fn open(
    id: u64,
    peer: Peer,
    socket: &OwnedFd,
    devices: &Devices,
    processors: &Processors,
    accounts: &Accounts,
) -> Result<Tenant, RemoteError> {
    let first = protocol::receive::<Request>(socket.as_fd()).map_err(|e| RemoteError::invalid(e.to_string()))?;
    let Some((Request::Open { version, addr, forward }, _)) = first else {
        return Err(RemoteError::invalid("the first request must open a device"));
    };
    if version != PROTOCOL_VERSION {
        return Err(RemoteError::invalid(format!(
            "this softrnicd speaks protocol {PROTOCOL_VERSION}, the program {version}: use a library and daemon of one build"
        )));
    }
    // A program in a container opens a device of its own network
    // namespace; the daemon learns which from the socket's peer.
    let netns = match peer.pid {
        Some(pid) => NetNs::of_peer(socket.as_fd(), pid).map_err(RemoteError::invalid)?,
        None => None,
    };
    let usage = accounts.usage(netns.as_ref().map(|ns| ns.inode));
    let connection = usage.reserve(Resource::Connections, 1)?;
    let device = devices.open(addr, netns.as_ref()).map_err(RemoteError::invalid)?;
    let registry = processors.of(&device);
    let doorbell = Arc::new(DoorbellPage::create().map_err(|e| RemoteError::exhausted(e.to_string()))?);
    let opened = Opened {
        tenant: id,
        active_mtu: device.active_mtu,
        engine_threads: device.nic.engine_threads() as u32,
        shared_memory: device.nic.shared_memory(),
        inline_progress: device.nic.progress_mode() == ProgressMode::Inline,
        epoch_unix_ns: softrnic_daemon_protocol::unix_ns().saturating_sub(device.nic.now().as_nanos()),
    };
    let wake = registry.wake.try_clone().map_err(|e| RemoteError::exhausted(e.to_string()))?;
    let (events, program_events) =
        rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(|e| RemoteError::exhausted(e.to_string()))?;
    // A holder before the program hears it holds the device.
    let holders = || device.holders.lock().unwrap_or_else(|e| e.into_inner());
    holders().insert(id, peer.uid);
    let fds = [doorbell.fd(), wake.as_fd(), program_events.as_fd()];
    if let Err(e) = protocol::send(socket.as_fd(), &Response::Opened(opened), &fds) {
        holders().remove(&id);
        return Err(RemoteError::invalid(e.to_string()));
    }
    registry.update(|s| s.doorbells.push(doorbell.clone()));
    connection.keep();
    Ok(Tenant {
        id,
        uid: peer.uid,
        forward,
        device,
        registry,
        usage,
        rate: accounts.limits().rate_bits_per_second(),
        doorbell,
        events: Arc::new(events),
        pds: HashSet::new(),
        regions: HashMap::new(),
        windows: HashSet::new(),
        channels: HashMap::new(),
        next_channel: 1,
        cqs: HashMap::new(),
        srqs: HashMap::new(),
        qps: HashMap::new(),
    })
}

fn io(e: std::io::Error) -> RemoteError {
    RemoteError::exhausted(e.to_string())
}

impl Tenant {
    fn handle(&mut self, request: Request, fds: Vec<OwnedFd>) -> Answer {
        let nic = &self.device.nic;
        let done = |r: softrnic_transport::Result<()>| -> Answer {
            r.map(|()| (Response::Done, Vec::new())).map_err(RemoteError::from)
        };
        match request {
            Request::Open { .. } => Err(RemoteError::invalid("the device is open already")),
            Request::AllocPd => {
                self.usage.reserve(Resource::Pds, 1)?.keep();
                let pd = nic.alloc_pd();
                self.pds.insert(pd);
                Ok((Response::Pd(pd), Vec::new()))
            }
            Request::DeallocPd { pd } => {
                self.own_pd(pd)?;
                done(nic.dealloc_pd(pd))?;
                self.pds.remove(&pd);
                self.usage.release(Resource::Pds, 1);
                Ok((Response::Done, Vec::new()))
            }
            Request::RegisterMemory { pd, access, translation } => self.register(pd, translation, access, fds),
            Request::ReregisterMemory { lkey, pd, access, translation } => {
                self.reregister(lkey, pd, access, translation, fds)
            }
            Request::DeregisterMemory { lkey } => {
                let len = *self.regions.get(&lkey).ok_or(RemoteError::not_found("MR"))?;
                done(nic.deregister_memory(lkey))?;
                if let Some(copy) = &self.device.copy {
                    copy.forget(nic, lkey);
                }
                self.regions.remove(&lkey);
                self.usage.release(Resource::Mrs, 1);
                self.usage.release(Resource::Memory, len);
                Ok((Response::Done, Vec::new()))
            }
            // Windows count against the tenant's regions: each is an entry
            // of the device's memory table.
            Request::AllocMw { pd, kind } => {
                self.own_pd(pd)?;
                let held = self.usage.reserve(Resource::Mrs, 1)?;
                let rkey = nic.alloc_window(pd, kind)?;
                self.windows.insert(window_handle(rkey));
                held.keep();
                Ok((Response::Window(rkey), Vec::new()))
            }
            Request::DeallocMw { rkey } => {
                if !self.windows.contains(&window_handle(rkey)) {
                    return Err(RemoteError::not_found("MW"));
                }
                done(nic.dealloc_window(rkey))?;
                self.windows.remove(&window_handle(rkey));
                self.usage.release(Resource::Mrs, 1);
                Ok((Response::Done, Vec::new()))
            }
            Request::CreateChannel if self.forward => {
                Err(RemoteError::from(softrnic_transport::VerbsError::NotSupported(
                    "completion channels of a forwarding tenant (the forwarding design is a baseline)".into(),
                )))
            }
            Request::CreateChannel => {
                let held = self.usage.reserve(Resource::Channels, 1)?;
                // The program's end blocks, as the kernel's event file does;
                // ours never (a program that stops reading drops
                // notifications, it does not stall the processor). A
                // connection, not datagrams: when the daemon goes, a
                // program waiting on its end reads the end of it.
                let (ours, theirs) =
                    rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                        .map_err(|e| io(e.into()))?;
                rustix::io::ioctl_fionbio(&ours, true).map_err(|e| io(e.into()))?;
                let id = self.next_channel;
                self.next_channel += 1;
                self.channels.insert(id, Arc::new(ours));
                held.keep();
                Ok((Response::Channel(id), vec![theirs]))
            }
            Request::DestroyChannel { channel } => {
                let ours = self.channels.get(&channel).ok_or(RemoteError::not_found("completion channel"))?;
                let uses = |cq: &ServedCq| {
                    cq.channel.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(|c| Arc::ptr_eq(c, ours))
                };
                if self.cqs.values().any(|cq| uses(cq)) {
                    return Err(RemoteError::from(softrnic_transport::VerbsError::Busy("completion channel")));
                }
                self.channels.remove(&channel);
                self.usage.release(Resource::Channels, 1);
                Ok((Response::Done, Vec::new()))
            }
            Request::CreateCq { capacity, channel } => self.create_cq(capacity, channel),
            Request::DestroyCq { cq } => {
                let served = self.cqs.get(&cq).ok_or(RemoteError::not_found("CQ"))?.clone();
                done(nic.destroy_cq(cq))?;
                nic.set_channel(cq, None);
                self.device.events.disown(Element::Cq(cq));
                self.cqs.remove(&cq);
                self.usage.release(Resource::Cqs, 1);
                self.registry.update(|s| s.cqs.retain(|c| !Arc::ptr_eq(c, &served)));
                Ok((Response::Done, Vec::new()))
            }
            Request::ResizeCq { cq, entries } => {
                let served = self.cqs.get(&cq).ok_or(RemoteError::not_found("CQ"))?;
                if entries == 0 || entries > MAX_CQE {
                    return Err(RemoteError::invalid(format!("a CQ holds 1 to {MAX_CQE} completions, not {entries}")));
                }
                let (slots, ring) = served.resize(entries)?;
                Ok((Response::Cq(CqLayout { cq, slots }), vec![ring]))
            }
            Request::CreateSrq { .. } if self.forward => {
                Err(RemoteError::from(softrnic_transport::VerbsError::NotSupported(
                    "SRQs of a forwarding tenant (the forwarding design is a baseline)".into(),
                )))
            }
            Request::CreateSrq { pd, attr } => self.create_srq(pd, attr),
            Request::SetSrqLimit { srq, limit } => {
                let served = self.srqs.get(&srq).ok_or(RemoteError::not_found("SRQ"))?;
                done(served.queue.set_limit(limit))?;
                Ok((Response::Done, Vec::new()))
            }
            Request::QuerySrq { srq } => {
                let served = self.srqs.get(&srq).ok_or(RemoteError::not_found("SRQ"))?;
                Ok((Response::SrqAttr(served.queue.query().0), Vec::new()))
            }
            Request::DestroySrq { srq } => {
                let served = self.srqs.get(&srq).ok_or(RemoteError::not_found("SRQ"))?.clone();
                done(nic.destroy_srq(srq))?;
                self.device.events.disown(Element::Srq(srq));
                self.srqs.remove(&srq);
                self.usage.release(Resource::Srqs, 1);
                self.registry.update(|s| s.srqs.retain(|q| !Arc::ptr_eq(q, &served)));
                Ok((Response::Done, Vec::new()))
            }
            Request::CreateQp { init, blocks } => self.create_qp(init, false, blocks),
            Request::CreateGsiQp { init } => self.create_qp(init, true, None),
            Request::ModifyQp { qpn, attr } => {
                let served = self.qps.get(&qpn).ok_or(RemoteError::not_found("QP"))?;
                let state = match attr.state {
                    Some(QpState::Reset) => served.reset(|| nic.modify_qp(qpn, &attr)),
                    _ => nic.modify_qp(qpn, &attr),
                };
                Ok((Response::State(state.map_err(RemoteError::from)?), Vec::new()))
            }
            Request::QueryQp { qpn } => {
                self.own_qp(qpn)?;
                let (state, attributes) = nic.query_qp(qpn).ok_or(RemoteError::not_found("QP"))?;
                Ok((Response::Query { state, attributes }, Vec::new()))
            }
            Request::SetRateLimit { qpn, bits_per_second } => {
                self.own_qp(qpn)?;
                // A tenant's limit caps what it asks for.
                let rate = match (bits_per_second, self.rate) {
                    (Some(asked), Some(limit)) => Some(asked.min(limit)),
                    (asked, limit) => asked.or(limit),
                };
                done(nic.set_qp_rate_limit(qpn, rate))
            }
            Request::SetCongestionControl { qpn, algorithm } => {
                self.own_qp(qpn)?;
                let choice = algorithm.map(|a| remote_algorithm(a, fds)).transpose()?;
                done(nic.set_qp_congestion_control(qpn, choice))
            }
            Request::CongestionRate { qpn } => {
                self.own_qp(qpn)?;
                Ok((Response::Rate(nic.qp_congestion_rate(qpn)), Vec::new()))
            }
            Request::SetCqChannel { cq, channel } => {
                let served = self.cqs.get(&cq).ok_or(RemoteError::not_found("CQ"))?;
                let channel = match channel {
                    None => None,
                    Some(id) => {
                        Some(self.channels.get(&id).ok_or(RemoteError::not_found("completion channel"))?.clone())
                    }
                };
                *served.channel.lock().unwrap_or_else(|e| e.into_inner()) = channel;
                Ok((Response::Done, Vec::new()))
            }
            Request::PostSend { .. } | Request::PostRecv { .. } | Request::PollCq { .. } if !self.forward => {
                Err(RemoteError::invalid("this tenant posts and polls through its queues, not the socket"))
            }
            Request::PostSend { qpn, wqe } => {
                let qp = self.qps.get(&qpn).ok_or(RemoteError::not_found("QP"))?;
                let caps = qp.caps;
                let wr = wqe::parse_send(&wqe, caps.max_send_sge as usize, caps.max_inline_data as usize)
                    .map_err(|e| RemoteError::invalid(e.to_string()))?;
                done(nic.post_send(&qp.posts, wr))
            }
            Request::PostRecv { qpn, wqe } => {
                let qp = self.qps.get(&qpn).ok_or(RemoteError::not_found("QP"))?;
                let wr = wqe::parse_recv(&wqe, qp.caps.max_recv_sge as usize)
                    .map_err(|e| RemoteError::invalid(e.to_string()))?;
                done(nic.post_recv(&qp.posts, wr))
            }
            Request::PollCq { cq, max } => {
                let served = self.cqs.get(&cq).ok_or(RemoteError::not_found("CQ"))?;
                // As many as one answer holds.
                let max = (max as usize).min((protocol::MAX_MESSAGE - 16) / CQE_LEN);
                let mut out = Vec::with_capacity(max);
                nic.poll_cq(&served.queue, max, &mut out);
                let mut bytes = vec![0u8; out.len() * CQE_LEN];
                for (c, slot) in out.iter().zip(bytes.chunks_exact_mut(CQE_LEN)) {
                    wqe::emit_completion(c, slot.try_into().expect("CQE_LEN bytes"));
                }
                Ok((Response::Completions(bytes), Vec::new()))
            }
            Request::Counters if !self.device.held_only_by(self.uid) => {
                Err(RemoteError::from(VerbsError::PermissionDenied(format!(
                    "the device's counters count the traffic of other users' programs on {} too, so none of them \
                     is shown them; softrnicd's operator sees them",
                    nic.addr()
                ))))
            }
            Request::Counters => Ok((Response::Counters(Box::new(nic.counters())), Vec::new())),
            Request::DestroyQp { qpn } => {
                self.own_qp(qpn)?;
                self.destroy_qp(qpn).map_err(RemoteError::from)?;
                Ok((Response::Done, Vec::new()))
            }
            Request::AttachMcast { qpn, group } => {
                self.own_qp(qpn)?;
                done(nic.attach_multicast(qpn, group))
            }
            Request::DetachMcast { qpn, group } => {
                self.own_qp(qpn)?;
                done(nic.detach_multicast(qpn, group))
            }
        }
    }

    fn own_pd(&self, pd: PdId) -> Result<(), RemoteError> {
        self.pds.contains(&pd).then_some(()).ok_or(RemoteError::not_found("PD"))
    }

    fn own_qp(&self, qpn: u32) -> Result<(), RemoteError> {
        self.qps.contains_key(&qpn).then_some(()).ok_or(RemoteError::not_found("QP"))
    }

    #[allow(clippy::too_many_arguments)] // the verb's own arguments
    fn register(
        &mut self,
        pd: PdId,
        translation: Translation,
        access: softrnic_transport::Access,
        fds: Vec<OwnedFd>,
    ) -> Answer {
        self.own_pd(pd)?;
        let (iova, len) = (translation.iova, translation.len);
        let region = self.usage.reserve(Resource::Mrs, 1)?;
        let bytes = self.usage.reserve(Resource::Memory, len)?;
        let buffer = map_translation(translation, fds)?;
        let nic = &self.device.nic;
        let keys = nic
            .register_memory(Registration { pd, buffer: buffer.clone(), offset: 0, len: len as usize, iova, access })
            .map_err(RemoteError::from)?;
        if let Some(copy) = &self.device.copy
            && let Err(e) = copy.twin(nic, keys.lkey, buffer, len as usize, iova)
        {
            let _ = nic.deregister_memory(keys.lkey);
            return Err(RemoteError::from(e));
        }
        self.regions.insert(keys.lkey, len);
        region.keep();
        bytes.keep();
        Ok((Response::Mr(keys), Vec::new()))
    }

    /// `ibv_rereg_mr`. On failure the region is as it was.
    fn reregister(
        &mut self,
        lkey: u32,
        pd: Option<PdId>,
        access: Option<softrnic_transport::Access>,
        translation: Option<Translation>,
        fds: Vec<OwnedFd>,
    ) -> Answer {
        let old_len = *self.regions.get(&lkey).ok_or(RemoteError::not_found("MR"))?;
        let nic = &self.device.nic;
        let region = nic.memory_region(lkey).ok_or(RemoteError::not_found("MR"))?;
        let pd = pd.unwrap_or(region.pd);
        self.own_pd(pd)?;
        let access = access.unwrap_or(region.access);
        // The daemon registers every region from its buffer's start.
        let (buffer, len, iova) = match translation {
            None => (region.buffer().clone(), region.len, region.iova),
            Some(t) => {
                let (len, iova) = (t.len, t.iova);
                (map_translation(t, fds)?, len, iova)
            }
        };
        let grown = self.usage.reserve(Resource::Memory, len.saturating_sub(old_len))?;
        nic.reregister_memory(
            lkey,
            Registration { pd, buffer: buffer.clone(), offset: 0, len: len as usize, iova, access },
        )
        .map_err(RemoteError::from)?;
        if let Some(copy) = &self.device.copy {
            copy.forget(nic, lkey);
            if let Err(e) = copy.twin(nic, lkey, buffer, len as usize, iova) {
                // Its sends are gathered instead (a failed pull falls back).
                eprintln!("softrnicd: tenant {}: MR {lkey:#x} has no copy-engine twin: {e}", self.id);
            }
        }
        grown.keep();
        self.usage.release(Resource::Memory, old_len.saturating_sub(len));
        self.regions.insert(lkey, len);
        Ok((Response::Done, Vec::new()))
    }

    fn create_srq(&mut self, pd: PdId, attr: SrqAttr) -> Answer {
        self.own_pd(pd)?;
        let held = self.usage.reserve(Resource::Srqs, 1)?;
        if attr.max_wr == 0 || attr.max_wr > MAX_QP_WR || attr.max_sge > MAX_SGE {
            return Err(RemoteError::invalid(format!(
                "an SRQ holds 1 to {MAX_QP_WR} receives of up to {MAX_SGE} SGEs"
            )));
        }
        let max_sge = attr.max_sge.max(1);
        let ring = SharedQueue::create("softrnic-srq", attr.max_wr, wqe::recv_slot_size(max_sge)).map_err(io)?;
        let queue = self.device.nic.create_srq(pd, SrqAttr { max_sge, ..attr }).map_err(RemoteError::from)?;
        let srq = queue.id();
        let layout = SrqLayout { srq, max_sge, slots: ring.slot_count(), slot_size: ring.slot_size() };
        let fd = match ring.fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => {
                let _ = self.device.nic.destroy_srq(srq);
                return Err(io(e));
            }
        };
        let served = Arc::new(ServedSrq::new(self.id, &self.device.nic, queue, ring, max_sge));
        self.device.events.own(Element::Srq(srq), &self.events);
        self.srqs.insert(srq, served.clone());
        self.registry.update(|s| s.srqs.push(served));
        held.keep();
        Ok((Response::Srq(layout), vec![fd]))
    }

    fn create_cq(&mut self, capacity: u32, channel: Option<u32>) -> Answer {
        let held = self.usage.reserve(Resource::Cqs, 1)?;
        if capacity == 0 || capacity > MAX_CQE {
            return Err(RemoteError::invalid(format!("a CQ holds 1 to {MAX_CQE} completions, not {capacity}")));
        }
        let channel = match channel {
            None => None,
            Some(id) => Some(self.channels.get(&id).ok_or(RemoteError::not_found("completion channel"))?.clone()),
        };
        let ring = SharedQueue::create("softrnic-cq", capacity, CQE_LEN as u32).map_err(io)?;
        let nic = &self.device.nic;
        let queue = nic.create_cq(ring.slot_count() as usize);
        nic.set_channel(queue.id(), Some(self.registry.completions.clone()));
        let layout = CqLayout { cq: queue.id(), slots: ring.slot_count() };
        let fd = ring.fd().try_clone_to_owned().map_err(io)?;
        let served = Arc::new(ServedCq::new(self.id, self.device.clone(), queue, ring, channel));
        self.device.events.own(Element::Cq(layout.cq), &self.events);
        self.cqs.insert(layout.cq, served.clone());
        held.keep();
        if !self.forward {
            self.registry.update(|s| s.cqs.push(served));
        }
        Ok((Response::Cq(layout), vec![fd]))
    }

    /// A QP, or with `gsi` the device's QP1.
    /// A QP (the GSI QP with `gsi`), whose storage blocks the daemon
    /// offloads if `blocks` asks.
    fn create_qp(&mut self, init: QpInitAttr, gsi: bool, blocks: Option<BlockOffload>) -> Answer {
        if blocks.is_some() && (init.qp_type != QpType::Rc || self.forward) {
            return Err(RemoteError::invalid(
                "the block offload is for RC QPs whose queues the daemon's processors serve (not forwarded)",
            ));
        }
        let held = self.usage.reserve(Resource::Qps, 1)?;
        self.own_pd(init.pd)?;
        for cq in [init.send_cq, init.recv_cq] {
            if !self.cqs.contains_key(&cq) {
                return Err(RemoteError::not_found("CQ"));
            }
        }
        if let Some(srq) = init.srq
            && !self.srqs.contains_key(&srq)
        {
            return Err(RemoteError::not_found("SRQ"));
        }
        let (caps, pd) = (init.caps, init.pd);
        if caps.max_send_wr > MAX_QP_WR
            || caps.max_recv_wr > MAX_QP_WR
            // The block offload keeps one gather entry for itself.
            || caps.max_send_sge + u32::from(blocks.is_some()) > MAX_SGE
            || caps.max_recv_sge > MAX_SGE
            || caps.max_inline_data > MAX_INLINE_DATA
        {
            return Err(RemoteError::invalid(format!(
                "capabilities beyond the device's: {MAX_QP_WR} requests, {MAX_SGE} SGEs, {MAX_INLINE_DATA} inline bytes"
            )));
        }
        let send = SharedQueue::create(
            "softrnic-sq",
            caps.max_send_wr,
            wqe::send_slot_size(caps.max_send_sge, caps.max_inline_data),
        )
        .map_err(io)?;
        // A QP on an SRQ takes its receives from there: its own ring is a
        // slot that is never read.
        let recv_wr = if init.srq.is_some() { 1 } else { caps.max_recv_wr };
        let recv = SharedQueue::create("softrnic-rq", recv_wr, wqe::recv_slot_size(caps.max_recv_sge)).map_err(io)?;
        let nic = &self.device.nic;
        // The block offload sends a block's header from a slot of its own
        // ahead of the program's entries: one more gather entry.
        let engine_caps = QpCaps { max_send_sge: caps.max_send_sge + u32::from(blocks.is_some()), ..caps };
        let posts = match gsi {
            false => nic.create_qp(QpInitAttr { caps: engine_caps, ..init }),
            true => claim_gsi(nic, init),
        }?;
        let qpn = posts.qpn();
        if let Some(rate) = self.rate {
            let _ = nic.set_qp_rate_limit(qpn, Some(rate));
        }
        let layout = QpLayout {
            qpn,
            caps,
            send_slots: send.slot_count(),
            send_slot_size: send.slot_size(),
            recv_slots: recv.slot_count(),
            recv_slot_size: recv.slot_size(),
        };
        let fds = vec![send.fd().try_clone_to_owned().map_err(io)?, recv.fd().try_clone_to_owned().map_err(io)?];
        // The offload designs stage what the processor moves; a forwarding
        // tenant's requests go to the engine as they come.
        let stages = match self.forward {
            true => Ok(Stages::default()),
            false => {
                // A QP's receives from an SRQ land directly: not staged.
                let depths = (caps.max_send_wr, init.srq.is_none().then_some(caps.max_recv_wr));
                match blocks {
                    Some(offload) => self.device.offload.block_stages(nic, pd, depths, offload),
                    None => self.device.offload.stages(nic, pd, depths, self.device.copy.as_ref()),
                }
            }
        };
        let stages = match stages {
            Ok(stages) => stages,
            Err(e) => {
                let _ = nic.destroy_qp(qpn);
                return Err(RemoteError::from(e));
            }
        };
        let recv = init.srq.is_none().then_some(recv);
        let served = Arc::new(ServedQp::new(self.id, self.device.clone(), posts, caps, stages, send, recv));
        self.device.events.own(Element::Qp(qpn), &self.events);
        held.keep();
        self.qps.insert(qpn, served.clone());
        if !self.forward {
            served.fetch_on_demand();
            self.registry.update(|s| s.qps.push(served));
        }
        Ok((Response::Qp(layout), fds))
    }

    fn destroy_qp(&mut self, qpn: u32) -> softrnic_transport::Result<()> {
        if let Some(served) = self.qps.get(&qpn) {
            served.take_posted();
        }
        self.device.nic.destroy_qp(qpn)?;
        self.device.events.disown(Element::Qp(qpn));
        if let Some(served) = self.qps.remove(&qpn) {
            self.registry.update(|s| s.qps.retain(|q| !Arc::ptr_eq(q, &served)));
            served.release();
            self.usage.release(Resource::Qps, 1);
        }
        Ok(())
    }
}

/// How long a program that asks for its address's QP1 waits for the
/// program holding it to leave, before it is refused.
const GSI_HANDOVER: Duration = Duration::from_secs(1);

/// The device's QP1, which is every tenant's on the address: one program's
/// at a time. A program that has just exited still holds it until the
/// daemon has seen its connection close and freed it, so a program
/// started right after it (a server restarted on its address) waits for
/// that, up to [`GSI_HANDOVER`], rather than being refused.
fn claim_gsi(nic: &Nic, init: QpInitAttr) -> softrnic_transport::Result<Arc<PostQueues>> {
    let deadline = Instant::now() + GSI_HANDOVER;
    loop {
        match nic.create_gsi_qp(init) {
            Err(VerbsError::Busy(_)) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(VerbsError::Busy(_)) => return Err(VerbsError::Busy(protocol::GSI_HELD)),
            claimed => return claimed,
        }
    }
}

impl Drop for Tenant {
    /// Frees what the tenant held, however its connection ended: QP1
    /// first, which the next program on the address may be waiting for
    /// ([`claim_gsi`]), while the rest can take a while (a thousand
    /// connections' QPs).
    fn drop(&mut self) {
        let device = self.device.clone();
        let nic = &device.nic;
        let error = QpAttr { state: Some(QpState::Error), ..QpAttr::default() };
        let mut qpns: Vec<u32> = self.qps.keys().copied().collect();
        qpns.sort_by_key(|&qpn| qpn != GSI_QPN);
        for &qpn in &qpns {
            let _ = nic.modify_qp(qpn, &error);
        }
        // Their flushes reach the program's rings before the CQs go: a
        // program still running (the daemon stopping under it) sees every
        // request it posted end.
        let served: Vec<Arc<ServedQp>> = self.qps.values().cloned().collect();
        for cq in self.cqs.values() {
            cq.deliver_now(&served);
        }
        for qpn in qpns {
            if let Err(e) = self.destroy_qp(qpn) {
                eprintln!("softrnicd: tenant {}: destroying QP {qpn:#x}: {e}", self.id);
            }
        }
        // What the engine would not destroy is gone with the tenant all
        // the same: its container may use the room.
        self.usage.release(Resource::Qps, self.qps.len() as u64);
        // Its QPs gone, its SRQs can go.
        let srqs: Vec<Arc<ServedSrq>> = self.srqs.drain().map(|(_, srq)| srq).collect();
        self.usage.release(Resource::Srqs, srqs.len() as u64);
        self.registry.update(|s| s.srqs.retain(|q| !srqs.iter().any(|gone| Arc::ptr_eq(q, gone))));
        for srq in srqs {
            let id = srq.queue.id();
            device.events.disown(Element::Srq(id));
            let _ = nic.destroy_srq(id);
        }
        let doorbell = self.doorbell.clone();
        let cqs: Vec<Arc<ServedCq>> = self.cqs.drain().map(|(_, cq)| cq).collect();
        self.registry.update(|s| {
            s.cqs.retain(|c| !cqs.iter().any(|gone| Arc::ptr_eq(c, gone)));
            s.doorbells.retain(|d| !Arc::ptr_eq(d, &doorbell));
        });
        self.usage.release(Resource::Cqs, cqs.len() as u64);
        for cq in cqs {
            let id = cq.queue.id();
            nic.set_channel(id, None);
            device.events.disown(Element::Cq(id));
            let _ = nic.destroy_cq(id);
        }
        // Windows before regions: a bound window keeps its region.
        self.usage.release(Resource::Mrs, self.windows.len() as u64);
        for handle in self.windows.drain() {
            let _ = nic.dealloc_window(handle);
        }
        for (lkey, len) in self.regions.drain() {
            let _ = nic.deregister_memory(lkey);
            if let Some(copy) = &device.copy {
                copy.forget(nic, lkey);
            }
            self.usage.release(Resource::Mrs, 1);
            self.usage.release(Resource::Memory, len);
        }
        self.usage.release(Resource::Pds, self.pds.len() as u64);
        for pd in self.pds.drain() {
            let _ = nic.dealloc_pd(pd);
        }
        self.usage.release(Resource::Channels, self.channels.len() as u64);
        self.usage.release(Resource::Connections, 1);
        device.holders.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}

/// Maps a region's memfd segments (which came with the request) as one
/// buffer of its `len` bytes.
fn map_translation(translation: Translation, fds: Vec<OwnedFd>) -> Result<Arc<DmaBuffer>, RemoteError> {
    let Translation { lead, len, segments, .. } = translation;
    if fds.len() != segments.len() {
        return Err(RemoteError::invalid(format!("{} segments came with {} memfds", segments.len(), fds.len())));
    }
    // The tenant is charged `len` bytes; what the daemon maps for them is
    // bounded by that, give or take the pages the region starts and ends
    // in. Otherwise one byte over a sparse terabyte memfd would take a
    // terabyte of the daemon's address space for the charge of a byte.
    let page = rustix::param::page_size() as u64;
    let segments_len = segments.iter().try_fold(0u64, |sum, s| sum.checked_add(s.len));
    let covering = lead.checked_add(len.max(1)).map(|end| end.next_multiple_of(page));
    if lead >= page || segments_len.zip(covering).is_none_or(|(total, covering)| total > covering) {
        return Err(RemoteError::invalid(format!(
            "the region ({len} bytes from {lead}) must start in its first segment's first page and its segments \
             ({} bytes) cover no more than its pages",
            segments_len.map_or("too many".to_string(), |t| t.to_string())
        )));
    }
    let mapping = SharedMapping::attach_segments(fds.into_iter().zip(segments).collect())
        .map_err(|e| RemoteError::invalid(e.to_string()))?;
    if lead.checked_add(len).is_none_or(|end| end > mapping.len() as u64) {
        return Err(RemoteError::invalid(format!(
            "the region ({len} bytes from {lead}) overflows its segments ({} bytes)",
            mapping.len()
        )));
    }
    // The engine's table holds the buffer, the buffer the mapping.
    Ok(Arc::new(mapping.into_buffer(lead as usize, len as usize)))
}

/// Makes a program's congestion control in the daemon: a built-in, or a
/// module compiled into the sandbox from a private copy of the memfd's
/// bytes (the program can still write its mapping).
fn remote_algorithm(algorithm: RemoteAlgorithm, fds: Vec<OwnedFd>) -> Result<Choice, RemoteError> {
    let spec = match algorithm {
        RemoteAlgorithm::Builtin { name, params } => AlgorithmSpec::Builtin { name, params },
        RemoteAlgorithm::Module { name, params, len } => {
            if len == 0 || len > MAX_MODULE {
                return Err(RemoteError::invalid(format!("a module of 1 to {MAX_MODULE} bytes, not {len}")));
            }
            let fd = fds.into_iter().next().ok_or(RemoteError::invalid("the module's memfd did not come"))?;
            let mapping = SharedMapping::attach(fd, len as usize).map_err(|e| RemoteError::invalid(e.to_string()))?;
            let mut bytes = vec![0u8; len as usize];
            mapping.bytes(0, len as usize).read(0, &mut bytes);
            AlgorithmSpec::Module { name, bytes: bytes.into(), params }
        }
    };
    softrnic_engine::congestion::from_spec(&spec).map_err(RemoteError::invalid)
}
