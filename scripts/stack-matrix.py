#!/usr/bin/env python3
"""The wider RDMA stack over softrnic, unmodified: the tools that read the
kernel's RDMA paths (infiniband-diags' ibstat and ibstatus) and UCX
(ucx_info, ucx_perftest over rc_verbs and ud_verbs), each run through
`softrnic run`; and rdma_cm programs over softrnic's librdmacm.so.1
(rdmacm-utils' rping, ucmatose, udaddy, mckey, rdma_server/rdma_client, cmtime,
qperf -cm1, perftest's eight tests with -R, and scripts/programs/
cm-ack-timeout.c for rdma_set_option); rsockets (rstream, riostream,
rcopy, scripts/programs/rsocket-check.c, and sockperf's TCP ping-pong
under librspreload.so, with no kernel TCP socket on its port); and libfabric's verbs
provider (fi_info, fi_pingpong over DGRAM and MSG endpoints); and Open
MPI over UCX (scripts/programs/mpi-check.c: ping-pong, an allreduce
checked against the exact sum, MPI_Put through osc ucx). On loopback and
between two network namespaces, with each program's figure; with
--daemon, the rdma_cm programs once more through one softrnicd, and rping
hearing that softrnicd stop under it (RDMA_CM_EVENT_DEVICE_REMOVAL).

    scripts/stack-matrix.py [--only REGEX] [--no-netns | --netns quick] [--daemon [quick]]

--netns quick leaves out, between the namespaces, what only repeats the
loopback half (the bandwidth variants, most of perftest's -R tests, the
rsocket programs but rsocket-check and librspreload); --daemon quick
leaves rstream's verified sweep through softrnicd to the other rsocket
programs there: what the test command runs.

verbs-matrix.py runs libibverbs' own programs and perftest; this is its
companion for what stands on top."""

import argparse
import atexit
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("verbs_matrix", os.path.join(HERE, "verbs-matrix.py"))
vm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vm)

SOFTRNIC = os.path.join(HERE, "..", "target", "release", "softrnic")
TOOLS = {"ibstat": "infiniband-diags", "ibstatus": "infiniband-diags", "ucx_info": "ucx-utils", "ucx_perftest": "ucx-utils",
         "rping": "rdmacm-utils", "qperf": "qperf", "ib_send_bw": "perftest", "fi_pingpong": "libfabric-bin",
         "mpirun": "openmpi-bin", "mpicc": "libopenmpi-dev", "rstream": "rdmacm-utils", "sockperf": "sockperf"}
TIMEOUT = 90
# How long a server may take to listen on its TCP port (a loaded 2-core
# machine has taken seconds).
READY_WAIT = 30


_scratch = []


def scratch():
    """The run's own temporary directory (programs built, launchers,
    captures), removed when the script exits."""
    if not _scratch:
        _scratch.append(tempfile.mkdtemp(prefix="softrnic-stack-"))
        atexit.register(shutil.rmtree, _scratch[0], True)
    return _scratch[0]


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


# The group mckey joins (administratively scoped: never routed off-site).
MCKEY_GROUP = "239.255.88.1"


