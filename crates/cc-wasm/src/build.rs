//! Building a module from its source: what the tests, the benchmark and
//! `softrnic exp e3` do with the example algorithms under `examples/cc/`,
//! and what a user does by hand (README, "Write your own algorithm").

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target user modules are built for.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// Builds the crate at `dir` for [`TARGET`] in release mode into
/// `target_dir`, and returns the module's path.
pub fn build_module(dir: &Path, target_dir: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--target", TARGET, "--target-dir"])
        .arg(target_dir)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run cargo to build {}: {e}", dir.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("target may not be installed") {
            format!("; install the target with `rustup target add {TARGET}`")
        } else {
            String::new()
        };
        return Err(format!("building {} failed{hint}:\n{stderr}", dir.display()));
    }
    let name = crate_name(dir)?.replace('-', "_");
    Ok(target_dir.join(TARGET).join("release").join(format!("{name}.wasm")))
}

/// The package name in `dir/Cargo.toml`.
fn crate_name(dir: &Path) -> Result<String, String> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("name = \"")?.strip_suffix('"').map(str::to_string))
        .ok_or_else(|| format!("{}: no package name", manifest.display()))
}

/// Whether modules can be built here: the target is installed.
pub fn target_installed() -> bool {
    Command::new("rustc")
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .is_ok_and(|o| o.status.success() && Path::new(String::from_utf8_lossy(&o.stdout).trim()).exists())
}
