//! The congestion control a device's QPs run, as users name it: a
//! built-in (`dcqcn`), a WebAssembly module (`./algo.wasm`), or `none`;
//! from the environment (`SOFTRNIC_CC`, `SOFTRNIC_CC_PARAMS`) for programs
//! on the drop-in library, from flags for `softrnic bench`. Whether the
//! device carries in-band telemetry: on for a device whose algorithm
//! steers by it (HPCC), or when `SOFTRNIC_INT=on` asks (a peer that only
//! echoes it).

use std::path::Path;

use softrnic_transport::{AlgorithmSpec, Choice};

/// The algorithm `name` with `params` (`key=value,...`): `None` for
/// `none`, a module for a name that is a path (it has a `/` or ends in
/// `.wasm`), else a built-in. Errors are one line that says what to give.
pub fn choose(name: &str, params: &str) -> Result<Option<Choice>, String> {
    let choice = match name {
        "none" if params.is_empty() => return Ok(None),
        "none" => return Err("`none` takes no parameters".to_string()),
        _ if name.contains('/') || name.ends_with(".wasm") => {
            module(name, ModuleSource::File(Path::new(name)), params)?
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
        AlgorithmSpec::Module { name, bytes, params } => module(name, ModuleSource::Bytes(bytes), params),
    }
}

/// Where a module's code comes from.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
enum ModuleSource<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

/// A WebAssembly module compiled into the sandbox.
#[cfg(feature = "wasm")]
fn module(name: &str, source: ModuleSource<'_>, params: &str) -> Result<Choice, String> {
    use softrnic_cc_wasm::WasmAlgorithm;
    use std::sync::Arc;
    let algorithm = match source {
        ModuleSource::File(path) => WasmAlgorithm::load(path, params)?,
        ModuleSource::Bytes(bytes) => WasmAlgorithm::from_bytes(name, bytes, params)?,
    };
    Ok(Choice(Arc::new(algorithm)))
}

/// Without the `wasm` feature (the fuzzing build leaves the sandbox out):
/// refused, saying so.
#[cfg(not(feature = "wasm"))]
fn module(name: &str, _source: ModuleSource<'_>, _params: &str) -> Result<Choice, String> {
    Err(format!(
        "{name}: this build of softrnic runs no WebAssembly modules (built without the engine's `wasm` feature)"
    ))
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
