//! `softrnic lab`: bring a topology up (hosts in network namespaces, the
//! software switch between them), run a command on each host, and take it
//! all down again, however the run ends.
//!
//! ```text
//! softrnic lab star:3 --bg 'h0=softrnic bench write_bw --server' \
//!                     --on 'h1=softrnic bench write_bw $h0' --on 'h2=softrnic bench write_bw $h0 -p 18516'
//! ```
//!
//! `--each COMMAND` runs one command on every host. Each command runs
//! under `sh -c` in its host's namespace, with `ADDR`
//! and `SOFTRNIC_ADDR` set to the host's address (so softrnic and the
//! drop-in libibverbs pick it), `HOST` to its name, and a variable named
//! after every host holding that host's address.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use softrnic_lab::topology::{parse_duration, parse_rate, parse_size};
use softrnic_lab::{LinkSpec, Namespaces, RunOptions, Runner, Topology};
use softrnic_switch::{AggregationConfig, RedConfig};

#[derive(Args, Debug, Clone)]
pub struct LabArgs {
    /// A topology file (TOML) or a shape: star:N, dumbbell:N,
    /// leaf-spine:LxSxH.
    pub topology: String,
    /// Run HOST=COMMAND and wait for it (repeatable).
    #[arg(long = "on", value_name = "HOST=COMMAND")]
    pub on: Vec<String>,
    /// Run COMMAND on every host and wait for each (repeatable).
    #[arg(long = "each", value_name = "COMMAND")]
    pub each: Vec<String>,
    /// Run HOST=COMMAND in the background, stopped when every --on command
    /// has ended (servers; repeatable).
    #[arg(long = "bg", value_name = "HOST=COMMAND")]
    pub bg: Vec<String>,
    /// Every link's rate, for a shape (10Gbps, 1Gbps, ...).
    #[arg(long, default_value = "10Gbps", value_parser = parse_rate)]
    pub rate: u64,
    /// Every egress queue's limit, for a shape.
    #[arg(long, default_value = "512KB", value_parser = parse_size)]
    pub queue: u64,
    /// ECN marking for a shape: `off`, `auto` (HPCC's thresholds for the
    /// rate) or KMIN,KMAX,PMAX (e.g. 40KB,160KB,0.2).
    #[arg(long, default_value = "auto")]
    pub ecn: String,
    /// Extra one-way delay on every link, for a shape (e.g. 10us).
    #[arg(long, default_value = "0us", value_parser = parse_duration)]
    pub delay: Duration,
    /// Write queue depths and counters over time to this CSV.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// How often --stats samples the queues.
    #[arg(long = "sample-every", default_value = "1ms", value_parser = parse_duration)]
    pub sample_every: Duration,
    /// Capture every host port's frames, both ways, into DIR/HOST.pcap.
    #[arg(long, value_name = "DIR")]
    pub pcap: Option<PathBuf>,
    /// Every switch of a shape aggregates in a pool of this many
    /// aggregators (a file says so per switch: `aggregators = N`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=softrnic_lab::topology::MAX_AGGREGATORS as u64))]
    pub aggregators: Option<u64>,
    /// With no --on command: stay up this long (default: until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
}

impl LabArgs {
    pub fn topology(&self) -> Result<Topology, String> {
        let path = std::path::Path::new(&self.topology);
        if self.topology.ends_with(".toml") || path.exists() {
            if self.aggregators.is_some() {
                return Err("--aggregators is for a shape: in a topology file, give a switch `aggregators = N`".into());
            }
            return Topology::load(path);
        }
        let ecn = match self.ecn.as_str() {
            "off" => None,
            "auto" => Some(RedConfig::for_rate(self.rate)),
            text => Some(parse_ecn(text)?),
        };
        let link = LinkSpec { rate_bps: self.rate, queue: self.queue, ecn, delay: self.delay, ..LinkSpec::default() };
        let mut topology = Topology::shape(&self.topology, link)?;
        if let Some(n) = self.aggregators {
            for switch in &mut topology.switches {
                switch.aggregation = Some(AggregationConfig::new(n as usize));
            }
        }
        Ok(topology)
    }
}

