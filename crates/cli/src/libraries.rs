//! Where the drop-in `libibverbs.so.1` and `librdmacm.so.1` are: the one
//! place `softrnic run`, `softrnic env` and `softrnic doctor` ask.
//! `scripts/build-libibverbs.sh` puts them in `softrnic/lib` beside the
//! build's `release` (or `debug`) directory, that is `../softrnic/lib`
//! from this binary.

use std::ffi::OsString;
use std::path::PathBuf;

/// The directory holding softrnic's `libibverbs.so.1`, if built.
pub fn dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.join("../softrnic/lib").canonicalize().ok()?;
    lib.join("libibverbs.so.1").exists().then_some(lib)
}

/// What to build when [`dir`] finds nothing.
pub const MISSING: &str = "no drop-in libibverbs.so.1 beside this softrnic: build it with scripts/build-libibverbs.sh";

/// `LD_LIBRARY_PATH` with `lib` first, before whatever `old` held.
pub fn search_path(lib: &std::path::Path, old: Option<OsString>) -> OsString {
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
        let lib = std::path::Path::new("/opt/softrnic/lib");
        assert_eq!(search_path(lib, None), "/opt/softrnic/lib");
        assert_eq!(search_path(lib, Some("".into())), "/opt/softrnic/lib");
        assert_eq!(search_path(lib, Some("/usr/local/lib".into())), "/opt/softrnic/lib:/usr/local/lib");
    }
}
