//! Gives `softrnic --version` the commit it was built from.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    // A build outside a clone (a source package) says so.
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown commit".into());
    println!("cargo:rustc-env=SOFTRNIC_VERSION={} ({commit})", env!("CARGO_PKG_VERSION"));
    // Again when HEAD moves (a commit, a checkout), and only then: an
    // edited tree is not named (watching the index would rebuild the
    // command at every cargo run, as `git status` rewrites it).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        // The branch's own file, where it has one (a packed ref has none,
        // and a path that does not exist would rerun this every time).
        let branch = git(&["symbolic-ref", "-q", "HEAD"]).map(|head| format!("{dir}/{head}"));
        if let Some(branch) = branch.filter(|path| std::path::Path::new(path).exists()) {
            println!("cargo:rerun-if-changed={branch}");
        }
    }
}
