#!/usr/bin/env bash
# Profiles one forward kernel launch (with --backward among the arguments, one launch of
# the backward's main kernel) with Nsight Compute and writes, under OUT_DIR:
#   fwd.ncu-rep      the full report (bwd.ncu-rep for the backward; open it in the
#                    Nsight Compute UI)
#   details.csv      every section of the report, as CSV
#   source-sass.csv  per-SASS-instruction counters and warp-stall samples
#   hotspots.txt     the instructions with the most stall samples, and where they stall
# Needs a Hopper GPU, ncu on the PATH and a built tree (BUILD_DIR/tools/fa3). The
# remaining arguments go to `fa3 run` (shape, --causal, --kernel ...).
#
#   scripts/profile_fwd.sh BUILD_DIR OUT_DIR --head-dim 128 --batch 32 --nheads 16 --seqlen 512 --causal
#   scripts/profile_fwd.sh BUILD_DIR OUT_DIR --backward --head-dim 128 --seqlen 16384 --nheads 16 --causal
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,13p' "$0"; exit 2; }
build=$1 out=$2
shift 2
pass=fwd
for arg in "$@"; do [ "$arg" = --backward ] && pass=bwd; done
mkdir -p "$out"
cd "$(dirname "$0")/.."

# Clocks are left alone (--clock-control none) so that the profile runs at the clocks
# the benchmarks see; the one warm-up call is the launch that is profiled.
ncu --clock-control none --set full --import-source yes -k regex:${pass}_kernel -c 1 -f -o "$out/$pass" \
  "$build/tools/fa3" run --device gpu --warmup 1 --iters 1 --check-rows 0 "$@" >"$out/ncu.log" 2>&1 ||
  { tail -20 "$out/ncu.log"; exit 1; }
ncu --import "$out/$pass.ncu-rep" --page details --csv >"$out/details.csv" 2>>"$out/ncu.log"
ncu --import "$out/$pass.ncu-rep" --page source --csv --print-source sass >"$out/source-sass.csv" 2>>"$out/ncu.log"
python3 scripts/ncu_hotspots.py "$out/source-sass.csv" >"$out/hotspots.txt" 2>&1
head -60 "$out/hotspots.txt"
