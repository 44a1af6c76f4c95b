//! The devices the daemon runs: one engine (`Nic`) per address, opened
//! when the first tenant asks for it and closed when the last one leaves.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use softrnic_engine::{EngineConfig, FaultConfig, Nic, NicCounters, OpenError, interface};

/// How long a device that is closing may keep its port from a new one.
const CLOSING_WAIT: Duration = Duration::from_secs(2);

/// One device.
pub struct Device {
    pub nic: Nic,
    /// Bytes of payload per packet on the device's port.
    pub active_mtu: u32,
}

/// Open devices by address.
pub struct Devices {
    open: Mutex<HashMap<IpAddr, Weak<Device>>>,
    engine_threads: usize,
}

impl Devices {
    /// Devices whose engines get `engine_threads` threads each (`--cores`).
    pub fn new(engine_threads: usize) -> Devices {
        Devices { open: Mutex::new(HashMap::new()), engine_threads }
    }

    /// The device on `addr`, opened if nobody holds it. The daemon's own
    /// environment configures it as it would an in-process engine
    /// (`SOFTRNIC_*`). Progress is the engine's policy: on a machine with
    /// cores to spare its threads poll (dedicated); on a small one the
    /// command processor, which polls the CQs anyway, drives the shards as
    /// an application's polling thread would (inline), and the engine
    /// threads stand by.
    pub fn open(&self, addr: IpAddr) -> Result<Arc<Device>, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(device) = open.get(&addr).and_then(Weak::upgrade) {
            return Ok(device);
        }
        let faults = FaultConfig::from_env()?;
        let config = EngineConfig { faults, ..EngineConfig::from_env(addr)? }.with_threads(self.engine_threads, false);
        // The last tenant of a device may have just left: the device closes
        // in whichever thread lets go of it last, and holds its port until
        // then. A new tenant waits for that, briefly.
        let closing = open.get(&addr).is_some_and(|d| d.strong_count() == 0);
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
        let active_mtu = interface::active_mtu(addr).bytes();
        let device = Arc::new(Device { nic, active_mtu });
        open.retain(|_, d| d.strong_count() > 0);
        open.insert(addr, Arc::downgrade(&device));
        Ok(device)
    }

    /// The counters of the device on `addr`, while it is open.
    pub fn counters(&self, addr: IpAddr) -> Option<NicCounters> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&addr).and_then(Weak::upgrade).map(|d| d.nic.counters())
    }
}
