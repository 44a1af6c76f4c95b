#!/usr/bin/env bash
# softrnic's CDI spec, checked as a runtime uses it: `softrnic cdi` writes
# the spec, the CNCF's reference implementation (cdi-check/, built with Go)
# validates it and injects softrnic.dev/rdma=softrnic0 into two OCI
# bundles, and runc runs them, each container in a network namespace of
# its own joined by a veth pair, its root an overlay of this host's files.
# Their unmodified ib_write_bw and rping reach each other through the
# host's softrnicd, with nothing but the spec's mounts and variables.
#
#   contrib/cdi/check.sh        (root; runc, Go >= 1.23, perftest, rdmacm-utils, iproute2)
#
# The bundles' specs have no rlimits and no cgroup limits: the sandboxes
# this runs in refuse them (podman and crun stop there for that reason).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."

for program in runc go ib_write_bw rping ip; do
    command -v "$program" >/dev/null || { echo "contrib/cdi/check.sh needs $program" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "contrib/cdi/check.sh runs containers: run it as root" >&2; exit 1; }
[ -x target/release/softrnicd ] && [ -e target/softrnic/lib/libibverbs.so.1 ] ||
    { echo "build first: scripts/build-libibverbs.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/softrnic-cdi.XXXXXX)
tag=srn-cdi-$$
containers=() bundles=() daemon=
cleanup() {
    for id in "${containers[@]}"; do runc delete -f "$id" >/dev/null 2>&1 || true; done
    for bundle in "${bundles[@]}"; do
        umount "$bundle/rootfs" 2>/dev/null || true
        umount "$bundle/layer" 2>/dev/null || true
    done
    ip netns del "$tag-a" 2>/dev/null || true
    ip netns del "$tag-b" 2>/dev/null || true
    [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# The reference implementation, as a runtime links it.
(cd "$here/cdi-check" && go build -buildvcs=false -o "$work/cdi-check" .)

# The host's softrnicd (as root: it opens each container's device in the
# container's network namespace), and the spec that names its socket.
target/release/softrnicd --socket "$work/run/softrnicd.sock" --nice 0 >"$work/daemon.log" 2>&1 &
daemon=$!
target/release/softrnic cdi --socket "$work/run/softrnicd.sock" --out "$work/cdi" >/dev/null
"$work/cdi-check" "$work/cdi"

# Two hosts' networks: a namespace each, a veth pair between them.
ip netns add "$tag-a"
ip netns add "$tag-b"
ip link add "$tag-a" netns "$tag-a" type veth peer name "$tag-b" netns "$tag-b"
ip -n "$tag-a" addr add 10.79.0.1/24 dev "$tag-a"
ip -n "$tag-b" addr add 10.79.0.2/24 dev "$tag-b"
for ns in a b; do
    ip -n "$tag-$ns" link set lo up
    ip -n "$tag-$ns" link set "$tag-$ns" up
done

# A bundle: the host's files under an overlay (what the container writes
# stays in a tmpfs), runc's default spec without rlimits or cgroup limits,
# the network namespace made above, the command, and then the CDI device.
bundle() {
    local name=$1 netns=$2 command=$3
    local dir=$work/$name
    mkdir -p "$dir/rootfs" "$dir/layer"
    bundles+=("$dir")
    mount -t tmpfs tmpfs "$dir/layer"
    mkdir "$dir/layer/upper" "$dir/layer/work"
    mount -t overlay overlay -o "lowerdir=/,upperdir=$dir/layer/upper,workdir=$dir/layer/work" "$dir/rootfs"
    runc spec --bundle "$dir"
    python3 - "$dir/config.json" "/run/netns/$netns" "$command" <<'EOF'
import json, sys
path, netns, command = sys.argv[1:]
config = json.load(open(path))
config["process"].update(terminal=False, args=["sh", "-c", command])
config["process"].pop("rlimits", None)
config["linux"].pop("resources", None)
config["root"]["readonly"] = False
for namespace in config["linux"]["namespaces"]:
    if namespace["type"] == "network":
        namespace["path"] = netns
json.dump(config, open(path, "w"), indent=1)
EOF
    "$work/cdi-check" "$work/cdi" softrnic.dev/rdma=softrnic0 "$dir/config.json" >/dev/null
}

# The client tries each program until its server listens (a container
# starts in seconds on a loaded machine), up to 40 times.
until_served() { echo "(ok=0; for try in \$(seq 40); do $1 && { ok=1; break; }; sleep 0.5; done; [ \$ok = 1 ])"; }
bundle server "$tag-a" "ib_write_bw -p 18791 -n 500 && rping -s -a 10.79.0.1 -p 18792 -C 100 -V"
bundle client "$tag-b" "$(until_served "ib_write_bw -p 18791 -n 500 10.79.0.1") && $(until_served "rping -c -a 10.79.0.1 -p 18792 -C 100 -V")"

containers+=("$tag-server")
runc run --bundle "$work/server" "$tag-server" >"$work/server.out" 2>&1 &
server=$!
containers+=("$tag-client")
if ! runc run --bundle "$work/client" "$tag-client" >"$work/client.out" 2>&1 || ! wait "$server"; then
    echo "the containers failed:" >&2
    tail -n 20 "$work/server.out" "$work/client.out" "$work/daemon.log" >&2
    exit 1
fi
bandwidth=$(awk '$1 == 65536 && $2 == 500 {print $4}' "$work/client.out")
[ -n "$bandwidth" ] || { cat "$work/client.out" >&2; exit 1; }
grep -q 'opened the device on 10.79.0.1' "$work/daemon.log" && grep -q 'opened the device on 10.79.0.2' "$work/daemon.log" ||
    { echo "the containers' devices were not the daemon's, in their namespaces:" >&2; cat "$work/daemon.log" >&2; exit 1; }
echo "CDI: the spec valid, injected into two runc containers; ib_write_bw $bandwidth MB/s and rping (100 verified pings) between them through the host's softrnicd"
