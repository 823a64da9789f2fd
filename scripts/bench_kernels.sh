#!/usr/bin/env bash
# Times every forward kernel built for a head dim and mask with `fa3 bench --kernel`,
# over the ANCHORS.md sequence lengths, and prints one row per kernel: the data for
# choosing tiles in hopper/fwd_dispatch.cpp. Needs a Hopper GPU and a built tree.
#
# Single runs of one kernel vary by 5-10 % at short sequences, more than most
# differences being measured, so the kernels of a spec are run in turns, ROUNDS times
# (default 3), and each point reports the median with the spread (max - min) in %.
#
#   scripts/bench_kernels.sh [--rounds N] [--flush-l2] BUILD_DIR OUT_DIR HDIM:MASK:KERNEL[,KERNEL...] ...
#       MASK is causal or non-causal; e.g. 128:non-causal:128x128,128x128-or-kv3-q1
#       --flush-l2 times each call after an L2 flush (`fa3 bench --flush-l2`), the way
#       bench/bench_attention.py's sweep times, instead of back to back.
set -uo pipefail
rounds=3
flush=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --flush-l2) flush=(--flush-l2); shift ;;
    *) break ;;
  esac
done
[ $# -ge 3 ] || { sed -n '2,13p' "$0"; exit 2; }
build=$1 out=$2
shift 2
mkdir -p "$out"
for spec in "$@"; do
  IFS=: read -r hdim mask kernels <<<"$spec"
  files=()
  for ((r = 1; r <= rounds; r++)); do
    for kernel in ${kernels//,/ }; do
      json="$out/kernels-hdim$hdim-$mask-$kernel-r$r.json"
      "$build/tools/fa3" bench --device gpu --head-dims "$hdim" --"$mask" --kernel "$kernel" "${flush[@]}" --json "$json" \
        >/dev/null || { echo "bench_kernels: $kernel failed" >&2; exit 1; }
      files+=("$kernel=$json")
    done
  done
  echo "== hdim $hdim $mask: median TFLOP/s over $rounds rounds (spread %)"
  python3 "$(dirname "$0")/kernel_medians.py" "${files[@]}"
done
