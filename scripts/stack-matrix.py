#!/usr/bin/env python3
"""The wider RDMA stack over softrnic, unmodified: the tools that read the
kernel's RDMA paths (infiniband-diags' ibstat and ibstatus) and UCX
(ucx_info, ucx_perftest over rc_verbs and ud_verbs), each run through
`softrnic run`, on loopback and between two network namespaces, with each
program's figure.

    scripts/stack-matrix.py [--only REGEX] [--no-netns]

verbs-matrix.py runs libibverbs' own programs and perftest; this is its
companion for what stands on top (rdma_cm, Open MPI and libfabric join it
as they come)."""

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("verbs_matrix", os.path.join(HERE, "verbs-matrix.py"))
vm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vm)

SOFTRNIC = os.path.join(HERE, "..", "target", "release", "softrnic")
TOOLS = {"ibstat": "infiniband-diags", "ibstatus": "infiniband-diags", "ucx_info": "ucx-utils", "ucx_perftest": "ucx-utils"}
TIMEOUT = 90


def softrnic_run(addr, argv):
    return [SOFTRNIC, "run", "--addr", addr, "--", *argv]


def singles():
    """(name, argv, patterns every one of which the output must match)."""
    return [
        ("ibstat", ["ibstat"], [r"CA 'softrnic0'", r"State: Active", r"Link layer: Ethernet"]),
        ("ibstatus", ["ibstatus"], [r"device 'softrnic0' port 1", r"state:\s+4: ACTIVE"]),
        ("ucx_info -d", ["ucx_info", "-d"],
         [r"Transport: rc_verbs\n#\s+Device: softrnic0:1", r"Transport: ud_verbs\n#\s+Device: softrnic0:1"]),
    ]


def pairs():
    """(name, UCX_TLS, ucx_perftest arguments, what the figure is)."""
    out = []
    for tls, label in [("rc_v,self", "rc_verbs"), ("ud_v,self", "ud_verbs")]:
        out.append((f"ucx_perftest tag_lat {label}", tls, ["-t", "tag_lat", "-n", "10000"], "latency"))
        out.append((f"ucx_perftest tag_bw 64KiB {label}", tls, ["-t", "tag_bw", "-s", "65536", "-n", "2000"], "bandwidth"))
        out.append((f"ucx_perftest ucp_put_bw 64KiB {label}", tls, ["-t", "ucp_put_bw", "-s", "65536", "-n", "2000"],
                    "bandwidth"))
    return out


def run_single(site, argv, patterns):
    cmd = site.command(site.server_ns, softrnic_run(site.server_addr, argv))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    text = out.stdout + out.stderr
    missing = [p for p in patterns if not re.search(p, text)]
    if out.returncode != 0 or missing:
        return ("FAIL", f"no {missing[0]!r}: " + vm.last_lines(text) if missing else vm.last_lines(text))
    return ("pass", re.sub(r"[\s#]+", " ", re.search(patterns[-1], text).group(0)).strip())


def perftest_figure(text, kind):
    """ucx_perftest's Final line: the median latency, or the average bandwidth."""
    line = next((l for l in text.splitlines() if l.startswith("Final:")), None)
    if line is None:
        return None
    fields = line.split()
    if kind == "latency":
        return f"{float(fields[2]):.2f} µs median (8 B)"
    return f"{float(fields[5]):.0f} MB/s"


def run_pair(site, tls, args, kind, port):
    env = {**os.environ, "UCX_TLS": tls, "UCX_NET_DEVICES": "softrnic0:1"}
    server_cmd = site.command(site.server_ns, softrnic_run(site.server_addr, ["ucx_perftest", "-p", str(port)]))
    client_cmd = site.command(site.client_ns, softrnic_run(
        site.client_addr, ["ucx_perftest", site.server_addr, "-p", str(port), *args]))
    server = subprocess.Popen(server_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 10
    while not site.listening(port) and time.time() < deadline and server.poll() is None:
        time.sleep(0.02)
    try:
        client = subprocess.run(client_cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()
        return ("FAIL", f"timed out after {TIMEOUT}s")
    try:
        server.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()
    text = client.stdout + client.stderr
    figure = perftest_figure(text, kind)
    if client.returncode != 0 or figure is None:
        return ("FAIL", "client: " + vm.last_lines(text))
    return ("pass", figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only the entries whose name matches this regular expression")
    parser.add_argument("--no-netns", action="store_true", help="skip the network-namespace half")
    args = parser.parse_args()
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        sys.exit(f"missing programs: install them with: sudo apt-get install {' '.join(missing)}")
    if not os.path.exists(SOFTRNIC):
        sys.exit("no target/release/softrnic: run cargo build --release first")
    vm.build_library()
    wanted = re.compile(args.only) if args.only else None
    results = []

    def run_site(site):
        for name, argv, patterns in singles():
            if not wanted or wanted.search(name):
                results.append((site.name, name, *run_single(site, argv, patterns)))
        for i, (name, tls, perftest_args, kind) in enumerate(pairs()):
            if wanted and not wanted.search(name):
                continue
            verdict = run_pair(site, tls, perftest_args, kind, 18700 + i)
            results.append((site.name, name, *verdict))
            print(f"  {site.name:9} {name:36} {verdict[0]}", file=sys.stderr, flush=True)

    run_site(vm.Site("loopback", "127.0.78.1", "127.0.78.2"))
    reason = "--no-netns given" if args.no_netns else vm.namespaces_unavailable()
    if reason:
        results.append(("netns", "all entries", "skip", reason))
    else:
        with vm.Namespaces() as site:
            run_site(site)

    sys.exit(vm.report(results))


if __name__ == "__main__":
    main()
