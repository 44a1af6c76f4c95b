//! softrnicd: runs softrnic's engine for every program of this host (and
//! its containers) that opens a device through it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use softrnic_daemon::limits::DaemonConfig;
use softrnic_daemon::server::{Daemon, DaemonOptions};
use softrnic_daemon::socket_path;

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
    /// Per-tenant limits (a TOML file with a [tenant] table: max_qps,
    /// max_cqs, max_mrs, max_pds, max_memory_mib, max_rate_gbps).
    #[arg(long)]
    config: Option<PathBuf>,
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
    let options = DaemonOptions {
        socket: args.socket.unwrap_or_else(socket_path::default_path),
        engine_threads: usize::from(args.cores),
        config,
    };
    let running = match Daemon::bind(options).and_then(Daemon::start) {
        Ok(running) => running,
        Err(e) => {
            eprintln!("softrnicd: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("softrnicd: listening on {}", running.socket().display());
    running.wait();
    ExitCode::SUCCESS
}