fn parse_ecn(text: &str) -> Result<RedConfig, String> {
    let bad = || format!("--ecn {text}: write off, auto, or KMIN,KMAX,PMAX such as 40KB,160KB,0.2");
    let parts: Vec<&str> = text.split(',').collect();
    let [kmin, kmax, pmax] = parts[..] else { return Err(bad()) };
    let (kmin, kmax) = (parse_size(kmin).map_err(|_| bad())?, parse_size(kmax).map_err(|_| bad())?);
    let pmax: f64 = pmax.parse().ok().filter(|p| (0.0..=1.0).contains(p)).ok_or_else(bad)?;
    if kmin > kmax {
        return Err(bad());
    }
    Ok(RedConfig { kmin, kmax, pmax })
}

/// `HOST=COMMAND` split, the host checked against the topology.
fn placed<'a>(topology: &Topology, text: &'a str) -> Result<(usize, &'a str), String> {
    let (host, command) =
        text.split_once('=').ok_or_else(|| format!("`{text}`: write HOST=COMMAND, e.g. 'h0=ping -c1 $h1'"))?;
    let names: Vec<&str> = topology.hosts.iter().map(|h| h.name.as_str()).collect();
    let index = topology
        .host_index(host)
        .ok_or_else(|| format!("`{host}` is not a host of this topology; its hosts are {}", names.join(", ")))?;
    Ok((index, command))
}

/// Stops on SIGINT and SIGTERM, so the lab cleans up.
fn stop_flag() -> Result<Arc<AtomicBool>, String> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, flag.clone()).map_err(|e| format!("cannot handle signals: {e}"))?;
    }
    Ok(flag)
}

pub fn run(args: &LabArgs) -> Result<(), String> {
    let topology = args.topology()?;
    let mut foreground = args.on.iter().map(|t| placed(&topology, t)).collect::<Result<Vec<_>, _>>()?;
    for command in &args.each {
        foreground.extend((0..topology.hosts.len()).map(|h| (h, command.as_str())));
    }
    let background = args.bg.iter().map(|t| placed(&topology, t)).collect::<Result<Vec<_>, _>>()?;
    let stop = stop_flag()?;
    let namespaces = Namespaces::create(&topology)?;
    let options = RunOptions {
        stats: args.stats.clone(),
        sample_every: args.sample_every,
        pcap: args.pcap.clone(),
        flows: None,
        aggregation: None,
    };
    let runner = Runner::start(&topology, &namespaces, options)?;
    eprintln!("softrnic lab: {} hosts, {} switches", topology.hosts.len(), topology.switches.len());
    for (name, addr, ns) in namespaces.describe(&topology) {
        eprintln!("  {name:<8} {addr:<12} ip netns exec {ns} bash");
    }
    let spawn = |(host, command): &(usize, &str)| {
        namespaces.spawn(&topology, *host, command, Stdio::inherit(), Stdio::inherit())
    };
    let mut servers: Vec<Child> = background.iter().map(spawn).collect::<Result<_, _>>()?;
    let mut clients: Vec<Child> = foreground.iter().map(spawn).collect::<Result<_, _>>()?;
    let mut failed = Vec::new();
    let deadline = args.duration.map(|d| std::time::Instant::now() + d);
    loop {
        if stop.load(Ordering::Relaxed) {
            eprintln!("softrnic lab: interrupted; taking the lab down");
            break;
        }
        if !clients.is_empty() {
            let mut running = false;
            for (child, (host, command)) in clients.iter_mut().zip(&foreground) {
                match child.try_wait() {
                    Ok(Some(status)) if !status.success() && !failed.contains(command) => {
                        eprintln!("softrnic lab: `{command}` on {} ended with {status}", topology.hosts[*host].name);
                        failed.push(*command);
                    }
                    Ok(None) => running = true,
                    _ => {}
                }
            }
            if !running {
                break;
            }
        } else if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for child in servers.iter_mut().chain(clients.iter_mut()) {
        super::exp::stop_child(child);
    }
    let summary = runner.stop()?;
    println!("{summary}");
    drop(namespaces);
    if failed.is_empty() { Ok(()) } else { Err(format!("{} command(s) failed: {}", failed.len(), failed.join("; "))) }
}
