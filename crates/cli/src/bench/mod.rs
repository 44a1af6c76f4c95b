//! `softrnic bench`: perftest's tests on softrnic.
//!
//! With no peer and no `--server`, both ends run in this process, each on
//! its own loopback address (127.0.0.2 and 127.0.0.3), connected through
//! the same TCP exchange two hosts would use.

pub mod account;
mod bw;
mod lat;
pub mod params;
pub mod report;
mod session;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use softrnic::exchange::Exchange;
use softrnic::{Context, EngineConfig, FaultConfig};

use params::{BenchArgs, Params};
use report::Format;
use session::{End, Session};

pub use params::Test;

/// Runs `softrnic bench` as its flags say.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    let params = Params::from_args(args)?;
    // Clock reads in the datapath only when the account is asked for.
    softrnic_account::set_timing(args.account);
    let format = if args.json {
        Format::Json
    } else if args.csv {
        Format::Csv
    } else {
        Format::Table
    };
    let timeout = Duration::from_secs_f64(args.timeout.max(0.1));
    match (args.server, args.peer) {
        (true, Some(_)) => Err("give either --server or a server address, not both".into()),
        (true, None) => {
            let addr = local_addr(args, None)?;
            // The device first, so that a busy or foreign address fails at once.
            let ctx = open(engine_config(args, addr)?)?;
            let listener = TcpListener::bind((addr, args.port)).map_err(|e| {
                format!("cannot listen on {addr}:{} for the exchange: {e}; pick another with -p", args.port)
            })?;
            if format == Format::Table {
                println!("softrnic bench: waiting for a client on {addr}:{} ...", args.port);
            }
            serve(&listener, ctx, timeout * 30, format, args.qp_timeout)
        }
        (false, Some(peer)) => {
            let addr = local_addr(args, Some(peer))?;
            let ctx = open(engine_config(args, addr)?)?;
            let exchange = Exchange::connect(SocketAddr::new(peer, args.port), timeout).map_err(|e| e.to_string())?;
            client(exchange, ctx, params, timeout, format, args.qp_timeout, Accounting::of(args, false))
        }
        (false, None) => {
            let client_addr = args.addr.unwrap_or(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
            let server_addr = neighbour(client_addr);
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| e.to_string())?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let server_ctx = open(engine_config(args, server_addr)?)?;
            let client_ctx = open(engine_config(args, client_addr)?)?;
            let qp_timeout = args.qp_timeout;
            let server = std::thread::Builder::new()
                .name("bench-server".into())
                .spawn(move || {
                    serve(&listener, server_ctx, timeout, Format::Json, qp_timeout).map_err(|e| format!("server: {e}"))
                })
                .map_err(|e| e.to_string())?;
            let exchange = Exchange::connect(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port), timeout)
                .map_err(|e| e.to_string())?;
            let accounting = Accounting::of(args, true);
            let result = client(exchange, client_ctx, params, timeout, format, args.qp_timeout, accounting);
            let server_result = server.join().map_err(|_| "the server thread panicked".to_string())?;
            result.and(server_result)
        }
    }
}

/// Whether the results carry an account of their costs (`--account`),
/// and whose costs the process's are.
#[derive(Clone, Copy)]
struct Accounting {
    wanted: bool,
    loopback: bool,
}

impl Accounting {
    fn of(args: &BenchArgs, loopback: bool) -> Accounting {
        Accounting { wanted: args.account, loopback }
    }

    fn keep(self, account: account::Account) -> Option<account::Account> {
        self.wanted.then(|| account.ends(self.loopback))
    }
}

/// The server's address in a loopback run: the client's, plus one.
fn neighbour(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let n = u32::from(v4);
            IpAddr::V4(Ipv4Addr::from(if n & 0xff == 0xff { n - 1 } else { n + 1 }))
        }
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) ^ 1)),
    }
}

/// Opens the device: softrnicd's when it serves this user
/// (`SOFTRNIC_DAEMON`, or its default socket), with the daemon's engine
/// settings; else an engine in this process as `config` says.
fn open(config: EngineConfig) -> Result<Context, String> {
    match softrnic::daemon_socket() {
        Some(socket) => Context::through_daemon(&socket, config.addr),
        None => Context::with_config(config),
    }
    .map_err(|e| e.to_string())
}

/// The environment's engine ([`EngineConfig::from_env`], every variable
/// checked), then the flags over it.
fn engine_config(args: &BenchArgs, addr: IpAddr) -> Result<EngineConfig, String> {
    let mut config = EngineConfig::from_env(addr)?;
    let env = config.faults;
    config.faults = FaultConfig {
        loss: args.loss.unwrap_or(env.loss),
        reorder: args.reorder.unwrap_or(env.reorder),
        duplicate: args.duplicate.unwrap_or(env.duplicate),
        corrupt: args.corrupt.unwrap_or(env.corrupt),
    };
    config.datapath = args.datapath.unwrap_or(config.datapath);
    config.progress = args.progress.unwrap_or(config.progress);
    config.transport.retransmission = args.retransmission.unwrap_or(config.transport.retransmission);
    match &args.cc {
        Some(name) => {
            config.transport.congestion.algorithm = softrnic::choose_congestion_control(name, &args.cc_params.join(","))
                .map_err(|e| format!("--cc {name}: {e}"))?
        }
        None if !args.cc_params.is_empty() => return Err("--cc-param needs --cc to name the algorithm".to_string()),
        None => {}
    }
    if let Some(rate) = args.line_rate {
        config.transport.congestion.line_rate_bps = rate;
    }
    Ok(config.with_threads(args.engine_threads, args.split_rx_tx))
}

