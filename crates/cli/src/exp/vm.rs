//! E11 in virtual machines (`softrnic exp e11 --vm`): unmodified perftest
//! inside QEMU guests, guest to host and guest to guest, against host to
//! host. softrnic needs nothing of the guest's kernel, so a stock kernel
//! (Debian's cloud kernel, `linux-image-cloud-amd64`) with its virtio-net
//! driver is all a guest has: its programs open the drop-in
//! `libibverbs.so.1` and run the engine over UDP on the guest's network.
//!
//! ```text
//!   namespace srnic-vm<pid>: bridge br0 10.77.0.1 (host programs, and 10.77.0.254)
//!       ├── tap0 ── guest A (QEMU, virtio-net) 10.77.0.2
//!       └── tap1 ── guest B (QEMU, virtio-net) 10.77.0.3
//! ```
//!
//! Each guest boots the host's kernel with an initramfs this runner builds
//! from the host's installed files ([`Image`]): busybox, the virtio
//! modules, perftest's programs and `rdma_bench` with every library they
//! load (softrnic's drop-ins in place of rdma-core's), and an init that
//! loads the modules, sets its address, runs the command the kernel's
//! command line names and powers off. Under TCG (the default: on these
//! machines a KVM guest prints nothing after its boot loader) the figures
//! are function only, every byte checked by `rdma_bench`; ratios against
//! the host come from `--accel kvm` where KVM works.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::daemon::{self, E11Args, ip};
use super::figure::Series;
use super::hosts::Build;
use super::listening::wait_for_listener;
use super::namespace::{exec_in, kill_and_remove, remove_leftovers};
use super::panels;

/// How QEMU runs a guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Accel {
    /// QEMU's own translator: slow, works everywhere; function only.
    #[default]
    Tcg,
    /// The kernel's virtual machines (`/dev/kvm`): the figures to compare.
    Kvm,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Tcg => "tcg",
            Accel::Kvm => "kvm",
        })
    }
}

/// The bridge's subnet, and who has which address on it: the host's
/// programs (a server per test, each with a device of its own, and the
/// host-to-host client), the two guests (guest A adds a server address
/// per test the same way).
const HOST: &str = "10.77.0.1";
const HOST_PEER: &str = "10.77.0.254";
const GUESTS: [&str; 2] = ["10.77.0.2", "10.77.0.3"];
/// The most tests a batch holds: four perftest programs and rdma_bench.
const MOST_TESTS: usize = 5;

/// Test `t`'s server address on the host, or in guest A.
fn server_addr(in_guest: bool, t: usize) -> String {
    format!("10.77.0.{}", if in_guest { 20 } else { 10 } + t)
}
/// How long a guest may run, boot to power-off (a full sweep under TCG
/// takes minutes).
const GUEST_LIMIT: Duration = Duration::from_secs(1800);
/// How long a guest may take to come up (TCG boots in seconds here).
const BOOT_LIMIT: Duration = Duration::from_secs(120);
/// The virtio modules a guest loads, in order (with what they need).
const MODULES: [&str; 2] = ["virtio_pci", "virtio_net"];

/// Where a pair's two ends run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Both on the host (in the namespace), over UDP between two addresses.
    HostHost,
    /// The client in guest A, the server on the host.
    GuestHost,
    /// The server in guest A, the client in guest B.
    GuestGuest,
}

impl Placement {
    const ALL: [Placement; 3] = [Placement::HostHost, Placement::GuestHost, Placement::GuestGuest];

    fn name(self) -> &'static str {
        match self {
            Placement::HostHost => "host-host",
            Placement::GuestHost => "guest-host",
            Placement::GuestGuest => "guest-guest",
        }
    }
}

/// The host's kernel and its modules, for the guests.
struct Kernel {
    image: PathBuf,
    modules: Vec<PathBuf>,
}

