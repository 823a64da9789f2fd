"""bench/bench_attention.py's host-side pieces: the FP8 GEMM yardstick has the forward
call's FLOPs, and runs on e4m3 forward points only."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_attention  # noqa: E402


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen, hdim", [(512, 64), (4096, 128), (16384, 256)])
def test_fp8_gemm_has_the_forward_flops(seqlen, hdim, causal):
    batch, nheads = max(1, 16384 // seqlen), 2048 // hdim
    m, n, k = bench_attention.fp8_gemm_shape(batch, seqlen, nheads, hdim, causal)
    assert 2 * m * n * k == bench_attention.flops("fwd", batch, nheads, seqlen, hdim, causal)
    # cuBLAS's FP8 GEMM wants every extent a multiple of 16.
    assert m % 16 == 0 and n % 16 == 0 and k % 16 == 0


def test_the_gemm_joins_e4m3_forward_points_only():
    args = SimpleNamespace(impls=["fa3", "cudnn"], deterministic=True)
    assert bench_attention.impls_for("fwd", "e4m3", args) == ["fa3", "cudnn", "cublas-fp8"]
    assert bench_attention.impls_for("fwd", "bf16", args) == ["fa3", "cudnn"]
    assert bench_attention.impls_for("bwd", "bf16", args) == ["fa3", "cudnn", "fa3-deterministic"]