def cm_pairs(ack_timeout, rsocket_check, rsocket_hostile, own_device):
    """(name, server argv, client argv, parse, how the server runs): rdma_cm
    programs, {S} and {C} standing for the server's and the client's
    address, {P} for the port ({PX} in hex). A server ONCE serves the
    client and exits; a server that SERVES_TCP listens on TCP port {P} too
    and, like one that runs FOREVER, is stopped once the client is done.
    `ack_timeout`, `rsocket_check` and `rsocket_hostile` are
    scripts/programs/cm-ack-timeout.c, rsocket-check.c and
    rsocket-hostile.c built; `own_device`: each program has its own
    device (not softrnicd's), whose counters it can check."""
    out = [
        # The server's check is its exit status: grep finds its line.
        ("rdma_set_option ACK_TIMEOUT", ["sh", "-c", f"{ack_timeout} -s {{S}} {{P}} | grep -x 'server timeout 18'"],
         [ack_timeout, "-c", "{S}", "{P}", "18"],
         expect(r"client timeout 18", "both QPs time out at code 18 (1.07 s), 32 refused"), ONCE),
        ("rping -V (500 verified pings)", ["rping", "-s", "-a", "{S}", "-p", "{P}", "-C", "500", "-V"],
         ["rping", "-c", "-a", "{S}", "-p", "{P}", "-C", "500", "-V"], counted("verified pings", 500), ONCE),
        ("ucmatose (8 connections)", ["ucmatose", "-b", "{S}", "-p", "{P}", "-c", "8", "-C", "100"],
         ["ucmatose", "-s", "{S}", "-b", "{C}", "-p", "{P}", "-c", "8", "-C", "100"],
         expect(r"return status 0", "8 connections × 100 messages each way"), ONCE),
        # udaddy's -p is the port space; it uses its own port.
        ("udaddy (4 UD endpoints)", ["udaddy", "-b", "{S}", "-c", "4", "-C", "100"],
         ["udaddy", "-s", "{S}", "-b", "{C}", "-c", "4", "-C", "100"],
         expect(r"return status 0", "4 endpoints resolved by SIDR × 100 datagrams"), ONCE),
        # mckey's receiver joins the group and waits for every datagram;
        # the sender joins and sends at once, so it starts a second later.
        ("mckey (multicast group)", ["mckey", "-m", MCKEY_GROUP, "-b", "{S}"],
         ["sh", "-c", f"sleep 1; exec mckey -m {MCKEY_GROUP} -s -b {{C}}"],
         expect(r"return status 0", "10 datagrams to an IP multicast group, joined through rdma_cm"), ONCE),
        ("mckey -o (send-only join)", ["mckey", "-m", MCKEY_GROUP, "-b", "{S}"],
         ["sh", "-c", f"sleep 1; exec mckey -m {MCKEY_GROUP} -s -o -b {{C}}"],
         expect(r"return status 0", "the sender joins send-only (its QP not attached)"), ONCE),
        ("rdma_server/rdma_client", ["rdma_server", "-s", "{S}", "-p", "{P}"], ["rdma_client", "-s", "{S}", "-p", "{P}"],
         expect(r"rdma_client: end 0", "synchronous endpoints, one message each way"), ONCE),
        ("cmtime (1000 connections)", ["cmtime", "-b", "{S}", "-p", "{P}", "-c", "1000"],
         ["cmtime", "-s", "{S}", "-b", "{C}", "-p", "{P}", "-c", "1000"], cmtime_figure, FOREVER),
    ]
    out += rsocket_pairs(rsocket_check, rsocket_hostile, own_device)
    for test in ["rc_lat", "rc_bw"]:
        out.append((f"qperf -cm1 {test}", ["qperf", "-lp", "{P}"], ["qperf", "{S}", "-lp", "{P}", "-t", "2", "-cm1", test],
                    qperf_figure, SERVES_TCP))
    for op in ["send", "write", "read", "atomic"]:
        for kind, figure in [("bw", vm.bw_figure), ("lat", vm.lat_figure)]:
            program = f"ib_{op}_{kind}"
            out.append((f"{program} -R", [program, "-R", "-p", "{P}"], [program, "-R", "-p", "{P}", "{S}"],
                        lambda text, seconds, figure=figure: figure(text), ONCE))
    return out


ONCE, SERVES_TCP, FOREVER = "once", "serves TCP", "forever"

# What --netns quick leaves to the loopback half: variants whose path
# through the interface another entry already takes (rstream's verified
# sweep, the longest entry there at 14 s, by rsocket-check's).
NETNS_QUICK_LEAVES = re.compile(r"tag_bw|ucp_put_bw|ib_(write|atomic)_|ib_send_lat|ib_read_bw|qperf -cm1 rc_bw|"
                                r"rstream -T [abv]|riostream|rcopy|mckey -o|cmtime")

# What --daemon quick leaves: rstream's verified sweep, the longest entry
# through softrnicd (12 s here), whose rsocket path through the daemon
# rstream -T b and -T a, riostream, rcopy and rsocket-check take too.
DAEMON_QUICK_LEAVES = re.compile(r"rstream -T v")

PRELOAD = "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so"


