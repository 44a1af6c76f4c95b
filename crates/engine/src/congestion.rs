//! The congestion control a device's QPs run, as users name it: a
//! built-in (`dcqcn`), a WebAssembly module (`./algo.wasm`), or `none`;
//! from the environment (`SOFTRNIC_CC`, `SOFTRNIC_CC_PARAMS`) for programs
//! on the drop-in library, from flags for `softrnic bench`.

use std::path::Path;
use std::sync::Arc;

use softrnic_cc_wasm::WasmAlgorithm;
use softrnic_transport::Choice;

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
    if choice.wants_int() {
        // The UDP engine sends plain RoCEv2: no switch on its path could
        // stamp what such an algorithm steers by.
        return Err(format!(
            "{name} steers by in-band telemetry, which the UDP engine does not carry; \
             run it in the simulator (softrnic exp cc) or choose dcqcn, dctcp, timely or swift"
        ));
    }
    Ok(Some(choice))
}

/// `SOFTRNIC_CC` and `SOFTRNIC_CC_PARAMS`; no algorithm when unset.
pub fn from_env() -> Result<Option<Choice>, String> {
    let params = std::env::var("SOFTRNIC_CC_PARAMS").unwrap_or_default();
    match std::env::var("SOFTRNIC_CC") {
        Ok(name) => choose(&name, &params).map_err(|e| format!("SOFTRNIC_CC={name}: {e}")),
        Err(_) if params.is_empty() => Ok(None),
        Err(_) => Err("SOFTRNIC_CC_PARAMS is set but SOFTRNIC_CC is not: name the algorithm too".to_string()),
    }
}

/// `SOFTRNIC_LINE_RATE` in Gb/s: the rate algorithms start from and never
/// exceed (100 Gb/s when unset).
pub fn line_rate_from_env() -> Result<Option<u64>, String> {
    match std::env::var("SOFTRNIC_LINE_RATE") {
        Err(_) => Ok(None),
        Ok(text) => parse_gbps(&text).map(Some).map_err(|e| format!("SOFTRNIC_LINE_RATE={text}: {e}")),
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
        let hpcc = choose("hpcc", "").unwrap_err();
        assert!(hpcc.contains("in-band telemetry"), "{hpcc}");
        assert!(choose("cubic", "").unwrap_err().contains("give one of dcqcn"));
        assert_eq!(parse_gbps("25"), Ok(25_000_000_000));
        assert!(parse_gbps("fast").is_err());
    }
}
