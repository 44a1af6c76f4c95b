#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for SECONDS each, two at a
# time, and prints what each did: executions, coverage (the edges and
# features libFuzzer counts), the corpus it kept, and its findings. A
# target that finds something fails the run, with its report (the input,
# the panic, the backtrace) printed.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]    (default: 600 s, every target)
#
# Needs a nightly toolchain and cargo-fuzz (.ci/run installs both). The
# corpora stay in fuzz/corpus, so a later run starts where this one ended.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

cargo +nightly fuzz build >"$logs/build" 2>&1 || { cat "$logs/build"; exit 1; }

run() {
    local rc=0
    cargo +nightly fuzz run "$1" -- -max_total_time="$seconds" -print_final_stats=1 >"$logs/$1" 2>&1 || rc=$?
    echo "$rc" >"$logs/$1.rc"
}

# Two at a time: CI's machines and most laptops have at least two cores.
for ((i = 0; i < ${#targets[@]}; i += 2)); do
    run "${targets[i]}" &
    if [ $((i + 1)) -lt ${#targets[@]} ]; then run "${targets[i + 1]}" & fi
    wait
done

failed=0
printf '%-16s %12s %8s %9s %7s  %s\n' target executions edges features corpus findings
for target in "${targets[@]}"; do
    log="$logs/$target"
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
    edges=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
    features=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$last")
    corpus=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<<"$last")
    if [ "$(cat "$log.rc")" = 0 ]; then
        findings=none
    else
        findings="FAILED (report below)"
        failed=1
    fi
    printf '%-16s %12s %8s %9s %7s  %s\n' "$target" "${executions:-?}" "${edges:-?}" "${features:-?}" "${corpus:-?}" "$findings"
done
for target in "${targets[@]}"; do
    if [ "$(cat "$logs/$target.rc")" != 0 ]; then
        echo
        echo "== $target"
        grep -v '^".*# Uses:' "$logs/$target" | tail -n 80
    fi
done
exit $failed
