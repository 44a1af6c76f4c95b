#!/usr/bin/env bash
# The project's test command: what README.md tells you to run and what CI
# (.ci/run) runs. Formatting, lints, every test (with thousands of
# simulation seeds), the matrix of verbs programs over softrnic's
# libibverbs.so.1, the loom model of the shared-memory rings, and a short
# fuzzing run when cargo-fuzz is installed.
#
#   SOFTRNIC_SIM_SEEDS=N   simulation seeds (default 2000)
#   SOFTRNIC_SIM_FRESH=N   more seeds drawn from the commit (default 500)
#   SOFTRNIC_FUZZ_SECONDS  seconds each fuzz target runs (default 10; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s (%s)\n' "$*" "$(date +%T)"; }

# User congestion-control modules build for WebAssembly (the sandbox's
# tests and softrnic exp e3 build the examples in examples/cc).
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
fi

step "formatting"
cargo fmt --all -- --check

step "lints"
# In the release profile, as the tests build: the build scripts and
# procedural macros (syn, serde's and clap's derives, cranelift's
# generators) it compiles are then the tests' own, not built a second
# time for the dev profile. The code has no cfg(debug_assertions) that
# the lints would miss.
cargo clippy --release --workspace --all-targets --locked -- -D warnings

step "tests (simulation seeds: ${SOFTRNIC_SIM_SEEDS:=2000})"
export SOFTRNIC_SIM_SEEDS
# Engines in the test processes, whatever softrnicd runs on this machine
# (the daemon's own tests start daemons of their own).
export SOFTRNIC_DAEMON=off
# The experiment runner's tests (softrnic exp e1, e2 --quick) run
# rdma_bench over the drop-in library, which must exist first (the
# stack matrix runs the release softrnic command built with it).
scripts/build-libibverbs.sh >/dev/null
# The tests run the release build, the one the library, softrnicd, the
# matrices and users run: built once, not a second time with the test
# profile's settings (that second build of wasmtime and the rest was a
# third of CI's time). `cargo test` alone still uses the test profile.
cargo test --workspace --locked --release