impl Kernel {
    /// The newest `/boot/vmlinuz-*` with its modules installed.
    fn find() -> Result<Kernel, String> {
        let missing = "no kernel for the guests in /boot: apt-get install linux-image-cloud-amd64";
        let mut versions: Vec<String> = std::fs::read_dir("/boot")
            .map_err(|_| missing.to_string())?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("vmlinuz-").map(str::to_string))
            .filter(|v| Path::new("/lib/modules").join(v).is_dir())
            .collect();
        versions.sort();
        let version = versions.pop().ok_or(missing)?;
        let mut modules = Vec::new();
        for module in MODULES {
            let out = Command::new("modprobe")
                .args(["-S", &version, "--show-depends", module])
                .output()
                .map_err(|e| format!("modprobe: {e} (apt-get install kmod)"))?;
            if !out.status.success() {
                return Err(format!("kernel {version} has no {module} module"));
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                // `insmod /lib/modules/.../virtio.ko` (or `builtin virtio`).
                if let Some(path) = line.strip_prefix("insmod ").and_then(|l| l.split_whitespace().next())
                    && !modules.iter().any(|m: &PathBuf| m == Path::new(path))
                {
                    modules.push(PathBuf::from(path));
                }
            }
        }
        Ok(Kernel { image: PathBuf::from("/boot").join(format!("vmlinuz-{version}")), modules })
    }
}

/// A guest's initramfs, built from the host's files.
struct Image {
    path: PathBuf,
}

/// The guest's init: modules, address, its script (`/run.sh`, added to
/// the image for each guest), power off. The kernel hands `GUEST_ADDR=`
/// and `GUEST_LIBS=` from its command line to init's environment.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
for m in $(cat /modules.list); do insmod "$m" || echo "GUEST cannot load $m"; done
ip link set lo up; ip addr add "$GUEST_ADDR/24" dev eth0; ip link set eth0 up
export LD_LIBRARY_PATH="$GUEST_LIBS" SOFTRNIC_ADDR="$GUEST_ADDR" SOFTRNIC_DAEMON=off PATH=/usr/bin:/bin
echo "GUEST UP $GUEST_ADDR after $(cut -d' ' -f1 /proc/uptime) s"
sh /run.sh; rc=$?
echo "GUEST EXIT $rc after $(cut -d' ' -f1 /proc/uptime) s"
poweroff -f
"#;

impl Image {
    /// Builds it in `dir`: busybox, `kernel`'s modules, `programs` and
    /// every library they load (`build`'s drop-ins first).
    fn build(dir: &Path, kernel: &Kernel, build: &Build, programs: &[PathBuf]) -> Result<Image, String> {
        let root = dir.join("guest-root");
        let _ = std::fs::remove_dir_all(&root);
        for sub in ["bin", "proc", "sys", "dev", "tmp", "modules"] {
            std::fs::create_dir_all(root.join(sub)).map_err(|e| e.to_string())?;
        }
        let busybox = super::roles::which("busybox").ok_or("busybox is missing: apt-get install busybox-static")?;
        copy_into(&root, &busybox, Some(Path::new("bin/busybox")))?;
        // The modules in load order, and their list for init.
        let mut list = String::new();
        for (i, module) in kernel.modules.iter().enumerate() {
            let name = format!("modules/{i:02}-{}", module.file_name().and_then(|n| n.to_str()).unwrap_or("module"));
            copy_into(&root, module, Some(Path::new(&name)))?;
            list.push_str(&format!("/{name}\n"));
        }
        std::fs::write(root.join("modules.list"), &list).map_err(|e| e.to_string())?;
        // The programs in /usr/bin; softrnic's drop-ins and every library
        // anything loads where the host has them.
        let drop_ins = ["libibverbs.so.1", "librdmacm.so.1"].map(|lib| build.lib.join(lib));
        let mut libraries = Vec::new();
        for file in programs.iter().chain(&drop_ins).chain([&busybox]) {
            libraries.extend(loaded_libraries(file, &build.lib)?);
        }
        for program in programs {
            let name = program.file_name().and_then(|n| n.to_str()).ok_or("a program without a name")?;
            copy_into(&root, program, Some(&Path::new("usr/bin").join(name)))?;
        }
        for file in drop_ins.iter().chain(&libraries) {
            copy_into(&root, file, None)?;
        }
        let init = root.join("init");
        std::fs::write(&init, INIT).map_err(|e| e.to_string())?;
        let executable = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&init, executable).map_err(|e| e.to_string())?;
        let path = dir.join("guest.cpio");
        cpio(&root, &path)?;
        let _ = std::fs::remove_dir_all(&root);
        Ok(Image { path })
    }

    /// The image with `script` as its `/run.sh`, written to `to`: a second
    /// archive after the first, which the kernel unpacks over it.
    fn with_script(&self, script: &str, to: &Path) -> Result<PathBuf, String> {
        let root = to.with_extension("root");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
        std::fs::write(root.join("run.sh"), script).map_err(|e| e.to_string())?;
        let extra = to.with_extension("script.cpio");
        cpio(&root, &extra)?;
        let _ = std::fs::remove_dir_all(&root);
        let mut image = std::fs::read(&self.path).map_err(|e| e.to_string())?;
        image.extend(std::fs::read(&extra).map_err(|e| e.to_string())?);
        let _ = std::fs::remove_file(&extra);
        std::fs::write(to, image).map_err(|e| format!("{}: {e}", to.display()))?;
        Ok(to.to_path_buf())
    }
}

