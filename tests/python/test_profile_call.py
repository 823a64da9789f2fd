"""bench/profile_call.py's host-side pieces: the sweep's shape for a point, its options,
and a clear exit without a GPU."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import profile_call  # noqa: E402


@pytest.mark.parametrize("seqlen, hdim, expected", [
    (16384, 64, (1, 16384, 32, 64)),
    (512, 128, (32, 512, 16, 128)),
    (4096, 96, (4, 4096, 21, 96)),
    (32768, 256, (1, 32768, 8, 256)),
])
def test_shape_is_the_sweeps(seqlen, hdim, expected):
    assert profile_call.shape(seqlen, hdim) == expected


def test_defaults_and_choices():
    args = profile_call.parse_args(["--impl", "flashattention3", "--causal", "--hdim", "64"])
    assert (args.impl, args.pass_, args.hdim, args.seqlen, args.causal) == ("flashattention3", "bwd", 64, 16384, True)
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--impl", "cublas-fp8"])
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--hdim", "0"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a GPU")
def test_exits_clearly_without_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        profile_call.main(["--pass", "fwd"])


@pytest.mark.parametrize("low, high", [(100, 4096), (211, 2912), (1664, 1664)])
def test_varlen_layout_packs_the_sweeps_tokens(low, high):
    lengths, cu_seqlens = profile_call.varlen_layout(low, high)
    assert cu_seqlens[0] == 0 and cu_seqlens[-1] == profile_call.bench_attention.TOKENS
    assert [b - a for a, b in zip(cu_seqlens, cu_seqlens[1:])] == lengths
    assert all(0 < n <= high for n in lengths)
    if high >= 2 * low:
        assert all(n >= low for n in lengths)


def test_varlen_lengths_option():
    args = profile_call.parse_args(["--varlen-lengths", "100:4096", "--hdim", "64", "--causal"])
    assert (args.varlen_lengths, args.impl, args.pass_) == ((100, 4096), "fa3", "bwd")
    args = profile_call.parse_args(["--varlen-lengths", "1664:1664", "--impl", "flashattention3"])
    assert args.varlen_lengths == (1664, 1664)
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--varlen-lengths", "100:4096", "--impl", "cudnn"])
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--varlen-lengths", "4096:100"])


def test_e4m3_profiles_fixed_length_forward_calls_only():
    args = profile_call.parse_args(["--dtype", "e4m3", "--pass", "fwd", "--hdim", "256"])
    assert (args.dtype, args.pass_, args.hdim) == ("e4m3", "fwd", 256)
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--dtype", "e4m3"])  # the backward, the default pass
    with pytest.raises(SystemExit):
        profile_call.parse_args(["--dtype", "e4m3", "--pass", "fwd", "--varlen-lengths", "100:4096"])
