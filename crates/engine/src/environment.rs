//! The engine's settings from the environment: every `SOFTRNIC_*` variable
//! the engine honours is read here and nowhere else, each checked, and a
//! value that does not parse is an error that names the variable and says
//! what to give. README.md's table of variables documents them, defaults
//! included (a test below checks it names each one).
//!
//! [`EngineConfig::from_env`](crate::EngineConfig::from_env) reads them
//! all, so a device opened from the environment refuses a bad value before
//! anything starts; the functions here serve what reads one alone (a
//! bench's flags fall back to them, a front end's connection options).

use std::time::Duration;

use softrnic_transport::{CongestionConfig, Retransmission};

use crate::datapath::DatapathKind;
use crate::faults::{FaultConfig, parse_probability};
use crate::progress::ProgressMode;

/// Every variable this module reads.
pub const VARIABLES: &[&str] = &[
    ENGINE_THREADS,
    DATAPATH,
    PROGRESS,
    RETRANSMISSION,
    SELECTIVE_REPEAT,
    CC,
    CC_PARAMS,
    INT,
    LINE_RATE,
    BASE_RTT,
    LOSS,
    REORDER,
    DUPLICATE,
    CORRUPT,
    ECN,
    NO_GSO,
    NO_ONE_COPY,
    TRACE,
    AUTH_KEY,
];

const ENGINE_THREADS: &str = "SOFTRNIC_ENGINE_THREADS";
const DATAPATH: &str = "SOFTRNIC_DATAPATH";
const PROGRESS: &str = "SOFTRNIC_PROGRESS";
const RETRANSMISSION: &str = "SOFTRNIC_RETRANSMISSION";
const SELECTIVE_REPEAT: &str = "SOFTRNIC_SELECTIVE_REPEAT";
const AUTH_KEY: &str = "SOFTRNIC_AUTH_KEY";
const CC: &str = "SOFTRNIC_CC";
const CC_PARAMS: &str = "SOFTRNIC_CC_PARAMS";
const INT: &str = "SOFTRNIC_INT";
const LINE_RATE: &str = "SOFTRNIC_LINE_RATE";
const BASE_RTT: &str = "SOFTRNIC_BASE_RTT";
const LOSS: &str = "SOFTRNIC_LOSS";
const REORDER: &str = "SOFTRNIC_REORDER";
const DUPLICATE: &str = "SOFTRNIC_DUPLICATE";
const CORRUPT: &str = "SOFTRNIC_CORRUPT";
const ECN: &str = "SOFTRNIC_ECN";
const NO_GSO: &str = "SOFTRNIC_NO_GSO";
const NO_ONE_COPY: &str = "SOFTRNIC_NO_ONE_COPY";
const TRACE: &str = "SOFTRNIC_TRACE";

/// The variable's value, if set.
fn read(name: &'static str) -> Option<String> {
    debug_assert!(VARIABLES.contains(&name), "{name} is read but not listed in VARIABLES");
    std::env::var(name).ok()
}

/// The variable parsed, if set; an error names it with its value.
fn parsed<T>(name: &'static str, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>, String> {
    read(name).map(|text| parse(&text).map_err(|why| format!("{name}={text}: {why}"))).transpose()
}

/// `SOFTRNIC_ENGINE_THREADS`: shards per device, 0 to `max`; unset: the
/// caller's default.
pub fn engine_threads(max: usize) -> Result<Option<usize>, String> {
    parsed(ENGINE_THREADS, |text| match text.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("give a number of engine threads from 0 to {max}")),
    })
}

/// `SOFTRNIC_DATAPATH`, `auto` when unset.
pub fn datapath() -> Result<DatapathKind, String> {
    Ok(parsed(DATAPATH, DatapathKind::parse)?.unwrap_or(DatapathKind::Auto))
}

/// `SOFTRNIC_PROGRESS`, `auto` when unset.
pub fn progress() -> Result<ProgressMode, String> {
    Ok(parsed(PROGRESS, ProgressMode::parse)?.unwrap_or(ProgressMode::Auto))
}

/// `SOFTRNIC_RETRANSMISSION`, `fixed` when unset.
pub fn retransmission() -> Result<Retransmission, String> {
    Ok(parsed(RETRANSMISSION, Retransmission::parse)?.unwrap_or(Retransmission::Fixed))
}

/// `SOFTRNIC_SELECTIVE_REPEAT`: whether connections ask for selective
/// repeat unless the program says (ECE, or the Rust API's connect
/// options); off when unset.
pub fn selective_repeat() -> Result<bool, String> {
    Ok(parsed(SELECTIVE_REPEAT, |text| match text {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err("give 1 (selective repeat) or 0 (go-back-N)".to_string()),
    })?
    .unwrap_or(false))
}