# Seeds no landing has run before: 500 more over each simulated network,
# from a first seed drawn from the commit, so that every landing proves
# new ground beside the 2000 seeds every landing proves (a failure prints
# the line that replays it). Outside a git checkout they are drawn at
# random.
fresh_from=$(git rev-parse --short=10 HEAD 2>/dev/null || true)
step "the simulator on ${SOFTRNIC_SIM_FRESH:=500} fresh seeds (softrnic sim${fresh_from:+ --first $((16#$fresh_from))})"
cargo run --release --locked -q -- sim --seeds "$SOFTRNIC_SIM_FRESH" ${fresh_from:+--first $((16#$fresh_from))}

# The README's main command exactly as it writes it: the first command of
# its Quick start (it broke once, when a second binary joined the default
# members, and nothing noticed).
main_command=$(awk '/^## Quick start/ { quick = 1 } quick && /^```sh/ { block = 1; next }
                    block && NF && !/^#/ { print; exit }' README.md)
step "the README's main command, as written ($main_command)"
main_output=$(eval "$main_command" 2>&1) || { echo "$main_output" >&2; exit 1; }
echo "$main_output" | tail -n 3
echo "$main_output" | grep -qE '^ 65536 +[0-9]+ +[0-9.]+ +[0-9.]+' || {
    echo "the README's main command ran but printed no bandwidth line" >&2
    exit 1
}

# The model checker over the shared-memory rings' index protocol, in a
# target directory of its own (a different --cfg rebuilds everything, and
# the ring's crate has no dependencies for that reason).
step "model checking the shared-memory ring (loom)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --locked -p softrnic-ring

# Unmodified RDMA programs over the drop-in libibverbs.so.1, both ends on
# loopback and (as root) between two network namespaces.
if command -v ibv_rc_pingpong >/dev/null 2>&1 && command -v ib_write_bw >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
    step "verbs programs over libibverbs.so.1, in the process and through softrnicd (scripts/verbs-matrix.py --daemon quick --netns quick)"
    scripts/verbs-matrix.py --daemon quick --netns quick
else
    if [ "${CI:-}" = true ]; then
        echo "the verbs matrix needs python3, ibverbs-utils and perftest, and CI must run it (.ci/run installs them)" >&2
        exit 1
    fi
    step "verbs programs skipped: needs python3, ibverbs-utils and perftest (sudo apt-get install ibverbs-utils perftest)"
fi

# The stack above libibverbs, unmodified: the tools that read the kernel's
# RDMA paths and UCX through `softrnic run`, rdma_cm programs over the
# drop-in librdmacm.so.1, libfabric and Open MPI. The script names any
# other package it misses, and fails.
if command -v ibstat >/dev/null 2>&1 && command -v ucx_perftest >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1; then
    step "the RDMA stack over softrnic, rdma_cm through softrnicd too (scripts/stack-matrix.py --daemon quick --netns quick)"
    scripts/stack-matrix.py --daemon quick --netns quick
else
    if [ "${CI:-}" = true ]; then
        echo "the stack matrix needs python3, infiniband-diags and ucx-utils, and CI must run it (.ci/run installs them)" >&2
        exit 1
    fi
    step "RDMA stack programs skipped: needs infiniband-diags and ucx-utils (sudo apt-get install infiniband-diags ucx-utils)"
fi

# Installing it as users do: the Debian package built, checked by lintian,
# installed with apt-get, used by ib_write_bw and rping from its files
# alone, and purged; the GitHub action's steps as a runner runs them; the
# CDI spec validated by the CNCF's implementation and run in two runc
# containers; and the Kubernetes device plugin against the kubelet's API,
# with the manifests' commands.
if [ "$(id -u)" = 0 ] && command -v lintian >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v go >/dev/null 2>&1; then
    step "installing it: the Debian package, the CI action, CDI containers, Kubernetes (scripts/package.sh --check, contrib/*/check.sh)"
    scripts/package.sh --check
    contrib/github-action/check.sh
    contrib/cdi/check.sh
    contrib/kubernetes/check.sh
else
    if [ "${CI:-}" = true ]; then
        echo "the install checks need root, lintian, runc and Go, and CI must run them (.ci/run installs them)" >&2
        exit 1
    fi
    step "the install checks skipped: need root, lintian, runc and Go >= 1.26 (apt-get install lintian runc python3-yaml)"
fi

# In-network aggregation from Python: NumPy tensors of four worker
# processes summed through the lab's switch over the C ABI.
if [ "$(id -u)" = 0 ] && { python3 -c 'import numpy' 2>/dev/null || /usr/bin/python3 -c 'import numpy' 2>/dev/null; }; then
    step "the Python allreduce through the lab's switch (scripts/python-allreduce.sh)"
    scripts/python-allreduce.sh | grep -E '^worker|^softrnic'
else
    if [ "${CI:-}" = true ]; then
        echo "the Python allreduce needs root and NumPy, and CI must run it (.ci/run installs python3-numpy)" >&2
        exit 1
    fi
    step "the Python allreduce skipped: needs root (network namespaces) and NumPy (apt-get install python3-numpy)"
fi

fuzz_seconds=${SOFTRNIC_FUZZ_SECONDS:-10}
if [ "$fuzz_seconds" -gt 0 ]; then
    if cargo fuzz --version >/dev/null 2>&1 && cargo +nightly --version >/dev/null 2>&1; then
        step "fuzzing every parser for ${fuzz_seconds}s each: packets, responder, CM, rsocket messages, aggregation, INT, inbox, daemon protocol, lab frames (scripts/fuzz.sh)"
        scripts/fuzz.sh "$fuzz_seconds"
    else
        if [ "${CI:-}" = true ]; then
            echo "fuzzing needs cargo-fuzz and a nightly toolchain, and CI must run it (.ci/run installs both)" >&2
            exit 1
        fi
        step "fuzzing skipped: needs cargo-fuzz and a nightly toolchain (cargo install cargo-fuzz)"
    fi
fi
