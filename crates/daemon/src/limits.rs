//! What one tenant may hold, from the daemon's configuration file
//! (`softrnicd --config FILE`):
//!
//! ```toml
//! [tenant]
//! max_qps = 256          # queue pairs
//! max_cqs = 256          # completion queues
//! max_mrs = 1024         # memory regions
//! max_pds = 64           # protection domains
//! max_srqs = 64          # shared receive queues
//! max_memory_mib = 4096  # bytes registered, all regions together
//! max_rate_gbps = 10.0   # each QP's send rate; absent: line rate
//! max_channels = 1024    # completion channels
//! max_connections = 256  # programs connected at once
//!
//! [daemon]
//! max_connections = 1024 # programs connected at once, all tenants together
//! allow_uids = [1000]    # users served besides the daemon's own and root
//! ```
//!
//! A tenant at a limit has its verb refused with `ENOMEM`, as a device out
//! of resources refuses it. Every connection is a thread of the daemon's,
//! so connections are limited too, a tenant's and all together.
//!
//! A tenant is a process, or every process of a container together: the
//! connections of programs in one network namespace other than the
//! daemon's share one [`Usage`] ([`Accounts`]), so a container cannot
//! pass its limits by opening more connections.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};

use softrnic_daemon_protocol::protocol::RemoteError;

#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    pub max_qps: u32,
    pub max_cqs: u32,
    pub max_mrs: u32,
    pub max_pds: u32,
    pub max_srqs: u32,
    pub max_memory_mib: u64,
    pub max_rate_gbps: Option<f64>,
    pub max_channels: u32,
    pub max_connections: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            max_qps: 4096,
            max_cqs: 4096,
            max_mrs: 16384,
            max_pds: 1024,
            max_srqs: 1024,
            max_memory_mib: 64 * 1024,
            max_rate_gbps: None,
            max_channels: 1024,
            max_connections: 256,
        }
    }
}

impl TenantLimits {
    pub fn max_memory_bytes(&self) -> u64 {
        self.max_memory_mib.saturating_mul(1 << 20)
    }

    /// A QP's rate limit in bits per second, if any.
    pub fn rate_bits_per_second(&self) -> Option<u64> {
        self.max_rate_gbps.map(|g| (g * 1e9) as u64)
    }
}

/// What a tenant holds, counted against its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Qps,
    Cqs,
    Mrs,
    Pds,
    Srqs,
    /// Bytes registered.
    Memory,
    /// Completion channels (a socket pair each).
    Channels,
    /// Connections to the daemon (a thread each).
    Connections,
}

/// How many kinds of [`Resource`] there are.
const RESOURCES: usize = Resource::Connections as usize + 1;

/// One tenant's holdings (a process's, or a container's processes'
/// together).
#[derive(Debug)]
pub struct Usage {
    limits: TenantLimits,
    /// Whose: "this program", "this container".
    whose: &'static str,
    held: Mutex<[u64; RESOURCES]>,
}

impl Usage {
    pub fn new(limits: TenantLimits, whose: &'static str) -> Usage {
        Usage { limits, whose, held: Mutex::new([0; RESOURCES]) }
    }

    fn limit(&self, what: Resource) -> (u64, String) {
        let l = &self.limits;
        match what {
            Resource::Qps => (u64::from(l.max_qps), format!("{} QPs", l.max_qps)),
            Resource::Cqs => (u64::from(l.max_cqs), format!("{} CQs", l.max_cqs)),
            Resource::Mrs => (u64::from(l.max_mrs), format!("{} memory regions", l.max_mrs)),
            Resource::Pds => (u64::from(l.max_pds), format!("{} PDs", l.max_pds)),
            Resource::Srqs => (u64::from(l.max_srqs), format!("{} SRQs", l.max_srqs)),
            Resource::Memory => (l.max_memory_bytes(), format!("{} MiB registered", l.max_memory_mib)),
            Resource::Channels => (u64::from(l.max_channels), format!("{} completion channels", l.max_channels)),
            Resource::Connections => {
                (u64::from(l.max_connections), format!("{} connections to softrnicd", l.max_connections))
            }
        }
    }

    /// Takes `amount` of `what`, or refuses with `ENOMEM` and a message
    /// naming the limit. Given back when the [`Reservation`] drops, unless
    /// kept.
    pub fn reserve(self: &Arc<Self>, what: Resource, amount: u64) -> Result<Reservation, RemoteError> {
        let (limit, named) = self.limit(what);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut held[what as usize];
        if slot.saturating_add(amount) > limit {
            return Err(RemoteError::exhausted(format!(
                "{} may hold at most {named} (softrnicd's [tenant] limits)",
                self.whose
            )));
        }
        *slot += amount;
        Ok(Reservation { usage: self.clone(), what, amount, kept: false })
    }