/// This end's device address (`addr.rs`).
fn local_addr(args: &BenchArgs, peer: Option<IpAddr>) -> Result<IpAddr, String> {
    crate::addr::device_addr(args.addr, peer)
}

fn client(
    mut exchange: Exchange,
    ctx: Context,
    params: Params,
    timeout: Duration,
    format: Format,
    qp_timeout: u8,
    accounting: Accounting,
) -> Result<(), String> {
    // The MTU the connections will use (and the report shows): -m, or the
    // link's if that is smaller.
    let params = Params { mtu: params.mtu.min(ctx.active_mtu()), ..params };
    exchange.send_text(&params.to_line()).map_err(|e| e.to_string())?;
    let mut s = Session::open(ctx, params.clone(), exchange, End::Client, timeout, qp_timeout)?;
    report::banner(&params, format, &s.describe_local(), &s.describe_remote(), &s.ctx);
    report::header(params.test, format);
    let mut failures = Vec::new();
    for &size in &params.sizes {
        s.exchange.barrier().map_err(|e| e.to_string())?;
        if params.test.is_latency() {
            let (histogram, failure, account) = lat::client(&mut s, size)?;
            let verified = params.verify.then_some(failure.is_none());
            failures.extend(failure);
            let mut result = report::LatResult::new(params.test, size, params.mtu.bytes(), histogram, verified);
            result.account = accounting.keep(account);
            report::print_lat(&result, format);
        } else {
            bw::prepare_target(&s, size);
            let duties = bw::Duties { send: true, receive: params.bidirectional && params.test == Test::SendBw };
            let meter = account::Meter::start();
            let outcome = bw::run(&mut s, size, duties)?;
            let account = meter.per_op(outcome.sent + outcome.received, "message");
            let mut failure = outcome.verify_failure.clone();
            if params.verify {
                failure = failure.or_else(|| bw::verify_after(&s, size, outcome.peer_sent, true));
                failure = failure.or_else(|| bw::verify_after(&s, size, outcome.sent, false));
            }
            // The server's own verdict on what it received.
            let verdict = s.exchange.read_line().map_err(|e| e.to_string())?;
            if let Some(reason) = verdict.strip_prefix("failed ") {
                failure.get_or_insert_with(|| format!("server: {reason}"));
            }
            let verified = params.verify.then_some(failure.is_none());
            failures.extend(failure);
            let mut result = bw::result(params.test, &s, size, &outcome, verified);
            result.account = accounting.keep(account);
            report::print_bw(&result, format);
        }
    }
    report::footer(format);
    if params.verify && format == Format::Table && failures.is_empty() {
        println!(" Data verification: every byte checked, all correct");
    }
    match failures.first() {
        Some(first) => Err(format!("data verification failed: {first}")),
        None => Ok(()),
    }
}

fn serve(
    listener: &TcpListener,
    ctx: Context,
    timeout: Duration,
    format: Format,
    qp_timeout: u8,
) -> Result<(), String> {
    let mut exchange = Exchange::accept(listener, timeout).map_err(|e| e.to_string())?;
    let params = Params::parse(&exchange.read_line().map_err(|e| e.to_string())?)?;
    let mut s = Session::open(ctx, params.clone(), exchange, End::Server, Duration::from_secs(10), qp_timeout)?;
    if format == Format::Table {
        report::banner(&params, format, &s.describe_local(), &s.describe_remote(), &s.ctx);
    }
    for &size in &params.sizes {
        s.exchange.barrier().map_err(|e| e.to_string())?;
        if params.test.is_latency() {
            lat::server(&mut s, size)?;
        } else {
            bw::prepare_target(&s, size);
            let duties = bw::Duties { send: params.bidirectional, receive: params.test == Test::SendBw };
            let outcome = bw::run(&mut s, size, duties)?;
            let mut failure = outcome.verify_failure.clone();
            if params.verify {
                failure = failure.or_else(|| bw::verify_after(&s, size, outcome.peer_sent, true));
            }
            let verdict = match &failure {
                Some(reason) => format!("failed {reason}"),
                None => "ok".into(),
            };
            s.exchange.send_text(&verdict).map_err(|e| e.to_string())?;
            if format == Format::Table {
                let what = if params.test == Test::SendBw { "received" } else { "served" };
                let count = if params.test == Test::SendBw { outcome.received } else { outcome.peer_sent };
                let checked = match (params.verify, &failure) {
                    (false, _) => String::new(),
                    (true, None) => ", every byte verified".into(),
                    (true, Some(reason)) => format!(", VERIFICATION FAILED: {reason}"),
                };
                println!(" {size} B: {what} {count} messages{checked}");
            }
        }
    }
    Ok(())
}