/// `SOFTRNIC_AUTH_KEY`: the secret the hosts share for packet
/// authentication ([`softrnic_transport::auth`]), at least 16 bytes. Set,
/// connections authenticate their packets where both ends offer it (ECE,
/// or the Rust API's connect options); unset, none does. The error never
/// repeats the secret.
pub fn auth_key() -> Result<Option<softrnic_transport::AuthKey>, String> {
    read(AUTH_KEY)
        .map(|secret| softrnic_transport::AuthKey::from_secret(&secret).map_err(|why| format!("{AUTH_KEY}: {why}")))
        .transpose()
}

/// What the environment says of a device's congestion control:
/// `SOFTRNIC_CC` and `SOFTRNIC_CC_PARAMS` (no algorithm when unset),
/// `SOFTRNIC_INT`, `SOFTRNIC_LINE_RATE` and `SOFTRNIC_BASE_RTT`; what is
/// unset keeps its value.
pub fn congestion(config: &mut CongestionConfig) -> Result<(), String> {
    let params = read(CC_PARAMS).unwrap_or_default();
    config.algorithm = match read(CC) {
        Some(name) => crate::congestion::choose(&name, &params).map_err(|e| format!("{CC}={name}: {e}"))?,
        None if params.is_empty() => None,
        None => return Err(format!("{CC_PARAMS} is set but {CC} is not: name the algorithm too")),
    };
    // `on` carries in-band telemetry whatever the device's own algorithm
    // (so a peer's HPCC sees this path).
    config.int = parsed(INT, |text| match text {
        "off" | "0" => Ok(false),
        "on" | "1" => Ok(true),
        _ => Err("give on or off".to_string()),
    })?
    .unwrap_or(false);
    if let Some(rate) = parsed(LINE_RATE, crate::congestion::parse_gbps)? {
        config.line_rate_bps = rate;
    }
    let rtt = parsed(BASE_RTT, |text| match text.parse::<f64>() {
        Ok(us) if us > 0.0 && us < 1e7 => Ok(Duration::from_nanos((us * 1e3) as u64)),
        _ => Err("give the path's round trip in µs, e.g. 50".to_string()),
    })?;
    if let Some(rtt) = rtt {
        config.base_rtt = rtt;
    }
    Ok(())
}

/// `SOFTRNIC_LOSS`, `SOFTRNIC_REORDER`, `SOFTRNIC_DUPLICATE` and
/// `SOFTRNIC_CORRUPT`: probabilities, 0 when unset.
pub fn faults() -> Result<FaultConfig, String> {
    let probability = |name| Ok::<_, String>(parsed(name, parse_probability)?.unwrap_or(0.0));
    Ok(FaultConfig {
        loss: probability(LOSS)?,
        reorder: probability(REORDER)?,
        duplicate: probability(DUPLICATE)?,
        corrupt: probability(CORRUPT)?,
    })
}

/// The ECN field datagrams leave with (RFC 3168's codepoints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecn {
    /// Not-ECT: no switch marks them.
    Off,
    /// ECT(0), the default: a congested switch marks them.
    Capable,
    /// Every datagram leaves marked CE, as if a congested switch had, to
    /// drive a peer's notification point with no switch in between.
    Congested,
}

/// `SOFTRNIC_ECN`: `ect0` (the default), `off` or `ce`.
pub fn ecn() -> Result<Ecn, String> {
    Ok(parsed(ECN, |text| match text {
        "ect0" => Ok(Ecn::Capable),
        "off" | "0" => Ok(Ecn::Off),
        "ce" => Ok(Ecn::Congested),
        _ => Err("give ect0, off or ce".to_string()),
    })?
    .unwrap_or(Ecn::Capable))
}

/// Whether sockets may use UDP GSO and GRO: unless `SOFTRNIC_NO_GSO` is
/// set.
pub fn offloads() -> bool {
    read(NO_GSO).is_none()
}

/// Whether regions are registered on memfds that devices on this host
/// copy payloads straight out of (one copy): unless `SOFTRNIC_NO_ONE_COPY`
/// is set, when payloads cross the shared-memory rings.
pub fn one_copy() -> bool {
    read(NO_ONE_COPY).is_none()
}

/// Whether every datagram is printed (`SOFTRNIC_TRACE`).
pub fn trace() -> bool {
    read(TRACE).is_some()
}

/// Whether this runs under CI (`CI=true`), where a test that needs root
/// must run rather than skip (CI's variable, not one of softrnic's).
pub fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_documents_every_variable_the_engine_reads() {
        let readme = include_str!("../../../README.md");
        for name in VARIABLES {
            assert!(readme.contains(&format!("`{name}`")), "README.md's table of variables lacks {name}");
        }
    }

    #[test]
    fn no_other_file_of_the_engine_reads_the_environment() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name() == Some("environment.rs".as_ref()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| l.contains("env::var")) {
                // The run-time directory follows XDG, not softrnic.
                assert!(line.contains("XDG_RUNTIME_DIR"), "{}: reads the environment: {line}", path.display());
            }
        }
    }
}
