#!/usr/bin/env bash
# The steps of softrnic's GitHub action (action.yml): install softrnic,
# start softrnicd if asked, and hand the job's later steps the variables
# that put its RDMA programs on softrnic. Runs anywhere GitHub's files are
# given (check.sh runs it so in CI).
#
#   SOFTRNIC_PACKAGE       a .deb to install; empty: build from this source tree
#   SOFTRNIC_SETUP_ADDR    the device's address (default 127.0.0.2)
#   SOFTRNIC_SETUP_DAEMON  true (default) or false
#   GITHUB_ENV, GITHUB_PATH, RUNNER_TEMP  as the runner sets them
set -euo pipefail
source_tree=$(cd "$(dirname "$0")/../.." && pwd)
addr=${SOFTRNIC_SETUP_ADDR:-127.0.0.2}
temp=${RUNNER_TEMP:-${TMPDIR:-/tmp}}/softrnic
: "${GITHUB_ENV:?the runner names GITHUB_ENV}" "${GITHUB_PATH:?the runner names GITHUB_PATH}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

echo "::group::installing softrnic"
if [ -n "${SOFTRNIC_PACKAGE:-}" ]; then
    # apt-get takes a file for a path with a slash in it.
    package=$(realpath "$SOFTRNIC_PACKAGE")
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"
    bin=/usr/bin
else
    "$source_tree/scripts/package.sh" --prefix "$temp"
    bin=$temp/bin
fi
echo "::endgroup::"

if [ "${SOFTRNIC_SETUP_DAEMON:-true}" = true ]; then
    socket=$temp/run/softrnicd.sock
    mkdir -p "$temp/run"
    # Its own session: it outlives this step, and the runner ends it with
    # the job. A user's daemon keeps the priority it was given (--nice 0).
    setsid "$bin/softrnicd" --socket "$socket" --nice 0 >"$temp/softrnicd.log" 2>&1 </dev/null &
    echo $! >"$temp/softrnicd.pid"
    for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
    [ -S "$socket" ] || { cat "$temp/softrnicd.log" >&2; echo "softrnicd did not start" >&2; exit 1; }
    echo "SOFTRNIC_DAEMON=$socket" >>"$GITHUB_ENV"
    need=(--need programs --need daemon)
    export SOFTRNIC_DAEMON=$socket
else
    echo "SOFTRNIC_DAEMON=off" >>"$GITHUB_ENV"
    need=(--need programs)
    export SOFTRNIC_DAEMON=off
fi
"$bin/softrnic" env --addr "$addr" --format plain >>"$GITHUB_ENV"
echo "$bin" >>"$GITHUB_PATH"
# What the job's programs will find, one line per check; a missing piece
# fails the step here rather than the job's tests later.
"$bin/softrnic" doctor --addr "$addr" "${need[@]}"
