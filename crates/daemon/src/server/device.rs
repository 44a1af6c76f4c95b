//! The devices the daemon runs: one engine (`Nic`) per address and
//! network namespace, opened when the first tenant asks for it and closed
//! when the last one leaves.
//!
//! A tenant in a container asks for an address of its own network
//! namespace. The daemon opens that device from a thread it moves into the
//! namespace (`setns`, which takes `CAP_SYS_ADMIN`): the device's sockets
//! are made there, and its engine threads, started by that thread, live
//! there too. The container needs no privilege and no device node, only
//! the daemon's socket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rustix::net::SendFlags;
use rustix::thread::LinkNameSpaceType;
use softrnic_engine::shm::{Scope, this_netns};
use softrnic_engine::{DatapathKind, EngineConfig, Nic, OpenError, interface};
use softrnic_transport::{AsyncEvent, CqId, SrqId};

use super::offload::copy_engine::CopyEngine;
use super::offload::{Offload, TxDesign};

/// How long a device that is closing may keep its port from a new one.
const CLOSING_WAIT: Duration = Duration::from_secs(2);

/// One device.
pub struct Device {
    pub nic: Nic,
    /// Which tenant each of the device's asynchronous events goes to.
    pub events: Arc<EventRoutes>,
    /// Bytes of payload per packet on the device's port.
    pub active_mtu: u32,
    /// The daemon's offload designs, which the device's QPs use.
    pub offload: Arc<Offload>,
    /// The `engine-copy` design's copy engine, when that is the design.
    pub copy: Option<Arc<CopyEngine>>,
    /// The command processor that serves every queue of the device
    /// ([`super::processor::Processors`]).
    pub processor: usize,
    /// The user of each tenant that holds the device, by tenant: the
    /// device's counters count every holder's traffic, so they are shown
    /// only where all holders are one user.
    pub holders: Mutex<HashMap<u64, u32>>,
}

impl Device {
    /// Whether every tenant holding the device runs as `uid`.
    pub fn held_only_by(&self, uid: u32) -> bool {
        self.holders.lock().unwrap_or_else(|e| e.into_inner()).values().all(|&holder| holder == uid)
    }
}

/// A network namespace, held open by a descriptor, named by its inode.
pub struct NetNs {
    fd: OwnedFd,
    pub inode: u64,
}

impl NetNs {
    /// The network namespace of the process at the other end of `socket`,
    /// if it is not the daemon's.
    ///
    /// Read from `/proc/<pid>`, where the pid might by now name another
    /// process (the program exited, and its pid went to a process in
    /// another namespace): so the program is held by a pidfd the kernel
    /// gave with the connection (`SO_PEERPIDFD`), and the namespace is
    /// believed only if that process still lives after it was read: a live
    /// process keeps its pid.
    pub fn of_peer(socket: BorrowedFd<'_>, pid: u32) -> Result<Option<NetNs>, String> {
        let pidfd =
            softrnic_daemon_protocol::peer::pidfd(socket, pid).map_err(|e| format!("the program's pidfd: {e}"))?;
        let path = format!("/proc/{pid}/ns/net");
        let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        if !softrnic_daemon_protocol::peer::alive(pidfd.as_fd()) {
            return Err(format!("the program (pid {pid}) left before its network namespace could be read"));
        }
        let inode = file.metadata().map_err(|e| format!("{path}: {e}"))?.ino();
        let ours = this_netns().map_err(|e| e.to_string())?;
        Ok((inode != ours).then(|| NetNs { fd: file.into(), inode }))
    }
}

/// Open devices by network namespace (its inode) and address.
pub struct Devices {
    open: Mutex<HashMap<(u64, IpAddr), Weak<Device>>>,
    engine_threads: usize,
    pub offload: Arc<Offload>,
    /// The embedded switch all devices share, if the daemon runs one.
    switch: Option<Scope>,
    /// Command processors to share the devices among.
    processors: usize,
}

impl Devices {
    /// Devices whose engines get `engine_threads` threads each (`--cores`),
    /// whose QPs use `offload`'s designs, which reach each other through
    /// `switch` if given, and which `processors` command processors share.
    pub fn new(engine_threads: usize, offload: Arc<Offload>, switch: Option<Scope>, processors: usize) -> Devices {
        Devices { open: Mutex::new(HashMap::new()), engine_threads, offload, switch, processors: processors.max(1) }
    }

