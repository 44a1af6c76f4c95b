//! What one tenant may hold, from the daemon's configuration file
//! (`softrnicd --config FILE`):
//!
//! ```toml
//! [tenant]
//! max_qps = 256          # queue pairs
//! max_cqs = 256          # completion queues
//! max_mrs = 1024         # memory regions
//! max_pds = 64           # protection domains
//! max_memory_mib = 4096  # bytes registered, all regions together
//! max_rate_gbps = 10.0   # each QP's send rate; absent: line rate
//! ```
//!
//! A tenant at a limit has its verb refused with `ENOMEM`, as a device out
//! of resources refuses it.

use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    pub max_qps: u32,
    pub max_cqs: u32,
    pub max_mrs: u32,
    pub max_pds: u32,
    pub max_memory_mib: u64,
    pub max_rate_gbps: Option<f64>,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            max_qps: 4096,
            max_cqs: 4096,
            max_mrs: 16384,
            max_pds: 1024,
            max_memory_mib: 64 * 1024,
            max_rate_gbps: None,
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

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    #[serde(default)]
    pub tenant: TenantLimits,
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
        if t.max_qps == 0 || t.max_cqs == 0 || t.max_pds == 0 {
            return Err("max_qps, max_cqs and max_pds must allow at least one".into());
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
    }
}
