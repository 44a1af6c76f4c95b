use std::net::IpAddr;
use std::sync::Arc;

use softrnic_engine::{EngineConfig, FaultConfig, Nic, NicCounters, ProgressMode, interface};
use softrnic_transport::Mtu;

use crate::{CompletionQueue, Error, ProtectionDomain};

/// An open software RNIC.
#[derive(Clone)]
pub struct Context {
    pub(crate) nic: Arc<Nic>,
    active_mtu: Mtu,
}

impl Context {
    /// Opens a device on `addr` with one engine thread (or the number
    /// `SOFTRNIC_ENGINE_THREADS` gives), injecting the faults the
    /// environment asks for (`SOFTRNIC_LOSS`, `SOFTRNIC_REORDER`,
    /// `SOFTRNIC_DUPLICATE`, `SOFTRNIC_CORRUPT`), none by default.
    pub fn open(addr: IpAddr) -> Result<Context, Error> {
        let faults = FaultConfig::from_env().map_err(Error::Config)?;
        let config = EngineConfig::from_env(addr).map_err(Error::Config)?;
        Context::with_config(EngineConfig { faults, ..config })
    }

    pub fn with_config(config: EngineConfig) -> Result<Context, Error> {
        let active_mtu = interface::active_mtu(config.addr);
        Ok(Context { nic: Arc::new(Nic::open(config)?), active_mtu })
    }

    /// The device's address, which is also its GID.
    pub fn addr(&self) -> IpAddr {
        self.nic.addr()
    }

    /// The largest path MTU whose packets the device's network interface
    /// carries (4096 on loopback, 1024 on a 1500-byte Ethernet link).
    pub fn active_mtu(&self) -> Mtu {
        self.active_mtu
    }

    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.nic.alloc_pd();
        ProtectionDomain { ctx: self.clone(), id: Arc::new(crate::pd::PdHandle { ctx: self.clone(), id }) }
    }

    /// A completion queue of `capacity` entries.
    pub fn create_cq(&self, capacity: usize) -> Result<CompletionQueue, Error> {
        let cq = self.nic.create_cq(capacity);
        Ok(CompletionQueue::new(self.clone(), cq))
    }

    pub fn counters(&self) -> NicCounters {
        self.nic.counters()
    }

    /// Whether devices on this host reach this one through shared memory.
    pub fn shared_memory(&self) -> bool {
        self.nic.shared_memory()
    }

    pub fn engine_threads(&self) -> usize {
        self.nic.engine_threads()
    }

    /// Whether engine threads poll the device on cores of their own
    /// ([`ProgressMode::Dedicated`]) or the program's posts and polls drive
    /// it ([`ProgressMode::Inline`]).
    pub fn progress_mode(&self) -> ProgressMode {
        self.nic.progress_mode()
    }

    /// Makes progress from the caller's thread; true if anything moved.
    pub fn progress(&self) -> bool {
        self.nic.progress()
    }
}