/// Archives the tree `root` into `to` (newc, what the kernel unpacks).
fn cpio(root: &Path, to: &Path) -> Result<(), String> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("cd '{}' && find . | cpio -o -H newc --quiet > '{}'", root.display(), to.display()))
        .status()
        .map_err(|e| format!("cpio: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err("cpio could not write the guest's initramfs: apt-get install cpio".into()),
    }
}

/// Copies `file` (following links) into `root`, at `at` or at its own
/// absolute path.
fn copy_into(root: &Path, file: &Path, at: Option<&Path>) -> Result<(), String> {
    let to = root.join(at.unwrap_or_else(|| file.strip_prefix("/").unwrap_or(file)));
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::copy(file, &to).map(drop).map_err(|e| format!("{} into the guest: {e}", file.display()))
}

/// The libraries `file` loads (with `lib` searched first), by `ldd`.
fn loaded_libraries(file: &Path, lib: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd").arg(file).env("LD_LIBRARY_PATH", lib).output().map_err(|e| format!("ldd: {e}"))?;
    // A static program: "not a dynamic executable", and nothing to copy.
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(PathBuf::from))
        .collect())
}

/// The namespace with the bridge and the guests' taps, removed (with
/// whatever runs in it) when dropped.
struct Network {
    name: String,
}

const PREFIX: &str = "srnic-vm";

impl Network {
    fn create() -> Result<Network, String> {
        remove_leftovers(PREFIX, "e11 --vm");
        let network = Network { name: format!("{PREFIX}{}", std::process::id()) };
        let ns = network.name.as_str();
        ip(&["netns", "add", ns])?;
        for step in [["link", "set", "lo", "up"].as_slice(), &["link", "add", "br0", "type", "bridge"]] {
            ip(&[&["-n", ns], step].concat())?;
        }
        let addresses = [HOST.to_string(), HOST_PEER.to_string()].into_iter();
        for addr in addresses.chain((0..MOST_TESTS).map(|t| server_addr(false, t))) {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "br0"])?;
        }
        ip(&["-n", ns, "link", "set", "br0", "up"])?;
        for tap in ["tap0", "tap1"] {
            ip(&["-n", ns, "tuntap", "add", tap, "mode", "tap"])?;
            ip(&["-n", ns, "link", "set", tap, "master", "br0"])?;
            ip(&["-n", ns, "link", "set", tap, "up"])?;
        }
        Ok(network)
    }

    /// `program` with `args`, in the namespace, dying with the runner.
    fn command(&self, program: &Path, args: &[String]) -> Command {
        let mut command = exec_in(&self.name, program);
        command.args(args);
        command
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        kill_and_remove(&self.name);
    }
}

/// One guest: a QEMU process whose serial console is its log.
struct Guest {
    child: Child,
    log: PathBuf,
    /// Its initramfs with its script, removed when it is done.
    image: PathBuf,
}

