#!/usr/bin/env bash
# A/B benchmark of a source change on a Hopper machine. Builds this tree as it is
# ("new") and a copy with PATCH reversed ("base"), checks one small call of each head
# dim against the reference, then runs `fa3 bench` for each HDIM:MASK with the two
# builds in turns, ROUNDS times (default 3), and prints the median TFLOP/s per build
# with the spread of its runs (scripts/kernel_medians.py). Same-run medians are the
# comparison to trust: absolute figures move by several percent between machines.
#
# PATCH is the change as `git diff BASE_REVISION` made where the repository is; the
# tree here needs no .git. --variant NAME=FILE (any number) adds a build of base with
# FILE applied (a patch against base), timed in the same turns: several candidate
# changes in one run, each against the same base.
#
# --bench-args passes options to every `fa3 bench`, e.g. "--iters 200 --warmup 50":
# long enough runs reach the GPU's power cap, as the Python benchmark's do; the
# default 20 calls per point mostly run at full clocks. --cmake-args passes options to
# both builds' configure step, e.g. "-DFA3_KERNEL_FILTER=^bwd_bf16_hdim128_" to build
# fewer kernels.
#
#   scripts/ab_bench.sh [--rounds N] [--dtype bf16] [--bench-args "..."] [--cmake-args "..."]
#       [--variant NAME=FILE ...] --patch FILE
#       --cutlass INCLUDE_DIR OUT_DIR HDIM:MASK ...   MASK is causal or non-causal
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=3 dtype=bf16 patch="" cutlass="" bench_args="" cmake_args="" variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --dtype) dtype=$2; shift 2 ;;
    --patch) patch=$2; shift 2 ;;
    --cutlass) cutlass=$2; shift 2 ;;
    --bench-args) bench_args=$2; shift 2 ;;
    --cmake-args) cmake_args=$2; shift 2 ;;
    --variant) variants+=("$2"); shift 2 ;;
    -*) echo "ab_bench: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ -n "$patch" ] && [ -n "$cutlass" ] && [ $# -ge 2 ] || { sed -n '2,24p' "$0"; exit 2; }
out=$1
shift
mkdir -p "$out"
patch=$(realpath "$patch")

head_dims=$(for spec in "$@"; do echo "${spec%%:*}"; done | sort -nu | paste -sd';')
copy_tree() {  # copy_tree DIR: this tree without builds, git and carried archives
  mkdir -p "$1"
  tar -cf - --exclude='./build*' --exclude=./.git --exclude=./.cutlass --exclude=./.whl . | tar -C "$1" -xf -
}
src_root=$(mktemp -d)
copy_tree "$src_root/base"
(cd "$src_root/base" && patch -R -p1 -s <"$patch") || { echo "ab_bench: $patch does not reverse-apply" >&2; exit 1; }
builds=(base new)
declare -A src=([base]="$src_root/base" [new]=.)
for v in "${variants[@]}"; do
  name=${v%%=*} file=$(realpath "${v#*=}")
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ && "$name" != base && "$name" != new ]] || { echo "ab_bench: bad variant name '$name'" >&2; exit 2; }
  cp -r "$src_root/base" "$src_root/$name"
  (cd "$src_root/$name" && patch -p1 -s <"$file") || { echo "ab_bench: $file does not apply to base" >&2; exit 1; }
  builds+=("$name")
  src[$name]="$src_root/$name"
done

configure() {  # configure SRC BUILD
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA3_CUTLASS_INCLUDE="$cutlass" \
    -DFA3_HEAD_DIMS="$head_dims" -DFA3_DTYPES="$dtype" -DFA3_BUILD_TESTS=OFF -DFA3_BUILD_PYTHON=OFF $cmake_args >/dev/null
}
jobs=$(( $(nproc) / ${#builds[@]} > 0 ? $(nproc) / ${#builds[@]} : 1 ))
pids=()
for build in "${builds[@]}"; do
  configure "${src[$build]}" "$out/build-$build" || exit 1
  cmake --build "$out/build-$build" -j "$jobs" --target fa3_cli >"$out/build-$build.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "ab_bench: a build failed (logs in $out)" >&2; exit 1; }; done

for build in "${builds[@]}"; do
  for hd in ${head_dims//;/ }; do
    for c in "" --causal; do
      timeout 60 "$out/build-$build/tools/fa3" run --device gpu --dtype "$dtype" --head-dim "$hd" $c --batch 2 --seqlen 1000 \
        --check-rows 64 >"$out/check.log" 2>&1 || { cat "$out/check.log"; echo "ab_bench: $build hdim $hd $c failed" >&2; exit 1; }
    done
  done
done

for spec in "$@"; do
  IFS=: read -r hd mask <<<"$spec"
  files=()
  for ((r = 1; r <= rounds; r++)); do
    for build in "${builds[@]}"; do
      json="$out/bench-hdim$hd-$mask-$build-r$r.json"
      "$out/build-$build/tools/fa3" bench --device gpu --dtype "$dtype" --head-dims "$hd" --"$mask" --json "$json" \
        $bench_args >/dev/null || { echo "ab_bench: $build bench failed" >&2; exit 1; }
      files+=("$build=$json")
    done
  done
  echo "== hdim $hd $mask: median TFLOP/s over $rounds rounds (spread %)"
  python3 scripts/kernel_medians.py "${files[@]}"
done
