#!/usr/bin/env bash
# Packs the pinned CUTLASS/CuTe headers into .cutlass/cutlass-include.tar.gz, for
# machines without network access (scripts/gpu_check.sh --cutlass-tarball unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip show nvidia-cutlass >/dev/null 2>&1 || python3 -m pip install --no-deps nvidia-cutlass==4.2.0.0
inc=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
mkdir -p .cutlass
tar -C "$inc" -czf .cutlass/cutlass-include.tar.gz cute cutlass
echo "packed $inc -> .cutlass/cutlass-include.tar.gz ($(du -h .cutlass/cutlass-include.tar.gz | cut -f1))"
