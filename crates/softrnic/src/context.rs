use std::net::IpAddr;
use std::sync::Arc;

use std::path::Path;

use softrnic_daemon::client::Session;
use softrnic_engine::{EngineConfig, FaultConfig, Nic, NicCounters, ProgressMode, interface};
use softrnic_transport::Mtu;

use crate::{CompletionQueue, Error, ProtectionDomain};
use softrnic_daemon::backend::Backend;

/// An open software RNIC: an engine in this process, or a device that
/// softrnicd serves.
#[derive(Clone)]
pub struct Context {
    pub(crate) backend: Arc<Backend>,
    active_mtu: Mtu,
}

impl Context {
    /// Opens a device on `addr` with one engine thread (or the number
    /// `SOFTRNIC_ENGINE_THREADS` gives), injecting the faults the
    /// environment asks for (`SOFTRNIC_LOSS`, `SOFTRNIC_REORDER`,
    /// `SOFTRNIC_DUPLICATE`, `SOFTRNIC_CORRUPT`), none by default.
    ///
    /// With softrnicd running (`SOFTRNIC_DAEMON=PATH`, or its default
    /// socket present and `SOFTRNIC_DAEMON` not `off`), the device is the
    /// daemon's instead, configured by the daemon's environment.
    pub fn open(addr: IpAddr) -> Result<Context, Error> {
        if let Some(socket) = softrnic_daemon::socket_path::from_env() {
            return Context::through_daemon(&socket, addr);
        }
        let faults = FaultConfig::from_env().map_err(Error::Config)?;
        let config = EngineConfig::from_env(addr).map_err(Error::Config)?;
        Context::with_config(EngineConfig { faults, ..config })
    }

    /// An engine in this process, as `config` says.
    pub fn with_config(config: EngineConfig) -> Result<Context, Error> {
        let active_mtu = interface::active_mtu(config.addr);
        Ok(Context { backend: Arc::new(Backend::Engine(Nic::open(config)?)), active_mtu })
    }

    /// The device on `addr` that softrnicd, listening on `socket`, serves:
    /// posting and polling are then memory operations on queues shared
    /// with the daemon.
    pub fn through_daemon(socket: &Path, addr: IpAddr) -> Result<Context, Error> {
        let session = Session::connect(socket, addr)?;
        let active_mtu = Mtu::from_bytes(session.active_mtu()).unwrap_or(Mtu::Mtu1024);
        Ok(Context { backend: Arc::new(Backend::Daemon(session)), active_mtu })
    }

    /// Whether softrnicd serves this device.
    pub fn through_daemon_now(&self) -> bool {
        matches!(*self.backend, Backend::Daemon(_))
    }

    /// The device's address, which is also its GID.
    pub fn addr(&self) -> IpAddr {
        self.backend.addr()
    }

    /// The largest path MTU whose packets the device's network interface
    /// carries (4096 on loopback, 1024 on a 1500-byte Ethernet link).
    pub fn active_mtu(&self) -> Mtu {
        self.active_mtu
    }

    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        let id = self.backend.alloc_pd()?;
        Ok(ProtectionDomain { ctx: self.clone(), id: Arc::new(crate::pd::PdHandle { ctx: self.clone(), id }) })
    }

    /// A completion queue of `capacity` entries.
    pub fn create_cq(&self, capacity: usize) -> Result<CompletionQueue, Error> {
        let cq = self.backend.create_cq(capacity)?;
        Ok(CompletionQueue::new(self.clone(), cq))
    }

    pub fn counters(&self) -> NicCounters {
        self.backend.counters()
    }

    /// Whether devices on this host reach this one through shared memory.
    pub fn shared_memory(&self) -> bool {
        self.backend.shared_memory()
    }

    pub fn engine_threads(&self) -> usize {
        self.backend.engine_threads()
    }

    /// Whether engine threads poll the device on cores of their own
    /// ([`ProgressMode::Dedicated`]) or the program's posts and polls drive
    /// it ([`ProgressMode::Inline`]).
    pub fn progress_mode(&self) -> ProgressMode {
        self.backend.progress_mode()
    }

    /// Makes progress from the caller's thread; true if anything moved.
    pub fn progress(&self) -> bool {
        self.backend.progress()
    }
}
