//! The built-in algorithms by name, for the host: `--cc dcqcn`,
//! `SOFTRNIC_CC=hpcc`.

use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};

use crate::{CongestionControl, Dcqcn, Dctcp, FromParams, Hpcc, Params, Path, Swift, Timely};

/// The names of the built-in algorithms.
pub const BUILTINS: &[&str] = &["dcqcn", "dctcp", "timely", "hpcc", "swift"];

/// A built-in algorithm with its parameters, checked: what a device keeps
/// to give each new QP its own state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Builtin {
    name: &'static str,
    params: String,
}

impl Builtin {
    /// The algorithm called `name` with `params` (`key=value,...`), or a
    /// one-line error that says what to give instead.
    pub fn new(name: &str, params: &str) -> Result<Builtin, String> {
        let Some(&name) = BUILTINS.iter().find(|&&n| n == name) else {
            return Err(format!(
                "no congestion-control algorithm `{name}`; give one of {}, none, or the path of a .wasm module",
                BUILTINS.join(", ")
            ));
        };
        let builtin = Builtin { name, params: params.to_string() };
        // Parameters are checked once, here, against a nominal path.
        let path = Path { line_rate_bps: 100_000_000_000, base_rtt_ns: 10_000, mtu: 4096 };
        builtin.try_build(&path).map_err(|e| format!("{name}: {e}"))?;
        Ok(builtin)
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn params(&self) -> &str {
        &self.params
    }

    /// The state of a new QP on `path`.
    pub fn build(&self, path: &Path) -> Box<dyn CongestionControl + Send> {
        self.try_build(path).expect("parameters were checked when the algorithm was chosen")
    }

    fn try_build(&self, path: &Path) -> Result<Box<dyn CongestionControl + Send>, String> {
        fn boxed<A: FromParams + Send + 'static>(
            params: &Params,
            path: &Path,
        ) -> Result<Box<dyn CongestionControl + Send>, String> {
            A::from_params(params, path)
                .map(|a| Box::new(a) as Box<dyn CongestionControl + Send>)
                .map_err(|e| e.to_string())
        }
        let params = Params::new(&self.params);
        match self.name {
            "dcqcn" => boxed::<Dcqcn>(&params, path),
            "dctcp" => boxed::<Dctcp>(&params, path),
            "timely" => boxed::<Timely>(&params, path),
            "hpcc" => boxed::<Hpcc>(&params, path),
            "swift" => boxed::<Swift>(&params, path),
            _ => unreachable!("names come from BUILTINS"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_parameters_are_checked_up_front() {
        assert!(Builtin::new("dcqcn", "rpg_ai_rate=10").is_ok());
        let typo = Builtin::new("dcqcn", "rpg_ai_rat=10").unwrap_err();
        assert!(typo.starts_with("dcqcn: no parameter `rpg_ai_rat`; this algorithm takes rpg_time_reset"), "{typo}");
        let unknown = Builtin::new("cubic", "").unwrap_err();
        assert!(unknown.contains("give one of dcqcn, dctcp, timely, hpcc, swift"), "{unknown}");
    }
}
