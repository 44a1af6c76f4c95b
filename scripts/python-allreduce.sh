#!/usr/bin/env bash
# In-network aggregation from Python: four workers (examples/python/allreduce.py,
# NumPy over the C ABI) and a parameter server in the lab, the switch
# aggregating. Needs root (network namespaces), python3 and NumPy.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p softrnic-cli -p softrnic-aggregation
bin=$PWD/target/release/softrnic
lib=$PWD/target/release/libsoftrnic_aggregation.so
example=$PWD/examples/python/allreduce.py
# The first python3 with NumPy (a pyenv shim may hide Debian's).
python=
for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import numpy' 2>/dev/null; then python=$(command -v "$candidate"); break; fi
done
[ -n "$python" ] || { echo "the example needs NumPy: apt-get install python3-numpy (or pip install numpy)" >&2; exit 1; }
on=()
for w in 0 1 2 3; do
    on+=(--on "h$w=$python $example --lib $lib --addr \$ADDR --server \$h4 --worker $w --workers 4")
done
"$bin" lab star:5 --rate 1Gbps --aggregators 256 \
    --bg "h4=exec $bin agg server --job 1 --workers \$h0,\$h1,\$h2,\$h3 --addr \$h4" "${on[@]}"