    /// Gives back `amount` of `what`, kept earlier.
    pub fn release(&self, what: Resource, amount: u64) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held[what as usize] = held[what as usize].saturating_sub(amount);
    }

    pub fn held(&self, what: Resource) -> u64 {
        self.held.lock().unwrap_or_else(|e| e.into_inner())[what as usize]
    }
}

/// Resources taken for a verb under way: given back if it fails.
#[derive(Debug)]
#[must_use = "keep() it once the verb succeeded"]
pub struct Reservation {
    usage: Arc<Usage>,
    what: Resource,
    amount: u64,
    kept: bool,
}

impl Reservation {
    /// The verb succeeded: the tenant holds it until it frees it.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.kept {
            self.usage.release(self.what, self.amount);
        }
    }
}

/// Every tenant's [`Usage`]: a program of the daemon's own network
/// namespace has one of its own; the programs of a container share one.
#[derive(Debug)]
pub struct Accounts {
    limits: TenantLimits,
    containers: Mutex<HashMap<u64, Weak<Usage>>>,
}

impl Accounts {
    pub fn new(limits: TenantLimits) -> Accounts {
        Accounts { limits, containers: Mutex::new(HashMap::new()) }
    }

    pub fn limits(&self) -> &TenantLimits {
        &self.limits
    }

    /// The usage of a program in the container whose network namespace is
    /// `container` (by inode), or of a program on its own.
    pub fn usage(&self, container: Option<u64>) -> Arc<Usage> {
        let Some(inode) = container else { return Arc::new(Usage::new(self.limits, "this program")) };
        let mut containers = self.containers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(usage) = containers.get(&inode).and_then(Weak::upgrade) {
            return usage;
        }
        containers.retain(|_, u| u.strong_count() > 0);
        let usage = Arc::new(Usage::new(self.limits, "this container (all its programs together)"));
        containers.insert(inode, Arc::downgrade(&usage));
        usage
    }
}

/// What the daemon admits, all tenants together (`[daemon]`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonLimits {
    /// Programs connected at once.
    pub max_connections: u32,
    /// Users whose programs the daemon serves besides its own user and
    /// root. Their programs share the daemon's devices of a namespace (and
    /// so see one another's traffic in the device's counters, which are
    /// then shown to none of them).
    pub allow_uids: Vec<u32>,
}

impl Default for DaemonLimits {
    fn default() -> Self {
        DaemonLimits { max_connections: 1024, allow_uids: Vec::new() }
    }
}

impl DaemonLimits {
    /// Whether a program of `uid` may connect to a daemon running as
    /// `daemon_uid`, and if not, why and how to allow it.
    pub fn admit_user(&self, uid: u32, daemon_uid: u32) -> Result<(), String> {
        if uid == daemon_uid || uid == 0 || self.allow_uids.contains(&uid) {
            return Ok(());
        }
        Err(format!(
            "softrnicd runs as uid {daemon_uid} and serves it, root and allow_uids; uid {uid} is none of them \
             (add it to [daemon] allow_uids in softrnicd's --config file)"
        ))
    }

