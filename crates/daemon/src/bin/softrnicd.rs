//! softrnicd: runs softrnic's engine for every program of this host (and
//! its containers) that opens a device through it.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use softrnic_daemon::command_line::Args;
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::offload::Designs;
use softrnic_daemon::server::priority::{self, Priority};
use softrnic_daemon::server::{Daemon, DaemonOptions};

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.config.as_deref().map(DaemonConfig::load).transpose() {
        Ok(config) => config.unwrap_or_default(),
        Err(e) => {
            eprintln!("softrnicd: --config {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        return match serde_json::to_string_pretty(&config) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("softrnicd: cannot print the configuration: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
    if !running.block_counters().is_idle() {
        eprintln!("softrnicd: {}", running.block_counters());
    }
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
