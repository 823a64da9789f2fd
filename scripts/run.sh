#!/usr/bin/env bash
# Sets up a fresh machine, builds the fa3 program and runs it: `fa3 info`, then
# `fa3 run` with any arguments given here (defaults: batch 1, seqlen 512, 8 heads, head dim 128, bf16).
# On a Hopper GPU it runs the Hopper kernels, otherwise the CPU path.
# The kernels built default to head dim 128 in bf16 and fp16 so that the build takes
# minutes; FA3_HEAD_DIMS / FA3_DTYPES choose others ("64;96;128;192;256").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
FA3_SETUP_TORCH=0 scripts/setup.sh

build=${FA3_BUILD_DIR:-build-run}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA3_BUILD_TESTS=OFF \
  -DFA3_HEAD_DIMS="${FA3_HEAD_DIMS:-128}" -DFA3_DTYPES="${FA3_DTYPES:-bf16;fp16}"
cmake --build "$build" -j "$(nproc)" --target fa3_cli
"$build/tools/fa3" info
"$build/tools/fa3" run "$@"
