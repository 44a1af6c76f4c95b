//! Roles on other hosts, over SSH, as the seeds' automation runs them. An
//! inventory (`--hosts FILE`, TOML) says where each role runs:
//!
//! ```toml
//! [server]
//! address = "10.0.0.1"          # the role's device and sockets take this address
//! ssh = "node1.example.org"     # where SSH connects (default: the address)
//! user = "alice"                # default: SSH's own
//! key = "/home/alice/.ssh/id_ed25519"
//! port = 22
//! bin = "/opt/softrnic/bin"     # softrnic and rdma_bench (default: this build's directory)
//! lib = "/opt/softrnic/lib"     # softrnic's libibverbs.so.1 (default: this build's)
//! options = ["UserKnownHostsFile=/dev/null"]   # more `ssh -o` options
//!
//! [client]
//! address = "10.0.0.2"
//! ```
//!
//! A remote role is an `ssh` process here, whose standard input stays open
//! while the role should run. On the host a small shell wrapper starts the
//! program and watches that input: when it closes (the runner stopping the
//! role, ending, or dying) the wrapper stops the program with the same
//! SIGINT, SIGTERM, SIGKILL ladder a local role gets. So nothing is left
//! running on a host, however the runner ends.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

/// The roles every experiment has, which an inventory must place.
pub const ROLES: [&str; 2] = ["server", "client"];

/// One host of an inventory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub address: IpAddr,
    ssh: Option<String>,
    user: Option<String>,
    key: Option<PathBuf>,
    port: Option<u16>,
    bin: Option<PathBuf>,
    lib: Option<PathBuf>,
    #[serde(default)]
    options: Vec<String>,
}

/// Where each role runs.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub path: PathBuf,
    hosts: BTreeMap<String, Host>,
}

/// Where a build's programs and library are: this machine's, and each
/// host's unless its inventory entry says otherwise.
#[derive(Debug, Clone)]
pub struct Build {
    pub bin: PathBuf,
    pub lib: PathBuf,
}

impl Build {
    /// This `softrnic`'s build: its directory, and its drop-in library's
    /// ([`crate::layout`]).
    pub fn here() -> Result<Build, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find softrnic's own path: {e}"))?;
        let bin = exe.parent().ok_or("softrnic has no directory")?.to_path_buf();
        Ok(Build { lib: crate::layout::dir_or_build_tree(), bin })
    }
}

/// A fresh loopback pair for point `i` of this runner: the second octet
/// from its pid, the third from the point, and a pair no device holds yet
/// (another runner may be sweeping beside this one), so that no point
/// meets another's leftovers.
pub fn loopback_pair(i: usize) -> (String, String) {
    let pid = std::process::id() as usize;
    let free = |addr: &str| std::net::UdpSocket::bind((addr, softrnic_wire::ROCEV2_UDP_PORT)).is_ok();
    let (mut server, mut client) = (String::new(), String::new());
    for attempt in 0..100 {
        let second = 100 + (pid + attempt) % 100;
        let third = 1 + i % 250;
        (server, client) = (format!("127.{second}.{third}.1"), format!("127.{second}.{third}.2"));
        if free(&server) && free(&client) {
            break;
        }
    }
    (server, client)
}

impl Inventory {
    pub fn load(path: &Path) -> Result<Inventory, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the inventory {} ({e}): give --hosts a readable file", path.display()))?;
        Inventory::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Inventory, String> {
        let hosts: BTreeMap<String, Host> = toml::from_str(text).map_err(|e| {
            let message = e.message().to_string();
            let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
            let at = line.map_or(String::new(), |l| format!(" line {l}"));
            format!("{}{at}: {message} (see `softrnic exp e1 --help` for the inventory's fields)", path.display())
        })?;
        if let Some(stray) = hosts.keys().find(|k| !ROLES.contains(&k.as_str())) {
            return Err(format!(
                "{}: [{stray}] is no role; the experiments' roles are [server] and [client]",
                path.display()
            ));
        }
        if let Some(missing) = ROLES.iter().find(|r| !hosts.contains_key(**r)) {
            return Err(format!("{}: no [{missing}]: say which host runs the {missing}", path.display()));
        }
        Ok(Inventory { path: path.to_path_buf(), hosts })
    }