impl Guest {
    /// Boots a guest on `tap` at `addr` that runs `script`, its console
    /// into `log`.
    fn boot(lab: &Lab, (tap, addr): (usize, &str), script: &str, log: PathBuf) -> Result<Guest, String> {
        let qemu =
            super::roles::which("qemu-system-x86_64").ok_or("qemu is missing: apt-get install qemu-system-x86")?;
        let image = lab.image.with_script(script, &log.with_extension("cpio"))?;
        let append = format!("console=ttyS0 quiet panic=-1 GUEST_ADDR={addr} GUEST_LIBS={}", lab.build.lib.display());
        // Under KVM the host's CPU, as a user's guest would have it.
        let cpu = match lab.accel {
            Accel::Kvm => "host",
            Accel::Tcg => "qemu64",
        };
        let args: Vec<String> = [
            "-accel",
            &lab.accel.to_string(),
            "-cpu",
            cpu,
            "-m",
            "1024",
            "-nographic",
            "-no-reboot",
            "-kernel",
            &lab.kernel.image.display().to_string(),
            "-initrd",
            &image.display().to_string(),
            "-append",
            &append,
            "-netdev",
            &format!("tap,id=n0,ifname=tap{tap},script=no,downscript=no"),
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac=52:54:00:77:00:{:02x}", 2 + tap),
        ]
        .map(String::from)
        .into();
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = lab
            .network
            .command(&qemu, &args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("cannot start qemu: {e}"))?;
        Ok(Guest { child, log, image })
    }

    /// Powers the guest off now, its script unfinished: an error naming
    /// its console's log.
    fn stop(mut self) -> Result<String, String> {
        super::stop_child(&mut self.child);
        let _ = std::fs::remove_file(&self.image);
        Err(format!("the guest was stopped; see {}", self.log.display()))
    }

    /// Waits for the guest to power off; its console, if its script
    /// succeeded. A guest that does not come up within [`BOOT_LIMIT`] is
    /// stopped, with what it printed.
    fn finish(mut self) -> Result<String, String> {
        let started = Instant::now();
        let text = loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break std::fs::read_to_string(&self.log).map_err(|e| format!("{}: {e}", self.log.display()));
            }
            let up = || std::fs::read_to_string(&self.log).is_ok_and(|t| t.contains("GUEST UP"));
            let elapsed = started.elapsed();
            if elapsed > GUEST_LIMIT || (elapsed > BOOT_LIMIT && !up()) {
                super::stop_child(&mut self.child);
                let what = if up() {
                    "ran past its limit"
                } else {
                    "did not come up (KVM under nested virtualization can stop a guest after its boot loader; try --accel tcg)"
                };
                break Err(format!("the guest {what}; see {}", self.log.display()));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = std::fs::remove_file(&self.image);
        let text = text?;
        match text.lines().find_map(|l| l.strip_prefix("GUEST EXIT ")) {
            Some(rest) if rest.starts_with("0 ") => Ok(text),
            Some(rest) => Err(format!("the guest's script exited {rest}; see {}", self.log.display())),
            None => Err(format!("the guest powered off without running its script; see {}", self.log.display())),
        }
    }
}

/// A shell script run on the host, in the namespace, with a device at
/// `addr`; its output in `log`.
fn host_script(network: &Network, build: &Build, addr: &str, script: &str, log: &Path) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let path = format!("PATH={}:{}", build.bin.display(), std::env::var("PATH").unwrap_or_default());
    network
        .command(Path::new("env"), &[])
        .args([
            path,
            format!("LD_LIBRARY_PATH={}", build.lib.display()),
            format!("SOFTRNIC_ADDR={addr}"),
            "SOFTRNIC_DAEMON=off".into(),
            // Two host devices would meet through shared memory; the
            // guests' only way is UDP, and so is the host's baseline.
            "SOFTRNIC_DATAPATH=udp".into(),
            "sh".into(),
            "-c".into(),
            // The shell dies with the runner (or is stopped by it) and a
            // program it started would live on: it runs the script in the
            // background, in a process group of its own, and passes a
            // signal on to the whole group.
            format!("trap 'trap - INT TERM; kill 0' INT TERM; ( {script} ) & wait $!"),
        ])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("cannot start a shell in the namespace: {e}"))
}

