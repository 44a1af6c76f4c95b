//! The congestion control a device's QPs run, as users name it: a
//! built-in (`dcqcn`), a WebAssembly module (`./algo.wasm`), or `none`;
//! from the environment (`SOFTRNIC_CC`, `SOFTRNIC_CC_PARAMS`) for programs
//! on the drop-in library, from flags for `softrnic bench`. Whether the
//! device carries in-band telemetry: on for a device whose algorithm
//! steers by it (HPCC), or when `SOFTRNIC_INT=on` asks (a peer that only
//! echoes it).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use softrnic_cc_wasm::WasmAlgorithm;
use softrnic_transport::{AlgorithmSpec, Choice, CongestionConfig};

/// The algorithm `name` with `params` (`key=value,...`): `None` for
/// `none`, a module for a name that is a path (it has a `/` or ends in
/// `.wasm`), else a built-in. Errors are one line that says what to give.
pub fn choose(name: &str, params: &str) -> Result<Option<Choice>, String> {
    let choice = match name {
        "none" if params.is_empty() => return Ok(None),
        "none" => return Err("`none` takes no parameters".to_string()),
        _ if name.contains('/') || name.ends_with(".wasm") => {
            Choice(Arc::new(WasmAlgorithm::load(Path::new(name), params)?))
        }
        _ => Choice::builtin(name, params)?,
    };
    Ok(Some(choice))
}

/// The algorithm `spec` describes, made in this process (softrnicd makes
/// a program's choice again): a built-in checked as [`choose`] checks one,
/// a module compiled into the sandbox from its bytes.
pub fn from_spec(spec: &AlgorithmSpec) -> Result<Choice, String> {
    match spec {
        AlgorithmSpec::Builtin { name, params } => Choice::builtin(name, params),
        AlgorithmSpec::Module { name, bytes, params } => {
            Ok(Choice(Arc::new(WasmAlgorithm::from_bytes(name, bytes, params)?)))
        }
    }
}

/// What the environment says of a device's congestion control:
/// `SOFTRNIC_CC`, `SOFTRNIC_CC_PARAMS`, `SOFTRNIC_INT`,
/// `SOFTRNIC_LINE_RATE` and `SOFTRNIC_BASE_RTT`; what is unset keeps its
/// value.
pub fn config_from_env(config: &mut CongestionConfig) -> Result<(), String> {
    config.algorithm = from_env()?;
    config.int = int_from_env()?;
    if let Some(rate) = line_rate_from_env()? {
        config.line_rate_bps = rate;
    }
    if let Some(rtt) = base_rtt_from_env()? {
        config.base_rtt = rtt;
    }
    Ok(())
}

/// `SOFTRNIC_CC` and `SOFTRNIC_CC_PARAMS`; no algorithm when unset.
fn from_env() -> Result<Option<Choice>, String> {
    let params = std::env::var("SOFTRNIC_CC_PARAMS").unwrap_or_default();
    match std::env::var("SOFTRNIC_CC") {
        Ok(name) => choose(&name, &params).map_err(|e| format!("SOFTRNIC_CC={name}: {e}")),
        Err(_) if params.is_empty() => Ok(None),
        Err(_) => Err("SOFTRNIC_CC_PARAMS is set but SOFTRNIC_CC is not: name the algorithm too".to_string()),
    }
}

/// `SOFTRNIC_INT`: `on` to carry in-band telemetry whatever the device's
/// own algorithm (so a peer's HPCC sees this path), `off` (the default)
/// unless the algorithm steers by it.
fn int_from_env() -> Result<bool, String> {
    match std::env::var("SOFTRNIC_INT").as_deref() {
        Err(_) | Ok("off" | "0") => Ok(false),
        Ok("on" | "1") => Ok(true),
        Ok(other) => Err(format!("SOFTRNIC_INT={other}: give on or off")),
    }
}

/// `SOFTRNIC_LINE_RATE` in Gb/s: the rate algorithms start from and never
/// exceed (100 Gb/s when unset).
fn line_rate_from_env() -> Result<Option<u64>, String> {
    match std::env::var("SOFTRNIC_LINE_RATE") {
        Err(_) => Ok(None),
        Ok(text) => parse_gbps(&text).map(Some).map_err(|e| format!("SOFTRNIC_LINE_RATE={text}: {e}")),
    }
}

/// `SOFTRNIC_BASE_RTT` in µs: the path's round trip without queues, which
/// HPCC sizes its window by and Swift and TIMELY their delay targets (10 µs
/// when unset, a data-centre hop; the lab's software switch takes longer).
fn base_rtt_from_env() -> Result<Option<Duration>, String> {
    match std::env::var("SOFTRNIC_BASE_RTT") {
        Err(_) => Ok(None),
        Ok(text) => match text.parse::<f64>() {
            Ok(us) if us > 0.0 && us < 1e7 => Ok(Some(Duration::from_nanos((us * 1e3) as u64))),
            _ => Err(format!("SOFTRNIC_BASE_RTT={text}: give the path's round trip in µs, e.g. 50")),
        },
    }
}

/// A rate in Gb/s, as bits per second.
pub fn parse_gbps(text: &str) -> Result<u64, String> {
    match text.parse::<f64>() {
        Ok(g) if g > 0.0 && g.is_finite() => Ok((g * 1e9) as u64),
        _ => Err("give the link's rate in Gb/s, e.g. 25".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_built_ins_paths_or_none() {
        assert!(choose("none", "").unwrap().is_none());
        assert_eq!(choose("dcqcn", "rpg_ai_rate=10").unwrap().unwrap().name(), "dcqcn");
        let missing = choose("./nowhere.wasm", "").unwrap_err();
        assert!(missing.starts_with("./nowhere.wasm: "), "{missing}");
        assert!(choose("hpcc", "").unwrap().unwrap().wants_int());
        assert!(choose("cubic", "").unwrap_err().contains("give one of dcqcn"));
        assert_eq!(parse_gbps("25"), Ok(25_000_000_000));
        assert!(parse_gbps("fast").is_err());
    }
}