    /// The host that runs `role` (one of `ROLES`).
    pub fn host(&self, role: &str) -> &Host {
        &self.hosts[role]
    }

    /// Before a sweep: every host answers over SSH and has a softrnic
    /// build where the inventory says. The error names the host and what
    /// to fix.
    pub fn check(&self, local: &Build) -> Result<(), String> {
        for (role, host) in &self.hosts {
            let build = host.build(local);
            let files = [build.bin.join("softrnic"), build.bin.join("rdma_bench"), build.lib.join("libibverbs.so.1")];
            let test: Vec<String> = files.iter().map(|f| format!("test -e {}", quote(&f.to_string_lossy()))).collect();
            let script = format!("{} || exit 3", test.join(" && "));
            let out =
                host.ssh().arg(script).stdin(Stdio::null()).output().map_err(|e| {
                    format!("cannot run ssh ({e}): install an SSH client (apt-get install openssh-client)")
                })?;
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no answer").trim();
            match out.status.code() {
                Some(0) => {}
                Some(3) => {
                    return Err(format!(
                        "the {role}'s host {} has no softrnic build in {} and {}: copy target/release/softrnic, target/release/rdma_bench and target/softrnic/lib there, or set bin and lib in {}",
                        host.destination(),
                        build.bin.display(),
                        build.lib.display(),
                        self.path.display()
                    ));
                }
                _ => {
                    return Err(format!(
                        "cannot reach the {role}'s host {} over SSH ({said}): check its address, user, key and port in {}",
                        host.destination(),
                        self.path.display()
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Host {
    /// Where the build is on this host.
    pub fn build(&self, local: &Build) -> Build {
        Build { bin: self.bin.clone().unwrap_or(local.bin.clone()), lib: self.lib.clone().unwrap_or(local.lib.clone()) }
    }

    /// `user@host:port`, as errors and logs name it.
    pub fn destination(&self) -> String {
        let user = self.user.as_ref().map_or(String::new(), |u| format!("{u}@"));
        let host = self.ssh.clone().unwrap_or(self.address.to_string());
        format!("{user}{host}:{}", self.port.unwrap_or(22))
    }

    /// `ssh` to this host, ready for the remote command: batch mode (a
    /// password prompt would hang a sweep), a bounded connect, and the
    /// inventory's user, key, port and options.
    pub fn ssh(&self) -> Command {
        let mut ssh = Command::new("ssh");
        ssh.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=accept-new"]);
        for option in &self.options {
            ssh.args(["-o", option]);
        }
        if let Some(user) = &self.user {
            ssh.args(["-l", user]);
        }
        if let Some(key) = &self.key {
            ssh.arg("-i").arg(key);
        }
        if let Some(port) = self.port {
            ssh.args(["-p", &port.to_string()]);
        }
        ssh.arg(self.ssh.clone().unwrap_or(self.address.to_string())).arg("--");
        ssh
    }
}

/// The command a remote role's `ssh` runs: the program, with its
/// environment, stopped by the ladder once the runner closes its input.
pub fn remote_script(env: &[(String, String)], program: &str, args: &[String]) -> String {
    let words: Vec<String> = env
        .iter()
        .map(|(k, v)| quote(&format!("{k}={v}")))
        .chain(std::iter::once(quote(program)))
        .chain(args.iter().map(|a| quote(a)))
        .collect();
    // The watcher keeps SSH's input on fd 3 (sh would give a background
    // job /dev/null). The program replaces the shell, so it keeps the
    // shell's pid ($$, which the watcher knows) and runs in the
    // foreground: a background job of a non-interactive shell ignores
    // SIGINT for good, and the ladder's first step would be lost. Each
    // step waits up to 2 s, and the watcher ends with the program.
    format!(
        "exec 3<&0; \
         (while read -r _; do :; done; for s in INT TERM KILL; do kill -$s $$ || exit 0; \
         i=0; while [ $i -lt 20 ] && kill -0 $$; do sleep 0.1; i=$((i+1)); done; done) <&3 >/dev/null 2>&1 & \
         exec env {} </dev/null 3<&-",
        words.join(" ")
    )
}

/// A word for the remote shell.
fn quote(word: &str) -> String {
    // A NUL cannot be in an argument at all; nothing else fails to quote.
    shlex::try_quote(word).map_or_else(|_| "''".to_string(), |q| q.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inventory_places_both_roles() {
        let text = "[server]\naddress = \"10.0.0.1\"\nuser = \"alice\"\nport = 2222\n\n[client]\naddress = \"10.0.0.2\"\nssh = \"node2\"\n";
        let inventory = Inventory::parse(Path::new("hosts.toml"), text).unwrap();
        assert_eq!(inventory.host("server").destination(), "alice@10.0.0.1:2222");
        assert_eq!(inventory.host("client").destination(), "node2:22");
        assert_eq!(inventory.host("client").address.to_string(), "10.0.0.2");
        let local = Build { bin: "/here/bin".into(), lib: "/here/lib".into() };
        assert_eq!(inventory.host("server").build(&local).bin, Path::new("/here/bin"));
        let ssh = inventory.host("server").ssh();
        let args: Vec<_> = ssh.get_args().map(|a| a.to_string_lossy().to_string()).collect();
        assert!(args.ends_with(&["-l", "alice", "-p", "2222", "10.0.0.1", "--"].map(String::from)), "{args:?}");
    }

    #[test]
    fn a_bad_inventory_says_what_to_fix() {
        let bad = |text: &str| Inventory::parse(Path::new("hosts.toml"), text).unwrap_err();
        let e = bad("[server]\naddress = \"10.0.0.1\"\nadress = \"x\"\n[client]\naddress = \"10.0.0.2\"\n");
        assert!(e.contains("line 3") && e.contains("adress"), "{e}");
        let e = bad("[server]\naddress = \"10.0.0.1\"\n");
        assert!(e.contains("no [client]"), "{e}");
        let e = bad(
            "[server]\naddress = \"10.0.0.1\"\n[client]\naddress = \"10.0.0.2\"\n[router]\naddress = \"10.0.0.3\"\n",
        );
        assert!(e.contains("[router] is no role"), "{e}");
        let e = bad("[server]\naddress = \"node1\"\n[client]\naddress = \"10.0.0.2\"\n");
        assert!(e.contains("line 2") && e.contains("address"), "{e}");
    }

    #[test]
    fn the_remote_script_quotes_every_word_and_runs() {
        let script =
            remote_script(&[("A".into(), "x y".into())], "/bin/sh", &["-c".into(), "echo \"$A\"; exit 7".into()]);
        // The script itself, run by a local shell with input held open,
        // passes the environment, the output and the exit status on.
        let mut child =
            Command::new("/bin/sh").args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let input = child.stdin.take();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        assert_eq!(out, "x y\n");
        assert_eq!(child.wait().unwrap().code(), Some(7));
        drop(input);
    }

    #[test]
    fn closing_the_input_stops_the_remote_program() {
        let script = remote_script(
            &[],
            "/bin/sh",
            &["-c".into(), "trap 'echo stopped; exit 0' INT; while :; do sleep 0.05; done".into()],
        );
        // As sshd starts a remote shell: SIGINT not ignored, whatever this
        // test's runner was started with.
        let mut command = Command::new("/bin/sh");
        crate::exp::roles::stoppable_by_runner(&mut command);
        let mut child = command.args(["-c", &script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(child.try_wait().unwrap().is_none(), "it runs while the input is open");
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "stopped\n");
    }
}
