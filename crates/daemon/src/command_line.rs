//! softrnicd's command line, in the library so that `softrnic manuals`
//! writes its manual page and shell completions beside softrnic's.

use std::path::PathBuf;

use clap::Parser;

use crate::server::offload::{RxDesign, TxDesign};

#[derive(Parser)]
#[command(name = "softrnicd", version, about = "One softrnic engine serving many programs through shared memory")]
pub struct Args {
    /// Where to listen [default: $XDG_RUNTIME_DIR/softrnic/softrnicd.sock].
    /// Programs find it there, or through SOFTRNIC_DAEMON=PATH.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Engine threads per device: the cores the engine polls on.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub cores: u16,
    /// Command processors: threads that move the programs' work requests
    /// and completions between their rings and the engine, each serving
    /// its share of the devices (and, with inline progress, driving their
    /// engines). More spread the devices' work over more cores.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub processors: u16,
    /// Per-tenant limits (a TOML file with a [tenant] table: max_qps,
    /// max_cqs, max_mrs, max_pds, max_srqs, max_memory_mib, max_rate_gbps).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the configuration it would run with (--config's file, the
    /// defaults for what it leaves out) as JSON, and exit: what the
    /// Kubernetes device plugin reads the tenant limits from.
    #[arg(long)]
    pub print_config: bool,
    /// How a send's payload reaches the wire (E4): the engine gathers it
    /// from the program's memory (header-only), or it is first copied into
    /// the daemon's memory whole (bulk-copy) or a packet at a time
    /// (engine-copy).
    #[arg(long, value_enum, default_value_t = TxDesign::HeaderOnly)]
    pub tx: TxDesign,
    /// Where a receive's payload lands first (E5): in the program's buffer
    /// (direct), in a ring of the QP's own (per-connection), or in a small
    /// pool every QP shares, copied on while hot (in-cache).
    #[arg(long, value_enum, default_value_t = RxDesign::Direct)]
    pub rx: RxDesign,
    /// Exit after this many seconds with no program connected (a daemon
    /// started on demand, SOFTRNIC_DAEMON=start, is given 60).
    #[arg(long, value_name = "SECONDS")]
    pub idle_exit: Option<u64>,
    /// Its scheduling priority, a nice value from -20 (first) to 19, while
    /// the programs connected outnumber the cores. The daemon does every
    /// program's network work: where programs spinning on their CQs
    /// outnumber the cores, an even share of the CPU starves them all.
    /// Raising it takes root or CAP_SYS_NICE; without, it keeps the
    /// priority it was started with, and says so.
    #[arg(long, default_value_t = -20, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub nice: i32,
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
    pub realtime: i32,
    /// Its devices hand each other their datagrams through shared memory,
    /// whatever network namespace each serves, as an SR-IOV NIC's embedded
    /// switch passes traffic between its virtual functions: containers on
    /// this host talk at the speed of processes on it. Without it they
    /// talk through their namespaces' network (veth, a bridge, the lab's
    /// switch). Each device needs an address no other namespace uses.
    #[arg(long)]
    pub embedded_switch: bool,
}
