//! `softrnic run -- CMD ...`: runs a program with the kernel paths RDMA
//! tools read themselves, showing softrnic's device: `/sys/class/infiniband`
//! (`ibstat`, `ibstatus`, libibumad), `/sys/class/infiniband_verbs` and
//! `/dev/infiniband/uverbs-softrnic0` (UCX lists only devices it finds
//! there), with `SOFTRNIC_ADDR` and the drop-in library set.
//!
//! Nothing changes outside the program: the paths live in a mount namespace
//! of its own, made without privileges where the kernel allows user
//! namespaces, and as root otherwise. Sysfs and devtmpfs take no new
//! entries, so each directory that needs one (`/sys/class`, and `/dev`
//! when it has no `infiniband`) is covered by a tmpfs that holds the old
//! entries, bound back, beside softrnic's. The files are written into a
//! tmpfs mounted only in the namespace; its mount point is removed before
//! the program starts, so however the program ends, nothing is left.

use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The device's address (default: SOFTRNIC_ADDR).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs the command in its namespace; returns only on failure (the
/// program replaces this process).
pub fn run(args: &RunArgs) -> Result<(), String> {
    let addr = crate::addr::device_addr(args.addr, None).map_err(|_| {
        "softrnic run needs the device's address: give --addr (or SOFTRNIC_ADDR), e.g. --addr 127.0.0.2".to_string()
    })?;
    enter_namespace()?;
    let staging = std::env::temp_dir().join(format!("softrnic-run-{}", std::process::id()));
    let built = build_view(&staging, addr);
    // The mount point goes whatever happened; the mounts made from it stay.
    let _ = rustix::mount::unmount(&staging, UnmountFlags::DETACH);
    let _ = std::fs::remove_dir_all(&staging);
    built?;
    keep_counters_current(addr);
    let (program, rest) = args.command.split_first().ok_or("give the program to run after --")?;
    let mut command = std::process::Command::new(program);
    command.args(rest).env("SOFTRNIC_ADDR", addr.to_string());
    // Without the libraries the program still sees the device's files
    // (a NIC's driver may serve it); `softrnic doctor` says what is missing.
    command.envs(crate::layout::program_env().unwrap_or_default());
    let error = command.exec();
    Err(format!("cannot run {}: {error}", program.to_string_lossy()))
}

/// How often the counter files follow the engine's: as often as it
/// publishes them.
const COUNTERS_EVERY: std::time::Duration = softrnic_engine::counters_file::EVERY;

/// Forks a process that rewrites the view's counter files from what the
/// engine publishes, for as long as the program runs: tools that read
/// `/sys/class/infiniband/softrnic0/ports/1/counters` see them move. It
/// dies with the program (PR_SET_PDEATHSIG) and holds none of its
/// descriptors, so nobody waiting for the program's output waits for it.
fn keep_counters_current(addr: IpAddr) {
    // Taken before the fork: the program may run and exit before the
    // child's first instruction, and a child that asked its parent then
    // got init's pid and watched init for ever (with two busy cores, 75
    // runs of `softrnic run -- true` in 100 left one behind).
    let parent = rustix::process::getpid();
    // SAFETY: this process has one thread here, so the child may run
    // ordinary code; it never returns into the caller's (it exits).
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        // The parent (or a failed fork: the counters stay as they were).
        return;
    }
    // SAFETY: plain prctl and close_range calls on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::close_range(0, u32::MAX, 0);
    }
    // A program gone before the death signal was asked for sent none.
    if rustix::process::getppid() != Some(parent) {
        std::process::exit(0);
    }
    let class = Path::new("/sys/class");
    let mut last = std::collections::HashMap::new();
    while rustix::process::getppid() == Some(parent) {
        for (path, value) in softrnic_ibverbs::sysfs::counters_tree(addr) {
            if last.get(&path) != Some(&value) {
                let _ = std::fs::write(class.join(&path), format!("{value}\n"));
                last.insert(path, value);
            }
        }
        std::thread::sleep(COUNTERS_EVERY);
    }
    std::process::exit(0);
}

/// A mount namespace of this process's own: as root directly, otherwise
/// inside a new user namespace that maps this user to itself.
fn enter_namespace() -> Result<(), String> {
    use rustix::thread::UnshareFlags;
    let (uid, gid) = (rustix::process::getuid(), rustix::process::getgid());
    let flags = match uid.is_root() {
        true => UnshareFlags::NEWNS,
        false => UnshareFlags::NEWNS | UnshareFlags::NEWUSER,
    };
    // SAFETY: neither flag is FILES (which would split descriptor tables
    // between threads); this process has one thread here.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(|e| {
        format!(
            "softrnic run needs a mount namespace ({e}): this kernel refuses user namespaces to unprivileged users, so run it as root (sudo softrnic run ...), or allow them (sysctl kernel.unprivileged_userns_clone=1)"
        )
    })?;
    if !uid.is_root() {
        let write = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| format!("/proc/self/{file}: {e}"))
        };
        write("setgroups", "deny".into())?;
        write("uid_map", format!("{0} {0} 1", uid.as_raw()))?;
        write("gid_map", format!("{0} {0} 1", gid.as_raw()))?;
    }
    // Nothing mounted from here on may reach the host's namespace.
    rustix::mount::mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| format!("cannot make the mounts private: {e}"))
}

