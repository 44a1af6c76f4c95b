use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use softrnic_engine::{EngineConfig, Nic, NicCounters, OpenError, ProgressMode};
use softrnic_provider::Provider;
use softrnic_provider::client::Session;
use softrnic_transport::Mtu;

use crate::{CompletionQueue, Error, ProtectionDomain};

/// An open software RNIC: an engine in this process, or a device that
/// softrnicd serves.
#[derive(Clone)]
pub struct Context {
    pub(crate) provider: Arc<Provider>,
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
        let engine = || Nic::open(EngineConfig::from_env(addr).map_err(OpenError::Config)?);
        Ok(Context::over(Provider::open(addr, engine)?))
    }

    /// An engine in this process, as `config` says.
    pub fn with_config(config: EngineConfig) -> Result<Context, Error> {
        Ok(Context::over(Provider::in_process(Nic::open(config)?)))
    }

    /// The device on `addr` that softrnicd, listening on `socket`, serves:
    /// posting and polling are then memory operations on queues shared
    /// with the daemon.
    pub fn through_daemon(socket: &Path, addr: IpAddr) -> Result<Context, Error> {
        Ok(Context::over(Provider::through(Session::connect(socket, addr)?)))
    }

    fn over(provider: Provider) -> Context {
        Context { active_mtu: provider.active_mtu(), provider: Arc::new(provider) }
    }

    /// Whether softrnicd serves this device.
    pub fn through_daemon_now(&self) -> bool {
        self.provider.served_by_daemon()
    }

    /// The device's address, which is also its GID.
    pub fn addr(&self) -> IpAddr {
        self.provider.addr()
    }

    /// The largest path MTU whose packets the device's network interface
    /// carries (4096 on loopback, 1024 on a 1500-byte Ethernet link).
    pub fn active_mtu(&self) -> Mtu {
        self.active_mtu
    }

    pub fn alloc_pd(&self) -> Result<ProtectionDomain, Error> {
        let id = self.provider.alloc_pd()?;
        Ok(ProtectionDomain { ctx: self.clone(), id: Arc::new(crate::pd::PdHandle { ctx: self.clone(), id }) })
    }

    /// A completion queue of `capacity` entries.
    pub fn create_cq(&self, capacity: usize) -> Result<CompletionQueue, Error> {
        let cq = self.provider.create_cq(capacity)?;
        Ok(CompletionQueue::new(self.clone(), cq))
    }

    pub fn counters(&self) -> NicCounters {
        self.provider.counters()
    }

    /// Whether devices on this host reach this one through shared memory.
    pub fn shared_memory(&self) -> bool {
        self.provider.shared_memory()
    }

    pub fn engine_threads(&self) -> usize {
        self.provider.engine_threads()
    }

    /// Whether engine threads poll the device on cores of their own
    /// ([`ProgressMode::Dedicated`]) or the program's posts and polls drive
    /// it ([`ProgressMode::Inline`]).
    pub fn progress_mode(&self) -> ProgressMode {
        self.provider.progress_mode()
    }

    /// Makes progress from the caller's thread; true if anything moved.
    pub fn progress(&self) -> bool {
        self.provider.progress()
    }
}