    /// Whether one more program may connect while `connected` are.
    pub fn admit_connection(&self, connected: usize) -> Result<(), String> {
        if connected >= self.max_connections as usize {
            return Err(format!(
                "softrnicd serves at most {} programs at once ([daemon] max_connections); try again when one leaves",
                self.max_connections
            ));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    #[serde(default)]
    pub tenant: TenantLimits,
    #[serde(default)]
    pub daemon: DaemonLimits,
}

impl DaemonConfig {
    pub fn parse(text: &str) -> Result<DaemonConfig, String> {
        let config: DaemonConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let t = &config.tenant;
        if let Some(rate) = t.max_rate_gbps
            && !(rate.is_finite() && rate > 0.0)
        {
            return Err(format!("max_rate_gbps must be a positive number of Gb/s, not {rate}"));
        }
        if t.max_qps == 0 || t.max_cqs == 0 || t.max_pds == 0 || t.max_connections == 0 {
            return Err("max_qps, max_cqs, max_pds and max_connections must allow at least one".into());
        }
        if config.daemon.max_connections == 0 {
            return Err("[daemon] max_connections must allow at least one".into());
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<DaemonConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        DaemonConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_it_names_and_refuses_what_it_does_not_know() {
        let c = DaemonConfig::parse("[tenant]\nmax_qps = 2\nmax_rate_gbps = 1.5\n").unwrap();
        assert_eq!(c.tenant.max_qps, 2);
        assert_eq!(c.tenant.max_cqs, TenantLimits::default().max_cqs);
        assert_eq!(c.tenant.rate_bits_per_second(), Some(1_500_000_000));
        let e = DaemonConfig::parse("[tenant]\nmax_qp = 2\n").unwrap_err();
        assert!(e.contains("unknown field `max_qp`"), "{e}");
        assert!(DaemonConfig::parse("[tenant]\nmax_rate_gbps = -1\n").unwrap_err().contains("positive"));
        assert!(DaemonConfig::parse("[tenant]\nmax_pds = 0\n").is_err());
        assert_eq!(DaemonConfig::parse("").unwrap(), DaemonConfig::default());
        let d = DaemonConfig::parse("[daemon]\nmax_connections = 2\nallow_uids = [1000]\n").unwrap().daemon;
        assert_eq!((d.max_connections, d.allow_uids.as_slice()), (2, &[1000][..]));
        assert!(DaemonConfig::parse("[daemon]\nmax_connections = 0\n").is_err());
    }

    #[test]
    fn only_allowed_users_and_only_so_many_programs_are_admitted() {
        let limits = DaemonLimits { max_connections: 2, allow_uids: vec![1000] };
        assert!(limits.admit_user(1000, 1000).is_ok() && limits.admit_user(0, 1000).is_ok());
        assert!(limits.admit_user(1000, 0).is_ok(), "allowed by the file");
        let refused = limits.admit_user(1001, 0).unwrap_err();
        assert!(refused.contains("uid 1001 is none of them") && refused.contains("allow_uids"), "{refused}");
        assert!(limits.admit_connection(1).is_ok());
        assert!(limits.admit_connection(2).unwrap_err().contains("at most 2 programs at once"));
    }

    #[test]
    fn a_containers_programs_share_its_limits_and_a_failed_verb_gives_back() {
        let limits = TenantLimits { max_qps: 2, ..TenantLimits::default() };
        let accounts = Accounts::new(limits);
        let (first, second) = (accounts.usage(Some(7)), accounts.usage(Some(7)));
        assert!(Arc::ptr_eq(&first, &second), "one container, one usage");
        first.reserve(Resource::Qps, 1).unwrap().keep();
        second.reserve(Resource::Qps, 1).unwrap().keep();
        let refused = first.reserve(Resource::Qps, 1).unwrap_err();
        assert!(refused.message.contains("this container (all its programs together) may hold at most 2 QPs"));
        // Programs on their own, and another container, are apart.
        accounts.usage(None).reserve(Resource::Qps, 2).unwrap().keep();
        accounts.usage(Some(8)).reserve(Resource::Qps, 2).unwrap().keep();
        // A reservation not kept (the verb failed) is given back.
        second.release(Resource::Qps, 1);
        drop(second.reserve(Resource::Qps, 1).unwrap());
        assert_eq!(first.held(Resource::Qps), 1);
        let memory = first.reserve(Resource::Memory, limits.max_memory_bytes() + 1).unwrap_err();
        assert!(memory.message.contains("MiB registered"), "{}", memory.message);
    }

    #[test]
    fn programs_of_a_container_reserving_at_once_never_pass_its_limit() {
        // Eight threads (a container's programs) create and free QPs as
        // fast as they can against a limit of 5; a count kept beside the
        // usage never sees more than 5 held, and everything comes back.
        let accounts = Accounts::new(TenantLimits { max_qps: 5, ..TenantLimits::default() });
        let live = std::sync::atomic::AtomicU64::new(0);
        let (granted, refused) = (std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0));
        let container = accounts.usage(Some(42));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let usage = accounts.usage(Some(42));
                    assert!(Arc::ptr_eq(&usage, &container));
                    for _ in 0..2000 {
                        match usage.reserve(Resource::Qps, 1) {
                            Ok(r) => {
                                r.keep();
                                let now = live.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                                assert!(now <= 5, "{now} QPs held against a limit of 5");
                                granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                                usage.release(Resource::Qps, 1);
                            }
                            Err(_) => {
                                refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(granted.into_inner() + refused.into_inner(), 16_000);
        assert_eq!(container.held(Resource::Qps), 0, "all given back");
    }
}