def rsocket_pairs(rsocket_check, rsocket_hostile, own_device):
    """rsockets: rdma-core's rstream (verifying every byte; blocking; with
    rpoll), riostream (riowrite into the peer's riomap'd buffer: custom
    sizes, as its receiver spins on memory and a 2-core machine's engine
    threads wait their turn), rcopy, rsocket-check, rsocket-hostile (a peer
    that connects with another protocol version, then sends a message of
    no kind), and an unmodified TCP
    program (sockperf) under librspreload.so. librspreload falls back to
    the kernel's TCP whenever an rsocket fails, so that client looks for a
    kernel TCP socket on the port while it runs: finding one fails it."""
    stream = lambda *a: (["rstream", "-b", "{S}", "-p", "{P}", *a], ["rstream", "-s", "{S}", "-p", "{P}", *a])
    rcopy = ("f=$(mktemp); head -c 4000000 /dev/urandom > $f; "
             "rcopy $f {S}:$f.copy -p {P} && cmp $f $f.copy && echo 'copied and compared'; rm -f $f $f.copy")
    preloaded = (f"LD_PRELOAD={PRELOAD} sockperf ping-pong --tcp -i {{S}} -p {{P}} -t 2 & sleep 1; "
                 "if grep -qi ':{PX} ' /proc/net/tcp /proc/net/tcp6; then echo 'kernel TCP carried it'; fi; wait")
    # Its own device's counters are in the files `softrnic run` shows.
    check = lambda side: (softrnic_run("{S}" if side == "-s" else "{C}", [rsocket_check, side, "{S}", "{P}", "-n"])
                          if own_device else [rsocket_check, side, "{S}", "{P}"])
    return [
        ("rstream -T v (rsockets, verified)", *stream("-T", "v"), rstream_figure, ONCE),
        ("rstream -T b (blocking, 64 KiB)", *stream("-T", "b", "-S", "65536", "-C", "1000"), rstream_figure, ONCE),
        ("rstream -T a (rpoll, 4 KiB)", *stream("-T", "a", "-S", "4096", "-C", "10000"), rstream_figure, ONCE),
        ("riostream (riowrite, 64 KiB)",
         ["riostream", "-b", "{S}", "-p", "{P}", "-S", "65536", "-C", "100", "-I", "10"],
         ["riostream", "-s", "{S}", "-p", "{P}", "-S", "65536", "-C", "100", "-I", "10"], rstream_figure, ONCE),
        ("rcopy (4 MB file)", ["rcopy", "-p", "{P}"], ["sh", "-c", rcopy],
         expect(r"copied and compared", "4 MB copied over rsockets and compared"), FOREVER),
        ("rsocket-check", check("-s"), check("-c"), checks_figure(own_device), ONCE),
        ("rsocket-hostile (a peer that is no rsocket)", [rsocket_hostile, "-s", "{S}", "{P}"],
         [rsocket_hostile, "-c", "{S}", "{P}"],
         expect(r"client: \d+ checks", "another version refused (ECONNABORTED), a kindless message EPROTO"), ONCE),
        ("librspreload: sockperf --tcp", ["env", f"LD_PRELOAD={PRELOAD}", "sockperf", "server", "--tcp", "-i", "{S}",
                                          "-p", "{P}"], ["sh", "-c", preloaded], preloaded_figure, FOREVER),
    ]


def rstream_figure(text, seconds):
    """rstream's and riostream's table: the last row's rate and time per
    transfer."""
    rows = [l.split() for l in text.splitlines() if re.match(r"^\w+\s+\d+[kmg]?\s+\d", l)]
    if not rows or len(rows[-1]) < 8:
        return None
    last = rows[-1]
    return f"{len(rows)} tests; {last[0]}: {last[6]} Gb/s, {last[7]} µs/xfer"


def checks_figure(own_device):
    def parse(text, seconds):
        m = re.search(r"^(\d+) checks passed", text, re.M)
        tail = ", no RNR NAK, retransmission or timeout on either device" if own_device else ""
        return m and f"{m.group(1)} client checks{tail}"
    return parse


def preloaded_figure(text, seconds):
    if "kernel TCP carried it" in text:
        return None
    m = re.search(r"Summary: Latency is ([\d.]+) usec", text)
    return m and f"{float(m.group(1)):.1f} µs average round trip, no kernel TCP socket on the port"


def cmtime_figure(text, seconds):
    m = re.search(r"^connect\s*:\s*([\d.]+)", text, re.M)
    return m and f"1000 connections set up in {float(m.group(1)):.0f} ms"


