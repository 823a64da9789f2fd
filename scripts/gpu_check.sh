#!/usr/bin/env bash
# The GPU check: on a Hopper machine (no network needed) build Release with every
# core, run the GPU tests (C++ and, when nanobind and torch are present, Python),
# run compute-sanitizer on small cases, and benchmark against PyTorch's SDPA
# backends (bench/bench_attention.py; the C++ `fa3 bench` when torch is absent).
# Logs and results go to the --out directory; a short summary is printed last.
#
#   scripts/gpu_check.sh --out DIR (--cutlass INCLUDE_DIR | --cutlass-tarball FILE)
#       [--head-dims "64;128"] [--dtypes "bf16"] [--build-dir DIR]
#       [--tests REGEX] [--test-timeout S] [--test-jobs N] [--no-tests] [--no-python] [--no-sanitizer]
#       [--no-bench] [--bench-args "..."] [--cmake-args "..."]
#
# --cmake-args passes options to the configure step, e.g. a build without one of the
# switched paths:
#   --cmake-args "-DFA3_GPU_VARLEN=OFF"
# (the tests that follow fa3.build_info() then check that varlen calls are refused).
set -uo pipefail
cd "$(dirname "$0")/.."

out="" cutlass="" tarball="" head_dims="64;96;128;192;256" dtypes="fp16;bf16" build_dir="build-gpu"
tests_regex="" test_timeout=600 test_jobs=1 run_tests=1 run_python=1 run_sanitizer=1 run_bench=1 bench_args="" cmake_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --cutlass) cutlass=$2; shift 2 ;;
    --cutlass-tarball) tarball=$2; shift 2 ;;
    --head-dims) head_dims=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --tests) tests_regex=$2; shift 2 ;;
    --test-timeout) test_timeout=$2; shift 2 ;;
    --test-jobs) test_jobs=$2; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    --no-python) run_python=0; shift ;;
    --no-sanitizer) run_sanitizer=0; shift ;;
    --no-bench) run_bench=0; shift ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --cmake-args) cmake_args=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_check: --out DIR is required" >&2; exit 2; }
mkdir -p "$out"

if [ -n "$tarball" ]; then
  cutlass="$(mktemp -d)/include"
  mkdir -p "$cutlass" && tar -C "$cutlass" -xzf "$tarball" || { echo "gpu_check: cannot unpack $tarball" >&2; exit 2; }
fi
[ -f "$cutlass/cute/tensor.hpp" ] || { echo "gpu_check: no CUTLASS headers at '$cutlass'" >&2; exit 2; }

declare -A result
step() {  # step NAME LOGFILE COMMAND...: runs, logs, records pass/fail and seconds
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  result[$name]="$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)") $((SECONDS - t0))s"
  return $rc
}

if [ $run_python -eq 1 ] && ! python3 -m nanobind --cmake_dir >/dev/null 2>&1; then
  echo "gpu_check: nanobind not found; skipping the Python parts"
  run_python=0
fi
has_torch=0
python3 -c "import torch" >/dev/null 2>&1 && has_torch=1

jobs=$(nproc)
step configure "$out/build.log" cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DFA3_CUTLASS_INCLUDE="$cutlass" -DFA3_HEAD_DIMS="$head_dims" -DFA3_DTYPES="$dtypes" -DFA3_PTXAS_VERBOSE=ON \
  -DFA3_BUILD_PYTHON=$([ $run_python -eq 1 ] && echo ON || echo OFF) $cmake_args
