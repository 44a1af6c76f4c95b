#!/usr/bin/env bash
# contrib/kubernetes without a cluster (no kubelet runs here): the device
# plugin's tests, which play the kubelet's side of deviceplugin/v1beta1
# (registration, ListAndWatch, Allocate, a kubelet restart), and the
# manifests' every softrnic command run against this build.
#
#   contrib/kubernetes/check.sh      (Go >= 1.26, python3-yaml, a build: scripts/build-libibverbs.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$here/device-plugin" && go vet ./... && go test -count=1 ./... && go build -buildvcs=false -o "$work/plugin" .)
(cd "$here/../cdi/cdi-check" && go build -buildvcs=false -o "$work/cdi-check" .)
/usr/bin/python3 "$here/check-manifests.py" "$work/cdi-check" "$work/plugin"
