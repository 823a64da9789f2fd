"""bench/timing_methods.py's host-side pieces: its points, its options, and a clear exit
without a GPU."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import timing_methods  # noqa: E402


def test_points_name_pass_head_dim_mask_and_length():
    args = timing_methods.parse_args(["fwd:128:causal:4096", "bwd:64:none:16384"])
    assert args.points == [("fwd", 128, True, 4096), ("bwd", 64, False, 16384)]
    assert args.impls == ["fa3", "flashattention3"]


@pytest.mark.parametrize("bad", ["fwd:128:causal", "sideways:128:causal:4096", "fwd:128:full:4096", "fwd:x:none:512"])
def test_malformed_points_are_refused(bad):
    with pytest.raises(SystemExit):
        timing_methods.parse_args([bad])


def test_e4m3_takes_forward_points_only():
    assert timing_methods.parse_args(["--dtype", "e4m3", "fwd:256:none:2048"]).dtype == "e4m3"
    with pytest.raises(SystemExit):
        timing_methods.parse_args(["--dtype", "e4m3", "fwd:256:none:2048", "bwd:256:none:2048"])


def test_the_fp8_gemm_yardstick_is_not_an_attention():
    with pytest.raises(SystemExit):
        timing_methods.parse_args(["--impls", "cublas-fp8", "fwd:128:none:512"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a GPU")
def test_exits_clearly_without_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        timing_methods.main(["fwd:128:none:512"])