def counted(what, n):
    def parse(text, seconds):
        return f"{n} {what} in {seconds:.2f} s, connection set-up and teardown included"
    return parse


def expect(pattern, figure):
    def parse(text, seconds):
        return figure if re.search(pattern, text) else None
    return parse


def qperf_figure(text, seconds):
    m = re.search(r"(latency|bw)\s+=\s+([\d.]+ \S+)", text)
    return m and f"{m.group(1)} {m.group(2)}"


def exit_status(code):
    """How a program ended, in words: a negative code is a signal."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited {code}"


def serve_and_run(site, server_cmd, client_cmd, ready_port=None, stop_server=False, server_env=None,
                  client_env=None):
    """Starts the server (its command already wrapped for the site), waits
    until it listens on TCP `ready_port` (or a moment, for a server with no
    TCP port: an rdma_cm request that comes early is sent again a response
    timeout later, crates/rdmacm/src/protocol.rs), runs the client, then
    waits for the server to exit, or stops it (`stop_server`: one that
    serves on). Returns (verdict, client output): FAIL with why, or None
    when both did what they should."""
    server = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=server_env)
    if ready_port:
        deadline = time.time() + READY_WAIT
        while not site.listening(ready_port) and time.time() < deadline and server.poll() is None:
            time.sleep(0.02)
        if not site.listening(ready_port):
            # The client would only be refused and exit without a word
            # (fi_pingpong does): say what the server did instead.
            ended = server.poll() is not None
            if not ended:
                server.kill()
            server_out, _ = server.communicate()
            why = (f"server {exit_status(server.returncode)} before listening" if ended
                   else f"server not listening on TCP port {ready_port} after {READY_WAIT} s")
            return ("FAIL", f"{why}: " + vm.last_lines(server_out)), server_out
    else:
        time.sleep(0.3)
    try:
        client = subprocess.run(client_cmd, capture_output=True, text=True, env=client_env, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()
        return ("FAIL", f"timed out after {TIMEOUT}s"), ""
    if stop_server:
        server.terminate()
    try:
        server_out, _ = server.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        server.kill()
        server_out, _ = server.communicate()
    text = client.stdout + client.stderr
    if client.returncode != 0:
        return ("FAIL", f"client {exit_status(client.returncode)}: " + vm.last_lines(text)), text
    if not stop_server and server.returncode != 0:
        return ("FAIL", "server: " + vm.last_lines(server_out)), text
    return None, text


def run_cm_pair(libdir, site, server_argv, client_argv, parse, runs, port):
    """Runs an rdma_cm server and client over softrnic's librdmacm; the
    client's output must parse."""
    fill = lambda argv: [a.replace("{S}", site.server_addr).replace("{C}", site.client_addr)
                         .replace("{PX}", f"{port:04X}").replace("{P}", str(port)) for a in argv]
    start = time.time()
    failed, text = serve_and_run(
        site, site.command(site.server_ns, fill(server_argv)), site.command(site.client_ns, fill(client_argv)),
        ready_port=port if runs == SERVES_TCP else None, stop_server=runs != ONCE,
        server_env=vm.environment(libdir, site.server_addr, site.env),
        client_env=vm.environment(libdir, site.client_addr, site.env))
    if failed:
        return failed
    figure = parse(text, time.time() - start)
    return ("pass", figure) if figure else ("FAIL", "no result in the output: " + vm.last_lines(text))


def fabric_figure(text):
    """fi_pingpong's table: the small-message latency and the largest
    size's bandwidth."""
    rows = [l.split() for l in text.splitlines() if re.match(r"^\d+[kmg]?\s+\d", l)]
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    return f"{first[0]} B: {float(first[6]):.1f} µs/xfer; {last[0]}: {float(last[5]):.0f} MB/s"


def run_fabric_pair(site, endpoint, port):
    """fi_pingpong over libfabric's verbs provider, both ends through
    `softrnic run`; the client's table must parse."""
    common = ["fi_pingpong", "-p", "verbs", "-e", endpoint, "-I", "1000"]
    failed, text = serve_and_run(
        site, site.command(site.server_ns, softrnic_run(site.server_addr, [*common, "-B", str(port)])),
        site.command(site.client_ns, softrnic_run(site.client_addr, [*common, "-P", str(port), site.server_addr])),
        ready_port=port)
    if failed:
        return failed
    figure = fabric_figure(text)
    return ("pass", figure) if figure else ("FAIL", "no table in the output: " + vm.last_lines(text))


