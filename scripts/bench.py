#!/usr/bin/env python3
"""Side-by-side benchmarks for BENCHMARKS.md.

Runs softrnic's bench and the peers a user would pick instead, in the same
run, on loopback:

  - a raw UDP ping-pong with busy polling (sockperf --nonblocked, both ends),
  - kernel TCP, one stream (iperf3),
  - UCX over TCP (ucx_perftest with UCX_TLS=tcp: tag_lat, ucp_am_bw, ucp_put_bw),

each RUNS times, and prints the medians and the ratios as a Markdown table.
softrnic runs over its UDP datapath there. Other modes:

  --shm       softrnic's shared-memory wire against UCX's shared-memory
              transport (UCX_TLS=posix), and the E1 latency against
              Soft-RoCE's published 24.07 us;
  --scaling   the E2 shape: 8 QPs, 64 B and 64 KiB, engine threads 1, 2,
              4 and 8, inline and dedicated progress (on a machine with
              the cores to show it);
  --loss      64 KiB write_bw and send_bw at 0.1, 1 and 5 % loss and the
              CI fault mix, and 64 B send_lat p99 at 1 %, with the fixed
              and the adaptive retransmission timer;
  --perftest  Debian's perftest over softrnic's drop-in libibverbs.so.1
              beside `softrnic bench` on the same tests.

    scripts/bench.py [--runs 5] [--engine-threads 1] [--shm | --scaling | --loss | --perftest]

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
PEERS = {"sockperf": "sockperf", "iperf3": "iperf3", "ucx_perftest": "ucx-utils"}


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
        self.proc.kill()
        self.proc.wait()


def softrnic(test, size, extra):
    out = sh([SOFTRNIC, "bench", test, "-s", str(size), "--json", *extra])
    if out.returncode != 0:
        raise RuntimeError(f"softrnic bench {test}: {out.stderr.strip()}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sockperf_p50_us(size):
    with Server(["sockperf", "server", "-i", "127.0.0.20", "-p", "11111", "--nonblocked"]):
        out = sh(["sockperf", "ping-pong", "-i", "127.0.0.20", "-p", "11111", "-m", str(size), "-t", "3", "--nonblocked"])
    return float(re.search(r"percentile 50\.000 =\s+([\d.]+)", out.stdout + out.stderr).group(1))


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


def perftest(program, args, port):
    """Runs a perftest pair over softrnic's libibverbs.so.1 (both ends on
    loopback addresses); returns the client's first result row."""
    libdir = os.path.join(ROOT, "target", "softrnic", "lib")
    env = lambda addr: {**os.environ, "LD_LIBRARY_PATH": libdir, "SOFTRNIC_ADDR": addr}
    server = subprocess.Popen([program, *args, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env("127.0.0.30"))
    time.sleep(0.5)
    try:
        out = sh([program, *args, "-p", str(port), "127.0.0.30"], env=env("127.0.0.31"))
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
    ratio = lambda a, b: median([x / y for x, y in zip(r[a], r[b])])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores:\n")
    print("| measure | perftest over libibverbs.so.1 | softrnic bench | ratio (median of per-run ratios) |")
    print("| --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 (`ib_send_lat -s 64`) | {m['pt_lat']:.2f} µs | {m['sr_lat']:.2f} µs | {ratio('pt_lat', 'sr_lat'):.2f}× |")
    print(f"| 64 B send_bw message rate (`ib_send_bw -s 64`) | {m['pt_rate'] / 1e6:.3f} M/s | {m['sr_rate'] / 1e6:.3f} M/s | {ratio('pt_rate', 'sr_rate'):.2f}× |")
    print(f"| 64 KiB write_bw (`ib_write_bw -s 65536`) | {m['pt_bw']:.2f} Gb/s | {m['sr_bw']:.2f} Gb/s | {ratio('pt_bw', 'sr_bw'):.2f}× |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


def shm_main(a, extra):
    """The shared-memory wire beside UCX's (UCX_TLS=posix), same run."""
    install_peers()
    extra = extra + ["--datapath", "shm"]
    tls = "posix,self"
    r = {k: [] for k in ["lat", "ucx_lat", "rate", "ucx_rate", "bw", "ucx_put", "lat_1k_mean"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        r["lat"].append(softrnic("send_lat", 64, extra + ["-n", "20000"])["p50_ns"] / 1000)
        r["ucx_lat"].append(ucx("tag_lat", 64, 14337 + run, tls)["p50_us"])
        r["rate"].append(softrnic("send_bw", 64, extra + ["-n", "400000"])["msg_rate_mpps"] * 1e6)
        r["ucx_rate"].append(ucx("ucp_am_bw", 64, 14437 + run, tls)["msg_rate"])
        r["bw"].append(softrnic("write_bw", 65536, extra + ["-n", "20000"])["bw_avg_gbps"])
        r["ucx_put"].append(ucx("ucp_put_bw", 65536, 14537 + run, tls)["mbps"] * 8 * 1.048576 / 1000)
        r["lat_1k_mean"].append(softrnic("send_lat", 1024, extra + ["-n", "20000"])["mean_ns"] / 1000)
    m = {k: median(v) for k, v in r.items()}
    ratio = lambda a, b: median([x / y for x, y in zip(r[a], r[b])])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared-memory wire:\n")
    print("| measure | softrnic (shm) | peer | peer value | ratio (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | UCX posix tag_lat | {m['ucx_lat']:.2f} µs | {ratio('lat', 'ucx_lat'):.2f}× | ≤ 3× |")
    print(f"| 64 B send_bw message rate | {m['rate'] / 1e6:.3f} M/s | UCX posix ucp_am_bw | {m['ucx_rate'] / 1e6:.3f} M/s | {ratio('rate', 'ucx_rate'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | UCX posix ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('bw', 'ucx_put'):.2f}× | ≥ 0.5× |")
    print(f"| 1 KiB send_lat mean (E1) | {m['lat_1k_mean']:.2f} µs | Soft-RoCE, published | 24.07 µs | {m['lat_1k_mean'] / 24.07:.2f}× | |")
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
    ratio = lambda m, t, k: median([x / y for x, y in zip(r[(m, t, k)], r[(m, 1, k)])])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, 8 QPs, {a.datapath} datapath:\n")
    print("| progress | engine threads | 64 B send_bw | × 1 thread | 64 KiB write_bw | × 1 thread |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in modes:
        for t in threads:
            rate, bw = median(r[(m, t, "rate")]), median(r[(m, t, "bw")])
            print(f"| {m} | {t} | {rate / 1e6:.3f} M/s | {ratio(m, t, 'rate'):.2f}× | {bw:.2f} Gb/s | {ratio(m, t, 'bw'):.2f}× |")
    print("\nAll runs:", json.dumps({f"{m}-{t}-{k}": [round(x, 3) for x in v] for (m, t, k), v in r.items()}))


def loss_main(a, extra):
    """Throughput and tail latency under injected loss, each retransmission
    timer, against lossless in the same run (issue 14's sweep)."""
    losses = [0.0, 0.001, 0.01, 0.05]
    timers = ["fixed", "adaptive"]
    tests = [("write_bw", 65536), ("send_bw", 65536)]
    r = {}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        for timer in timers:
            for test, size in tests:
                for p in losses:
                    args = extra + ["--retransmission", timer, "--loss", str(p), "-D", "3"]
                    r.setdefault((timer, test, p), []).append(softrnic(test, size, args)["bw_avg_gbps"])
                mix = extra + ["--retransmission", timer, "--loss", "0.05", "--reorder", "0.05",
                               "--duplicate", "0.02", "--corrupt", "0.01", "-D", "3"]
                r.setdefault((timer, test, "mix"), []).append(softrnic(test, size, mix)["bw_avg_gbps"])
            for p in [0.0, 0.01]:
                lat = softrnic("send_lat", 64, extra + ["--retransmission", timer, "--loss", str(p), "-n", "5000"])
                r.setdefault((timer, "p99", p), []).append(lat["p99_ns"] / 1000)
    ratio = lambda key, base: median([x / y for x, y in zip(r[key], r[base])])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one QP, loss in each direction:\n")
    print("| test | timer | lossless | 0.1 % | 1 % | 5 % | CI mix |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for test, _ in tests:
        for timer in timers:
            cells = [f"{median(r[(timer, test, 0.0)]):.2f} Gb/s"]
            cells += [f"{median(r[(timer, test, p)]):.2f} Gb/s ({ratio((timer, test, p), (timer, test, 0.0)):.0%})" for p in losses[1:]]
            cells.append(f"{median(r[(timer, test, 'mix')]):.2f} Gb/s")
            print(f"| 64 KiB {test} | {timer} | " + " | ".join(cells) + " |")
    for timer in timers:
        lossless, lossy = median(r[(timer, "p99", 0.0)]), median(r[(timer, "p99", 0.01)])
        print(f"| 64 B send_lat p99 | {timer} | {lossless:.1f} µs | | {lossy:.1f} µs ({lossy / lossless:.1f}×) | | |")
    print("\nAll runs:", json.dumps({f"{k[0]}-{k[1]}-{k[2]}": [round(x, 3) for x in v] for k, v in r.items()}))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--perftest", action="store_true", help="perftest over libibverbs.so.1 beside softrnic bench")
    parser.add_argument("--shm", action="store_true", help="the shared-memory wire against UCX's")
    parser.add_argument("--scaling", action="store_true", help="8 QPs over 1, 2, 4 and 8 engine threads")
    parser.add_argument("--loss", action="store_true", help="throughput and tail latency under loss, each retransmission timer")
    parser.add_argument("--datapath", default="udp", choices=["udp", "shm"], help="the wire for --scaling")
    a = parser.parse_args()
    if "SOFTRNIC_BIN" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "softrnic-cli"], cwd=ROOT, check=True)
    extra = ["--engine-threads", str(a.engine_threads)]
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
    install_peers()
    extra = extra + ["--datapath", "udp"]
    r = {k: [] for k in ["lat", "udp", "ucx_lat", "rate", "ucx_rate", "bw", "tcp", "ucx_put"]}
    for run in range(a.runs):
        print(f"run {run + 1}/{a.runs} ...", file=sys.stderr)
        r["lat"].append(softrnic("send_lat", 64, extra + ["-n", "20000"])["p50_ns"] / 1000)
        r["udp"].append(sockperf_p50_us(64))
        r["ucx_lat"].append(ucx("tag_lat", 64, 13337 + run)["p50_us"])
        r["rate"].append(softrnic("send_bw", 64, extra + ["-n", "200000"])["msg_rate_mpps"] * 1e6)
        r["ucx_rate"].append(ucx("ucp_am_bw", 64, 13437 + run)["msg_rate"])
        r["bw"].append(softrnic("write_bw", 65536, extra + ["-n", "20000"])["bw_avg_gbps"])
        r["tcp"].append(iperf3_gbps())
        r["ucx_put"].append(ucx("ucp_put_bw", 65536, 13537 + run)["mbps"] * 8 * 1.048576 / 1000)
    m = {k: median(v) for k, v in r.items()}
    # The machine drifts between runs; each peer ran beside softrnic in the
    # same run, so the median of per-run ratios is the fairer figure.
    ratio = lambda a, b: median([x / y for x, y in zip(r[a], r[b])])
    print(f"\nMedians of {a.runs} runs, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, engine threads {a.engine_threads}:\n")
    print("| measure | softrnic | peer | peer value | ratio (median of per-run ratios) | target |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | raw UDP ping-pong, spinning (sockperf) | {m['udp']:.2f} µs | {ratio('lat', 'udp'):.2f}× | ≤ 1.2× |")
    print(f"| 64 B send_lat p50 | {m['lat']:.2f} µs | UCX tcp tag_lat | {m['ucx_lat']:.2f} µs | {ratio('lat', 'ucx_lat'):.2f}× | < 1× |")
    print(f"| 64 B send_bw message rate | {m['rate'] / 1e6:.3f} M/s | UCX tcp ucp_am_bw | {m['ucx_rate'] / 1e6:.3f} M/s | {ratio('rate', 'ucx_rate'):.2f}× | ≥ 1× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | kernel TCP, one stream (iperf3) | {m['tcp']:.2f} Gb/s | {ratio('bw', 'tcp'):.2f}× | ≥ 0.5× |")
    print(f"| 64 KiB write_bw | {m['bw']:.2f} Gb/s | UCX tcp ucp_put_bw | {m['ucx_put']:.2f} Gb/s | {ratio('bw', 'ucx_put'):.2f}× | |")
    print("\nAll runs:", json.dumps({k: [round(x, 3) for x in v] for k, v in r.items()}))


if __name__ == "__main__":
    main()
