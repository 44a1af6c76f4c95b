#!/usr/bin/env bash
# Builds softrnic's drop-in libibverbs.so.1 and librdmacm.so.1 into
# target/softrnic/lib and prints that directory. Run verbs and rdma_cm
# programs over softrnic with
#
#   SOFTRNIC_ADDR=127.0.0.2 LD_LIBRARY_PATH=$(scripts/build-libibverbs.sh) ibv_devinfo
#
# Each Rust crate (crates/ibverbs, crates/rdmacm) is built as a static
# library and linked here with its version script, which gives each symbol
# the version node of rdma-core's library: rustc's cdylib output cannot
# carry version nodes. librdmacm.so.1 calls libibverbs.so.1, as
# rdma-core's does, so both share the process's one engine.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${SOFTRNIC_PROFILE:-release}
# The softrnic command (`softrnic run` sets up a program's environment),
# softrnicd and rdma_bench, which the matrices run beside the library, come
# in the same build: built apart, each would pick different features of
# the dependencies they share and build those (wasmtime among them) again.
# Together they pick the features the tests' build does (scripts/test.sh).
cargo build --quiet --locked --profile "$profile" \
    -p softrnic-ibverbs -p softrnic-rdmacm -p softrnic-cli -p softrnic-daemon -p softrnic-rdma-bench
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
${CC:-cc} -shared -o "$out/librdmacm.so.1.tmp" \
    -Wl,-soname,librdmacm.so.1 \
    -Wl,--version-script=crates/rdmacm/librdmacm.map \
    -Wl,--whole-archive "target/$dir/libsoftrnic_rdmacm.a" -Wl,--no-whole-archive \
    -Wl,--gc-sections -L"$out" -libverbs -lpthread -ldl -lm
mv "$out/librdmacm.so.1.tmp" "$out/librdmacm.so.1"
ln -sf librdmacm.so.1 "$out/librdmacm.so"
echo "$PWD/$out"
