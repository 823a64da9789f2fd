#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine with the CUDA toolkit lacks to build and
# test fa3: the pinned CUTLASS headers, build tools, GoogleTest and the Python test
# dependencies (transformers too, when PyTorch is there). Safe to run again. Environment:
#   FA3_SETUP_TORCH=auto|1|0  install PyTorch for the Python tests (auto: when >= 10 GB
#                             of disk are free; its wheels and CUDA libraries take ~5 GB)
set -euo pipefail

say() { echo "[setup] $*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
pip_install() { python3 -m pip install --disable-pip-version-check -q "$@"; }

command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "[setup] nvcc not found: install the CUDA toolkit (13.0 or newer) first" >&2
  exit 1
}

apt_missing=()
command -v cmake >/dev/null 2>&1 || apt_missing+=(cmake)
command -v ninja >/dev/null 2>&1 || apt_missing+=(ninja-build)
command -v g++ >/dev/null 2>&1 || apt_missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || apt_missing+=(libgtest-dev)
if [ ${#apt_missing[@]} -gt 0 ]; then
  say "apt-get install ${apt_missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_missing[@]}"
fi

python3 -c "import cutlass_library" 2>/dev/null || { say "pip install nvidia-cutlass==4.2.0.0 (headers only)"; pip_install --no-deps nvidia-cutlass==4.2.0.0; }
python3 -c "import nanobind, numpy, pytest" 2>/dev/null || { say "pip install nanobind numpy pytest"; pip_install nanobind numpy pytest; }

want_torch=${FA3_SETUP_TORCH:-auto}
if [ "$want_torch" = auto ]; then
  free_gb=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  want_torch=$([ "$free_gb" -ge 10 ] && echo 1 || echo 0)
  [ "$want_torch" = 0 ] && say "only ${free_gb} GB free: skipping PyTorch (its tests will report skipped)"
fi
if [ "$want_torch" = 1 ] && ! python3 -c "import torch" 2>/dev/null; then
  say "pip install torch (for the Python tests; a few minutes)"
  pip_install torch
fi
# transformers (~25 MB of wheels, no second torch: it does not depend on one) for the
# tests of fa3.integrations.transformers; without torch they would skip anyway.
if python3 -c "import torch" 2>/dev/null && ! python3 -c "import transformers" 2>/dev/null; then
  say "pip install transformers (for the integration tests)"
  pip_install transformers
fi
say "done"