    /// The device on `addr` in `netns` (the daemon's own when `None`),
    /// opened if nobody holds it. The daemon's own environment configures
    /// it as it would an in-process engine (`SOFTRNIC_*`). Progress is the
    /// engine's policy: on a machine with cores to spare its threads poll
    /// (dedicated); on a small one the command processor, which polls the
    /// CQs anyway, drives the shards as an application's polling thread
    /// would (inline), and the engine threads stand by.
    pub fn open(&self, addr: IpAddr, netns: Option<&NetNs>) -> Result<Arc<Device>, String> {
        let key = (netns.map_or(this_netns().map_err(|e| e.to_string())?, |ns| ns.inode), addr);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(device) = open.get(&key).and_then(Weak::upgrade) {
            return Ok(device);
        }
        let mut config = EngineConfig::from_env(addr)?.with_threads(self.engine_threads, false);
        if let Some(switch) = self.switch {
            // One switch, one address space: a datagram for an address
            // must have one device to go to.
            let elsewhere = open.iter().any(|(&(ns, a), d)| a == addr && ns != key.0 && d.strong_count() > 0);
            if elsewhere {
                return Err(format!(
                    "{addr} is already a device of softrnicd's embedded switch, in another network namespace: \
                     give each container an address of its own, or run softrnicd without --embedded-switch"
                ));
            }
            config.shm_scope = Some(switch);
            config.datapath = DatapathKind::Shm;
        }
        // The last tenant of a device may have just left: the device closes
        // in whichever thread lets go of it last, and holds its port until
        // then. A new tenant waits for that, briefly.
        let closing = open.get(&key).is_some_and(|d| d.strong_count() == 0);
        let processor = least_loaded(&open, self.processors);
        let device = match netns {
            None => open_device(config, closing, &self.offload, processor)?,
            Some(ns) => std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        rustix::thread::move_into_link_name_space(ns.fd.as_fd(), Some(LinkNameSpaceType::Network))
                            .map_err(|e| {
                                format!(
                                    "cannot enter the program's network namespace ({e}): softrnicd serves containers \
                                     only with CAP_SYS_ADMIN (run it as root)"
                                )
                            })?;
                        open_device(config, closing, &self.offload, processor)
                    })
                    .join()
                    .unwrap_or_else(|_| Err("opening the device panicked".into()))
            })?,
        };
        let device = Arc::new(device);
        // A closed device's entry stays until its address opens again: it
        // is what tells a new tenant there that the device may still be
        // closing (removed when another address opened, it once let a
        // program that reopened at once find the port taken while its
        // last tenant was still unmapping 256 MiB of regions).
        open.insert(key, Arc::downgrade(&device));
        Ok(device)
    }

    /// The device on `addr` in the daemon's namespace, while it is open.
    pub fn get(&self, addr: IpAddr) -> Option<Arc<Device>> {
        let key = (this_netns().ok()?, addr);
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&key).and_then(Weak::upgrade)
    }
}

/// The objects a device's asynchronous events name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    Qp(u32),
    Cq(CqId),
    Srq(SrqId),
}

/// Where a device's asynchronous events go: to the socket of the tenant
/// that owns the object each names, as a postcard-encoded [`AsyncEvent`]
/// (the program's `async_fd`). An event for an object nobody owns (the
/// copy engine's QP, one just destroyed) is dropped, as the verbs drop an
/// event for a destroyed object.
#[derive(Default)]
pub struct EventRoutes {
    owners: Mutex<HashMap<Element, Arc<OwnedFd>>>,
}

impl EventRoutes {
    /// Events about `element` go to `socket` from now on.
    pub fn own(&self, element: Element, socket: &Arc<OwnedFd>) {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).insert(element, socket.clone());
    }

    pub fn disown(&self, element: Element) {
        self.owners.lock().unwrap_or_else(|e| e.into_inner()).remove(&element);
    }

    /// Runs on the thread that raised the event, with no lock of the
    /// device held: a tenant that does not read its events loses them
    /// rather than stall the engine.
    fn deliver(&self, event: AsyncEvent) {
        let element = match event {
            AsyncEvent::QpFatal { qpn }
            | AsyncEvent::QpRequestError { qpn }
            | AsyncEvent::QpAccessError { qpn }
            | AsyncEvent::QpLastWqeReached { qpn } => Element::Qp(qpn),
            AsyncEvent::CqError { cq } => Element::Cq(cq),
            AsyncEvent::SrqLimitReached { srq } => Element::Srq(srq),
        };
        let Some(socket) = self.owners.lock().unwrap_or_else(|e| e.into_inner()).get(&element).cloned() else {
            return;
        };
        let bytes = softrnic_daemon_protocol::protocol::encode_event(&event);
        let _ = rustix::net::send(&socket, &bytes, SendFlags::DONTWAIT | SendFlags::NOSIGNAL);
    }
}

/// The command processor serving the fewest open devices: a device's
/// queues cost its processor about the same whoever the tenant is.
fn least_loaded(open: &HashMap<(u64, IpAddr), Weak<Device>>, processors: usize) -> usize {
    let mut load = vec![0usize; processors];
    for device in open.values().filter_map(Weak::upgrade) {
        load[device.processor] += 1;
    }
    (0..processors).min_by_key(|&p| load[p]).unwrap_or(0)
}

/// Opens a device in the calling thread's network namespace, served by
/// command processor `processor`.
fn open_device(
    config: EngineConfig,
    closing: bool,
    offload: &Arc<Offload>,
    processor: usize,
) -> Result<Device, String> {
    let addr = config.addr;
    let deadline = Instant::now() + CLOSING_WAIT;
    let nic = loop {
        match Nic::open(config.clone()) {
            Ok(nic) => break nic,
            Err(OpenError::Bind(_)) if closing && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(format!("cannot open the device on {addr}: {e}")),
        }
    };
    let mtu = interface::active_mtu(addr);
    let copy = match offload.designs.tx {
        TxDesign::EngineCopy => Some(Arc::new(
            CopyEngine::open(&nic, mtu).map_err(|e| format!("cannot open the copy engine on {addr}: {e}"))?,
        )),
        _ => None,
    };
    let events = Arc::new(EventRoutes::default());
    let routes = events.clone();
    nic.route_async_events(Box::new(move |event| routes.deliver(event)));
    Ok(Device {
        nic,
        events,
        active_mtu: mtu.bytes(),
        offload: offload.clone(),
        copy,
        processor,
        holders: Mutex::new(HashMap::new()),
    })
}