if step build "$out/build-steps.log" cmake --build "$build_dir" -j "$jobs"; then
  cat "$out/build-steps.log" >>"$out/build.log"
  rm -f "$out/build-steps.log"
  # Registers / spills per kernel, for the perf log.
  grep -E "Compiling entry|registers|spill" "$out/build.log" | grep -B1 -A1 "fwd_kernel" >"$out/ptxas.txt" || true

  # Smoke: one small call per head dim and mask under a short timeout, so that a hang
  # costs seconds, not the test suite's timeouts. The backward's smoke (MHA, and GQA in
  # deterministic mode) has its own result: a failing backward leaves the forward's
  # tests and benchmark running, and skips only the backward's sanitizer runs.
  smoke_ok=1 smoke_bwd_ok=1
  for hd in ${head_dims//;/ }; do
    for c in "" "--causal"; do
      echo "== smoke hdim $hd $c" >>"$out/smoke.log"
      timeout 30 "$build_dir/tools/fa3" run --device gpu --head-dim "$hd" $c --batch 2 --seqlen 1000 \
        --check-rows 64 >>"$out/smoke.log" 2>&1 || { smoke_ok=0; echo "   FAILED (rc $?)" >>"$out/smoke.log"; }
      for bwd in "--nheads 8" "--nheads 8 --nheads-kv 2 --deterministic"; do
        echo "== smoke backward hdim $hd $c $bwd" >>"$out/smoke.log"
        timeout 60 "$build_dir/tools/fa3" run --backward --device gpu --head-dim "$hd" $c $bwd --batch 2 \
          --seqlen 1000 --check-rows 64 >>"$out/smoke.log" 2>&1 ||
          { smoke_bwd_ok=0; echo "   FAILED (rc $?)" >>"$out/smoke.log"; }
      done
    done
  done
  result[smoke]="$([ $smoke_ok -eq 1 ] && echo ok || echo FAILED)"
  result[smoke_bwd]="$([ $smoke_bwd_ok -eq 1 ] && echo ok || echo FAILED)"
  if [ $smoke_ok -eq 0 ]; then
    run_tests=0 run_sanitizer=0 run_bench=0
  fi
  if [ $smoke_ok -eq 0 ] || [ $smoke_bwd_ok -eq 0 ]; then
    cat "$out/smoke.log"
  fi

  if [ $run_tests -eq 1 ]; then
    filter=(-L gpu)
    [ -n "$tests_regex" ] && filter=(-R "$tests_regex")
    # --test-jobs > 1 runs test processes side by side on the GPU (one at a time, the
    # first 132 of a full build's 251 took 330 s on an H100); a test of huge buffers may
    # then find too little memory free and skip, or fail where another process took the
    # memory between its check and its allocation.
    step gpu_tests "$out/gpu-tests.log" ctest --test-dir "$build_dir" "${filter[@]}" --timeout "$test_timeout" \
      -j "$test_jobs" --output-on-failure
    if [ $run_python -eq 1 ]; then
      step python_tests "$out/python-tests.log" env PYTHONPATH="$build_dir/python" \
        timeout "$test_timeout" python3 -m pytest -q -rs tests/python
    fi
  fi
  if [ $run_sanitizer -eq 1 ]; then
    fa3="$build_dir/tools/fa3"
    small="--seqlen-q 137 --seqlen-k 211 --nheads 4 --nheads-kv 2 --iters 1 --warmup 0 --check-rows 8"
    # A subshell, so that the first failure ends the sanitizer runs, not the script.
    (
      c=""
      for hd in ${head_dims//;/ }; do
        echo "== memcheck hdim $hd $c"
        compute-sanitizer --tool memcheck --error-exitcode 99 "$fa3" run --device gpu --head-dim "$hd" $small $c || exit 1
        c=$([ -z "$c" ] && echo --causal || echo "")
      done
      # Shared-memory hazards depend on the head dim's configuration (one or two Q
      # buffers, where O is staged), so racecheck covers every head dim and mask.
      for hd in ${head_dims//;/ }; do
        for c in "" --causal; do
          echo "== racecheck hdim $hd $c"
          compute-sanitizer --tool racecheck --error-exitcode 99 "$fa3" run --device gpu --head-dim "$hd" $small $c || exit 1
        done
      done
      # Head dim 64's tile follows the key length (256x64 up to 1024 keys, 192x128
      # beyond: hopper/fwd_dispatch.cpp), so longer keys cover its second kernel.
      if [[ ";$head_dims;" == *";64;"* ]]; then
        for c in "" --causal; do
          echo "== racecheck hdim 64 $c, 1100 keys"
          compute-sanitizer --tool racecheck --error-exitcode 99 "$fa3" run --device gpu --head-dim 64 \
            --seqlen-q 137 --seqlen-k 1100 --nheads 4 --nheads-kv 2 --iters 1 --warmup 0 --check-rows 8 $c || exit 1
        done
      fi
      # The small case gives each CTA at most two tiles, so a two-stage Q ring never
      # reuses a stage there; this one gives every CTA at least two and some three.
      many="--seqlen-q 137 --seqlen-k 211 --batch 12 --nheads 24 --nheads-kv 4 --iters 1 --warmup 0 --check-rows 8"
      for hd in ${head_dims//;/ }; do
        echo "== racecheck, several tiles per CTA, hdim $hd"
        compute-sanitizer --tool racecheck --error-exitcode 99 "$fa3" run --device gpu --head-dim "$hd" $many || exit 1
      done
      # Non-causal kernels the small cases do not reach, run by name: CTA pairs that
      # share K/V loads at head dims 96 to 256 (the dispatcher's choice from 4096
      # keys; 300 queries make three query blocks, so one pair has a block past the
      # sequence end) and head dim 256's 64-key blocks (chosen by key length).
      odd="--seqlen-q 300 --seqlen-k 211 --nheads 4 --nheads-kv 2 --iters 1 --warmup 0 --check-rows 8"
      for pair in 96:128x128-c2 128:128x128-c2 192:128x96-c2 256:128x80-c2 256:128x64; do
        hd=${pair%%:*}
        [[ ";$head_dims;" == *";$hd;"* ]] || continue
        for run in "memcheck:$odd" "racecheck:$odd" "racecheck:$many"; do
          echo "== ${run%%:*} hdim $hd, kernel ${pair#*:}: ${run#*:}"
          compute-sanitizer --tool "${run%%:*}" --error-exitcode 99 "$fa3" run --device gpu --head-dim "$hd" \
            --kernel "${pair#*:}" ${run#*:} || exit 1
        done
      done
      echo "== synccheck"
      compute-sanitizer --tool synccheck --error-exitcode 99 "$fa3" run --device gpu --head-dim 128 $small --causal || exit 1
    ) >"$out/sanitizer.log" 2>&1
    result[sanitizer]="$([ $? -eq 0 ] && echo ok || echo FAILED)"
    # The backward (`fa3 run --backward`: the forward once, then the backward's
    # preprocess, main and postprocess kernels), on small shapes: racecheck is slow.
    if [ $smoke_bwd_ok -eq 1 ]; then
      (
        bsmall="--seqlen-q 137 --seqlen-k 211 --nheads 4 --iters 1 --warmup 0 --check-rows 8"
        sanitize() {  # sanitize TOOL ARGS...: one backward run under the tool
          echo "== $1 backward ${*:2}"
          compute-sanitizer --tool "$1" --error-exitcode 99 "$fa3" run --backward --device gpu "${@:2}"
        }
        # Every tool on every head dim and mask, with GQA (dK/dV summed over the
        # group in the workspace); MHA, whose dK/dV go straight out of the kernel,
        # gets memcheck and racecheck with the mask alternating over head dims.
        c=""
        for hd in ${head_dims//;/ }; do
          for m in "" --causal; do
            for tool in memcheck racecheck synccheck; do
              sanitize $tool --head-dim "$hd" $bsmall --nheads-kv 2 $m || exit 1
            done
          done
          for tool in memcheck racecheck; do
            sanitize $tool --head-dim "$hd" $bsmall $c || exit 1
          done
          c=$([ -z "$c" ] && echo --causal || echo "")
        done
        # One head dim, 128 when built, for the two cases below.
        one=128
        [[ ";$head_dims;" == *";128;"* ]] || one=${head_dims%%;*}
        # Deterministic: dQ and the group's dK/dV summed in a fixed order behind
        # semaphores; `fa3 run` also compares the last call's gradients with the first's.
        for tool in memcheck racecheck synccheck; do
          sanitize $tool --head-dim "$one" $bsmall --nheads-kv 2 --causal --deterministic || exit 1
        done
        # 12 x 24 heads of two or three key blocks: four or more tiles for every CTA of
        # the persistent grid (one CTA per SM), so that every shared-memory stage and
        # barrier is reused across tiles; the small cases give each CTA one tile. MHA
        # too: its dK/dV leave through the dS and dQ staging buffers the next tile reuses.
        for kv in 4 24; do
          for tool in memcheck racecheck; do
            sanitize $tool --head-dim "$one" --seqlen-q 137 --seqlen-k 211 --batch 12 --nheads 24 --nheads-kv $kv \
              --iters 1 --warmup 0 --check-rows 8 || exit 1
          done
        done
      ) >"$out/sanitizer-bwd.log" 2>&1
      result[sanitizer_bwd]="$([ $? -eq 0 ] && echo ok || echo FAILED)"
    fi
  fi
  if [ $run_bench -eq 1 ]; then
    if [ $run_python -eq 1 ] && [ $has_torch -eq 1 ]; then
      step bench "$out/bench.log" env PYTHONPATH="$build_dir/python" PYTHONUNBUFFERED=1 \
        python3 bench/bench_attention.py --out-dir "$out" $bench_args
    else
      step bench "$out/bench.log" "$build_dir/tools/fa3" bench --device gpu --json "$out/bench-fa3.json" $bench_args
    fi
  fi
else
  cat "$out/build-steps.log" >>"$out/build.log"
  rm -f "$out/build-steps.log"
  tail -40 "$out/build.log"
fi

echo
echo "== gpu_check summary ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
for k in configure build smoke smoke_bwd gpu_tests python_tests sanitizer sanitizer_bwd bench; do
  [ -n "${result[$k]:-}" ] && printf '  %-13s %s\n' "$k" "${result[$k]}"
done
[ -f "$out/gpu-tests.log" ] && grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$out/gpu-tests.log" | tail -15
[ -f "$out/python-tests.log" ] && tail -3 "$out/python-tests.log"
[ -f "$out/bench.log" ] && tail -45 "$out/bench.log"
for k in "${!result[@]}"; do case "${result[$k]}" in FAILED*) exit 1 ;; esac; done
exit 0
