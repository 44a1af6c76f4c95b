//! `softrnic cdi`: a Container Device Interface spec, so that a runtime
//! that knows CDI (podman, containerd, CRI-O, Docker 25+, Kubernetes'
//! device plugins) gives a container softrnic by name:
//!
//!     sudo softrnic cdi                      # /etc/cdi/softrnic.dev-rdma.json
//!     podman run --device softrnic.dev/rdma=softrnic0 IMAGE ib_write_bw ...
//!
//! The device's edits are mounts and variables only: the directory of the
//! host's softrnicd socket, the drop-in libraries, and the variables that
//! point the container's programs at both. No device node, capability or
//! privilege: the daemon (root, the host's unit) opens each container's
//! device in its network namespace, on the container's own address.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;

/// The kind a container asks for: `softrnic.dev/rdma=NAME`.
pub const KIND: &str = "softrnic.dev/rdma";
/// Where the host's softrnicd listens (contrib/systemd/system).
const HOST_SOCKET: &str = "/run/softrnic/softrnicd.sock";
/// Where the libraries appear inside the container.
const CONTAINER_LIBRARIES: &str = "/usr/lib/softrnic";
/// The CDI version whose features the spec uses (mounts with options,
/// environment).
const CDI_VERSION: &str = "0.6.0";

#[derive(Args, Debug)]
pub struct CdiArgs {
    /// The host softrnicd's socket, whose directory each container mounts.
    #[arg(long, default_value = HOST_SOCKET)]
    pub socket: PathBuf,
    /// The host's directory of the drop-in libraries the containers mount
    /// (default: this softrnic's own).
    #[arg(long)]
    pub libraries: Option<PathBuf>,
    /// The device's name in the spec (softrnic.dev/rdma=NAME).
    #[arg(long, default_value = "softrnic0")]
    pub device: String,
    /// Where to write softrnic.dev-rdma.json: /etc/cdi, or /var/run/cdi for
    /// a spec that should not outlive a reboot.
    #[arg(long, default_value = "/etc/cdi", conflicts_with = "print")]
    pub out: PathBuf,
    /// Print the spec instead of writing it.
    #[arg(long)]
    pub print: bool,
}

pub fn run(args: &CdiArgs) -> Result<(), String> {
    let libraries = match &args.libraries {
        // Absolute: the runtime mounts it from wherever it runs.
        Some(dir) if dir.join("libibverbs.so.1").exists() => dir.canonicalize().map_err(|e| e.to_string())?,
        Some(dir) => return Err(format!("--libraries {}: no libibverbs.so.1 there", dir.display())),
        None => crate::layout::dir().ok_or_else(crate::layout::missing)?,
    };
    let spec = spec(&args.device, &args.socket, &libraries)?;
    let text = serde_json::to_string_pretty(&spec).map_err(|e| e.to_string())? + "\n";
    if args.print {
        print!("{text}");
        return Ok(());
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let path = args.out.join("softrnic.dev-rdma.json");
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e} (root writes /etc/cdi)", path.display()))?;
    println!("{}: {KIND}={} (the daemon's socket {})", path.display(), args.device, args.socket.display());
    Ok(())
}

/// The spec: one device whose edits mount the socket's directory and the
/// libraries, and set the variables.
pub fn spec(device: &str, socket: &Path, libraries: &Path) -> Result<serde_json::Value, String> {
    if device.is_empty() || !device.chars().all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c)) {
        return Err(format!("--device {device:?}: a CDI device name is letters, digits and _ . : - (softrnic0)"));
    }
    let socket_dir = socket
        .parent()
        .filter(|d| d.is_absolute())
        .ok_or_else(|| format!("--socket {}: give the socket's absolute path", socket.display()))?;
    let name = socket.file_name().ok_or_else(|| format!("--socket {}: no file name", socket.display()))?;
    // The directory, not the socket: a daemon that restarts makes a new
    // socket there, which a bind mount of the old one would not show.
    let container_socket = Path::new("/run/softrnic").join(name);
    Ok(json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{
            "name": device,
            "containerEdits": {
                "env": [
                    format!("SOFTRNIC_DAEMON={}", container_socket.display()),
                    format!("LD_LIBRARY_PATH={CONTAINER_LIBRARIES}"),
                ],
                "mounts": [
                    { "hostPath": socket_dir, "containerPath": "/run/softrnic", "options": ["bind", "rw"] },
                    { "hostPath": libraries, "containerPath": CONTAINER_LIBRARIES, "options": ["bind", "ro"] },
                ],
            },
        }],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_mounts_the_sockets_directory_and_the_libraries() {
        let spec =
            spec("softrnic0", Path::new("/run/softrnic/softrnicd.sock"), Path::new("/usr/lib/softrnic")).unwrap();
        assert_eq!(spec["kind"], KIND);
        let edits = &spec["devices"][0]["containerEdits"];
        assert_eq!(edits["env"][0], "SOFTRNIC_DAEMON=/run/softrnic/softrnicd.sock");
        assert_eq!(edits["env"][1], "LD_LIBRARY_PATH=/usr/lib/softrnic");
        assert_eq!(edits["mounts"][0]["hostPath"], "/run/softrnic");
        assert_eq!(edits["mounts"][1]["options"][1], "ro");
        // No device node, capability or hook.
        assert!(edits.get("deviceNodes").is_none() && edits.get("hooks").is_none());
    }

    #[test]
    fn a_socket_elsewhere_keeps_its_name_under_run_softrnic() {
        let spec = spec("rdma1", Path::new("/tmp/t/d.sock"), Path::new("/opt/lib")).unwrap();
        let edits = &spec["devices"][0]["containerEdits"];
        assert_eq!(edits["env"][0], "SOFTRNIC_DAEMON=/run/softrnic/d.sock");
        assert_eq!(edits["mounts"][0]["hostPath"], "/tmp/t");
    }

    #[test]
    fn bad_names_and_relative_sockets_are_refused_with_the_fix() {
        let err = spec("soft rnic", Path::new("/run/s.sock"), Path::new("/l")).unwrap_err();
        assert!(err.contains("letters, digits"), "{err}");
        let err = spec("softrnic0", Path::new("s.sock"), Path::new("/l")).unwrap_err();
        assert!(err.contains("absolute path"), "{err}");
    }
}
