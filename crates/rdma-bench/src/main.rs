//! `rdma_bench`: libr's RDMA benchmark with its flags and output lines,
//! written as an ordinary verbs program. It loads `libibverbs.so.1` at run
//! time, so the same binary measures softrnic (its drop-in library on
//! `LD_LIBRARY_PATH`), a real RDMA NIC or Soft-RoCE (`-deviceName mlx5_0`),
//! and puts them side by side.
//!
//! ```text
//! rdma_bench -serverIp 127.0.0.1 -nodeId 0 &            # server: receives, verifies
//! rdma_bench -serverIp 127.0.0.1 -nodeId 1 -threads 8 -packSize 64
//! Data verification success, thread [0], duration [0.188152]s, throughput [1.393258] Gbps
//! ```
//!
//! The client SENDs `-iterations` × `-numPack` messages of `-packSize`
//! bytes on each of `-threads` RC QPs with `-outstanding` in flight; the
//! server checks every byte. With `-outstanding 1` the client times each
//! message's round trip to the server and back and prints percentiles.
//!
//! - [`args`]: the flags; [`exchange`]: the TCP conversation around a run;
//!   [`verbs`]: the loaded library and its objects; [`run`]: each thread's
//!   loop; `report` (in the library, shared with `softrnic bench` and the
//!   experiment runner): the output lines and how to read them back.

mod exchange;
mod run;
mod snap;
mod verbs;

use softrnic_rdma_bench::report;

use std::process::ExitCode;
use std::time::Duration;

use exchange::{Channel, Workload};
use softrnic_rdma_bench::args::Args;
use verbs::{Buffer, Qp, QpInfo, Verbs};

fn main() -> ExitCode {
    // SAFETY: first thing in main, before any thread: `rdma_bench | head`
    // ends quietly on the closed pipe, as a C program does, instead of
    // panicking in println! (Rust starts with SIGPIPE ignored). The
    // exchange's TCP writes pass MSG_NOSIGNAL, so a vanished peer is
    // still an error, not a signal.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let args = Args::parse_libr_style();
    if let Some(seconds) = args.auto_exit_sec {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(seconds));
            eprintln!("rdma_bench: -auto_exit_sec {seconds} reached before the run finished; exiting");
            std::process::exit(3);
        });
    }
    let result = match args.node_id {
        0 => server(&args),
        _ => client(&args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("rdma_bench: {message}");
            ExitCode::from(2)
        }
    }
}

/// One thread's QP, buffer and address.
struct Endpoint<'v> {
    qp: Qp<'v>,
    buf: Buffer<'v>,
    info: QpInfo,
    /// The server's Snap-like baseline work (`-snapListMiB`).
    snap: Option<snap::SnapWork>,
}

/// Creates `w.threads` endpoints with buffers of `buf_size` (or what the
/// workload needs).
fn endpoints<'v>(verbs: &'v Verbs, args: &Args, w: &Workload, server: bool) -> Result<Vec<Endpoint<'v>>, String> {
    let needed = run::buffer_needed(w, server);
    let len = match args.buf_size {
        Some(given) if given < needed => {
            return Err(format!(
                "-bufSize {given} is too small for -outstanding {} messages of -packSize {}: give -bufSize {needed} or more",
                w.outstanding, w.pack_size
            ));
        }
        Some(given) => given,
        None => needed,
    };
    let (mtu, gid) = (verbs.active_mtu()?, verbs.gid(args.gid_index)?);
    let recv = if server { w.outstanding * run::RECEIVES_PER_OUTSTANDING } else { 1 };
    (0..w.threads)
        .map(|thread| {
            let qp = Qp::new(verbs, w.outstanding + 1, recv + 1)?;
            let buf = Buffer::new(verbs, len)?;
            let psn = (qp.qpn().wrapping_mul(2_654_435_761) ^ std::process::id() ^ thread) & 0xff_ffff;
            let info = QpInfo { qpn: qp.qpn(), psn, gid, mtu };
            let snap = (server && args.snap_list_mib > 0)
                .then(|| snap::SnapWork::new(args.snap_list_mib, u64::from(thread) + 1));
            Ok(Endpoint { qp, buf, info, snap })
        })
        .collect()
}

fn connect_all(ends: &[Endpoint], remote: &[QpInfo], args: &Args) -> Result<(), String> {
    ends.iter()
        .zip(remote)
        .try_for_each(|(end, remote)| end.qp.connect(&end.info, remote, args.gid_index, args.qp_timeout))
}

