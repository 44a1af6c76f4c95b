#!/usr/bin/env python3
"""Side-by-side benchmarks for BENCHMARKS.md.

Runs softrnic's bench and the peers a user would pick instead, in the same
run, on loopback:

  - a raw UDP ping-pong with busy polling (sockperf --nonblocked, both ends),
  - kernel TCP, one stream (iperf3),
  - UCX over TCP (ucx_perftest with UCX_TLS=tcp: tag_lat, ucp_am_bw, ucp_put_bw),

each RUNS times, and prints the medians and the ratios as a Markdown table.
softrnic runs over its UDP datapath there, its 64 B message rate posted
one at a time and in lists of 16 (`-l 16`). Other modes:

  --shm       softrnic's shared-memory wire against UCX's shared-memory
              transport (UCX_TLS=posix), and the E1 latency against
              Soft-RoCE's published 24.07 us;
  --scaling   the E2 shape: 8 QPs, 64 B and 64 KiB, engine threads 1, 2,
              4 and 8, inline and dedicated progress (on a machine with
              the cores to show it);
  --loss      64 KiB write_bw and send_bw at 0.1, 1 and 5 % loss, every
              operation under the CI fault mix, and 64 B send_lat p99 at
              1 %, for go-back-N (fixed and adaptive timer) and selective
              repeat; then, as root, softrnic and Linux TCP (iperf3)
              across a link between two namespaces that loses 0.1, 1 and
              5 % in the kernel (netem, or nftables without it);
  --perftest  Debian's perftest over softrnic's drop-in libibverbs.so.1
              beside `softrnic bench` on the same tests;
  --cm        connection set-up through rdma_cm: rdmacm-utils' cmtime
              over softrnic's librdmacm.so.1 (1 to 1000 connections) beside
              kernel TCP's connect and accept of as many connections;
  --rsockets  rdmacm-utils' rstream over softrnic's rsockets beside the
              same program's TCP mode (-T s), non-blocking and blocking,
              64 B latency and 64 KiB bandwidth; riostream (riowrite)
              beside it; and sockperf's TCP ping-pong under
              librspreload.so beside plain kernel TCP; over the
              default wire between two processes and over UDP;
  --mpi       Open MPI over UCX over softrnic (pml ucx) beside Open MPI's
              TCP BTL (pml ob1, btl self,tcp): scripts/programs/mpi-check.c's
              8 B latency, 1 MiB bandwidth and 64 Ki-double allreduce.
  --switch    the network lab (as root): the software switch's forwarding
              rate (64 B frames/s, 4 KiB Gb/s) beside the Linux bridge
              between the same kind of namespaces, with iperf3's UDP as
              the load, and bmv2's published ~80 kpps / 1 Gb/s; the rate
              accuracy of a 1 and a 10 Gb/s port under TCP; and the
              simulator's speed on the fat tree (softrnic exp fct).
  --auth      packet authentication's cost: 64 B send_lat p50 and 64 KiB
              write_bw with a keyed MAC per packet (--auth) and without,
              over UDP and over the shared-memory wire, same run;
  --daemon    softrnic bench through softrnicd (queues shared with the
              daemon's engine) beside the engine in the process.
  --read      RDMA READ beside RDMA WRITE at 64 KiB and 1 MiB (issue 32,
              item 4): softrnic bench over UDP, shared memory and
              softrnicd, and perftest in the process and through
              softrnicd, the two operations alternating in each run.
  --qps       many QPs on one host (issue 32, item 3's scale): 4 KiB
              write_bw over the shared-memory wire with 256 QPs beside
              one QP, alternating in each run: the rates and their ratio,
              every run's retransmissions and timer expiries, and the
              engine's own memory per QP (peak resident memory less the
              registered buffers, 256 QPs against one);
  --account   where the time goes: per 64 B round trip and per 64 KiB
              message, the system calls by kind, context switches and CPU
              time of softrnic (UDP, the shared-memory wire, and through
              softrnicd), sockperf and UCX (tcp and posix), each process
              counted by `perf stat`
              alike, beside softrnic's own account (`softrnic bench
              --account`: empty receives, wake-ups, bytes copied, ICRC
              bytes, locks);
  --against OTHER
              this build's softrnic beside another build's (OTHER, the
              path of its softrnic binary: a change before and after),
              64 KiB write_bw and 64 B send_lat over shared memory and
              UDP, each round running this
              build twice and the other once in a shuffled order: the
              second run of this build against the first is an A/A
              control, the noise any difference must stand out from.

    scripts/bench.py [--runs 5] [--engine-threads 1] [--shm | --scaling | --loss | --perftest | --read | --cm | --rsockets | --mpi | --switch | --daemon | --auth | --qps | --account | --against OTHER]

Installs the peers from Debian's packages when run as root and they are
missing. Benchmarks are not tests: nothing here asserts a speed.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SOFTRNIC_BIN runs a binary built elsewhere (on a machine without cargo).
SOFTRNIC = os.environ.get("SOFTRNIC_BIN") or os.path.join(ROOT, "target", "release", "softrnic")
PEERS = {"sockperf": "sockperf", "iperf3": "iperf3", "ucx_perftest": "ucx-utils", "perf": "linux-perf"}


def sh(args, env=None, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def install_peers():
    missing = [pkg for tool, pkg in PEERS.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"missing peers: {' '.join(missing)}; install them with: sudo apt-get install {' '.join(missing)}")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


class Server:
    """A peer's server process, stopped on exit."""

    def __init__(self, args, env=None, settle=0.5):
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        time.sleep(settle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # Asked first, so that a server that cleans up (softrnicd removes
        # its socket) can; killed if it does not go.
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def softrnic(test, size, extra, env=None):
    out = sh([SOFTRNIC, "bench", test, "-s", str(size), "--json", *extra], env=env)
    if out.returncode != 0:
        raise RuntimeError(f"softrnic bench {test}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sockperf_us(size):
    """sockperf's spinning UDP ping-pong: (p50, p99) of half the round
    trip, in µs, as sockperf reports them."""
    with Server(["sockperf", "server", "-i", "127.0.0.20", "-p", "11111", "--nonblocked"]):
        out = sh(["sockperf", "ping-pong", "-i", "127.0.0.20", "-p", "11111", "-m", str(size), "-t", "3", "--nonblocked"])
    text = out.stdout + out.stderr
    return tuple(float(re.search(rf"percentile {p} =\s+([\d.]+)", text).group(1)) for p in (r"50\.000", r"99\.000"))


def iperf3_gbps():
    with Server(["iperf3", "-s", "-B", "127.0.0.21", "-1"]):
        out = sh(["iperf3", "-c", "127.0.0.21", "-t", "3", "-J"])
    return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9


def ucx(test, size, port, tls="tcp"):
    env = {**os.environ, "UCX_TLS": tls}
    with Server(["ucx_perftest", "-p", str(port)], env=env, settle=1.0):
        out = sh(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s", str(size), "-n", "100000" if "lat" in test else "200000"], env=env)
    final = [l for l in out.stdout.splitlines() if l.strip().startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest {test}: {out.stdout[-300:]} {out.stderr[-300:]}")
    # Final: iterations, lat 50%ile, lat avg, lat overall, MB/s avg, MB/s overall, msg/s avg, msg/s overall
    cols = final[0].split()[1:]
    return {"p50_us": float(cols[1]), "mbps": float(cols[5]), "msg_rate": float(cols[7])}


def perftest(program, args, port, more_env=None, addrs=("127.0.0.30", "127.0.0.31")):
    """Runs a perftest pair over softrnic's libibverbs.so.1 (both ends on
    loopback addresses, `more_env` added to their environment); returns
    the client's first result row."""
    libdir = os.path.join(ROOT, "target", "softrnic", "lib")
    env = lambda addr: {**os.environ, "LD_LIBRARY_PATH": libdir, "SOFTRNIC_ADDR": addr, **(more_env or {})}
    server = subprocess.Popen([program, *args, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(addrs[0]))
    time.sleep(0.5)
    try:
        out = sh([program, *args, "-p", str(port), addrs[0]], env=env(addrs[1]))
    finally:
        server.wait(timeout=30)
    rows = [l.split() for l in out.stdout.splitlines() if l.split() and l.split()[0].isdigit() and len(l.split()) >= 4]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"{program}: {out.stdout[-300:]} {out.stderr[-300:]}")
    return [float(x) for x in rows[0]]


def perftest_main(a, extra):
    """perftest over libibverbs.so.1 beside `softrnic bench`, same tests."""
    subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, stdout=subprocess.DEVNULL)
    r = {k: [] for k in ["pt_lat", "sr_lat", "pt_rate", "sr_rate", "pt_bw", "sr_bw"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        # ib_send_lat: #bytes #iterations t_min t_max t_typical ...; t_typical is the median.
        r["pt_lat"].append(perftest("ib_send_lat", ["-s", "64", "-n", "20000"], 18700 + run)[4])
        r["sr_lat"].append(softrnic("send_lat", 64, extra + ["-n", "20000"])["p50_ns"] / 1000)
        # ib_*_bw --report_gbits: #bytes #iterations BW_peak BW_average MsgRate.
        r["pt_rate"].append(perftest("ib_send_bw", ["-s", "64", "-n", "200000", "--report_gbits"], 18800 + run)[4] * 1e6)
        r["sr_rate"].append(softrnic("send_bw", 64, extra + ["-n", "200000"])["msg_rate_mpps"] * 1e6)
        r["pt_bw"].append(perftest("ib_write_bw", ["-s", "65536", "-n", "20000", "--report_gbits"], 18900 + run)[3])
        r["sr_bw"].append(softrnic("write_bw", 65536, extra + ["-n", "20000"])["bw_avg_gbps"])
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: per_run_ratio(r[a], r[b])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| measure | perftest over libibverbs.so.1 | softrnic bench | ratio (median of per-run ratios) |")
    print("| --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 (`ib_send_lat -s 64`) | {m['pt_lat']:.2f} µs | {m['sr_lat']:.2f} µs | {ratio('pt_lat', 'sr_lat'):.2f}× |")
    print(f"| 64 B send_bw message rate (`ib_send_bw -s 64`) | {m['pt_rate'] / 1e6:.3f} M/s | {m['sr_rate'] / 1e6:.3f} M/s | {ratio('pt_rate', 'sr_rate'):.2f}× |")
    print(f"| 64 KiB write_bw (`ib_write_bw -s 65536`) | {m['pt_bw']:.2f} Gb/s | {m['sr_bw']:.2f} Gb/s | {ratio('pt_bw', 'sr_bw'):.2f}× |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


def read_main(a, extra):
    """Issue 32's item 4: RDMA READ beside RDMA WRITE at 64 KiB and 1 MiB,
    by `softrnic bench` over UDP, over the shared-memory wire and through
    softrnicd, and by perftest over libibverbs.so.1 with the engine in the
    process and through softrnicd. Within each run the two operations
    alternate (which goes first swaps each run); the ratio is the median
    of per-run ratios (target: READ at 0.9x WRITE or better)."""
    subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, stdout=subprocess.DEVNULL)
    socket = f"/tmp/softrnicd-bench-{os.getpid()}.sock"
    softrnicd = os.path.join(os.path.dirname(SOFTRNIC), "softrnicd")
    here = {**os.environ, "SOFTRNIC_DAEMON": "off"}
    there = {**os.environ, "SOFTRNIC_DAEMON": socket}
    # Timed runs: at 300 Gb/s a count of messages that took a second
    # before one copy takes a few tens of milliseconds.
    sizes = [65536, 1048576]

    def bench(env, flags):
        return lambda op, size: softrnic(op, size, [*extra, *flags, "-D", "2"], env)["bw_avg_gbps"]

    def pt(more_env, addrs, port):
        def run(op, size):
            row = perftest(f"ib_{op}", ["-s", str(size), "-D", "2", "--report_gbits"], port, more_env, addrs)
            return row[3]
        return run

    configs = [
        ("softrnic bench, UDP", bench(here, ["--datapath", "udp"])),
        ("softrnic bench, shared memory", bench(here, ["--datapath", "shm"])),
        ("softrnic bench, through softrnicd", bench(there, ["--addr", "127.0.0.12"])),
        ("perftest, engine in the process", pt({"SOFTRNIC_DAEMON": "off"}, ("127.0.0.30", "127.0.0.31"), 18960)),
        ("perftest, through softrnicd", pt({"SOFTRNIC_DAEMON": socket}, ("127.0.0.32", "127.0.0.33"), 18961)),
    ]
    r = {}
    with Server([softrnicd, "--socket", socket]):
        for run in range(a.runs):
            print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
            for name, measure in configs:
                for size in sizes:
                    ops = ["write_bw", "read_bw"] if run % 2 == 0 else ["read_bw", "write_bw"]
                    for op in ops:
                        r.setdefault((name, size, op), []).append(measure(op, size))
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| path | size | WRITE | READ | READ / WRITE (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, _ in configs:
        for size in sizes:
            write, read = r[(name, size, "write_bw")], r[(name, size, "read_bw")]
            print(f"| {name} | {size // 1024} KiB | {median(write):.2f} Gb/s | {median(read):.2f} Gb/s | "
                  f"{per_run_ratio(read, write):.2f}× | ≥ 0.9× |")
    print("\nAll runs:", json.dumps({f"{k[0]} {k[1]} {k[2]}": [round(x, 3) for x in v] for k, v in r.items()}))


def memcpy_gbps(size, slots=128, rounds=20000):
    """A single thread's memcpy of `size`-byte messages between two
    page-aligned buffers of `slots` of them, as `softrnic bench` lays its
    buffers out (scripts/programs/memcpy-rate.c, compiled here with the
    toolchain's cc)."""
    binary = os.path.join(ROOT, "target", "memcpy-rate")
    source = os.path.join(ROOT, "scripts", "programs", "memcpy-rate.c")
    if not os.path.exists(binary) or os.path.getmtime(binary) < os.path.getmtime(source):
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", binary, source], check=True)
    out = sh([binary, str(size), str(slots), str(rounds)])
    if out.returncode != 0:
        raise RuntimeError(f"memcpy-rate: {out.stderr.strip()}")
    return float(out.stdout.strip())


def shm_main(a, extra):
    """The shared-memory wire beside UCX's (UCX_TLS=posix) and a memcpy,
    same run; 64 KiB write_bw also with one copy off (four copies through
    the rings, SOFTRNIC_NO_ONE_COPY), and perftest's ib_write_bw in the
    process and between two tenants of one softrnicd."""
    install_peers()
    subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, stdout=subprocess.DEVNULL)
    extra = extra + ["--datapath", "shm"]
    measures = ["lat", "ucx_lat", "rate", "ucx_rate", "bw", "bw_four", "perftest_bw", "daemon_bw", "memcpy_cached", "memcpy", "ucx_put", "lat_1k_mean"]
    r = {k: [] for k in measures}
    socket = f"/tmp/softrnicd-bench-{os.getpid()}.sock"
    softrnicd = os.path.join(os.path.dirname(SOFTRNIC), "softrnicd")
    with Server([softrnicd, "--socket", socket]):
        shm_runs(a, extra, r, socket)
    shm_report(a, r)


def shm_runs(a, extra, r, socket):
    """`--shm`'s runs, into `r`; `socket` is a softrnicd's."""
    four_copies = {**os.environ, "SOFTRNIC_NO_ONE_COPY": "1"}
    tls = "posix,self"
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        r["lat"].append(softrnic("send_lat", 64, extra + ["-n", "20000"])["p50_ns"] / 1000)
        r["ucx_lat"].append(ucx("tag_lat", 64, 14337 + run, tls)["p50_us"])
        r["rate"].append(softrnic("send_bw", 64, extra + ["-n", "400000"])["msg_rate_mpps"] * 1e6)
        r["ucx_rate"].append(ucx("ucp_am_bw", 64, 14437 + run, tls)["msg_rate"])
        # Timed: 20,000 messages took 40 ms once one copy reached 300 Gb/s,
        # too short to leave the start behind.
        r["bw"].append(softrnic("write_bw", 65536, extra + ["-D", "2"])["bw_avg_gbps"])
        r["bw_four"].append(softrnic("write_bw", 65536, extra + ["-D", "2"], four_copies)["bw_avg_gbps"])
        # One buffer written over and over, as ucx_perftest's put_bw does.
        perftest_write = ["-s", "65536", "-D", "2", "--report_gbits"]
        r["perftest_bw"].append(perftest("ib_write_bw", perftest_write, 18970 + run, {"SOFTRNIC_DAEMON": "off"})[3])
        # The same pair as two tenants of one softrnicd (E11's path).
        tenants = ({"SOFTRNIC_DAEMON": socket}, ("127.0.0.32", "127.0.0.33"))
        r["daemon_bw"].append(perftest("ib_write_bw", perftest_write, 18980 + run, *tenants)[3])
        r["memcpy_cached"].append(memcpy_gbps(65536, slots=1))
        r["memcpy"].append(memcpy_gbps(65536))
        r["ucx_put"].append(ucx("ucp_put_bw", 65536, 14537 + run, tls)["mbps"] * 8 * 1.048576 / 1000)
        r["lat_1k_mean"].append(softrnic("send_lat", 1024, extra + ["-n", "20000"])["mean_ns"] / 1000)


def shm_report(a, r):
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: per_run_ratio(r[a], r[b])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared-memory wire:\n")
    print("| measure | softrnic (shm) | peer | peer value | ratio (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | UCX posix tag_lat | {m['ucx_lat']:.2f} µs | {ratio('lat', 'ucx_lat'):.2f}× | ≤ 3× |")
    print(f"| 64 B send_bw message rate | {m['rate'] / 1e6:.3f} M/s | UCX posix ucp_am_bw | {m['ucx_rate'] / 1e6:.3f} M/s | {ratio('rate', 'ucx_rate'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | UCX posix ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('bw', 'ucx_put'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | memcpy, one thread, between two 64 KiB buffers (in cache) | {m['memcpy_cached']:.2f} Gb/s | {ratio('bw', 'memcpy_cached'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | memcpy, one thread, 64 KiB at a time between the benchmark's two 8 MiB of buffers | {m['memcpy']:.2f} Gb/s | {ratio('bw', 'memcpy'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB `ib_write_bw` (perftest, engine in the process: one buffer, as UCX's) | {m['perftest_bw']:.2f} Gb/s | UCX posix ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('perftest_bw', 'ucx_put'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB `ib_write_bw` (as above) | {m['perftest_bw']:.2f} Gb/s | memcpy, one thread, between two 64 KiB buffers (in cache) | {m['memcpy_cached']:.2f} Gb/s | {ratio('perftest_bw', 'memcpy_cached'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB `ib_write_bw` between two tenants of one softrnicd | {m['daemon_bw']:.2f} Gb/s | UCX posix ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('daemon_bw', 'ucx_put'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | four copies through the rings (`SOFTRNIC_NO_ONE_COPY=1`) | {m['bw_four']:.2f} Gb/s | {ratio('bw', 'bw_four'):.2f}× | |")
    print(f"| 1 KiB send_lat mean (E1) | {m['lat_1k_mean']:.2f} µs | Soft-RoCE, published | 24.07 µs | {m['lat_1k_mean'] / 24.07:.2f}× | |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


# The system calls `perf stat` counts by name (tracepoints); the rest are
# "other". Together: every kind a datapath makes per message.
SYSCALL_KINDS = {
    "send": ["sendto", "sendmsg", "sendmmsg", "write", "writev"],
    "receive": ["recvfrom", "recvmsg", "recvmmsg", "read", "readv"],
    "poll": ["poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait"],
    "futex": ["futex"],
    "yield": ["sched_yield"],
}
PERF_EVENTS = ["raw_syscalls:sys_enter", "context-switches", "task-clock"] + [
    f"syscalls:sys_enter_{name}" for names in SYSCALL_KINDS.values() for name in names
]


class Counted:
    """A program under `perf stat` (every thread, the kernel's view), its
    counts read when it ends; `stop()` ends a server, and perf reports."""

    def __init__(self, args, env=None, out=None):
        self.out = f"/tmp/softrnic-account-{os.getpid()}-{time.monotonic_ns()}.csv"
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x,", "-o", self.out, "-e", ",".join(PERF_EVENTS), "--", *args],
            stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT if out else subprocess.DEVNULL, text=True, env=env)

    def stop(self):
        # The program stops and perf, seeing it go, reports.
        subprocess.run(["pkill", "-TERM", "-P", str(self.proc.pid)])
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.counts()

    def counts(self):
        counts = {}
        with open(self.out) as f:
            for line in f:
                fields = line.strip().split(",")
                if len(fields) > 2 and fields[0] and not line.startswith("#"):
                    try:
                        counts[fields[2]] = float(fields[0])
                    except ValueError:
                        counts[fields[2]] = 0.0  # <not counted>
        os.remove(self.out)
        return counts


def per_op(counts, ops):
    """perf's counts of one or more processes, per operation, by kind."""
    total = lambda event: sum(c.get(event, 0.0) for c in counts)
    out = {"syscalls": total("raw_syscalls:sys_enter") / ops,
           "context_switches": total("context-switches") / ops,
           "cpu_us": total("task-clock") * 1000 / ops}  # task-clock is in ms
    named = 0.0
    for kind, names in SYSCALL_KINDS.items():
        n = sum(total(f"syscalls:sys_enter_{name}") for name in names)
        out[kind] = n / ops
        named += n
    out["other"] = out["syscalls"] - named / ops
    return out


def marginal(run, small, large):
    """What one operation costs, without the set-up: a program run twice,
    for `small` and `large` operations, under perf; the difference of the
    counts over the difference of the operations. `run(n)` returns the
    counts of every process and the operations it did."""
    (c1, n1), (c2, n2) = run(small), run(large)
    diff = [{k: b.get(k, 0.0) - a.get(k, 0.0) for k in b} for a, b in zip(c1, c2)]
    return per_op(diff, n2 - n1)


def counted_softrnic(test, size, iters, extra, daemon=False):
    """softrnic bench (both ends in one process) under perf, and its own
    account of the measured loop; or, with `daemon`, through a softrnicd
    of its own, both processes under perf (the account is then the
    program's side only, and not returned)."""
    rows = []
    softrnicd = os.path.join(os.path.dirname(SOFTRNIC), "softrnicd")
    socket = f"/tmp/softrnicd-account-{os.getpid()}.sock"

    def run(n):
        env = {**os.environ, "SOFTRNIC_DAEMON": socket if daemon else "off"}
        served = Counted([softrnicd, "--socket", socket]) if daemon else None
        if served:
            time.sleep(0.5)
        with open(f"/tmp/softrnic-account-{os.getpid()}.out", "w+") as out:
            bench = Counted([SOFTRNIC, "bench", test, "-s", str(size), "-n", str(n), "--json", "--account", *extra],
                            env=env, out=out)
            bench.proc.wait(timeout=300)
            out.seek(0)
            rows.append(json.loads([l for l in out.read().splitlines() if l.startswith("{")][-1]))
        return [bench.counts()] + ([served.stop()] if served else []), n

    counts = marginal(run, iters // 4, iters)
    return counts, None if daemon else rows[-1]["account"]


def counted_sockperf(size):
    """sockperf's ping-pong as fast as it goes, both sides under perf."""
    def run(seconds):
        server = Counted(["sockperf", "server", "-i", "127.0.0.20", "-p", "11112", "--nonblocked"])
        time.sleep(0.5)
        with open(f"/tmp/softrnic-account-{os.getpid()}.out", "w+") as out:
            client = Counted(["sockperf", "ping-pong", "-i", "127.0.0.20", "-p", "11112", "-m", str(size), "-t",
                              str(seconds), "--nonblocked", "--mps=max"], out=out)
            client.proc.wait(timeout=60)
            out.seek(0)
            trips = int(re.search(r"\[Total Run\].*ReceivedMessages=(\d+)", out.read()).group(1))
        return [client.counts(), server.stop()], trips

    return marginal(run, 1, 3)


def counted_ucx(test, size, iters, port, tls):
    env = {**os.environ, "UCX_TLS": tls}

    def run(n):
        server = Counted(["ucx_perftest", "-p", str(port)], env=env)
        time.sleep(1.0)
        client = Counted(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", test, "-s", str(size), "-n", str(n)], env=env)
        client.proc.wait(timeout=120)
        return [client.counts(), server.stop()], n

    return marginal(run, iters // 4, iters)


def account_main(a):
    """Where the time goes: softrnic's account beside perf's count of every
    program, per 64 B round trip and per 64 KiB message."""
    install_peers()
    if shutil.which("perf") is None:
        sys.exit("--account needs perf: sudo apt-get install linux-perf")
    lat_n, bw_n = 50000, 20000
    columns = {}
    runs = {}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for wire in ["udp", "shm"]:
            runs.setdefault(f"softrnic {wire}, 64 B send_lat", []).append(counted_softrnic("send_lat", 64, lat_n, ["--datapath", wire]))
            runs.setdefault(f"softrnic {wire}, 64 KiB write_bw", []).append(counted_softrnic("write_bw", 65536, bw_n, ["--datapath", wire]))
        # Through softrnicd: the program and the daemon, both counted.
        runs.setdefault("softrnic through softrnicd, 64 B send_lat", []).append(counted_softrnic("send_lat", 64, lat_n, [], daemon=True))
        runs.setdefault("softrnic through softrnicd, 64 KiB write_bw", []).append(counted_softrnic("write_bw", 65536, bw_n, [], daemon=True))
        runs.setdefault("sockperf, 64 B ping-pong", []).append((counted_sockperf(64), None))
        for tls in ["tcp", "posix"]:
            # As many operations as take about a second each.
            lat_ops, bw_ops = (2_000_000, 400_000) if tls == "posix" else (100_000, 100_000)
            runs.setdefault(f"UCX {tls}, 64 B tag_lat", []).append((counted_ucx("tag_lat", 64, lat_ops, 15337 + run, f"{tls},self"), None))
            runs.setdefault(f"UCX {tls}, 64 KiB ucp_put_bw", []).append((counted_ucx("ucp_put_bw", 65536, bw_ops, 15437 + run, f"{tls},self"), None))
    kinds = ["syscalls", "send", "receive", "poll", "futex", "yield", "other", "context_switches", "cpu_us"]
    own = ["empty_receives", "sleeps", "wake_signals", "wake_reads", "doorbells", "bytes_copied", "icrc_bytes", "locks", "locks_contended"]
    # Time (µs): in each kind of call, and softrnic's own work in the
    # passes that moved data (the pass less its calls).
    timed = {
        "send calls": lambda c: c["send_ns"],
        "receive calls": lambda c: c["receive_ns"],
        "empty receives": lambda c: c["empty_receive_ns"],
        "own work sending": lambda c: max(c["transmit_pass_ns"] - c["send_ns"], 0),
        "own work receiving": lambda c: max(c["receive_pass_ns"] - c["receive_ns"], 0),
    }
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; per round trip (latency) or "
          "message (bandwidth), both ends; system calls, context switches and CPU time counted by perf stat for every "
          "program alike, as the difference between a short and a long run (set-up cancels out):\n")
    def table(columns, cell, own_only=False):
        print("| program | " + " | ".join(columns) + " |")
        print("| --- |" + " --- |" * len(columns))
        for name, rs in runs.items():
            if not own_only or rs[0][1] is not None:
                print(f"| {name} | " + " | ".join(f"{median([cell(r, c) for r in rs]):.2f}" for c in columns) + " |")

    table(kinds, lambda r, k: r[0][k])
    print("\nsoftrnic's own account (`softrnic bench --account`), the same runs:\n")
    table(own, lambda r, k: r[1]["costs"][k], own_only=True)
    print("\nTime in µs, from the same account:\n")
    table(list(timed), lambda r, k: timed[k](r[1]["costs"]) / 1000, own_only=True)
    print("\nAll runs:", json.dumps({name: [r[0] for r in rs] for name, rs in runs.items()}))


def daemon_main(a):
    """softrnic bench through softrnicd (shared queues) beside the engine in
    the process, same run, same tests."""
    socket = f"/tmp/softrnicd-bench-{os.getpid()}.sock"
    softrnicd = os.path.join(os.path.dirname(SOFTRNIC), "softrnicd")
    here = {**os.environ, "SOFTRNIC_DAEMON": "off"}
    there = {**os.environ, "SOFTRNIC_DAEMON": socket}
    r = {k: [] for k in ["lat", "d_lat", "rate", "d_rate", "bw", "d_bw"]}
    with Server([softrnicd, "--socket", socket]):
        for run in range(a.runs):
            print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
            # Addresses of their own each way: the daemon closes a device
            # a moment after its last program leaves, and an engine in the
            # process that opened the same address then found it taken.
            for key, env, addr in [("", here, "127.0.0.2"), ("d_", there, "127.0.0.12")]:
                at = ["--addr", addr]
                r[key + "lat"].append(softrnic("send_lat", 64, ["-n", "20000", *at], env)["p50_ns"] / 1000)
                r[key + "rate"].append(softrnic("send_bw", 64, ["-n", "200000", *at], env)["msg_rate_mpps"] * 1e6)
                r[key + "bw"].append(softrnic("write_bw", 65536, ["-n", "20000", *at], env)["bw_avg_gbps"])
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: per_run_ratio(r[a], r[b])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| measure | through softrnicd | engine in the process | ratio (median of per-run ratios) |")
    print("| --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 | {m['d_lat']:.2f} µs | {m['lat']:.2f} µs | {ratio('d_lat', 'lat'):.2f}× |")
    print(f"| 64 B send_bw message rate | {m['d_rate'] / 1e6:.3f} M/s | {m['rate'] / 1e6:.3f} M/s | {ratio('d_rate', 'rate'):.2f}× |")
    print(f"| 64 KiB write_bw | {m['d_bw']:.2f} Gb/s | {m['bw']:.2f} Gb/s | {ratio('d_bw', 'bw'):.2f}× |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


def auth_main(a, extra):
    """Packet authentication on and off, alternating in each run, on each
    wire."""
    plain = {**os.environ}
    plain.pop("SOFTRNIC_AUTH_KEY", None)
    keyed = {**plain, "SOFTRNIC_AUTH_KEY": "the benchmark's shared secret"}
    wires = ["udp", "shm"]
    r = {f"{w}_{k}": [] for w in wires for k in ["lat", "a_lat", "bw", "a_bw"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for wire in wires:
            for key, env, flag in [("", plain, []), ("a_", keyed, ["--auth"])]:
                at = extra + ["--datapath", wire, *flag]
                r[f"{wire}_{key}lat"].append(softrnic("send_lat", 64, ["-n", "20000", *at], env)["p50_ns"] / 1000)
                r[f"{wire}_{key}bw"].append(softrnic("write_bw", 65536, ["-n", "20000", *at], env)["bw_avg_gbps"])
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: per_run_ratio(r[a], r[b])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| wire | measure | authenticated | plain | ratio (median of per-run ratios) |")
    print("| --- | --- | --- | --- | --- |")
    for w in wires:
        print(f"| {w} | 64 B send_lat p50 | {m[w + '_a_lat']:.2f} µs | {m[w + '_lat']:.2f} µs | {ratio(w + '_a_lat', w + '_lat'):.2f}× |")
        print(f"| {w} | 64 KiB write_bw | {m[w + '_a_bw']:.2f} Gb/s | {m[w + '_bw']:.2f} Gb/s | {ratio(w + '_a_bw', w + '_bw'):.2f}× |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


def scaling_main(a, extra):
    """The E2 shape: 8 QPs, engine threads 1, 2, 4, 8, each progress mode."""
    threads = [1, 2, 4, 8]
    modes = ["inline", "dedicated"]
    r = {(m, t, k): [] for m in modes for t in threads for k in ["rate", "bw"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for m in modes:
            for t in threads:
                common = ["-q", "8", "--engine-threads", str(t), "--datapath", a.datapath, "--progress", m, "-D", "3"]
                r[(m, t, "rate")].append(softrnic("send_bw", 64, common)["msg_rate_mpps"] * 1e6)
                r[(m, t, "bw")].append(softrnic("write_bw", 65536, common)["bw_avg_gbps"])
    ratio = lambda m, t, k: per_run_ratio(r[(m, t, k)], r[(m, 1, k)])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, 8 QPs, {a.datapath} datapath:\n")
    print("| progress | engine threads | 64 B send_bw | × 1 thread | 64 KiB write_bw | × 1 thread |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in modes:
        for t in threads:
            rate, bw = median(r[(m, t, "rate")]), median(r[(m, t, "bw")])
            print(f"| {m} | {t} | {rate / 1e6:.3f} M/s | {ratio(m, t, 'rate'):.2f}× | {bw:.2f} Gb/s | {ratio(m, t, 'bw'):.2f}× |")
    print("\nAll runs:", json.dumps({f"{m}-{t}-{k}": [round(x, 3) for x in v] for (m, t, k), v in r.items()}))


RECOVERIES = [
    ("go-back-N, fixed timer", ["--retransmission", "fixed"]),
    ("go-back-N, adaptive timer", ["--retransmission", "adaptive"]),
    ("selective repeat", ["--selective-repeat"]),
]
MIX = ["--loss", "0.05", "--reorder", "0.05", "--duplicate", "0.02", "--corrupt", "0.01"]


def gbps_or_zero(test, size, args, key="bw_avg_gbps"):
    """A run's Gb/s (or another figure); 0 when it failed (go-back-N gives
    up at high loss)."""
    try:
        return softrnic(test, size, args)[key]
    except RuntimeError as e:
        print(f"  {test} {' '.join(args)}: {e}", file=sys.stderr)
        return 0.0


def loss_main(a, extra):
    """Throughput and tail latency under injected loss for each recovery,
    against lossless in the same run, then softrnic and Linux TCP (iperf3)
    across a link between two namespaces that loses in the kernel (issue
    14's sweep)."""
    losses = [0.0, 0.001, 0.01, 0.05]
    tests = [("write_bw", 65536), ("send_bw", 65536)]
    r = {}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for mode, flags in RECOVERIES:
            for test, size in tests:
                for p in losses:
                    args = extra + flags + ["--loss", str(p), "-D", "2"]
                    r.setdefault((mode, test, p), []).append(gbps_or_zero(test, size, args))
            for test, size in tests + [("read_bw", 65536)]:
                r.setdefault((mode, test, "mix"), []).append(gbps_or_zero(test, size, extra + flags + MIX + ["-D", "2"]))
            # 8-byte operands: operations per second say more than Gb/s.
            ops = lambda *more: gbps_or_zero("atomic_bw", 8, extra + flags + list(more) + ["-D", "2"], "msg_rate_mpps") * 1e6
            r.setdefault((mode, "atomic_bw", 0.0), []).append(ops())
            r.setdefault((mode, "atomic_bw", "mix"), []).append(ops(*MIX))
            for p in [0.0, 0.01]:
                lat = softrnic("send_lat", 64, extra + flags + ["--loss", str(p), "-n", "5000"])
                r.setdefault((mode, "p99", p), []).append(lat["p99_ns"] / 1000)
    ratio = lambda key, base: per_run_ratio(r[key], r[base])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one QP, loss in each direction:\n")
    print("| test | recovery | lossless | 0.1 % | 1 % | 5 % |")
    print("| --- | --- | --- | --- | --- | --- |")
    for test, _ in tests:
        for mode, _ in RECOVERIES:
            cells = [f"{median(r[(mode, test, 0.0)]):.2f} Gb/s"]
            cells += [f"{median(r[(mode, test, p)]):.2f} Gb/s ({ratio((mode, test, p), (mode, test, 0.0)):.0%})" for p in losses[1:]]
            print(f"| 64 KiB {test} | {mode} | " + " | ".join(cells) + " |")
    print("\nThe CI fault mix (5 % loss, 5 % reordering, 2 % duplication, 1 % corruption):\n")
    print("| recovery | write_bw | send_bw | read_bw | atomic_bw (lossless) |")
    print("| --- | --- | --- | --- | --- |")
    for mode, _ in RECOVERIES:
        cells = [f"{median(r[(mode, t, 'mix')]):.3f} Gb/s" for t in ["write_bw", "send_bw", "read_bw"]]
        cells.append(f"{median(r[(mode, 'atomic_bw', 'mix')]):,.0f} ops/s ({median(r[(mode, 'atomic_bw', 0.0)]):,.0f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")
    print("\n| 64 B send_lat p99 | lossless | 1 % loss |")
    print("| --- | --- | --- |")
    for mode, _ in RECOVERIES:
        lossless, lossy = median(r[(mode, "p99", 0.0)]), median(r[(mode, "p99", 0.01)])
        print(f"| {mode} | {lossless:.1f} µs | {lossy:.1f} µs ({ratio((mode, 'p99', 0.01), (mode, 'p99', 0.0)):.1f}×) |")
    print("\nAll runs:", json.dumps({f"{k[0]}-{k[1]}-{k[2]}": [round(x, 3) for x in v] for k, v in r.items()}))
    if os.geteuid() == 0:
        netns_loss(a, [0.0, 0.1, 1.0, 5.0])
    else:
        print("\n(the namespace sweep against iperf3 needs root)")


class Namespaces:
    """Network namespaces named NAMES, removed on exit whatever happened."""

    NAMES = ()

    def run(self, i, args):
        return ["ip", "netns", "exec", self.NAMES[i], *args]

    def remove(self):
        for ns in self.NAMES:
            sh(["ip", "netns", "del", ns])

    def __exit__(self, *exc):
        self.remove()


class LossyLink(Namespaces):
    """Two network namespaces joined by a veth pair whose ends drop a
    given percentage of what they send: netem, or nftables where the
    kernel has no netem. Removed on exit, whatever happened."""

    NAMES = ("srnic-loss-a", "srnic-loss-b")
    DEVS = ("srnic-la", "srnic-lb")
    ADDRS = ("10.78.0.1", "10.78.0.2")

    def __enter__(self):
        self.remove()
        a, b = self.NAMES
        for args in [["netns", "add", a], ["netns", "add", b],
                     ["link", "add", self.DEVS[0], "type", "veth", "peer", "name", self.DEVS[1]],
                     ["link", "set", self.DEVS[0], "netns", a], ["link", "set", self.DEVS[1], "netns", b]]:
            subprocess.run(["ip", *args], check=True, capture_output=True)
        for ns, dev, addr in zip(self.NAMES, self.DEVS, self.ADDRS):
            for args in [["addr", "add", addr + "/24", "dev", dev], ["link", "set", dev, "up"], ["link", "set", "lo", "up"]]:
                subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)
        return self

    def lose(self, percent):
        """Sets the loss of both ends; returns what applies it."""
        for ns, dev in zip(self.NAMES, self.DEVS):
            sh(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"])
            sh(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "lossy"])
        if percent == 0:
            return "none"
        if all(sh(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "netem", "loss", f"{percent}%"]).returncode == 0
               for ns, dev in zip(self.NAMES, self.DEVS)):
            return "netem"
        for ns, dev in zip(self.NAMES, self.DEVS):
            nft = lambda *rest: subprocess.run(["ip", "netns", "exec", ns, "nft", *rest], check=True, capture_output=True)
            nft("add", "table", "inet", "lossy")
            nft("add", "chain", "inet", "lossy", "out", "{ type filter hook output priority 0; }")
            nft("add", "rule", "inet", "lossy", "out", "oifname", dev, "numgen", "random", "mod", "10000", "<", str(round(percent * 100)), "drop")
        return "nftables"


def netns_loss(a, percents):
    """softrnic (each recovery) and Linux TCP (iperf3, one stream) across
    the same lossy link between two namespaces, same run."""
    install_peers()
    r, how = {}, {}
    with LossyLink() as link:
        for run in range(a.runs):
            print(f"namespaces, run {run + 1}/{a.runs} ...", file=sys.stderr)
            for p in percents:
                how[p] = link.lose(p)
                with Server(link.run(0, ["iperf3", "-s", "-B", link.ADDRS[0], "-1"])):
                    out = sh(link.run(1, ["iperf3", "-c", link.ADDRS[0], "-t", "3", "-J"]), timeout=30)
                try:
                    gbps = json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e9
                except (ValueError, KeyError):
                    gbps = 0.0
                r.setdefault(("iperf3 (TCP)", p), []).append(gbps)
                for mode, flags in RECOVERIES[1:]:
                    with Server(link.run(0, [SOFTRNIC, "bench", "write_bw", "--server", "--addr", link.ADDRS[0]])):
                        out = sh(link.run(1, [SOFTRNIC, "bench", "write_bw", link.ADDRS[0], "--addr", link.ADDRS[1],
                                              "-s", "65536", "-m", "1024", "-D", "3", "--json", *flags]), timeout=60)
                    try:
                        gbps = json.loads(out.stdout.strip().splitlines()[-1])["bw_avg_gbps"]
                    except (ValueError, IndexError, KeyError):
                        gbps = 0.0
                    r.setdefault((mode, p), []).append(gbps)
    tools = ["iperf3 (TCP)"] + [m for m, _ in RECOVERIES[1:]]
    print(f"\nAcross a veth between two namespaces (1500-byte MTU, 1024-byte path MTU), loss in the kernel ({', '.join(sorted(set(how.values()) - {'none'}))}), medians of {a.runs} runs:\n")
    print("| | " + " | ".join(f"{p} % loss" for p in percents) + " |")
    print("| --- |" + " --- |" * len(percents))
    for tool in tools:
        base = median(r[(tool, 0.0)])
        cells = [f"{median(r[(tool, p)]):.2f} Gb/s" + (f" ({median(r[(tool, p)]) / base:.0%})" if p and base else "") for p in percents]
        print(f"| {tool} | " + " | ".join(cells) + " |")
    sr = RECOVERIES[2][0]
    print("\n| softrnic selective repeat ÷ TCP | " + " | ".join(f"{median(r[(sr, p)]) / median(r[('iperf3 (TCP)', p)]):.2f}×" for p in percents) + " |")
    print("\nAll runs:", json.dumps({f"{k[0]}-{k[1]}": [round(x, 3) for x in v] for k, v in r.items()}))


def cmtime_connect_ms(connections, port):
    """cmtime over softrnic's librdmacm (both ends on loopback addresses,
    UDP): the total of its connect step, in ms."""
    libdir = os.path.join(ROOT, "target", "softrnic", "lib")
    env = lambda addr: {**os.environ, "LD_LIBRARY_PATH": libdir, "SOFTRNIC_ADDR": addr, "SOFTRNIC_DATAPATH": "udp"}
    args = ["-p", str(port), "-c", str(connections)]
    with Server(["cmtime", "-b", "127.0.0.40", *args], env=env("127.0.0.40")):
        out = sh(["cmtime", "-s", "127.0.0.40", "-b", "127.0.0.41", *args], env=env("127.0.0.41"))
    m = re.search(r"^connect\s*:\s*([\d.]+)", out.stdout, re.M)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"cmtime -c {connections}: {out.stdout[-300:]} {out.stderr[-300:]}")
    return float(m.group(1))


def tcp_connect_ms(connections):
    """Kernel TCP on loopback: `connections` connects, each accepted, as
    one client opens them (what cmtime's connect step is for rdma_cm)."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.42", 0))
    listener.listen(connections)
    clients, accepted = [], []
    start = time.perf_counter()
    for _ in range(connections):
        c = socket.create_connection(listener.getsockname())
        accepted.append(listener.accept()[0])
        clients.append(c)
    elapsed = (time.perf_counter() - start) * 1000
    for s in clients + accepted + [listener]:
        s.close()
    return elapsed


def cm_main(a):
    """Connections per second through rdma_cm beside TCP's, same run."""
    if shutil.which("cmtime") is None:
        sys.exit("cmtime is missing: sudo apt-get install rdmacm-utils")
    subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, stdout=subprocess.DEVNULL)
    counts = [1, 10, 100, 1000]
    r = {n: {"cm": [], "tcp": []} for n in counts}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for i, n in enumerate(counts):
            r[n]["cm"].append(cmtime_connect_ms(n, 15000 + run * 10 + i))
            r[n]["tcp"].append(tcp_connect_ms(n))
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| connections | rdma_cm over softrnic: connect | per second | kernel TCP: connect + accept | per second | softrnic's rate / TCP's (median of per-run ratios) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in counts:
        cm, tcp = median(r[n]["cm"]), median(r[n]["tcp"])
        ratio = median([t / c for c, t in zip(r[n]["cm"], r[n]["tcp"])])
        print(f"| {n} | {cm:.2f} ms | {n / cm * 1000:,.0f} | {tcp:.2f} ms | {n / tcp * 1000:,.0f} | {ratio:.2f}× |")
    print("\nAll runs:", json.dumps({n: v for n, v in r.items()}))


PRELOAD = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"


def rstream_row(program, args, port, env, server_addr="127.0.0.60", client_addr="127.0.0.61"):
    """One rstream (or riostream) pair; its table's last row: (Gb/s,
    µs per transfer, one way)."""
    common = [program, "-p", str(port), *args]
    with Server([*common, "-b", server_addr], env={**env, "SOFTRNIC_ADDR": server_addr}):
        out = sh([*common, "-s", server_addr], env={**env, "SOFTRNIC_ADDR": client_addr}, timeout=300)
    rows = [l.split() for l in out.stdout.splitlines() if re.match(r"^\w+\s+\d+[kmg]?\s+\d", l)]
    if out.returncode != 0 or not rows:
        raise RuntimeError(f"{' '.join(common)}: {out.stdout[-300:]} {out.stderr[-300:]}")
    return float(rows[-1][6]), float(rows[-1][7])


def sockperf_tcp_p50_us(port, env, preload):
    """sockperf's blocking TCP ping-pong, 64 B, 3 s: the median round
    trip's half, as sockperf reports it; under librspreload.so when
    `preload`."""
    pre = {"LD_PRELOAD": PRELOAD} if preload else {}
    with Server(["sockperf", "server", "--tcp", "-i", "127.0.0.62", "-p", str(port)],
                env={**env, **pre, "SOFTRNIC_ADDR": "127.0.0.62"}, settle=1):
        out = sh(["sockperf", "ping-pong", "--tcp", "-i", "127.0.0.62", "-p", str(port), "-m", "64", "-t", "3"],
                 env={**env, **pre, "SOFTRNIC_ADDR": "127.0.0.63"})
    m = re.search(r"percentile 50\.000 =\s+([\d.]+)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"sockperf --tcp{' (preloaded)' if preload else ''}: {out.stdout[-300:]} {out.stderr[-300:]}")
    return float(m.group(1))


def rsockets_main(a):
    """rsockets over softrnic beside kernel TCP through the same programs,
    same run."""
    for tool, package in [("rstream", "rdmacm-utils"), ("sockperf", "sockperf")]:
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: sudo apt-get install {package}")
    libdir = subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    wires = {"default": {}, "udp": {"SOFTRNIC_DATAPATH": "udp"}}
    lat, bw = ["-S", "64", "-C", "1", "-I", "20000"], ["-S", "65536", "-C", "5000"]
    cases = [  # (key, program, arguments, figure: 0 Gb/s, 1 µs)
        ("lat", "rstream", lat, 1), ("bw", "rstream", bw, 0),
        ("blat", "rstream", ["-T", "b", *lat], 1), ("bbw", "rstream", ["-T", "b", *bw], 0),
    ]
    r = {}
    port = 16000
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for key, program, args, figure in cases:
            for wire, extra in wires.items():
                env = {**os.environ, "LD_LIBRARY_PATH": libdir, **extra}
                port += 1
                r.setdefault(f"{key}_{wire}", []).append(rstream_row(program, args, port, env)[figure])
            port += 1
            r.setdefault(f"{key}_tcp", []).append(rstream_row(program, ["-T", "s", *args], port, dict(os.environ))[figure])
        for wire, extra in wires.items():
            env = {**os.environ, "LD_LIBRARY_PATH": libdir, **extra}
            port += 1
            r.setdefault(f"riobw_{wire}", []).append(rstream_row("riostream", ["-S", "65536", "-C", "1000"], port, env)[0])
            port += 1
            r.setdefault(f"preload_{wire}", []).append(sockperf_tcp_p50_us(port, env, preload=True))
        port += 1
        r.setdefault("preload_tcp", []).append(sockperf_tcp_p50_us(port, dict(os.environ), preload=False))
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda x, y: per_run_ratio(r[x], r[y])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| measure | wire | rsockets over softrnic | kernel TCP (same program) | ratio (median of per-run ratios) |")
    print("| --- | --- | --- | --- | --- |")
    rows = [("rstream 64 B latency, non-blocking", "lat", "µs", "{:.2f}"),
            ("rstream 64 KiB bandwidth, non-blocking", "bw", "Gb/s", "{:.2f}"),
            ("rstream 64 B latency, blocking (-T b)", "blat", "µs", "{:.2f}"),
            ("rstream 64 KiB bandwidth, blocking (-T b)", "bbw", "Gb/s", "{:.2f}")]
    for wire in wires:
        for name, key, unit, fmt in rows:
            ours, tcp = fmt.format(m[f"{key}_{wire}"]), fmt.format(m[f"{key}_tcp"])
            print(f"| {name} | {wire} | {ours} {unit} | {tcp} {unit} | {ratio(f'{key}_{wire}', f'{key}_tcp'):.2f}× |")
        print(f"| riostream 64 KiB bandwidth (riowrite) against rstream -T s | {wire} | {m[f'riobw_{wire}']:.2f} Gb/s | "
              f"{m['bw_tcp']:.2f} Gb/s | {ratio(f'riobw_{wire}', 'bw_tcp'):.2f}× |")
        print(f"| sockperf --tcp 64 B ping-pong p50, under librspreload.so | {wire} | {m[f'preload_{wire}']:.2f} µs | "
              f"{m['preload_tcp']:.2f} µs | {ratio(f'preload_{wire}', 'preload_tcp'):.2f}× |")
    print("\nAll runs:", json.dumps({k: [round(x, 2) for x in v] for k, v in r.items()}))


def mpi_figures(argv):
    """Runs mpi-check; returns its latency (µs), bandwidth (MB/s) and
    allreduce time (µs)."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = sh(argv, env=env, timeout=300)
    text = out.stdout + out.stderr
    pick = lambda pattern: float(re.search(pattern, text, re.M).group(1))
    if out.returncode != 0 or "put:" not in text:
        raise RuntimeError(f"{' '.join(argv[:6])}...: {text[-400:]}")
    return pick(r"^latency: 8 B ([\d.]+)"), pick(r"^bandwidth: 1 MiB ([\d.]+)"), pick(r"^allreduce: 64 Ki doubles ([\d.]+)")


def mpi_main(a):
    """Open MPI over softrnic (pml ucx, rc_verbs only) beside Open MPI over
    its TCP BTL, same program, same run."""
    if shutil.which("mpicc") is None:
        sys.exit("Open MPI is missing: sudo apt-get install openmpi-bin libopenmpi-dev")
    libdir = subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    binary = os.path.join(ROOT, "target", "mpi-check")
    subprocess.run(["mpicc", "-O2", "-o", binary, os.path.join(ROOT, "scripts", "programs", "mpi-check.c")], check=True)
    softrnic_run = [SOFTRNIC, "run", "--addr", "127.0.0.50", "--", "mpirun", "--oversubscribe", "--mca", "pml", "ucx",
                    "--mca", "osc", "ucx", "-x", "UCX_TLS=rc_v,self", "-x", "UCX_NET_DEVICES=softrnic0:1",
                    "-x", f"LD_LIBRARY_PATH={libdir}",
                    "-np", "1", "-x", "SOFTRNIC_ADDR=127.0.0.50", binary, ":",
                    "-np", "1", "-x", "SOFTRNIC_ADDR=127.0.0.51", binary]
    tcp = ["mpirun", "--oversubscribe", "-np", "2", "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", binary]
    r = {k: [] for k in ["lat", "tcp_lat", "bw", "tcp_bw", "ar", "tcp_ar"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for prefix, argv in [("", softrnic_run), ("tcp_", tcp)]:
            lat, bw, ar = mpi_figures(argv)
            r[prefix + "lat"].append(lat)
            r[prefix + "bw"].append(bw)
            r[prefix + "ar"].append(ar)
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda x, y: per_run_ratio(r[x], r[y])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| measure | Open MPI over softrnic (pml ucx) | Open MPI over TCP (ob1, btl tcp) | ratio (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| 8 B ping-pong, half round trip | {m['lat']:.2f} µs | {m['tcp_lat']:.2f} µs | {ratio('lat', 'tcp_lat'):.2f}× | ≤ 1× |")
    print(f"| 1 MiB ping-pong bandwidth | {m['bw']:.0f} MB/s | {m['tcp_bw']:.0f} MB/s | {ratio('bw', 'tcp_bw'):.2f}× | ≥ 1× |")
    print(f"| 64 Ki-double allreduce | {m['ar']:.0f} µs | {m['tcp_ar']:.0f} µs | {ratio('ar', 'tcp_ar'):.2f}× | |")
    print("\nAll runs:", json.dumps({k: [round(x, 2) for x in v] for k, v in r.items()}))


def qps_main(a, extra):
    """256 QPs of 4 KiB write_bw on the shared-memory wire beside one QP,
    and the engines' own memory per QP (from runs with one copy off, whose
    buffers are mapped once)."""
    many = 256
    r = {k: [] for k in ["one", "many", "ratio", "lost", "per_qp"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        rows = {}
        for qps in ([1, many] if run % 2 == 0 else [many, 1]):
            rows[qps] = softrnic("write_bw", 4096, extra + ["--datapath", "shm", "-q", str(qps), "-D", "3"])
        one, lots = rows[1], rows[many]
        r["one"].append(one["bw_avg_gbps"])
        r["many"].append(lots["bw_avg_gbps"])
        r["ratio"].append(lots["bw_avg_gbps"] / one["bw_avg_gbps"])
        r["lost"].append((lots["retransmitted"], lots["timeouts"]))
        # The engines' memory from two more runs with one copy off: with it
        # on, each end's buffers are mapped twice in the one process (by
        # their owner and by the peer that copies out of them) and the
        # resident figure counts such pages twice. One process holds both
        # ends: each end's buffers, and twice the QPs.
        once = {**os.environ, "SOFTRNIC_NO_ONE_COPY": "1"}
        memory = {qps: softrnic("write_bw", 4096, extra + ["--datapath", "shm", "-q", str(qps), "-D", "1"], once)
                  for qps in (1, many)}
        own = lambda row: row["resident_peak_bytes"] - 2 * row["registered_bytes"]
        r["per_qp"].append((own(memory[many]) - own(memory[1])) / (2 * (many - 1)))
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| 4 KiB write_bw, shared memory | 1 QP | 256 QPs | 256 ÷ 1 (median of per-run ratios) | retransmitted, timeouts (each run, 256 QPs) | engine memory per QP |")
    print("| --- | --- | --- | --- | --- | --- |")
    lost = ", ".join(f"{x}/{y}" for x, y in r["lost"])
    print(f"| | {median(r['one']):.2f} Gb/s | {median(r['many']):.2f} Gb/s | {median(r['ratio']):.2f}× "
          f"({min(r['ratio']):.2f} to {max(r['ratio']):.2f}) | {lost} | {median(r['per_qp']) / 1024:.1f} KiB |")
    print("\nAll runs:", json.dumps({k: v for k, v in r.items()}))


def per_run_ratio(xs, ys):
    """The median of the runs' own ratios: the machine drifts between runs,
    and each peer ran beside softrnic in the same run."""
    return median([x / y for x, y in zip(xs, ys) if y > 0])


def median(xs):
    return statistics.median(xs) if xs else float("nan")


class Bridge(Namespaces):
    """Two namespaces on a Linux bridge (in a third), veths with checksum
    offload off as the lab's: the kernel's own forwarding, for
    comparison. Removed on exit."""

    NAMES = ("srnic-br-a", "srnic-br-b", "srnic-br-sw")
    ADDRS = ("10.79.0.1", "10.79.0.2")

    def __enter__(self):
        self.remove()
        a, b, sw = self.NAMES
        cmds = [["netns", "add", a], ["netns", "add", b], ["netns", "add", sw],
                ["-n", sw, "link", "add", "br0", "type", "bridge"], ["-n", sw, "link", "set", "br0", "up"]]
        for i, ns in enumerate((a, b)):
            cmds += [["link", "add", "eth0", "netns", ns, "mtu", "8000", "type", "veth", "peer", "name", f"p{i}", "netns", sw, "mtu", "8000"],
                     ["-n", sw, "link", "set", f"p{i}", "master", "br0", "up"],
                     ["-n", ns, "addr", "add", self.ADDRS[i] + "/24", "dev", "eth0"],
                     ["-n", ns, "link", "set", "eth0", "up"], ["-n", ns, "link", "set", "lo", "up"]]
        for args in cmds:
            subprocess.run(["ip", *args], check=True, capture_output=True)
        for ns in (a, b):
            sh(["ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off"])
        return self


def iperf3_udp(out_json):
    """Frames per second and Gb/s that reached the iperf3 server."""
    try:
        end = json.loads(out_json)["end"]["sum"]
        received = end["packets"] - end["lost_packets"]
        return received / end["seconds"], end["bytes"] * (1 - end["lost_percent"] / 100) * 8 / end["seconds"] / 1e9
    except (ValueError, KeyError, ZeroDivisionError):
        return 0.0, 0.0


# UDP payloads that make 64-byte and 4 KiB Ethernet frames (14 + 20 + 8
# bytes of headers).
FRAME_PAYLOAD = {64: 22, 4096: 4054}


def switch_main(a):
    if os.geteuid() != 0:
        sys.exit("--switch builds namespaces: run it as root")
    install_peers()
    r = {}
    secs = "3"
    for run in range(a.runs):
        print(f"switch, run {run + 1}/{a.runs} ...", file=sys.stderr)
        for frame, payload in FRAME_PAYLOAD.items():
            client = ["iperf3", "-u", "-b", "0", "-l", str(payload), "-t", secs, "-J"]
            with Bridge() as br:
                with Server(br.run(1, ["iperf3", "-s", "-1"])):
                    out = sh(br.run(0, client + ["-c", br.ADDRS[1]]), timeout=30)
                r.setdefault(("bridge", frame), []).append(iperf3_udp(out.stdout))
            cmd = " ".join(client + ["-c", "$h1"])
            out = sh([SOFTRNIC, "lab", "star:2", "--rate", "400Gbps", "--queue", "4MB", "--ecn", "off",
                      "--bg", "h1=iperf3 -s -1", "--on", f"h0=sleep 0.5; {cmd}"], timeout=60)
            r.setdefault(("softrnic", frame), []).append(iperf3_udp(out.stdout[out.stdout.find("{"):out.stdout.rfind("}") + 1]))
        for gbps in (1, 10):
            stats = f"/tmp/softrnic-rate-{os.getpid()}.csv"
            sh([SOFTRNIC, "lab", "star:2", "--rate", f"{gbps}Gbps", "--stats", stats, "--sample-every", "100ms",
                "--bg", "h1=iperf3 -s -1", "--on", f"h0=sleep 0.5; iperf3 -c $h1 -t {secs}"], timeout=60)
            r.setdefault(("rate", gbps), []).append(port_rate_gbps(stats, "h1"))
    fct = sh([SOFTRNIC, "exp", "fct", "--quick", "--out", f"/tmp/softrnic-fct-{os.getpid()}"], timeout=600)
    speed = re.search(r"([0-9]+) datagrams per wall second, ([0-9]+)x slower", fct.stdout)
    m = lambda k, i: median([v[i] for v in r[k]])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; iperf3 UDP at full speed from one namespace to another:\n")
    print("| measure | softrnic switch | Linux bridge | ratio | bmv2 (published) | ÷ bmv2 | target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    pps = lambda k: m(k, 0)
    print(f"| 64 B frames forwarded | {pps(('softrnic', 64)) / 1e6:.3f} Mpps | {pps(('bridge', 64)) / 1e6:.3f} Mpps | "
          f"{per_run_ratio([v[0] for v in r[('softrnic', 64)]], [v[0] for v in r[('bridge', 64)]]):.2f}× | 0.080 Mpps | "
          f"{pps(('softrnic', 64)) / 80e3:.1f}× | ≥ 0.5× bridge, ≥ 10× bmv2 |")
    print(f"| 4 KiB frames forwarded | {m(('softrnic', 4096), 1):.2f} Gb/s | {m(('bridge', 4096), 1):.2f} Gb/s | "
          f"{per_run_ratio([v[1] for v in r[('softrnic', 4096)]], [v[1] for v in r[('bridge', 4096)]]):.2f}× | 1 Gb/s | "
          f"{m(('softrnic', 4096), 1):.1f}× | ≥ 10× bmv2 |")
    print("\n| port rate | egress measured (frames, TCP load) | error |")
    print("| --- | --- | --- |")
    for gbps in (1, 10):
        got = median(r[("rate", gbps)])
        print(f"| {gbps} Gb/s | {got:.3f} Gb/s | {abs(got - gbps) / gbps:.1%} |")
    if speed:
        print(f"\nSimulator on the 320-server fat tree (exp fct --quick): {int(speed.group(1)):,} datagrams per wall second, {speed.group(2)}× slower than real time.")
    print("\nAll runs:", json.dumps({f"{k[0]}-{k[1]}": v for k, v in r.items()}))


def port_rate_gbps(stats_csv, peer):
    """The egress rate of the switch's port to `peer` while it was busy:
    bytes between the first and last samples with traffic, over that time."""
    rows = []
    try:
        with open(stats_csv) as f:
            next(f)
            for line in f:
                c = line.strip().split(",")
                if c[3] == peer and c[4] == "1":
                    rows.append((float(c[0]), int(c[11])))
    except (OSError, StopIteration):
        return 0.0
    busy = [(t, b) for (t, b), (_, prev) in zip(rows[1:], rows) if b > prev]
    if len(busy) < 3:
        return 0.0
    # Leave out the first and last busy samples (TCP starting and ending).
    (t0, b0), (t1, b1) = busy[1], busy[-2]
    return (b1 - b0) * 8 / (t1 - t0) / 1e9 if t1 > t0 else 0.0


def against_main(a):
    """This build beside another, in shuffled rounds with an A/A control."""
    import random
    other = os.path.abspath(a.against)
    if not os.access(other, os.X_OK):
        sys.exit(f"--against {a.against}: not an executable softrnic binary")
    builds = {"this": SOFTRNIC, "this again": SOFTRNIC, "other": other}
    tests = {f"64 KiB write_bw, {wire} (Gb/s)": ("write_bw", 65536, "bw_avg_gbps", 1, wire) for wire in ("shm", "udp")}
    tests |= {f"64 B send_lat p50, {wire} (µs)": ("send_lat", 64, "p50_ns", 1e-3, wire) for wire in ("shm", "udp")}
    r = {(t, b): [] for t in tests for b in builds}
    order = list(builds)
    rng = random.Random(a.runs)
    env = {**os.environ, "SOFTRNIC_DAEMON": "off"}
    for run in range(a.runs):
        print(f"round {run + 1}/{a.runs} ...", file=sys.stderr)
        rng.shuffle(order)
        for b in order:
            for t, (test, size, key, scale, wire) in tests.items():
                out = sh([builds[b], "bench", test, "-s", str(size), "--datapath", wire, "--json", "-n", "20000"],
                         env=env)
                if out.returncode != 0:
                    sys.exit(f"{builds[b]} bench {test}: {out.stderr.strip()}")
                r[(t, b)].append(json.loads(out.stdout.strip().splitlines()[-1])[key] * scale)
    print(f"\n{a.runs} shuffled rounds, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; other: {other}\n")
    print("| measure | this build | other build | this ÷ other (median of per-round ratios, range, rounds lower) | A/A control: this again ÷ this |")
    print("| --- | --- | --- | --- | --- |")
    for t in tests:
        this, again, that = r[(t, "this")], r[(t, "this again")], r[(t, "other")]
        ratios = [x / y for x, y in zip(this, that)]
        control = [x / y for x, y in zip(again, this)]
        print(f"| {t} | {median(this):.2f} | {median(that):.2f} | {median(ratios):.2f} ({min(ratios):.2f} to "
              f"{max(ratios):.2f}, {sum(x < 1 for x in ratios)} of {a.runs}) | {median(control):.2f} "
              f"({min(control):.2f} to {max(control):.2f}) |")
    print("\nAll runs:", json.dumps({f"{t} {b}": [round(x, 3) for x in v] for (t, b), v in r.items()}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--perftest", action="store_true", help="perftest over libibverbs.so.1 beside softrnic bench")
    parser.add_argument("--read", action="store_true",
                        help="RDMA READ beside RDMA WRITE at 64 KiB and 1 MiB: softrnic bench (UDP, shared memory, softrnicd) and perftest")
    parser.add_argument("--shm", action="store_true", help="the shared-memory wire against UCX's")
    parser.add_argument("--scaling", action="store_true", help="8 QPs over 1, 2, 4 and 8 engine threads")
    parser.add_argument("--loss", action="store_true", help="throughput and tail latency under loss, each recovery, and against TCP")
    parser.add_argument("--cm", action="store_true", help="connection set-up through rdma_cm beside TCP's")
    parser.add_argument("--rsockets", action="store_true", help="rstream, riostream and librspreload over softrnic beside TCP")
    parser.add_argument("--mpi", action="store_true", help="Open MPI over softrnic beside Open MPI over TCP")
    parser.add_argument("--switch", action="store_true", help="the lab's switch beside the Linux bridge; port rate accuracy; simulator speed")
    parser.add_argument("--daemon", action="store_true", help="softrnic bench through softrnicd beside the engine in the process")
    parser.add_argument("--auth", action="store_true", help="packet authentication on and off, over UDP and shared memory")
    parser.add_argument("--account", action="store_true", help="where the time goes: system calls, switches, copies per message, beside sockperf and UCX")
    parser.add_argument("--qps", action="store_true", help="256 QPs of 4 KiB write_bw on one host beside one QP; memory per QP")
    parser.add_argument("--datapath", default="udp", choices=["udp", "shm"], help="the wire for --scaling")
    parser.add_argument("--against", metavar="OTHER", help="this build's softrnic beside OTHER, another build's, with an A/A control")
    a = parser.parse_args()
    if "SOFTRNIC_BIN" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "softrnic-cli", "-p", "softrnic-daemon"], cwd=ROOT, check=True)
    extra = ["--engine-threads", str(a.engine_threads)]
    if a.against:
        return against_main(a)
    if a.switch:
        return switch_main(a)
    if a.daemon:
        return daemon_main(a)
    if a.auth:
        return auth_main(a, extra)
    if a.account:
        return account_main(a)
    if a.qps:
        return qps_main(a, extra)
    if a.cm:
        return cm_main(a)
    if a.rsockets:
        return rsockets_main(a)
    if a.mpi:
        return mpi_main(a)
    if a.shm:
        return shm_main(a, extra)
    if a.scaling:
        return scaling_main(a, extra)
    if a.loss:
        return loss_main(a, extra)
    if a.perftest:
        if shutil.which("ib_send_lat") is None:
            sys.exit("perftest is missing: sudo apt-get install perftest")
        return perftest_main(a, extra)
    if a.read:
        if shutil.which("ib_read_bw") is None:
            sys.exit("perftest is missing: sudo apt-get install perftest")
        return read_main(a, extra)
    install_peers()
    extra = extra + ["--datapath", "udp"]
    r = {k: [] for k in ["lat", "lat_p99", "udp", "udp_p99", "ucx_lat", "rate", "rate_list", "ucx_rate", "bw", "tcp", "ucx_put"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        lat = softrnic("send_lat", 64, extra + ["-n", "20000"])
        r["lat"].append(lat["p50_ns"] / 1000)
        r["lat_p99"].append(lat["p99_ns"] / 1000)
        p50, p99 = sockperf_us(64)
        r["udp"].append(p50)
        r["udp_p99"].append(p99)
        r["ucx_lat"].append(ucx("tag_lat", 64, 13337 + run)["p50_us"])
        r["rate"].append(softrnic("send_bw", 64, extra + ["-n", "200000"])["msg_rate_mpps"] * 1e6)
        r["rate_list"].append(softrnic("send_bw", 64, extra + ["-n", "400000", "-l", "16"])["msg_rate_mpps"] * 1e6)
        r["ucx_rate"].append(ucx("ucp_am_bw", 64, 13437 + run)["msg_rate"])
        r["bw"].append(softrnic("write_bw", 65536, extra + ["-n", "20000"])["bw_avg_gbps"])
        r["tcp"].append(iperf3_gbps())
        r["ucx_put"].append(ucx("ucp_put_bw", 65536, 13537 + run)["mbps"] * 8 * 1.048576 / 1000)
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: per_run_ratio(r[a], r[b])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, engine threads {a.engine_threads}:\n")
    print("| measure | softrnic | peer | peer value | ratio (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | raw UDP ping-pong, spinning (sockperf) | {m['udp']:.2f} µs | {ratio('lat', 'udp'):.2f}× | ≤ 1.2× |")
    print(f"| 64 B send_lat p99 | {m['lat_p99']:.2f} µs | sockperf's p99 | {m['udp_p99']:.2f} µs | {ratio('lat_p99', 'udp_p99'):.2f}× | ≤ 1.5× |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | UCX tcp tag_lat | {m['ucx_lat']:.2f} µs | {ratio('lat', 'ucx_lat'):.2f}× | < 1× |")
    print(f"| 64 B send_bw message rate | {m['rate'] / 1e6:.3f} M/s | UCX tcp ucp_am_bw | {m['ucx_rate'] / 1e6:.3f} M/s | {ratio('rate', 'ucx_rate'):.2f}× | ≥ 1.5× |")
    print(f"| 64 B send_bw, lists of 16 (`-l 16`) | {m['rate_list'] / 1e6:.3f} M/s | UCX tcp ucp_am_bw | {m['ucx_rate'] / 1e6:.3f} M/s | {ratio('rate_list', 'ucx_rate'):.2f}× | |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | kernel TCP, one stream (iperf3) | {m['tcp']:.2f} Gb/s | {ratio('bw', 'tcp'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | UCX tcp ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('bw', 'ucx_put'):.2f}× | |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


if __name__ == "__main__":
    main()
