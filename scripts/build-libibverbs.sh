#!/usr/bin/env bash
# Builds softrnic's drop-in libibverbs.so.1 into target/softrnic/lib and
# prints that directory. Run verbs programs over softrnic with
#
#   SOFTRNIC_ADDR=127.0.0.2 LD_LIBRARY_PATH=$(scripts/build-libibverbs.sh) ibv_devinfo
#
# The Rust crate (crates/ibverbs) is built as a static library and linked
# here with libibverbs.map, which gives each symbol the version node of
# rdma-core's library: rustc's cdylib output cannot carry version nodes.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${SOFTRNIC_PROFILE:-release}
cargo build --quiet --locked --profile "$profile" -p softrnic-ibverbs
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")
out=target/softrnic/lib
mkdir -p "$out"
${CC:-cc} -shared -o "$out/libibverbs.so.1.tmp" \
    -Wl,-soname,libibverbs.so.1 \
    -Wl,--version-script=crates/ibverbs/libibverbs.map \
    -Wl,--whole-archive "target/$dir/libsoftrnic_ibverbs.a" -Wl,--no-whole-archive \
    -Wl,--gc-sections -lpthread -ldl -lm
mv "$out/libibverbs.so.1.tmp" "$out/libibverbs.so.1"
ln -sf libibverbs.so.1 "$out/libibverbs.so"
echo "$PWD/$out"