/// One test of a batch: its server's and its client's shell scripts (a
/// run per size, the client's tried while its server is not up yet), on
/// a port and a server address of its own.
struct Test {
    name: String,
    server: String,
    client: String,
    port: u16,
    /// Where its server's device is.
    addr: String,
}

/// `command` tried until it succeeds (its server may still be booting,
/// or starting its next run), up to a minute.
fn tried(command: &str) -> String {
    format!("n=0; until {command}; do n=$((n + 1)); [ $n -ge 60 ] && exit 1; sleep 1; done")
}

/// The shell lines that run `test`'s client in a guest, marked so the
/// console can be split by test.
fn client_lines(test: &Test) -> String {
    format!("echo '=== {}'\n( {} ) || exit 1\n", test.name, test.client)
}

/// The shell lines that start `test`'s server in guest A, in the
/// background, on an address of its own.
fn server_lines(test: &Test) -> String {
    format!("ip addr add {addr}/24 dev eth0\n( export SOFTRNIC_ADDR={addr}; {} ) &\n", test.server, addr = test.addr)
}

/// A console split at the `=== name` lines: each test's part.
fn sections(text: &str, name: &str) -> String {
    let marker = format!("=== {name}");
    let after = text.split_once(&marker).map_or("", |(_, rest)| rest);
    after.split("\n=== ").next().unwrap_or("").to_string()
}

/// Everything a placement's batch needs.
struct Lab<'a> {
    network: &'a Network,
    kernel: &'a Kernel,
    image: &'a Image,
    accel: Accel,
    build: &'a Build,
    logs: &'a Path,
}

impl Lab<'_> {
    fn log(&self, placement: Placement, end: &str) -> PathBuf {
        self.logs.join(format!("{}_{end}.log", placement.name()))
    }

    /// Runs every test placed as `placement`: one guest boot for all of
    /// them (two for guest to guest). Each test's client output, and all
    /// servers' output together.
    fn batch(&self, placement: Placement, tests: &[Test]) -> Result<(Vec<String>, String), String> {
        match placement {
            Placement::HostHost => {
                let (mut clients, mut servers) = (Vec::new(), String::new());
                for test in tests {
                    let (mut server, server_log) = self.host_server(placement, test)?;
                    let client_log = self.logs.join(format!("{}_{}_client.log", placement.name(), test.name));
                    let mut client = host_script(self.network, self.build, HOST_PEER, &test.client, &client_log)?;
                    let client_text = daemon::finish(&mut client, &client_log, GUEST_LIMIT);
                    if client_text.is_err() {
                        super::stop_child(&mut server);
                    }
                    clients.push(client_text?);
                    servers.push_str(&daemon::finish(&mut server, &server_log, Duration::from_secs(30))?);
                }
                Ok((clients, servers))
            }
            Placement::GuestHost => {
                let mut servers = Vec::new();
                for test in tests {
                    match self.host_server(placement, test) {
                        Ok(server) => servers.push(server),
                        Err(e) => {
                            servers.iter_mut().for_each(|(child, _)| super::stop_child(child));
                            return Err(e);
                        }
                    }
                }
                let script: String = tests.iter().map(client_lines).collect();
                let console = Guest::boot(self, (0, GUESTS[0]), &script, self.log(placement, "client"))?.finish();
                let mut server_text = String::new();
                for (child, log) in &mut servers {
                    if console.is_err() {
                        super::stop_child(child);
                    }
                    server_text.push_str(&daemon::finish(child, log, Duration::from_secs(30)).unwrap_or_default());
                }
                let console = console?;
                Ok((tests.iter().map(|t| sections(&console, &t.name)).collect(), server_text))
            }
            Placement::GuestGuest => {
                // The servers together in the background, then wait.
                let script: String = tests.iter().map(server_lines).chain(["wait\n".into()]).collect();
                let server = Guest::boot(self, (0, GUESTS[0]), &script, self.log(placement, "server"))?;
                let script: String = tests.iter().map(client_lines).collect();
                let client =
                    Guest::boot(self, (1, GUESTS[1]), &script, self.log(placement, "client")).and_then(Guest::finish);
                // A client that failed leaves servers waiting for it in
                // guest A: stop it rather than wait out its limit.
                let server = if client.is_ok() { server.finish() } else { server.stop() };
                let console = client?;
                Ok((tests.iter().map(|t| sections(&console, &t.name)).collect(), server?))
            }
        }
    }

    /// `test`'s server on the host, listening; and its log.
    fn host_server(&self, placement: Placement, test: &Test) -> Result<(Child, PathBuf), String> {
        let log = self.logs.join(format!("{}_{}_server.log", placement.name(), test.name));
        let mut child = host_script(self.network, self.build, &test.addr, &test.server, &log)?;
        if let Err(e) = wait_for_listener(&mut child, test.port, Duration::from_secs(30)) {
            super::stop_child(&mut child);
            return Err(format!("{e}; see {}", log.display()));
        }
        Ok((child, log))
    }
}