# libfabric's verbs provider offers MSG endpoints (rdma_cm connections)
# only on addresses it finds on a network interface other than lo, as it
# does for a RoCE NIC: the namespaces' veths have them, loopback's 127.x
# device addresses do not.
NO_MSG_ON_LOOPBACK = "libfabric offers verbs MSG endpoints only on an interface's own address (it skips lo)"


def run_fabric(site, wanted, results):
    loopback = site.server_ns is None
    if not wanted or wanted.search("fi_info"):
        patterns = [r"type: FI_EP_DGRAM"] if loopback else [r"type: FI_EP_DGRAM", r"domain: softrnic0\n.*\n.*type: FI_EP_MSG"]
        results.append((site.name, "fi_info -p verbs", *run_single(site, ["fi_info", "-p", "verbs"], patterns)))
    for i, endpoint in enumerate(["dgram", "msg"]):
        name = f"fi_pingpong -p verbs -e {endpoint}"
        if wanted and not wanted.search(name):
            continue
        if endpoint == "msg" and loopback:
            results.append((site.name, name, "skip", NO_MSG_ON_LOOPBACK))
            continue
        results.append((site.name, name, *run_fabric_pair(site, endpoint, 18890 + i)))


MPI_CHECK = os.path.join(HERE, "programs", "mpi-check.c")


def build_cm_program(name):
    """Compiles scripts/programs/NAME.c against librdmacm's headers;
    returns the binary (run over softrnic's library)."""
    source = os.path.join(HERE, "programs", f"{name}.c")
    binary = os.path.join(tempfile.mkdtemp(prefix="cm-", dir=scratch()), name)
    built = subprocess.run(["cc", "-O2", "-Wall", "-o", binary, source, "-lrdmacm", "-libverbs"],
                           capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"cc {source} failed (librdmacm-dev installed?):\n{built.stderr}")
    return binary


def build_mpi_check():
    """Compiles scripts/programs/mpi-check.c with mpicc; returns the binary."""
    out_dir = tempfile.mkdtemp(prefix="mpi-", dir=scratch())
    binary = os.path.join(out_dir, "mpi-check")
    built = subprocess.run(["mpicc", "-O2", "-o", binary, MPI_CHECK], capture_output=True, text=True)
    if built.returncode != 0:
        sys.exit(f"mpicc {MPI_CHECK} failed:\n{built.stderr}")
    return binary


MPI_OPTIONS = ["--oversubscribe", "--mca", "pml", "ucx", "--mca", "osc", "ucx",
               "-x", "UCX_TLS=rc_v,self", "-x", "UCX_NET_DEVICES=softrnic0:1", "-x", "LD_LIBRARY_PATH"]


def mpirun_over_softrnic(site, binary):
    """Open MPI with UCX over softrnic: `softrnic run` gives mpirun (and
    the ranks it starts) the kernel paths UCX looks for and a device
    address; UCX may use rc_verbs only (no shared memory, no TCP), so every
    byte crosses softrnic. On loopback one mpirun starts both ranks, each
    its own app context with its own address. Between namespaces the
    second rank is a remote host to mpirun, reached through a launcher
    script in place of ssh: `ip netns exec` into its namespace and
    `softrnic run` there."""
    if site.server_ns is None:
        contexts = []
        for addr in [site.server_addr, site.client_addr]:
            contexts += [":", "-np", "1", "-x", f"SOFTRNIC_ADDR={addr}", binary]
        return site.command(None, softrnic_run(site.server_addr, ["mpirun", *MPI_OPTIONS, *contexts[1:]]))
    agent = os.path.join(tempfile.mkdtemp(prefix="mpi-", dir=scratch()), "launch")
    with open(agent, "w") as f:
        f.write(f"""#!/bin/sh
# mpirun's launcher (plm_rsh_agent): HOST COMMAND..., run in HOST's namespace.
host=$1; shift
case "$host" in
  {site.client_addr}) ns={site.client_ns};;
  *) ns={site.server_ns};;
esac
exec ip netns exec "$ns" {SOFTRNIC} run --addr "$host" -- sh -c "$*"
""")
    os.chmod(agent, 0o755)
    subnet = site.server_addr.rsplit(".", 1)[0] + ".0/24"
    # Each "host"'s orted would bind its rank to the first core, the same
    # core of this one machine: both ranks and their engines on one core
    # made the 8 B ping-pong 650 us instead of 18.
    return site.command(site.server_ns, softrnic_run(site.server_addr, [
        "mpirun", *MPI_OPTIONS, "--bind-to", "none", "--mca", "plm_rsh_agent", agent, "--mca", "oob_tcp_if_include", subnet,
        "--host", f"{site.server_addr},{site.client_addr}", "-np", "2", "--map-by", "node", binary]))


