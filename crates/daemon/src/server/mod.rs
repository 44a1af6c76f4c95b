//! softrnicd's side: the listening socket, a thread per tenant for its
//! control verbs, and the command processors that serve the tenants'
//! queues.

pub mod device;
pub mod offload;
pub mod priority;
pub mod processor;
pub mod tenant;

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use softrnic_engine::shm::Scope;

use crate::limits::{Accounts, DaemonConfig, DaemonLimits};
use device::Devices;
use processor::Processors;
use softrnic_daemon_protocol::peer::Peer;
use softrnic_daemon_protocol::protocol::{self, RemoteError};
use softrnic_transport::VerbsError;

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Where to listen.
    pub socket: PathBuf,
    /// Engine threads per device (`--cores`).
    pub engine_threads: usize,
    /// Command processors, the devices shared among them (`--processors`).
    pub processors: usize,
    pub config: DaemonConfig,
    /// The offloaded stack's transmit and receive designs (`--tx`, `--rx`).
    pub designs: offload::Designs,
    /// Its devices reach each other through shared memory whatever network
    /// namespace each serves (`--embedded-switch`), instead of through the
    /// namespaces' network.
    pub embedded_switch: bool,
}

impl DaemonOptions {
    /// A daemon on `socket` as `softrnicd` runs by default: one engine
    /// thread per device, one command processor, no limits beyond the
    /// defaults, header-only transmit and direct receive, no switch.
    pub fn at(socket: PathBuf) -> DaemonOptions {
        DaemonOptions {
            socket,
            engine_threads: 1,
            processors: 1,
            config: DaemonConfig::default(),
            designs: offload::Designs::default(),
            embedded_switch: false,
        }
    }
}

/// The connected tenants' sockets, by tenant.
type Connections = Mutex<HashMap<u64, OwnedFd>>;

/// How long a stopping daemon waits for its tenants to be torn down (each
/// frees its QPs, a thousand connections' in well under a second).
const TENANTS_LEAVE_WITHIN: Duration = Duration::from_secs(3);

/// A bound daemon, not yet serving.
pub struct Daemon {
    listener: OwnedFd,
    options: DaemonOptions,
    processors: Arc<Processors>,
    devices: Arc<Devices>,
}

/// A daemon serving on its own threads (tests, and `softrnicd` itself).
pub struct Running {
    socket: PathBuf,
    processors: Arc<Processors>,
    /// Tenants connected now.
    tenants: Arc<AtomicUsize>,
    /// Their connections (a second descriptor of each), to end them when
    /// the daemon stops.
    connections: Arc<Connections>,
    devices: Arc<Devices>,
    stopping: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    processor_threads: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Binds the socket. A socket file left by a daemon that died is
    /// replaced; one a live daemon listens on is not.
    pub fn bind(options: DaemonOptions) -> io::Result<Daemon> {
        let path = &options.socket;
        softrnic_daemon_protocol::make_socket_dir(path)?;
        let addr = SocketAddrUnix::new(path.as_path())?;
        if path.exists() {
            let probe = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None)?;
            if rustix::net::connect(&probe, &addr).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("softrnicd already listens on {}; stop it or pick another --socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        // Bound under a name of its own and renamed into place once it
        // listens: a program that finds the socket can connect to it (one
        // that came between bind and listen was refused).
        let binding = path.with_extension(format!("binding-{}", std::process::id()));
        let _ = std::fs::remove_file(&binding);
        let listener =
            rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        rustix::net::bind(&listener, &SocketAddrUnix::new(binding.as_path())?)?;
        // The daemon serves its user (and containers mapped to it).
        std::fs::set_permissions(&binding, std::fs::Permissions::from_mode(0o600))?;
        rustix::net::listen(&listener, 128)?;
        // Never over another's: a daemon that raced this one there first
        // keeps the name (and this one leaves, as with a live one above).
        let placed = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &binding,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        );
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&binding);
            return Err(match e {
                rustix::io::Errno::EXIST => io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("another softrnicd took {} meanwhile; stop it or pick another --socket", path.display()),
                ),
                e => e.into(),
            });
        }
        let processors = Arc::new(Processors::new(options.processors)?);
        let offload = Arc::new(offload::Offload::new(options.designs));
        let switch = options.embedded_switch.then(|| Scope::Switch(std::process::id()));
        // What a killed daemon's devices (or programs') left in /dev/shm.
        softrnic_engine::shm::remove_abandoned_inboxes();
        let devices = Arc::new(Devices::new(options.engine_threads, offload, switch, processors.count()));
        Ok(Daemon { listener, options, processors, devices })
    }

    /// Starts the command processors and the acceptor.
    pub fn start(self) -> io::Result<Running> {
        let Daemon { listener, options, processors, devices } = self;
        let stopping = Arc::new(AtomicBool::new(false));
        let devices_for_running = devices.clone();
        let processor_threads = processors.spawn()?;
        let tenants = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(Connections::default());
        let acceptor = {
            let (processors, stopping, tenants) = (processors.clone(), stopping.clone(), tenants.clone());
            let connections = connections.clone();
            let accounts = Arc::new(Accounts::new(options.config.tenant));
            let admission = options.config.daemon.clone();
            std::thread::Builder::new().name("softrnicd-accept".into()).spawn(move || {
                let next_tenant = AtomicU64::new(1);
                let mut refused = std::collections::VecDeque::with_capacity(REFUSED_HELD);
                loop {
                    let socket = match rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
                        Ok(socket) => socket,
                        Err(rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => continue,
                        Err(e) => {
                            eprintln!("softrnicd: accept: {e}");
                            std::thread::sleep(std::time::Duration::from_millis(10));
                            continue;
                        }
                    };
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    let peer = match admit(&socket, &admission, tenants.load(Ordering::Acquire)) {
                        Ok(peer) => peer,
                        Err(refusal) => {
                            eprintln!("softrnicd: refused a program: {}", refusal.message);
                            let _ = protocol::send(socket.as_fd(), &protocol::Response::Error(refusal), &[]);
                            // Held open a while: closed with the program's
                            // first request unread, the kernel would reset
                            // the connection and the answer with it.
                            if refused.len() == REFUSED_HELD {
                                refused.pop_front();
                            }
                            refused.push_back(socket);
                            continue;
                        }
                    };
                    let id = next_tenant.fetch_add(1, Ordering::Relaxed);
                    let (devices, processors, count) = (devices.clone(), processors.clone(), tenants.clone());
                    let (accounts, ours) = (accounts.clone(), connections.clone());
                    count.fetch_add(1, Ordering::AcqRel);
                    if let Ok(second) = socket.try_clone() {
                        ours.lock().unwrap_or_else(|e| e.into_inner()).insert(id, second);
                    }
                    let spawned = std::thread::Builder::new().name(format!("softrnicd-tenant-{id}")).spawn(move || {
                        tenant::serve(id, socket, peer, &devices, &processors, &accounts);
                        ours.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        count.fetch_sub(1, Ordering::AcqRel);
                    });
                    if let Err(e) = spawned {
                        connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        tenants.fetch_sub(1, Ordering::AcqRel);
                        eprintln!("softrnicd: cannot serve tenant {id}: {e}");
                    }
                }
            })?
        };
        Ok(Running {
            socket: options.socket,
            processors,
            tenants,
            connections,
            devices: devices_for_running,
            stopping,
            acceptor: Some(acceptor),
            processor_threads,
        })
    }
}

