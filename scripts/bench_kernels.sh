#!/usr/bin/env bash
# Times every forward kernel built for a head dim and mask with `fa3 bench --kernel`,
# over the ANCHORS.md sequence lengths, and prints one table per kernel: the data for
# choosing tiles in hopper/fwd_dispatch.cpp. Needs a Hopper GPU and a built tree.
#
#   scripts/bench_kernels.sh BUILD_DIR OUT_DIR HDIM:MASK:KERNEL[,KERNEL...] ...
#       MASK is causal or non-causal; e.g. 128:non-causal:128x176,128x128
set -uo pipefail
[ $# -ge 3 ] || { sed -n '2,7p' "$0"; exit 2; }
build=$1 out=$2
shift 2
mkdir -p "$out"
for spec in "$@"; do
  IFS=: read -r hdim mask kernels <<<"$spec"
  for kernel in ${kernels//,/ }; do
    echo "== hdim $hdim $mask kernel $kernel"
    "$build/tools/fa3" bench --device gpu --head-dims "$hdim" --"$mask" --kernel "$kernel" \
      --json "$out/kernels-hdim$hdim-$mask-$kernel.json" | tail -n +2
  done
done