/// The batch: each perftest program over its sizes, and `rdma_bench`
/// (whose server checks every byte), their servers in guest A or on the
/// host.
fn tests(programs: &[&str], quick: bool, accel: Accel, in_guest: bool) -> Vec<Test> {
    let base = 23_500 + (std::process::id() % 1000) as u16;
    // Under TCG the runs check function: few iterations. A translated
    // guest runs tens of times slower than the host and loses its core for
    // long stretches on a busy one; perftest's default ACK timeout (14:
    // 67 ms, 7 tries) once gave up on a live peer there, guest to guest.
    // 18 waits 1.07 s a try, as a QP across a slow fabric would be set.
    let (iterations, qp_timeout) = match (quick, accel) {
        (false, Accel::Kvm) => (1000, 14),
        (true, Accel::Kvm) => (100, 14),
        (_, Accel::Tcg) => (20, 18),
    };
    let mut tests: Vec<Test> = programs
        .iter()
        .enumerate()
        .map(|(t, program)| {
            let lat = program.ends_with("_lat");
            // E11's 4 B to 1 MiB, a run each (perftest's -a goes on to
            // 8 MiB, minutes a size under TCG); one size with --quick.
            let sizes = match (quick, lat) {
                (false, _) => (2..=20).map(|p| (1u32 << p).to_string()).collect::<Vec<_>>().join(" "),
                (true, true) => "64".into(),
                (true, false) => "65536".into(),
            };
            let (port, addr) = (base + t as u16, server_addr(in_guest, t));
            let gbits = if lat { "" } else { " --report_gbits" };
            let run = format!("{program} -s $s -n {iterations} -u {qp_timeout} -p {port}{gbits}");
            Test {
                name: program.to_string(),
                server: format!("for s in {sizes}; do {run} || exit 1; done"),
                client: format!("for s in {sizes}; do {}; done", tried(&format!("{run} {addr}"))),
                port,
                addr,
            }
        })
        .collect();
    let (port, addr) = (base + programs.len() as u16, server_addr(in_guest, programs.len()));
    tests.push(Test {
        name: "rdma_bench".into(),
        server: format!("rdma_bench -nodeId 0 -port {port} -qpTimeout {qp_timeout} -serverIp {addr}"),
        client: tried(&format!(
            "rdma_bench -nodeId 1 -port {port} -packSize 4096 -numPack 200 -iterations 2 -outstanding 16 -qpTimeout {qp_timeout} -serverIp {addr}"
        )),
        port,
        addr,
    });
    tests
}

