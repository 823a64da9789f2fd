#!/usr/bin/env bash
# Sets up a fresh machine, builds everything (every CUDA kernel included) and runs the
# tests: the C++ tests through CTest and the Python tests through pytest. Without a
# Hopper GPU, GPU tests report "skipped". Environment:
#   FA3_BUILD_DIR   build directory (default build)
#   FA3_HEAD_DIMS / FA3_DTYPES   trim the kernels (default: all)
#   FA3_KERNEL_SET  all (default) or ci: the representative subset CI compiles
#                   (src/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
scripts/setup.sh

build=${FA3_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFA3_BUILD_PYTHON=ON \
  ${FA3_HEAD_DIMS:+-DFA3_HEAD_DIMS="$FA3_HEAD_DIMS"} ${FA3_DTYPES:+-DFA3_DTYPES="$FA3_DTYPES"} \
  ${FA3_KERNEL_SET:+-DFA3_KERNEL_SET="$FA3_KERNEL_SET"}
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
PYTHONPATH="$PWD/$build/python" python3 -m pytest -q -rs tests/python