def run_mpi(libdir, site, binary):
    """mpi-check's parts over pml ucx and osc ucx; every line must come,
    every check pass."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "LD_LIBRARY_PATH": libdir}
    try:
        out = subprocess.run(mpirun_over_softrnic(site, binary), capture_output=True, text=True, env=env,
                             timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return ("FAIL", f"timed out after {TIMEOUT}s")
    text = out.stdout + out.stderr
    lines = {k: m.group(1) for k in ["latency", "bandwidth", "allreduce", "put"]
             if (m := re.search(rf"^{k}: (.*)$", text, re.M))}
    if out.returncode != 0 or len(lines) != 4:
        return ("FAIL", vm.last_lines(text))
    return ("pass", f"{lines['latency']}, {lines['bandwidth']}, allreduce {lines['allreduce']}, put checked")


def counters_follow(site):
    """Inside `softrnic run`, the device's counter files move with the
    engine: an ib_send_bw server run there must leave rx_packets at the
    1000 messages' packets, and port_rcv_data at a quarter of rx_bytes (it
    counts 4-byte words), in the files a tool reads."""
    port = 18898
    d = "/sys/class/infiniband/softrnic0/ports/1"
    script = (f"ib_send_bw -p {port} >/dev/null & sleep 0.5; "
              f"SOFTRNIC_ADDR={site.client_addr} ib_send_bw -p {port} {site.server_addr} >/dev/null; wait; sleep 0.6; "
              f"cat {d}/hw_counters/rx_packets {d}/hw_counters/rx_bytes {d}/counters/port_rcv_data")
    out = subprocess.run(softrnic_run(site.server_addr, ["sh", "-c", script]), capture_output=True, text=True,
                         timeout=TIMEOUT)
    values = out.stdout.split()
    if out.returncode != 0 or len(values) != 3:
        return ("FAIL", vm.last_lines(out.stdout + out.stderr))
    packets, rx_bytes, words = map(int, values)
    if packets < 1000 or words != rx_bytes // 4:
        return ("FAIL", f"rx_packets {packets}, rx_bytes {rx_bytes}, port_rcv_data {words}")
    return ("pass", f"rx_packets {packets}, port_rcv_data {words} words, read from the files")


def cm_on_the_wire(libdir, site):
    """An independent decoder reads softrnic's CM: tshark captures an rping
    over UDP (no shared memory, so every packet crosses the interface) and
    must decode the five messages of a connection's life as InfiniBand CM
    MADs over RoCEv2, the REQ carrying rdma_cm's IP header with both
    addresses. Capturing needs root (CAP_NET_RAW): elsewhere it is skipped
    with that reason, but not under CI."""
    if shutil.which("tshark") is None:
        return ("FAIL" if os.environ.get("CI") == "true" else "skip", "no tshark (apt-get install tshark)")
    if os.geteuid() != 0:
        return ("FAIL" if os.environ.get("CI") == "true" else "skip", "capturing packets needs root")
    pcap = os.path.join(tempfile.mkdtemp(prefix="cm-", dir=scratch()), "cm.pcap")
    capture = subprocess.Popen(["tshark", "-q", "-i", "lo", "-f", "udp port 4791", "-w", pcap],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # Ready once it says where it captures.
        deadline = time.time() + 20
        seen = ""
        while "Capturing on" not in seen and time.time() < deadline and capture.poll() is None:
            seen += capture.stderr.readline()
        if "Capturing on" not in seen:
            return ("FAIL", "tshark did not start capturing: " + vm.last_lines(seen))
        udp = {"SOFTRNIC_DATAPATH": "udp"}
        server = subprocess.Popen(["rping", "-s", "-a", site.server_addr, "-p", "18899", "-C", "3", "-V"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                  env=vm.environment(libdir, site.server_addr, udp))
        time.sleep(0.3)
        client = subprocess.run(["rping", "-c", "-a", site.server_addr, "-p", "18899", "-C", "3", "-V"],
                                capture_output=True, text=True, env=vm.environment(libdir, site.client_addr, udp),
                                timeout=TIMEOUT)
        server.wait(timeout=TIMEOUT)
        time.sleep(0.5)
    finally:
        capture.send_signal(2)
        capture.wait(timeout=20)
    if client.returncode != 0:
        return ("FAIL", "rping: " + vm.last_lines(client.stdout + client.stderr))
    fields = ["_ws.col.Info", "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4",
              "infiniband.cm.rep.localqpn"]
    decoded = subprocess.run(["tshark", "-r", pcap, "-Y", "infiniband.mad", "-T", "fields", "-E", "separator=|",
                              *[a for f in fields for a in ("-e", f)]], capture_output=True, text=True)
    rows = [line.split("|") for line in decoded.stdout.splitlines()]
    messages = [row[0].removeprefix("CM: ").strip() for row in rows]
    expected = ["ConnectRequest", "ConnectReply", "ReadyToUse", "DisconnectRequest", "DisconnectReply"]
    if messages != expected:
        return ("FAIL", f"tshark decoded {messages}, expected {expected}")
    req, rep = rows[0], rows[1]
    if (req[1], req[2]) != (site.client_addr, site.server_addr) or int(rep[3], 16) == 0:
        return ("FAIL", f"REQ's IP header {req[1:3]}, REP's QPN {rep[3]}")
    return ("pass", "tshark: " + ", ".join(expected) + f"; REQ from {req[1]} to {req[2]}, REP's QP {rep[3]}")


def run_single(site, argv, patterns):
    cmd = site.command(site.server_ns, softrnic_run(site.server_addr, argv))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    text = out.stdout + out.stderr
    missing = [p for p in patterns if not re.search(p, text)]
    if out.returncode != 0 or missing:
        return ("FAIL", f"no {missing[0]!r}: " + vm.last_lines(text) if missing else vm.last_lines(text))
    return ("pass", re.sub(r"[\s#]+", " ", re.search(patterns[-1], text).group(0)).strip())


def device_removal(libdir):
    """rping -s listening through a softrnicd that stops under it: its CM
    thread hears RDMA_CM_EVENT_DEVICE_REMOVAL ("cma detected device
    removal") and it exits within seconds, as under a kernel device
    removed, rather than listen on for ever."""
    addr = "127.0.78.5"
    with vm.Daemon() as socket:
        env = vm.environment(libdir, addr, {"SOFTRNIC_DAEMON": socket})
        server = subprocess.Popen(["rping", "-s", "-a", addr, "-v"], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env)
        time.sleep(1)
        if server.poll() is not None:
            return "FAIL", f"rping {exit_status(server.returncode)} before the daemon stopped: " + \
                vm.last_lines(server.communicate()[0])
        stopped = time.time()
    try:
        out, _ = server.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        return "FAIL", "rping still listening 10 s after softrnicd stopped: " + vm.last_lines(server.communicate()[0])
    if "cma detected device removal" not in out:
        return "FAIL", f"rping {exit_status(server.returncode)} without hearing the device go: " + vm.last_lines(out)
    return "pass", f"rping told, and gone {time.time() - stopped:.2f} s after softrnicd stopped"


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
    failed, text = serve_and_run(
        site, site.command(site.server_ns, softrnic_run(site.server_addr, ["ucx_perftest", "-p", str(port)])),
        site.command(site.client_ns, softrnic_run(
            site.client_addr, ["ucx_perftest", site.server_addr, "-p", str(port), *args])),
        ready_port=port, server_env=env, client_env=env)
    if failed:
        return failed
    figure = perftest_figure(text, kind)
    return ("pass", figure) if figure else ("FAIL", "client: " + vm.last_lines(text))


def progress(site, name, verdict, started):
    """One line on stderr as each entry ends, with its seconds (where CI's
    time goes)."""
    print(f"  {site.name:9} {name:36} {verdict[0]:5} {time.monotonic() - started:5.1f} s", file=sys.stderr, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only the entries whose name matches this regular expression")
    parser.add_argument("--no-netns", action="store_true", help="skip the network-namespace half")
    parser.add_argument("--netns", choices=["full", "quick"], default="full",
                        help="the network-namespace half in full, or without what only repeats loopback (quick)")
    parser.add_argument("--daemon", nargs="?", const="full", choices=["full", "quick"],
                        help="the rdma_cm programs again on loopback, through one softrnicd "
                             "(quick: without rstream's verified sweep)")
    args = parser.parse_args()
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        sys.exit(f"missing programs: install them with: sudo apt-get install {' '.join(missing)}")
    if not os.path.exists(SOFTRNIC):
        sys.exit("no target/release/softrnic: run cargo build --release first")
    libdir = vm.build_library()
    mpi_check = build_mpi_check()
    ack_timeout = build_cm_program("cm-ack-timeout")
    rsocket_check = build_cm_program("rsocket-check")
    rsocket_hostile = build_cm_program("rsocket-hostile")
    wanted = re.compile(args.only) if args.only else None
    results = []
    left = []
    daemon_left = []

    def chosen(site, name):
        """Whether to run `name` at `site` (noting what --netns quick leaves)."""
        if wanted and not wanted.search(name):
            return False
        if site.name == "netns" and args.netns == "quick" and NETNS_QUICK_LEAVES.search(name):
            left.append(name)
            return False
        if site.name == "softrnicd" and args.daemon == "quick" and DAEMON_QUICK_LEAVES.search(name):
            daemon_left.append(name)
            return False
        return True

    def run_cm_site(site):
        own_device = "SOFTRNIC_DAEMON" not in site.env
        pairs = cm_pairs(ack_timeout, rsocket_check, rsocket_hostile, own_device)
        for i, (name, server_argv, client_argv, parse, runs) in enumerate(pairs):
            if not chosen(site, name):
                continue
            started = time.monotonic()
            verdict = run_cm_pair(libdir, site, server_argv, client_argv, parse, runs, 18800 + i)
            results.append((site.name, name, *verdict))
            progress(site, name, verdict, started)

    def run_site(site):
        for name, argv, patterns in singles():
            if not wanted or wanted.search(name):
                results.append((site.name, name, *run_single(site, argv, patterns)))
        for i, (name, tls, perftest_args, kind) in enumerate(pairs()):
            if not chosen(site, name):
                continue
            started = time.monotonic()
            verdict = run_pair(site, tls, perftest_args, kind, 18700 + i)
            results.append((site.name, name, *verdict))
            progress(site, name, verdict, started)
        run_cm_site(site)
        run_fabric(site, wanted, results)
        name = "mpirun pml ucx: ping-pong, allreduce, MPI_Put"
        if not wanted or wanted.search(name):
            results.append((site.name, name, *run_mpi(libdir, site, mpi_check)))

    loopback = vm.Site("loopback", "127.0.78.1", "127.0.78.2")
    run_site(loopback)
    if not wanted or wanted.search("counters"):
        results.append(("loopback", "sysfs counters follow the engine", *counters_follow(loopback)))
    if not wanted or wanted.search("tshark"):
        results.append(("loopback", "tshark decodes the CM exchange", *cm_on_the_wire(libdir, loopback)))
    if args.daemon:
        with vm.Daemon() as socket:
            run_cm_site(vm.Site("softrnicd", "127.0.78.3", "127.0.78.4", env={"SOFTRNIC_DAEMON": socket}))
        if not wanted or wanted.search("device removal"):
            results.append(("softrnicd", "rping hears the device removal", *device_removal(libdir)))
        if daemon_left:
            results.append(("softrnicd", f"{len(daemon_left)} entries", "skip",
                            "--daemon quick: the other rsocket programs ran through it"))
    reason = "--no-netns given" if args.no_netns else vm.namespaces_unavailable()
    if reason:
        results.append(("netns", "all entries", "skip", reason))
    else:
        with vm.Namespaces() as site:
            run_site(site)
        if left:
            results.append(("netns", f"{len(left)} entries", "skip", "--netns quick: the loopback half ran them"))

    sys.exit(vm.report(results))


if __name__ == "__main__":
    main()