/// `softrnic exp e11 --vm`.
pub fn run(args: &E11Args) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("e11 --vm makes a network namespace and tap devices for its guests: run it as root".into());
    }
    let (quick, out, accel) = (args.common.quick, &args.common.out, args.accel);
    let build = Build::with_perftest()?;
    let programs = daemon::e11_tests(&args.tests)?;
    let (csv, logs) = daemon::output(out, "e11_vm")?;
    let kernel = Kernel::find()?;
    let mut paths: Vec<PathBuf> = programs.iter().filter_map(|t| super::roles::which(t)).collect();
    paths.push(build.bin.join("rdma_bench"));
    let image = Image::build(&logs, &kernel, &build, &paths)?;
    let network = Network::create()?;
    let lab = Lab { network: &network, kernel: &kernel, image: &image, accel, build: &build, logs: &logs };
    println!(
        "e11 --vm: {accel} guests of {}, a {} MB initramfs; host programs at {HOST} and {HOST_PEER}, guests at {} and {}",
        kernel.image.display(),
        std::fs::metadata(&image.path).map_or(0, |m| m.len() >> 20),
        GUESTS[0],
        GUESTS[1]
    );
    let mut rows = Vec::new();
    let mut series: Vec<(usize, Series)> = Vec::new();
    for placement in Placement::ALL {
        let batch = tests(&programs, quick, accel, placement == Placement::GuestGuest);
        let started = Instant::now();
        let (clients, servers) = lab.batch(placement, &batch)?;
        for (t, (test, client)) in batch.iter().zip(&clients).enumerate().take(programs.len()) {
            let lat = test.name.ends_with("_lat");
            let mut points = Vec::new();
            for row in daemon::result_rows(client).iter().filter(|r| (4.0..=1048576.0).contains(&r[0])) {
                let (value, unit) = if lat { (row[4], "us") } else { (row[3], "gbps") };
                rows.push(format!("{},{accel},{},{},{value},{unit}", placement.name(), test.name, row[0]));
                points.push((row[0], value));
            }
            if points.is_empty() {
                return Err(format!("{} {}: no result rows; see {}", test.name, placement.name(), logs.display()));
            }
            series.push((t, Series { name: placement.name().to_string(), points }));
        }
        if !servers.contains("Data verification success") {
            return Err(format!(
                "rdma_bench {}: the server verified nothing; see {}",
                placement.name(),
                logs.display()
            ));
        }
        rows.push(format!("{},{accel},rdma_bench,4096,400,verified", placement.name()));
        println!(
            "e11 --vm: {}: {} ran, and rdma_bench's server verified every byte of 400 messages of 4 KiB ({:.1} s)",
            placement.name(),
            programs.join(", "),
            started.elapsed().as_secs_f64()
        );
    }
    drop(network);
    daemon::write_csv(&csv, "placement,accel,test,size,value,unit", &rows)?;
    let panels = daemon::e11_panels(&programs, &series);
    let figure = out.join("e11_vm_figure.svg");
    let title =
        format!("E11 in virtual machines ({accel}): perftest guest to host and guest to guest, against host to host");
    panels::write(&figure, &title, &panels)?;
    print_summary(accel, &programs, &rows);
    println!("wrote {}, {} and the logs in {}", csv.display(), figure.display(), logs.display());
    Ok(())
}

/// Guest against host at 64 B and 64 KiB, where both were measured;
/// under TCG no ratio at all (QEMU's translator, not the design, would be
/// measured).
fn print_summary(accel: Accel, tests: &[&str], rows: &[String]) {
    if accel == Accel::Tcg {
        println!(
            "\ne11 --vm under TCG: every test ran and rdma_bench verified every byte; the figures are QEMU's \
             translator's, not ratios (run --accel kvm where KVM works)"
        );
        return;
    }
    let value = |placement: &str, test: &str, size: f64| daemon::e11_value(rows, placement, test, size);
    println!("\nE11 in virtual machines (KVM), against host to host:");
    for test in tests {
        for size in [64.0, 65536.0] {
            if let (Some(h), Some(gh), Some(gg)) =
                (value("host-host", test, size), value("guest-host", test, size), value("guest-guest", test, size))
            {
                println!(
                    "  {test:13} {size:>6} B: host {h:.3}, guest-host {gh:.3} ({:.2}x), guest-guest {gg:.3} ({:.2}x)",
                    gh / h,
                    gg / h
                );
            }
        }
    }
}