/// Writes softrnic's entries into a tmpfs at `staging` and mounts them
/// over the paths programs read.
fn build_view(staging: &Path, addr: IpAddr) -> Result<(), String> {
    let fail = |what: &str, e: &dyn std::fmt::Display| format!("softrnic run: {what}: {e}");
    std::fs::create_dir_all(staging).map_err(|e| fail("staging directory", &e))?;
    rustix::mount::mount("softrnic", staging, "tmpfs", MountFlags::empty(), None)
        .map_err(|e| fail("tmpfs for the view", &e))?;
    for (path, contents) in softrnic_ibverbs::sysfs::class_tree(addr) {
        let file = staging.join("class").join(path);
        std::fs::create_dir_all(file.parent().expect("a file in a directory")).map_err(|e| fail("view", &e))?;
        std::fs::write(&file, contents + "\n").map_err(|e| fail("view", &e))?;
    }
    for (path, target) in softrnic_ibverbs::sysfs::class_links(addr) {
        let link = staging.join("class").join(path);
        std::fs::create_dir_all(link.parent().expect("a link in a directory")).map_err(|e| fail("view", &e))?;
        std::os::unix::fs::symlink(target, &link).map_err(|e| fail("view", &e))?;
    }
    let dev = staging.join("dev");
    std::fs::create_dir_all(&dev).map_err(|e| fail("view", &e))?;
    std::fs::write(dev.join("uverbs-softrnic0"), "").map_err(|e| fail("view", &e))?;
    let classes = ["infiniband", "infiniband_verbs", "infiniband_mad"];
    let sys_class = Path::new("/sys/class");
    add_entries(sys_class, &staging.join("saved"), &classes.map(|c| (c, staging.join("class").join(c))))?;
    let dev_ib = Path::new("/dev/infiniband");
    match dev_ib.is_dir() {
        true => bind(&dev, dev_ib)?,
        false => add_entries(Path::new("/dev"), &staging.join("saved"), &[("infiniband", dev)])?,
    }
    // UCX takes only a device whose uverbs node is a character device. No
    // one may make one without privileges, so /dev/null stands in: nothing
    // opens it (the verbs go to softrnic's library).
    bind(Path::new("/dev/null"), &dev_ib.join("uverbs-softrnic0"))
}

/// Makes `dir` show `extra` (name, directory to bind there) beside what it
/// holds: a tmpfs over it with each old entry bound back from a copy of
/// the old mount kept at `saved` for as long as it takes.
fn add_entries(dir: &Path, saved: &Path, extra: &[(&str, PathBuf)]) -> Result<(), String> {
    let fail = |what: String, e: rustix::io::Errno| format!("softrnic run: {what}: {e}");
    std::fs::create_dir_all(saved).map_err(|e| format!("softrnic run: {}: {e}", saved.display()))?;
    rustix::mount::mount_bind_recursive(dir, saved).map_err(|e| fail(format!("keeping {}", dir.display()), e))?;
    rustix::mount::mount("softrnic", dir, "tmpfs", MountFlags::empty(), None)
        .map_err(|e| fail(format!("tmpfs over {}", dir.display()), e))?;
    let entries = std::fs::read_dir(saved).map_err(|e| format!("softrnic run: {}: {e}", saved.display()))?;
    for entry in entries.flatten() {
        let (from, to) = (entry.path(), dir.join(entry.file_name()));
        if extra.iter().any(|(name, _)| entry.file_name() == *name) {
            continue;
        }
        let kind = entry.file_type().map_err(|e| format!("softrnic run: {}: {e}", from.display()))?;
        if kind.is_symlink() {
            // A bind follows links; the link itself is copied.
            let target = std::fs::read_link(&from).map_err(|e| format!("softrnic run: {}: {e}", from.display()))?;
            std::os::unix::fs::symlink(target, &to).map_err(|e| format!("softrnic run: {}: {e}", to.display()))?;
            continue;
        }
        let made = match kind.is_dir() {
            true => std::fs::create_dir(&to),
            false => std::fs::write(&to, ""),
        };
        made.map_err(|e| format!("softrnic run: {}: {e}", to.display()))?;
        rustix::mount::mount_bind_recursive(&from, &to).map_err(|e| fail(format!("binding {}", to.display()), e))?;
    }
    for (name, source) in extra {
        let to = dir.join(name);
        std::fs::create_dir(&to).map_err(|e| format!("softrnic run: {}: {e}", to.display()))?;
        bind(source, &to)?;
    }
    rustix::mount::unmount(saved, UnmountFlags::DETACH).map_err(|e| fail(format!("releasing {}", saved.display()), e))
}

fn bind(from: &Path, to: &Path) -> Result<(), String> {
    rustix::mount::mount_bind(from, to).map_err(|e| format!("softrnic run: binding {}: {e}", to.display()))
}