/// How many refused connections the acceptor holds open until their
/// programs have read why.
const REFUSED_HELD: usize = 64;

/// Whether the program that connected on `socket` is served, before it
/// costs a thread: it runs as an allowed user, and fewer than the most
/// programs are connected. Refused on the socket, in the answer to the
/// program's first request.
fn admit(socket: &OwnedFd, limits: &DaemonLimits, connected: usize) -> Result<Peer, RemoteError> {
    let peer = softrnic_daemon_protocol::peer::credentials(socket.as_fd())
        .map_err(|e| RemoteError::invalid(format!("who connected is unknown: {e}")))?;
    let me = rustix::process::geteuid().as_raw();
    limits.admit_user(peer.uid, me).map_err(|why| RemoteError::from(VerbsError::PermissionDenied(why)))?;
    limits.admit_connection(connected).map_err(RemoteError::exhausted)?;
    Ok(peer)
}

impl Running {
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// How many QPs and CQs the command processors serve now.
    pub fn served(&self) -> (usize, usize) {
        self.processors.served()
    }

    /// How often a command processor panicked and started again: zero,
    /// unless softrnicd has a bug.
    pub fn processor_restarts(&self) -> u64 {
        self.processors.restarts()
    }

    /// The counters of the device on `addr`, while a tenant holds it.
    pub fn counters(&self, addr: std::net::IpAddr) -> Option<softrnic_engine::NicCounters> {
        self.devices.get(addr).map(|d| d.nic.counters())
    }

    /// Which command processor serves the device on `addr`, while a tenant
    /// holds it.
    pub fn processor_of(&self, addr: std::net::IpAddr) -> Option<usize> {
        self.devices.get(addr).map(|d| d.processor)
    }

    /// How many programs are connected now.
    pub fn tenants(&self) -> usize {
        self.tenants.load(Ordering::Acquire)
    }

    /// The command processors' thread ids.
    pub fn processor_threads(&self) -> Vec<rustix::process::Pid> {
        self.processors.threads()
    }

    /// What the offload designs copied so far.
    pub fn offload_stats(&self) -> offload::OffloadStats {
        self.devices.offload.counters.snapshot()
    }

    /// What the block offload did so far.
    pub fn block_counters(&self) -> &offload::blocks::BlockCounters {
        &self.devices.offload.blocks
    }

    /// Runs until the process ends.
    pub fn wait(mut self) {
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

impl Drop for Running {
    /// Stops accepting, ends every tenant's connection and waits for the
    /// tenants to be torn down, as a device removed under its programs:
    /// their QPs flush (the processors, still running, write the flushed
    /// completions into their rings), their next control verb fails, and
    /// the devices close, their shared-memory inboxes with them (a
    /// daemon that exited under its tenants left those in `/dev/shm`).
    /// Then stops the processors.
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wake the acceptor with a connection of our own.
        if let Ok(probe) = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None)
            && let Ok(addr) = SocketAddrUnix::new(self.socket.as_path())
        {
            let _ = rustix::net::connect(&probe, &addr);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for connection in self.connections.lock().unwrap_or_else(|e| e.into_inner()).values() {
            // Its tenant's thread reads the end of the connection.
            let _ = rustix::net::shutdown(connection, rustix::net::Shutdown::Both);
        }
        let deadline = Instant::now() + TENANTS_LEAVE_WITHIN;
        while self.tenants() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.processors.stop();
        for processor in self.processor_threads.drain(..) {
            let _ = processor.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
