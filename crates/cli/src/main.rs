//! `softrnic`: the command-line face of the software RNIC.
//!
//! With no arguments it runs the main job: `softrnic bench write_bw`, a
//! 64 KiB RDMA WRITE bandwidth test between two devices on this machine,
//! each on its own loopback address.

mod addr;
mod agg;
mod bench;
mod careful;
mod cdi;
mod demo;
mod devinfo;
mod doctor;
mod env;
mod exp;
mod lab;
mod layout;
mod manuals;
mod run;
mod sim;
mod storage;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "softrnic",
    version = env!("SOFTRNIC_VERSION"),
    about = "An RDMA NIC in software: RoCEv2 over UDP, the verbs API, no kernel module"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a perftest-style benchmark (send_bw, write_bw, read_bw,
    /// atomic_bw, send_lat, write_lat, read_lat, atomic_lat).
    Bench(bench::params::BenchArgs),
    /// In-network aggregation's programs: a job's parameter server, and
    /// workers that sum tensors through the lab's switch.
    Agg(agg::AggArgs),
    /// Show a device's address, GID, limits and counters.
    Devinfo(devinfo::DevinfoArgs),
    /// Write a Container Device Interface spec (softrnic.dev/rdma=softrnic0)
    /// that gives containers the host softrnicd's socket and the drop-in
    /// libraries: no device node, capability or privilege.
    Cdi(cdi::CdiArgs),
    /// Print the shell completion script for softrnic:
    /// softrnic completions bash > ~/.local/share/bash-completion/completions/softrnic
    Completions(manuals::CompletionsArgs),
    /// Check that this machine has what softrnic needs, and say how to
    /// fix what it lacks (one line per check).
    Doctor(doctor::DoctorArgs),
    /// Print the shell lines that put unmodified RDMA programs on
    /// softrnic: eval "$(softrnic env --addr 127.0.0.2)".
    Env(env::EnvArgs),
    /// Run the transport between two simulated RNICs over a faulty network.
    Demo(demo::DemoArgs),
    /// Throughput the careful way (E9): one end of a run, over softrnic
    /// SEND or WRITE or a plain TCP socket.
    Careful(careful::CarefulArgs),
    /// Run an evaluation (`softrnic exp` lists them): its sweep, a CSV,
    /// the logs and an SVG figure.
    #[command(after_help = exp::NOT_COMMANDS)]
    Exp(exp::ExpArgs),
    /// The network lab: hosts in network namespaces joined by softrnic's
    /// software switch; runs a command on each host (needs root).
    Lab(lab::LabArgs),
    /// Run a program with the kernel's RDMA paths showing softrnic0
    /// (/sys/class/infiniband, /dev/infiniband) and the drop-in library:
    /// ibstat, ibstatus, UCX.
    Run(run::RunArgs),
    /// Write the manual pages and shell completions of softrnic, softrnicd
    /// and rdma_bench (the package's build runs it).
    #[command(hide = true)]
    Manuals(manuals::ManualsArgs),
    /// E7's block-storage service, either end: 4 KiB blocks with a CRC-32
    /// each, written and read back, with the CRC and the copy done by the
    /// applications, or offloaded to softrnicd, or over kernel TCP.
    Storage(storage::StorageArgs),
    /// Run the simulator on fresh seeds for a while (softrnic sim --for
    /// 1h): every failing seed, with the line that replays it.
    Sim(sim::SimArgs),
}

fn main() {
    end_quietly_on_a_closed_pipe();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or_else(|| {
        let args = Cli::parse_from(["softrnic", "bench", "write_bw"]);
        args.command.expect("bench is a command")
    });
    let result = match command {
        Command::Bench(args) => bench::run(&args),
        Command::Agg(args) => agg::run(&args),
        Command::Devinfo(args) => devinfo::run(&args),
        Command::Cdi(args) => cdi::run(&args),
        Command::Completions(args) => manuals::completions(&args),
        Command::Doctor(args) => doctor::run(&args),
        Command::Env(args) => env::run(&args),
        Command::Demo(args) => demo::run(&args),
        Command::Careful(args) => careful::run(&args),
        Command::Storage(args) => storage::run(&args),
        Command::Exp(args) => exp::run(args),
        Command::Run(args) => run::run(&args),
        Command::Lab(args) => lab::run(&args),
        Command::Manuals(args) => manuals::manuals(&args),
        Command::Sim(args) => sim::run(&args),
    };
    if let Err(message) = result {
        eprintln!("softrnic: {message}");
        std::process::exit(1);
    }
}

/// `softrnic devinfo | head`: a reader that stops early ends the program
/// quietly, as it does `ibv_devinfo`, instead of `println!` panicking on
/// the broken pipe. Rust starts programs with SIGPIPE ignored; this gives
/// it back its default. Sockets are unaffected: the engine's are UDP, and
/// the exchange's TCP writes pass MSG_NOSIGNAL.
fn end_quietly_on_a_closed_pipe() {
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL
    // is a valid disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
