#!/usr/bin/env bash
# Runs the action's steps (setup.sh) as a runner would, from this source
# tree, then the job a user would write after them: ibv_rc_pingpong with
# both ends on the one device the action made, and rping, with nothing but
# the variables the action exported. Needs ibverbs-utils and rdmacm-utils.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runner=$(mktemp -d)
trap 'kill "$(cat "$runner/softrnic/softrnicd.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$runner"' EXIT
touch "$runner/env" "$runner/path"

# The runner's side: a clean environment but its toolchain (PATH and
# HOME, where rustup keeps it), and the runner's three variables.
runner_vars=("RUNNER_TEMP=$runner" "GITHUB_ENV=$runner/env" "GITHUB_PATH=$runner/path")
env -i "PATH=$PATH" "HOME=$HOME" "${runner_vars[@]}" SOFTRNIC_SETUP_ADDR=127.0.79.5 "$here/setup.sh" \
    >"$runner/setup.log" 2>&1 || {
    cat "$runner/setup.log" >&2
    exit 1
}

# A later step's environment: GITHUB_ENV's lines, GITHUB_PATH before the
# system's, and nothing of this source tree or toolchain.
job=(env -i "HOME=$runner" "PATH=$(cat "$runner/path"):/usr/sbin:/usr/bin:/sbin:/bin")
while IFS= read -r line; do job+=("$line"); done <"$runner/env"
grep -q '^SOFTRNIC_DAEMON=/' "$runner/env" || { echo "the action exported no daemon: $(cat "$runner/env")" >&2; exit 1; }

# A server and its client; the client tries until the server listens
# (seconds, on a loaded machine), up to 40 times half a second apart.
pair() {
    local name=$1 server=$2 client=$3
    "${job[@]}" sh -c "$server" >"$runner/server" 2>&1 &
    local pid=$!
    "${job[@]}" sh -c "for try in \$(seq 40); do $client && exit 0; sleep 0.5; done; exit 1" >"$runner/client" 2>&1 || {
        echo "$name failed after the action's setup:" >&2
        cat "$runner/server" "$runner/client" "$runner/softrnic/softrnicd.log" >&2
        exit 1
    }
    wait "$pid"
}
pair ibv_rc_pingpong "ibv_rc_pingpong -g 0 -p 18781 -n 200" "ibv_rc_pingpong -g 0 -p 18781 -n 200 127.0.0.1"
grep -q '200 iters' "$runner/client" || { cat "$runner/client" >&2; exit 1; }
# rdma_cm's programs each need an address of their own, through the
# daemon too (README, Troubleshooting): the client takes another.
pair rping "rping -s -a 127.0.79.5 -p 18782 -C 100 -V" "SOFTRNIC_ADDR=127.0.79.6 rping -c -a 127.0.79.5 -p 18782 -C 100 -V"
echo "the action's steps: installed, softrnicd started, ibv_rc_pingpong (200 iterations) on its one device, rping (100 verified pings)"
