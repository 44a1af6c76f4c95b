//! `softrnic`: the command-line face of the software RNIC.
//!
//! With no arguments it runs the main job. Until the UDP engine and
//! `softrnic bench` exist, that is `softrnic demo`: two simulated RNICs
//! running a mix of every RC operation over a lossy network, verified byte
//! for byte.

mod demo;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "softrnic",
    version,
    about = "An RDMA NIC in software: RoCEv2 over UDP, the verbs API, no kernel module"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the transport between two simulated RNICs over a faulty network.
    Demo(demo::DemoArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Demo(demo::DemoArgs::default())) {
        Command::Demo(args) => demo::run(&args),
    };
    if let Err(message) = result {
        eprintln!("softrnic: {message}");
        std::process::exit(1);
    }
}
