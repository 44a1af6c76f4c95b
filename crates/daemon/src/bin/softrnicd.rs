//! softrnicd: runs softrnic's engine for every program of this host (and
//! its containers) that opens a device through it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::offload::{Designs, RxDesign, TxDesign};
use softrnic_daemon::server::priority::{self, Priority};
use softrnic_daemon::server::{Daemon, DaemonOptions};

#[derive(Parser)]
#[command(version, about = "One softrnic engine serving many programs through shared memory")]
struct Args {
    /// Where to listen [default: $XDG_RUNTIME_DIR/softrnic/softrnicd.sock].
    /// Programs find it there, or through SOFTRNIC_DAEMON=PATH.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Engine threads per device: the cores the engine polls on.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    cores: u16,
    /// Command processors: threads that move the programs' work requests
    /// and completions between their rings and the engine, each serving
    /// its share of the devices (and, with inline progress, driving their
    /// engines). More spread the devices' work over more cores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    processors: u16,
    /// Per-tenant limits (a TOML file with a [tenant] table: max_qps,
    /// max_cqs, max_mrs, max_pds, max_srqs, max_memory_mib, max_rate_gbps).
    #[arg(long)]
    config: Option<PathBuf>,
    /// How a send's payload reaches the wire (E4): the engine gathers it
    /// from the program's memory (header-only), or it is first copied into
    /// the daemon's memory whole (bulk-copy) or a packet at a time
    /// (engine-copy).
    #[arg(long, value_enum, default_value_t = TxDesign::HeaderOnly)]
    tx: TxDesign,
    /// Where a receive's payload lands first (E5): in the program's buffer
    /// (direct), in a ring of the QP's own (per-connection), or in a small
    /// pool every QP shares, copied on while hot (in-cache).
    #[arg(long, value_enum, default_value_t = RxDesign::Direct)]
    rx: RxDesign,
    /// Exit after this many seconds with no program connected (a daemon
    /// started on demand, SOFTRNIC_DAEMON=start, is given 60).
    #[arg(long, value_name = "SECONDS")]
    idle_exit: Option<u64>,
    /// Its scheduling priority, a nice value from -20 (first) to 19, while
    /// the programs connected outnumber the cores. The daemon does every
    /// program's network work: where programs spinning on their CQs
    /// outnumber the cores, an even share of the CPU starves them all.
    /// Raising it takes root or CAP_SYS_NICE; without, it keeps the
    /// priority it was started with, and says so.
    #[arg(long, default_value_t = -20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    nice: i32,
    /// With the raised nice value, a real-time priority (SCHED_RR, 1 to
    /// 99) for its command processors, if they leave a core to the
    /// programs; 0 for none. A nice value is a weight, and against
    /// hundreds of spinning programs a share still starves the daemon; a
    /// real-time processor runs whenever it has work, as a core given to
    /// the engine would, and sleeps when it has none (the kernel's
    /// real-time throttle leaves the programs their share even if it did
    /// not). Takes root or CAP_SYS_NICE, and real-time time in its cgroup;
    /// without, the nice value alone, and it says so.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(0..=99))]
    realtime: i32,
    /// Its devices hand each other their datagrams through shared memory,
    /// whatever network namespace each serves, as an SR-IOV NIC's embedded
    /// switch passes traffic between its virtual functions: containers on
    /// this host talk at the speed of processes on it. Without it they
    /// talk through their namespaces' network (veth, a bridge, the lab's
    /// switch). Each device needs an address no other namespace uses.
    #[arg(long)]
    embedded_switch: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.config.as_deref().map(DaemonConfig::load).transpose() {
        Ok(config) => config.unwrap_or_default(),
        Err(e) => {
            eprintln!("softrnicd: --config {e}");
            return ExitCode::from(2);
        }
    };
    // Before the daemon's threads start, so that it knows its own.
    let realtime = (args.realtime > 0).then_some(args.realtime);
    let mut priority = Priority::new(args.nice, realtime, usize::from(args.processors));
    let options = DaemonOptions {
        socket: args.socket.unwrap_or_else(softrnic_daemon_protocol::default_socket),
        engine_threads: usize::from(args.cores),
        processors: usize::from(args.processors),
        config,
        designs: Designs { tx: args.tx, rx: args.rx },
        embedded_switch: args.embedded_switch,
    };
    let running = match Daemon::bind(options).and_then(Daemon::start) {
        Ok(running) => running,
        Err(e) => {
            eprintln!("softrnicd: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SIGINT and SIGTERM stop it cleanly: the socket file goes, and what
    // the offload designs copied is said (`softrnic exp e4` reads it).
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(signal, stop.clone()) {
            eprintln!("softrnicd: cannot handle signals: {e}");
            return ExitCode::FAILURE;
        }
    }
    eprintln!("softrnicd: listening on {} (--tx {}, --rx {})", running.socket().display(), args.tx, args.rx);
    let mut idle_since = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(priority::LOOK_EVERY);
        priority.follow(running.tenants(), &running.processor_threads());
        if running.tenants() > 0 {
            idle_since = Instant::now();
        } else if args.idle_exit.is_some_and(|s| idle_since.elapsed() >= Duration::from_secs(s)) {
            eprintln!("softrnicd: no program for {}s (--idle-exit); leaving", args.idle_exit.unwrap_or(0));
            break;
        }
    }
    eprintln!("softrnicd: {}", running.offload_stats());
    // Stopping joins the acceptor and the command processor; a thread that
    // does not stop (a bug) must not keep the daemon from exiting.
    let (stopped, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(running);
        let _ = stopped.send(());
    });
    match wait.recv_timeout(Duration::from_secs(5)) {
        Ok(()) => eprintln!("softrnicd: stopped"),
        Err(_) => eprintln!("softrnicd: its threads did not stop within 5 s; exiting anyway"),
    }
    ExitCode::SUCCESS
}
