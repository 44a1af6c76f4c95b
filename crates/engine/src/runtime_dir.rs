//! Where softrnic keeps a user's run-time files: each device's counters,
//! softrnicd's socket and log. `$XDG_RUNTIME_DIR/softrnic`, or
//! `/tmp/softrnic-<uid>` where there is no runtime directory.
//!
//! Other users share `/tmp`, so the directory is made private (mode
//! 0700) and checked before anything is written there or a socket found
//! there is trusted: a directory, not a symlink, owned by this user, with
//! no access for anyone else. One that fails is refused with what is wrong
//! and how to fix it. Before, it was a shared `/tmp/softrnic` that anyone
//! could create first and plant symlinks or a socket of their own in.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory, whether or not it exists yet.
pub fn path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(base) => PathBuf::from(base).join("softrnic"),
        None => std::env::temp_dir().join(format!("softrnic-{}", rustix::process::getuid().as_raw())),
    }
}

/// [`path`], created private if it is missing, and checked.
pub fn ensure() -> io::Result<PathBuf> {
    let dir = path();
    make_private(&dir)?;
    Ok(dir)
}

/// Creates `dir` with mode 0700 if it is missing (its parent must exist),
/// and checks that it is private to this user.
pub fn make_private(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display()))),
    }
    check_private(dir)
}

/// Whether `dir` is a directory of this user's that no one else may enter.
pub fn check_private(dir: &Path) -> io::Result<()> {
    let refuse = |why: String| {
        let fix = "remove it, or set XDG_RUNTIME_DIR to a directory of your own";
        Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{}: {why}; {fix}", dir.display())))
    };
    // Not followed: a symlink could point anywhere its maker chose.
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return refuse("a symbolic link, not softrnic's directory".into());
    }
    if !meta.is_dir() {
        return refuse("not a directory".into());
    }
    let me = rustix::process::getuid().as_raw();
    if meta.uid() != me {
        return refuse(format!("owned by uid {}, not by you (uid {me})", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return refuse(format!("mode {mode:o} lets others in (softrnic's is 700)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory of this test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("softrnic-runtime-dir-test-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn refusal(dir: &Path) -> String {
        make_private(dir).unwrap_err().to_string()
    }

    #[test]
    fn a_missing_directory_is_made_private_and_a_private_one_kept() {
        let scratch = Scratch::new("made");
        let dir = scratch.0.join("softrnic");
        make_private(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        make_private(&dir).unwrap();
    }

    #[test]
    fn a_planted_symlink_is_refused() {
        let scratch = Scratch::new("symlink");
        let target = scratch.0.join("theirs");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        let dir = scratch.0.join("softrnic");
        std::os::unix::fs::symlink(&target, &dir).unwrap();
        assert!(refusal(&dir).contains("a symbolic link"), "{}", refusal(&dir));
    }

    #[test]
    fn a_directory_others_may_enter_or_a_file_is_refused() {
        let scratch = Scratch::new("open");
        let dir = scratch.0.join("softrnic");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = refusal(&dir);
        assert!(why.contains("mode 777 lets others in") && why.contains("XDG_RUNTIME_DIR"), "{why}");
        let file = scratch.0.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(refusal(&file).contains("not a directory"), "{}", refusal(&file));
    }

    /// Another user's directory: made as root and given away, so this runs
    /// as root (CI does) and says why it skips otherwise.
    #[test]
    fn another_users_directory_is_refused() {
        if !rustix::process::geteuid().is_root() {
            assert!(!crate::environment::under_ci(), "CI runs as root and must run this test");
            eprintln!("skipped: giving a directory to another user needs root");
            return;
        }
        let scratch = Scratch::new("owner");
        let dir = scratch.0.join("softrnic");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        let why = refusal(&dir);
        assert!(why.contains("owned by uid 65534, not by you (uid 0)"), "{why}");
    }
}
