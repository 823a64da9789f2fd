"""bench/bench_models.py's host-side pieces: the shapes are ANCHORS.md's model shapes,
their FLOPs count the query heads, the options, the table, and a clear exit without a
GPU."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_models  # noqa: E402


def test_the_shapes_are_the_anchors_model_shapes():
    got = {m.name: (m.batch, m.seqlen, m.nheads, m.nheads_kv, m.hdim, m.causal) for m in bench_models.MODELS}
    assert got == {
        "Llama-3-8B": (4, 4096, 32, 8, 128, True),
        "Llama-3-70B": (1, 8192, 64, 8, 128, True),
        "Llama-3-8B long": (1, 32768, 32, 8, 128, True),
        "Mistral": (8, 2048, 32, 8, 128, True),
        "Gemma-2-9B": (2, 8192, 16, 8, 256, True),
        "Qwen": (2, 4096, 28, 4, 128, True),
        "ViT-L": (64, 577, 16, 16, 64, False),
        "SD3": (2, 4096, 24, 24, 64, False),
        "MQA": (2, 8192, 32, 1, 128, True),
        "short prefill": (16, 1024, 32, 8, 128, True),
    }
    for m in bench_models.MODELS:
        assert m.nheads % m.nheads_kv == 0


def test_flops_count_query_heads_halved_when_causal_and_25x_backward():
    mqa = bench_models.BY_NAME["MQA"]
    fwd = 4 * 2 * 32 * 8192 * 8192 * 128 / 2
    assert bench_models.flops("fwd", mqa) == fwd
    assert bench_models.flops("bwd", mqa) == 2.5 * fwd
    vit = bench_models.BY_NAME["ViT-L"]
    assert bench_models.flops("fwd", vit) == 4 * 64 * 16 * 577 * 577 * 64


def test_options():
    args = bench_models.parse_args(["--models", "Qwen", "MQA", "--passes", "bwd", "fwd", "--rounds", "3"])
    assert [m.name for m in args.models] == ["Qwen", "MQA"]
    assert args.passes == ["fwd", "bwd"]
    assert bench_models.parse_args([]).models == bench_models.MODELS
    for bad in (["--models", "GPT-5"], ["--rounds", "0"], ["--impls", "cublas-fp8"]):
        with pytest.raises(SystemExit):
            bench_models.parse_args(bad)


def test_table_gives_fa3_over_the_best_peer():
    base = {"pass": "fwd", "model": "Qwen", "batch": 2, "seqlen": 4096, "nheads": 28, "nheads_kv": 4, "hdim": 128,
            "causal": True}
    records = [dict(base, impl="fa3", tflops=640.0), dict(base, impl="cudnn", tflops=530.0),
               dict(base, impl="flashattention3", tflops=650.0, error=None)]
    lines = bench_models.table(records)
    assert lines[0].startswith("| pass | model |") and "flashattention3" in lines[0]
    assert lines[2] == "| fwd | Qwen | 2 x 4096, 28:4, 128, causal | 640 | 530 | 650 | 0.98 |"
    unavailable = bench_models.table([dict(base, impl="fa3", tflops=None, error="x")])
    assert unavailable[2].endswith("| - | - |")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a GPU")
def test_exits_clearly_without_a_gpu():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench_models.main(["--models", "Qwen"])
