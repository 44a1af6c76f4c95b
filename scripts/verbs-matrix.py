#!/usr/bin/env python3
"""Runs unmodified RDMA programs over softrnic's libibverbs.so.1.

Debian's ibverbs-utils (ibv_devices, ibv_devinfo, ibv_rc_pingpong,
ibv_srq_pingpong, ibv_uc_pingpong), perftest (ib_{send,write,read,atomic}_{bw,lat},
and SEND and WRITE over UC), the project's own
rdma_bench (libr's flags and lines) and scripts/programs/rxe-parity.c
(memory windows and ATOMIC WRITE through verbs.h's inline functions),
both ends of each pair on
this machine, each end with its own loopback address (SOFTRNIC_ADDR); then
the same pairs between two network namespaces joined by a veth pair (as
root; skipped with the reason otherwise). Prints a table of what passed
with each program's bandwidth or latency, and exits non-zero when any
entry fails.

    scripts/verbs-matrix.py [--quick] [--only REGEX] [--markdown] [--no-netns | --netns quick]
                            [--daemon [quick]]

With --daemon, the loopback pairs run again with both ends' devices served
by one softrnicd (SOFTRNIC_DAEMON), as unmodified programs do when a
daemon runs; --daemon quick runs each program once that way, and --netns
quick each program once between the namespaces (what the test command
does, to keep CI's time: every mode of every program runs on loopback).

Also checks the library's ABI first: every symbol the system's
libibverbs.so.1 exports, with the same version node.

Installs nothing: .ci/run installs ibverbs-utils and perftest.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 90


def build_library():
    """Builds libibverbs.so.1, rdma_bench and softrnicd (one build, one set
    of features); returns the library's directory."""
    out = subprocess.run([os.path.join(ROOT, "scripts", "build-libibverbs.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"building libibverbs.so.1 failed:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


RXE_PARITY = os.path.join(ROOT, "scripts", "programs", "rxe-parity.c")


def build_rxe_parity(libdir):
    """Compiles scripts/programs/rxe-parity.c (memory windows and ATOMIC
    WRITE through verbs.h's inline functions) beside the library; returns
    the binary."""
    binary = os.path.join(os.path.dirname(libdir), "bin", "rxe-parity")
    os.makedirs(os.path.dirname(binary), exist_ok=True)
    built = subprocess.run(["cc", "-O2", "-o", binary, RXE_PARITY, "-libverbs"], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"cc {RXE_PARITY} failed (libibverbs-dev installed?):\n{built.stderr}")
    return binary


def exported(path):
    """{symbol: version} of a shared library's versioned exports."""
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    symbols = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2 or "IBVERBS" not in line or fields[-1].startswith("IBVERBS"):
            continue
        version = fields[-2].strip("()")
        # A symbol in both 1.0 and 1.1: programs bind the default, 1.1.
        if symbols.get(fields[-1]) != "IBVERBS_1.1":
            symbols[fields[-1]] = version
    return symbols


def check_abi(libdir):
    system = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
    if not os.path.exists(system) or shutil.which("objdump") is None:
        return ("skip", "no system libibverbs.so.1 or objdump to compare with")
    theirs, ours = exported(system), exported(os.path.join(libdir, "libibverbs.so.1"))
    wrong = [f"{s}@{v}" for s, v in sorted(theirs.items()) if ours.get(s) != v]
    if wrong:
        return ("FAIL", f"missing or misversioned: {' '.join(wrong[:8])}")
    return ("pass", f"all {len(theirs)} symbols, same versions")


class Site:
    """Where the two ends of a pair run: loopback addresses, or namespaces."""

    def __init__(self, name, server_addr, client_addr, server_ns=None, client_ns=None, env=None):
        self.name, self.server_addr, self.client_addr = name, server_addr, client_addr
        self.server_ns, self.client_ns = server_ns, client_ns
        # What both ends' environment adds (the daemon's socket).
        self.env = env or {}

    def command(self, ns, args):
        return (["ip", "netns", "exec", ns] if ns else []) + args

    def listening(self, port):
        """Whether a TCP socket listens on `port` where the server runs."""
        cmd = self.command(self.server_ns, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
        out = subprocess.run(cmd, capture_output=True, text=True).stdout
        return any(f":{port:04X} " in line and line.split()[3] == "0A" for line in out.splitlines()[1:] if len(line.split()) > 3)


def environment(libdir, addr, extra=None):
    return {**os.environ, "LD_LIBRARY_PATH": libdir, "SOFTRNIC_ADDR": addr, **(extra or {})}


def run_single(libdir, site, args, expect):
    env = environment(libdir, site.server_addr, site.env)
    out = subprocess.run(site.command(site.server_ns, args), capture_output=True, text=True, env=env, timeout=TIMEOUT)
    text = out.stdout + out.stderr
    if out.returncode != 0 or not re.search(expect, text):
        return ("FAIL", last_lines(text))
    return ("pass", re.search(expect, text).group(0).strip())


def last_lines(text, n=3):
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


# The counters that say why a transfer failed: recovery and drops.
TELLING_COUNTERS = re.compile(r"retransmit|timeout|nak|out_of_sequence|dropped|duplicate|rnr|probe|stall")


def engine_counters(addr):
    """What the engine on `addr` last published (the file `softrnic
    devinfo` reads; see crates/engine/src/counters_file.rs), reduced to
    the nonzero counters that explain a failure."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    try:
        text = open(os.path.join(base, "softrnic", f"{addr}.counters")).read()
    except OSError:
        return "no counters"
    rows = [l.split() for l in text.splitlines()]
    telling = [f"{k}={v}" for k, v in (r for r in rows if len(r) == 2) if v != "0" and TELLING_COUNTERS.search(k)]
    return " ".join(telling) or "no retransmissions or drops"


def command_lines(program, args, port, server_addr):
    """The server's and the client's command lines: perftest's style (-p
    PORT, the client names the server last) or libr's (rdma_bench:
    -serverIp, -nodeId, -port)."""
    if os.path.basename(program) == "rdma_bench":
        common = [program, *args, "-serverIp", server_addr, "-port", str(port)]
        return common + ["-nodeId", "0"], common + ["-nodeId", "1"]
    return [program, *args, "-p", str(port)], [program, *args, "-p", str(port), server_addr]


def run_pair(libdir, site, program, args, port, parse, env=None):
    """Runs the server, waits for it to listen, runs the client; both must
    exit 0 and the output must parse: the client's, or for rdma_bench,
    whose server prints the verification lines, both ends'. `env` adds to
    both ends' environment."""
    server_argv, client_argv = command_lines(program, args, port, site.server_addr)
    server = subprocess.Popen(
        site.command(site.server_ns, server_argv),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment(libdir, site.server_addr, {**site.env, **(env or {})}),
    )
    deadline = time.time() + 10
    while not site.listening(port) and time.time() < deadline and server.poll() is None:
        time.sleep(0.02)
    try:
        client = subprocess.run(
            site.command(site.client_ns, client_argv),
            capture_output=True, text=True, env=environment(libdir, site.client_addr, {**site.env, **(env or {})}), timeout=TIMEOUT,
        )
        server_out, _ = server.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()
        return ("FAIL", f"timed out after {TIMEOUT}s")
    client_out = client.stdout + client.stderr
    if client.returncode != 0:
        counters = f" [server {engine_counters(site.server_addr)}; client {engine_counters(site.client_addr)}]"
        return ("FAIL", "client: " + last_lines(client_out) + counters)
    if server.returncode != 0:
        return ("FAIL", "server: " + last_lines(server_out))
    if os.path.basename(program) == "rdma_bench":
        client_out = server_out + "\n" + client_out
    try:
        figure = parse(client_out)
    except ValueError as e:
        return ("FAIL", str(e))
    if figure is None:
        return ("FAIL", "no result in the output: " + last_lines(client_out))
    return ("pass", figure)


# perftest times itself in CPU cycles and, before each report, fits
# cycles against gettimeofday over 200 short spins; on a loaded machine
# (both ends' engines and perftest on two cores) the fit can fall
# under its r^2 = 0.9 threshold, and perftest then exits with "Can't
# produce a report" after the transfer succeeded. That is the
# benchmark's clock, not the device: such a run is repeated once, and
# the result says so.
CLOCK_CALIBRATION_FAILED = "Correlation coefficient r^2"


def pingpong_figure(text):
    m = re.search(r"= ([\d.]+) Mbit/sec.*?= ([\d.]+) usec/iter", text, re.S)
    return m and f"{m.group(2)} µs/iter, {float(m.group(1)) / 1000:.2f} Gb/s"


def pingpong_timestamps(text):
    """ibv_rc_pingpong -t: the extended CQ API with completion timestamps.
    The average time between receive completions, on the device clock the
    device reports (1 GHz: a cycle is a nanosecond), must agree with the
    program's own usec/iter: timestamps that were zero or invented would
    not."""
    m = re.search(r"= ([\d.]+) usec/iter.*?Average receive completion clock cycles = ([\d.]+)", text, re.S)
    if not m:
        return None
    per_iter_us, cycles = float(m.group(1)), float(m.group(2))
    if not 0.5 < cycles / 1000 / per_iter_us < 2:
        raise ValueError(f"completions {cycles:.0f} ns apart on the device clock, but {per_iter_us} µs per iteration")
    return f"{per_iter_us} µs/iter, completions {cycles / 1000:.1f} µs apart by their timestamps"


def perftest_rows(text):
    """The numeric rows of perftest's result table."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0].isdigit() and all(re.fullmatch(r"[\d.]+", f) for f in fields[:5]):
            rows.append(fields)
    return rows


def bw_figure(text):
    rows = perftest_rows(text)
    if not rows:
        return None
    unit = "Gb/s" if "Gb/sec" in text else "MB/s"
    best = max(rows, key=lambda r: float(r[3]))
    return f"{float(best[3]):.2f} {unit} average at {best[0]} B" + (f" ({len(rows)} sizes)" if len(rows) > 1 else "")


def lat_figure(text):
    rows = perftest_rows(text)
    if not rows:
        return None
    first = rows[0]
    # #bytes #iterations t_min t_max t_typical t_avg ...
    return f"{first[4]} µs typical at {first[0]} B" + (f" ({len(rows)} sizes)" if len(rows) > 1 else "")


def lat_within(limit_us):
    """lat_figure, failing when the typical latency of the smallest size is
    above `limit_us`: `ib_write_lat` spins on memory, not on its CQ, and the
    engine must not leave it waiting (a 2 ms step-aside once did)."""
    def parse(text):
        rows = perftest_rows(text)
        if rows and float(rows[0][4]) > limit_us:
            raise ValueError(f"t_typical {rows[0][4]} µs at {rows[0][0]} B is above the {limit_us} µs bound")
        return lat_figure(text)
    return parse


# rdma_bench's lines, as libr prints them (the seeds spell Gbps "Gpbs" too).
VERIFIED = re.compile(r"Data verification success, thread \[(\d+)\], duration \[([\d.]+)\]s, throughput \[([\d.]+)\] (?:Gbps|Gpbs)")
MEDIAN = re.compile(r"^50th percentile \(median\): (\d+) ns$", re.M)
SUMMARY = re.compile(r"^\[Mean\s+=\s+([\d.]+), StdDeviation\s+=\s+([\d.]+)\]\n\[Max\s+=\s+([\d.]+), Total count\s+=\s+(\d+)\]\n"
                     r"\[Buckets\s+=\s+(\d+), SubBuckets\s+=\s+2048\]$", re.M)


def rdma_bench_throughput(threads):
    """rdma_bench's throughput: one verification line per thread."""
    def parse(text):
        lines = VERIFIED.findall(text)
        if sorted(int(t) for t, _, _ in lines) != list(range(threads)):
            raise ValueError(f"expected a verification line for each of {threads} threads: " + last_lines(text))
        return f"{sum(float(g) for _, _, g in lines):.2f} Gb/s over {threads} QPs, data verified"
    return parse


def rdma_bench_latency(count):
    """rdma_bench's latency block: percentiles and the histogram summary."""
    def parse(text):
        median, summary = MEDIAN.search(text), SUMMARY.search(text)
        if not median or not summary or not VERIFIED.search(text):
            raise ValueError("no verified latency block: " + last_lines(text))
        if int(summary.group(4)) != count:
            raise ValueError(f"Total count {summary.group(4)}, expected {count}")
        return f"{int(median.group(1)) / 1000:.2f} µs median round trip at 1024 B (mean {float(summary.group(1)) / 1000:.2f})"
    return parse


def entries(quick):
    """(name, program, args, parse, env) for every pair in the matrix."""
    out = [
        ("ibv_rc_pingpong -g 0", "ibv_rc_pingpong", ["-g", "0"], pingpong_figure),
        ("ibv_rc_pingpong -g 0 -e", "ibv_rc_pingpong", ["-g", "0", "-e"], pingpong_figure),
        ("ibv_rc_pingpong -g 0 -s 65536", "ibv_rc_pingpong", ["-g", "0", "-s", "65536"], pingpong_figure),
        ("ibv_rc_pingpong -g 0 -t", "ibv_rc_pingpong", ["-g", "0", "-t"], pingpong_timestamps),
        # 16 QPs taking their receives from one SRQ.
        ("ibv_srq_pingpong -g 0", "ibv_srq_pingpong", ["-g", "0"], pingpong_figure),
        # Unreliable connected: nothing acknowledged.
        ("ibv_uc_pingpong -g 0", "ibv_uc_pingpong", ["-g", "0"], pingpong_figure),
    ]
    for op in ["send", "write", "read", "atomic"]:
        bw, lat = f"ib_{op}_bw", f"ib_{op}_lat"
        out.append((bw, bw, [], bw_figure))
        out.append((lat, lat, [], lat_within(1000) if op == "write" else lat_figure))
        if quick:
            continue
        # The latency sweeps take 10 to 20 s whatever -n says: perftest
        # calibrates its clock from /proc/cpuinfo over 0.2 s at each end
        # for each of the 23 sizes. READ's is left to ib_read_bw -a, whose
        # sizes take the same path; SEND's is the README's example, and
        # WRITE's receiver polls each size's last byte.
        all_sizes = [] if op == "atomic" else ["-a", "-n", "200"]
        if all_sizes:
            out.append((f"{bw} -a", bw, all_sizes, bw_figure))
        if all_sizes and op != "read":
            out.append((f"{lat} -a", lat, all_sizes, lat_within(1000) if op == "write" else lat_figure))
        out.append((f"{bw} -q 4", bw, ["-q", "4"], bw_figure))
        out.append((f"{bw} -b", bw, ["-b"], bw_figure))
        out.append((f"{bw} --report_gbits", bw, ["--report_gbits"], bw_figure))
    if not quick:
        out.append(("ib_send_bw -c UD", "ib_send_bw", ["-c", "UD"], bw_figure))
        out.append(("ib_send_lat -c UD", "ib_send_lat", ["-c", "UD"], lat_figure))
        out.append(("ib_send_lat -e", "ib_send_lat", ["-e"], lat_figure))
        out.append(("ib_send_bw --use-srq", "ib_send_bw", ["--use-srq"], bw_figure))
        for program, parse in [("ib_send_bw", bw_figure), ("ib_write_bw", bw_figure), ("ib_send_lat", lat_figure),
                               ("ib_write_lat", lat_figure)]:
            out.append((f"{program} -c UC", program, ["-c", "UC"], parse))
    bench = os.path.join(ROOT, "target", "release", "rdma_bench")
    out.append(("rdma_bench -threads 2 -packSize 64", bench,
                ["-threads", "2", "-packSize", "64", "-iterations", "20", "-numPack", "1000"], rdma_bench_throughput(2)))
    out.append(("rdma_bench -outstanding 1", bench,
                ["-outstanding", "1", "-iterations", "10", "-numPack", "200"], rdma_bench_latency(2000)))
    out = [(*entry, None) for entry in out]
    # perftest knows no ECE: both ends ask for selective repeat by the
    # environment.
    selective = {"SOFTRNIC_SELECTIVE_REPEAT": "1"}
    for program, parse in [("ib_write_bw", bw_figure), ("ib_read_bw", bw_figure), ("ib_send_lat", lat_figure)]:
        out.append((f"{program} (SOFTRNIC_SELECTIVE_REPEAT=1)", program, [], parse, selective))
    return out


class Daemon:
    """A softrnicd on a socket of its own, stopped on exit; build_library()
    built it."""

    def __enter__(self):
        self.socket = os.path.join(tempfile.gettempdir(), f"softrnicd-matrix-{os.getpid()}.sock")
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([os.path.join(ROOT, "target", "release", "softrnicd"), "--socket", self.socket],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.time() > deadline:
                self.log.seek(0)
                sys.exit(f"softrnicd did not start: {self.log.read()}")
            time.sleep(0.05)
        return self.socket

    def __exit__(self, *exc):
        # SIGTERM, as a user or systemd stops it: it closes its devices and
        # their shared-memory inboxes (SIGKILL left them in /dev/shm for the
        # next device to sweep). SIGKILL only if it hangs.
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("softrnicd did not stop within 10 s of SIGTERM; killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode not in (0, -9):
            self.log.seek(0)
            print(f"softrnicd exited with {self.proc.returncode}:\n{self.log.read()[-2000:]}", file=sys.stderr)


class Namespaces:
    """Two network namespaces joined by a veth pair, removed on exit."""

    NAMES = ("srnic-matrix-a", "srnic-matrix-b")
    ADDRS = ("10.231.0.1", "10.231.0.2")

    def __enter__(self):
        a, b = self.NAMES
        self.cleanup()
        steps = [
            ["netns", "add", a], ["netns", "add", b],
            ["link", "add", "srnic-va", "type", "veth", "peer", "name", "srnic-vb"],
            ["link", "set", "srnic-va", "netns", a], ["link", "set", "srnic-vb", "netns", b],
            ["-n", a, "addr", "add", f"{self.ADDRS[0]}/24", "dev", "srnic-va"],
            ["-n", b, "addr", "add", f"{self.ADDRS[1]}/24", "dev", "srnic-vb"],
            ["-n", a, "link", "set", "srnic-va", "up"], ["-n", b, "link", "set", "srnic-vb", "up"],
            ["-n", a, "link", "set", "lo", "up"], ["-n", b, "link", "set", "lo", "up"],
        ]
        for step in steps:
            out = subprocess.run(["ip", *step], capture_output=True, text=True)
            if out.returncode != 0:
                self.cleanup()
                raise RuntimeError(f"ip {' '.join(step)}: {out.stderr.strip()}")
        return Site("netns", self.ADDRS[0], self.ADDRS[1], a, b)

    def __exit__(self, *exc):
        self.cleanup()

    def cleanup(self):
        for name in self.NAMES:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def namespaces_unavailable():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="each program once, in its default mode")
    parser.add_argument("--only", help="run only the entries whose name matches this regular expression")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--no-netns", action="store_true", help="skip the network-namespace half")
    parser.add_argument("--netns", choices=["full", "quick"], default="full",
                        help="the network-namespace half in full, or each program once (quick)")
    parser.add_argument("--daemon", nargs="?", const="full", choices=["full", "quick"],
                        help="the loopback pairs again, through one softrnicd (quick: each program once)")
    args = parser.parse_args()

    missing = [p for p in ["ibv_devinfo", "ibv_rc_pingpong", "ib_write_bw"] if shutil.which(p) is None]
    if missing:
        sys.exit(f"missing {' '.join(missing)}: install them with: sudo apt-get install ibverbs-utils perftest")
    libdir = build_library()
    rxe_parity = build_rxe_parity(libdir)
    results = [("ABI", "libibverbs.so.1 symbols", *check_abi(libdir))]
    wanted = re.compile(args.only) if args.only else None

    def run_site(site, quick=args.quick):
        singles = [("ibv_devices", ["ibv_devices"], r"softrnic0\s+[0-9a-f]{16}"),
                   ("ibv_devinfo -v", ["ibv_devinfo", "-v"], r"state:\s+PORT_ACTIVE"),
                   ("memory windows, ATOMIC WRITE (rxe-parity.c)", [rxe_parity], r"rxe-parity: \d+ checks passed")]
        for name, argv, expect in singles:
            if not wanted or wanted.search(name):
                results.append((site.name, name, *run_single(libdir, site, argv, expect)))
        for i, (name, program, argv, parse, env) in enumerate(entries(quick)):
            if wanted and not wanted.search(name):
                continue
            started = time.monotonic()
            verdict = run_pair(libdir, site, program, argv, 18600 + i, parse, env)
            if verdict[0] == "FAIL" and CLOCK_CALIBRATION_FAILED in verdict[1]:
                verdict = run_pair(libdir, site, program, argv, 18600 + i, parse, env)
                verdict = (verdict[0], verdict[1] + " (run twice: perftest's clock calibration failed the first time)")
            results.append((site.name, name, *verdict))
            # With its seconds: where CI's time goes.
            print(f"  {site.name:9} {name:32} {verdict[0]:5} {time.monotonic() - started:5.1f} s", file=sys.stderr,
                  flush=True)

    run_site(Site("loopback", "127.0.77.1", "127.0.77.2"))
    if args.daemon:
        with Daemon() as socket:
            run_site(Site("softrnicd", "127.0.77.3", "127.0.77.4", env={"SOFTRNIC_DAEMON": socket}),
                     quick=args.quick or args.daemon == "quick")
    reason = "--no-netns given" if args.no_netns else namespaces_unavailable()
    if reason:
        results.append(("netns", "all pairs", "skip", reason))
    else:
        with Namespaces() as site:
            run_site(site, quick=args.quick or args.netns == "quick")

    sys.exit(report(results, args.markdown))


def report(results, markdown=False):
    """Prints the (where, program, verdict, figure) rows and the tally;
    returns the exit status (1 when any failed)."""
    if markdown:
        print("| Where | Program | Result | Figure |\n|---|---|---|---|")
        for where, name, verdict, figure in results:
            print(f"| {where} | `{name}` | {verdict} | {figure} |")
    else:
        width = max(len(r[1]) for r in results)
        for where, name, verdict, figure in results:
            print(f"{where:9} {name:{width}}  {verdict:4}  {figure}")
    failed = [r for r in results if r[2] == "FAIL"]
    passed = sum(1 for r in results if r[2] == "pass")
    print(f"\n{passed} passed, {len(failed)} failed, {len(results) - passed - len(failed)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    main()