/// The receiving end: takes the client's workload, verifies every
/// message, and tells the client whether all of it arrived intact.
fn server(args: &Args) -> Result<bool, String> {
    let verbs = Verbs::open(args.device_name.as_deref())?;
    let mut channel = Channel::accept(&args.server_ip, args.port)?;
    let w = channel.receive_workload()?;
    let remote = channel.receive_qps(w.threads)?;
    let mut ends = endpoints(&verbs, args, &w, true)?;
    connect_all(&ends, &remote, args)?;
    for end in &ends {
        run::post_receives(&end.qp, &end.buf, &w)?;
    }
    channel.send_qps(&ends.iter().map(|e| e.info).collect::<Vec<_>>())?;
    println!("{}", describe("server", &verbs, &w));

    let results = each_thread(&mut ends, |thread, end| match w.outstanding {
        1 => run::echo(&end.qp, &end.buf, thread, &w),
        _ => run::receive_stream(&end.qp, &end.buf, thread, &w, end.snap.as_mut()),
    });
    let mut ok = true;
    for (thread, result) in (0..).zip(results) {
        match result {
            Ok(duration) => {
                let bytes = w.messages * u64::from(w.pack_size);
                let line = match w.verify {
                    true => report::verified(thread, duration, bytes),
                    false => report::received(thread, duration, bytes),
                };
                println!("{line}");
            }
            Err(message) => {
                println!("{message}");
                ok = false;
            }
        }
    }
    channel.send_verdict(ok)?;
    Ok(ok)
}

/// The sending end: names the workload, streams (or pings) on every QP,
/// and reports the server's verdict.
fn client(args: &Args) -> Result<bool, String> {
    let w = Workload {
        threads: args.threads,
        pack_size: args.pack_size,
        outstanding: args.outstanding,
        messages: args.messages(),
        verify: !args.no_verify,
    };
    let verbs = Verbs::open(args.device_name.as_deref())?;
    let mut ends = endpoints(&verbs, args, &w, false)?;
    let mut channel = Channel::connect(&args.server_ip, args.port)?;
    channel.send_workload(&w)?;
    channel.send_qps(&ends.iter().map(|e| e.info).collect::<Vec<_>>())?;
    let remote = channel.receive_qps(w.threads)?;
    connect_all(&ends, &remote, args)?;
    println!("{}", describe("client", &verbs, &w));

    if args.latency_mode() {
        let histograms = each_thread(&mut ends, |thread, end| run::ping(&end.qp, &end.buf, thread, &w))
            .into_iter()
            .collect::<Result<Vec<_>, String>>()?;
        let mut all = report::histogram();
        for h in &histograms {
            all.add(h).map_err(|e| format!("merging histograms: {e}"))?;
        }
        print!("{}", report::latency(&all));
    } else {
        let durations = each_thread(&mut ends, |thread, end| run::send_stream(&end.qp, &end.buf, thread, &w))
            .into_iter()
            .collect::<Result<Vec<_>, String>>()?;
        for (thread, duration) in (0..).zip(durations) {
            println!("{}", report::sent(thread, duration, w.messages * u64::from(w.pack_size)));
        }
    }
    let ok = channel.receive_verdict()?;
    if !ok {
        eprintln!("rdma_bench: the server found data that did not verify");
    }
    Ok(ok)
}

/// Runs `work` on every endpoint, each on a thread of its own (libr's
/// one thread per QP), and returns what each returned, in thread order.
fn each_thread<T: Send>(
    ends: &mut [Endpoint],
    work: impl Fn(u32, &mut Endpoint) -> Result<T, String> + Sync,
) -> Vec<Result<T, String>> {
    std::thread::scope(|s| {
        let work = &work;
        let handles: Vec<_> =
            (0..).zip(ends.iter_mut()).map(|(thread, end)| s.spawn(move || work(thread, end))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".to_string()))).collect()
    })
}

fn describe(role: &str, verbs: &Verbs, w: &Workload) -> String {
    let mode =
        if w.outstanding == 1 { "latency".to_string() } else { format!("throughput, {} outstanding", w.outstanding) };
    format!(
        "rdma_bench {role} on {}: {} QP(s), {} messages of {} B each, {mode}",
        verbs.device_name, w.threads, w.messages, w.pack_size
    )
}
