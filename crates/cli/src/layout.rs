//! Where softrnic's pieces are, relative to this `softrnic`: the one
//! place `softrnic run`, `softrnic env`, `softrnic doctor` and the
//! experiments ask for the drop-in `libibverbs.so.1` and `librdmacm.so.1`
//! and for softrnicd.
//!
//! | layout | programs | libraries |
//! | --- | --- | --- |
//! | installed (the Debian package, `scripts/package.sh --prefix`) | `PREFIX/bin` | `PREFIX/lib/softrnic` |
//! | a build tree (`scripts/build-libibverbs.sh`) | `target/release` | `target/softrnic/lib` |
//!
//! The libraries are never put where the system's rdma-core is: a program
//! gets them only through `LD_LIBRARY_PATH`, for the programs it is asked
//! to run.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where the libraries may be, from this binary's directory, in order.
const LIBRARY_DIRS: [&str; 2] = ["../lib/softrnic", "../softrnic/lib"];

/// This binary's directory.
fn bin_dir() -> Option<PathBuf> {
    Some(std::env::current_exe().ok()?.parent()?.to_path_buf())
}

/// The directory holding softrnic's `libibverbs.so.1`, if there is one.
pub fn dir() -> Option<PathBuf> {
    let bin = bin_dir()?;
    LIBRARY_DIRS.iter().filter_map(|d| bin.join(d).canonicalize().ok()).find(|d| d.join("libibverbs.so.1").exists())
}

/// [`dir`], else where a build tree would have them (where the
/// experiments' errors tell a user to look).
pub fn dir_or_build_tree() -> PathBuf {
    dir().or_else(|| Some(bin_dir()?.join(LIBRARY_DIRS[1]))).unwrap_or_else(|| PathBuf::from(LIBRARY_DIRS[1]))
}

/// Why [`dir`] found nothing, and what gives the libraries.
pub fn missing() -> String {
    let looked: Vec<String> = match bin_dir() {
        Some(bin) => LIBRARY_DIRS.iter().map(|d| bin.join(d).display().to_string()).collect(),
        None => vec!["(softrnic cannot find its own path)".into()],
    };
    format!(
        "no drop-in libibverbs.so.1 for this softrnic (looked in {}): install the Debian package \
         (scripts/package.sh), or build them in a source tree with scripts/build-libibverbs.sh \
         (`cargo install` copies programs only)",
        looked.join(" and ")
    )
}

/// The softrnicd installed or built beside this `softrnic`, if any.
pub fn daemon() -> Option<PathBuf> {
    bin_dir().map(|bin| bin.join("softrnicd")).filter(|p| p.is_file())
}

/// The variables that put a program on softrnic's libraries, and let
/// them start this softrnicd on demand (`SOFTRNIC_DAEMON=start`, which
/// otherwise looks beside the program and on `PATH`): what `softrnic env`
/// prints and `softrnic run` sets. Without the libraries, why not.
pub fn program_env() -> Result<Vec<(&'static str, OsString)>, String> {
    let lib = dir().ok_or_else(missing)?;
    let mut vars = vec![("LD_LIBRARY_PATH", search_path(&lib, std::env::var_os("LD_LIBRARY_PATH")))];
    if let Some(daemon) = daemon() {
        vars.push((softrnic_provider::launch::BIN_ENV, daemon.into_os_string()));
    }
    Ok(vars)
}

/// `LD_LIBRARY_PATH` with `lib` first, before whatever `old` held.
pub fn search_path(lib: &Path, old: Option<OsString>) -> OsString {
    let mut joined = lib.as_os_str().to_owned();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        joined.push(":");
        joined.push(old);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_come_first_and_an_empty_path_adds_no_colon() {
        let lib = Path::new("/opt/softrnic/lib");
        assert_eq!(search_path(lib, None), "/opt/softrnic/lib");
        assert_eq!(search_path(lib, Some("".into())), "/opt/softrnic/lib");
        assert_eq!(search_path(lib, Some("/usr/local/lib".into())), "/opt/softrnic/lib:/usr/local/lib");
    }

    #[test]
    fn the_test_build_finds_the_build_trees_libraries_or_names_both_places() {
        // The tests run a build tree's binary: its libraries are there when
        // scripts/build-libibverbs.sh ran for this profile.
        match dir() {
            Some(lib) => assert!(lib.ends_with("softrnic/lib"), "{}", lib.display()),
            None => {
                let said = missing();
                assert!(said.contains("lib/softrnic") && said.contains("softrnic/lib"), "{said}");
            }
        }
    }
}
