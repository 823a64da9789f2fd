"""bench/bench_attention.py's host-side pieces: the FP8 GEMM yardstick has the forward
call's FLOPs, and runs on e4m3 forward points only; FlashAttention-3's own interface is
called where installed and recorded as unavailable where not."""

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


def test_flashattention3_calls_its_interface_where_installed(monkeypatch):
    import torch

    calls = []

    def flash_attn_func(q, k, v, causal=False, **descales):
        calls.append((causal, sorted(descales)))
        return q.float() + 1, None  # releases that return (out, lse)

    monkeypatch.setitem(sys.modules, "flash_attn_interface", SimpleNamespace(flash_attn_func=flash_attn_func))
    q = torch.zeros(1, 4, 2, 8, dtype=torch.bfloat16)
    out = bench_attention.IMPLS["flashattention3"](q, q, q, True)
    assert calls == [(True, [])]
    assert torch.equal(out, q.float() + 1)
    # Its FP8 path takes per-head descales, which reach it; fa3's block scales do not.
    codes = q.to(torch.float8_e4m3fn)
    scale = torch.ones(1, 2)
    bench_attention.IMPLS["flashattention3"](codes, codes, codes, False, q_descale=scale, k_descale=scale,
                                             v_descale=scale)
    assert calls[-1] == (False, ["k_descale", "q_descale", "v_descale"])
    with pytest.raises(NotImplementedError, match="e4m3"):
        bench_attention.IMPLS["flashattention3"](codes, codes, codes, False, block_scales=(scale,) * 3)


def test_flashattention3_is_unavailable_where_not_installed(monkeypatch):
    import torch

    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)  # import raises ImportError
    q = torch.zeros(1, 4, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="not installed"):
        bench_attention.IMPLS["flashattention3"](q, q, q, False)
    assert "flashattention3" not in bench_attention.DEFAULT_IMPLS
    assert bench_attention.parse_args(["--impls", "fa3", "flashattention3"]).impls == ["fa3", "flashattention3"]


def test_each_round_starts_one_implementation_later():
    impls = ["fa3", "flashattention3", "cudnn"]
    orders = [bench_attention.round_order(impls, r) for r in range(4)]
    assert orders == [
        ["fa3", "flashattention3", "cudnn"],
        ["flashattention3", "cudnn", "fa3"],
        ["cudnn", "fa3", "flashattention3"],
        ["fa3", "flashattention3", "cudnn"],
    ]
    assert bench_attention.round_order([], 3) == []


def test_rounds_time_every_call_once_per_round_in_round_order():
    timed = []

    def timer(call, rep_ms):
        timed.append(call())
        return float(len(timed))

    calls = {name: (lambda name=name: name) for name in ("a", "b", "c")}
    times = bench_attention.time_in_rounds(calls, 2, rep_ms=7, timer=timer)
    assert timed == ["a", "b", "c", "b", "c", "a"]
    assert times == {"a": [1.0, 6.0], "b": [2.0, 4.0], "c": [3.0, 5.0]}
    assert bench_attention.parse_args(["--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        bench_attention.parse_args(["--rounds", "0"])


def test_interleaved_rounds_time_all_calls_together_in_round_order():
    turns = []

    def interleaved(calls, rep_ms):
        assert rep_ms == 7
        turns.append([call() for call in calls.values()])
        return {name: float(len(turns)) + i / 10 for i, name in enumerate(calls)}

    calls = {name: (lambda name=name: name) for name in ("a", "b", "c")}
    times = bench_attention.time_in_rounds(calls, 3, rep_ms=7, interleaved=interleaved)
    assert turns == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert times == {"a": [1.0, 2.2, 3.1], "b": [1.1, 2.0, 3.2], "c": [1.2, 2.1, 3.0]}
    assert bench_attention.parse_args(["--interleave"]).interleave
    assert not bench_attention.parse_args([]).interleave


def test_per_head_descales_map_each_heads_largest_value_to_e4m3s_largest():
    import torch

    gen = torch.Generator().manual_seed(0)
    t = torch.randn(2, 300, 3, 64, generator=gen) * torch.tensor([1.0, 10.0, 0.01])[None, None, :, None]
    codes, descale = bench_attention.quantize_per_head(t)
    assert codes.dtype == torch.float8_e4m3fn and descale.shape == (2, 3) and descale.dtype == torch.float32
    assert torch.equal(codes.float().abs().amax(dim=(1, 3)), torch.full((2, 3), 448.0))
    back = bench_attention.dequantize(codes, descale[:, :, None], t.shape[1])
    # e4m3 keeps 3 mantissa bits: each value within 2^-4 of itself (normal range).
    big = t.abs() > descale[:, None, :, None] * 2**-6
    assert ((back - t).abs() <= t.abs() * 2**-4 + 1e-12)[big].all()


def test_descale_runs_are_named_apart():
    args = bench_attention.parse_args(["--dtypes", "e4m3", "--fp8-scales", "descales"])
    assert args.fp8_scales == "descales"
    json_stem, png_stem = bench_attention.output_stems(args, "NVIDIA H200")
    assert json_stem.endswith("-descales") and png_stem.endswith("-descales")
    assert not bench_attention.output_stems(bench_attention.parse_args(["--dtypes", "e4m3"]), "NVIDIA H200")[0].endswith(
        "-descales")


@pytest.mark.parametrize("nheads_kv", [4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_fp32_references_read_each_query_heads_kv_head(nheads_kv, causal):
    # The fallback references of GQA/MQA points (bench_models.py's shapes), on the CPU:
    # against the float64 reference of the accuracy rule, gradients summed per K/V head.
    # (SDPA's causal mask is top-left aligned: the sweep's points are square.)
    import torch
    from attention_reference import reference, reference_grads

    gen = torch.Generator().manual_seed(3)
    q, dout = (torch.randn(2, 37, 4, 16, generator=gen) for _ in range(2))
    seqlen_k = 37 if causal else 45
    k, v = (torch.randn(2, seqlen_k, nheads_kv, 16, generator=gen) for _ in range(2))
    out = bench_attention.fp32_reference(q, k, v, causal)
    want, _ = reference(q, k, v, dtype=torch.float64, causal=causal)
    assert torch.allclose(out.double(), want, atol=1e-5)
    grads = bench_attention.fp32_reference_grads(q, k, v, causal, dout)
    wants = reference_grads(q, k, v, dout, dtype=torch.float64, causal=causal)
    for got, expected in zip(grads, wants):
        assert got.shape == expected.shape
        assert torch.allclose(got.double(), expected, atol=1e-4)


def test_a_point_checks_fa3_times_what_runs_and_records_why_the_rest_cannot(monkeypatch):
    # measure_point, shared by the sweep and bench_models.py, with the GPU parts faked.
    checked = []

    def fake_check(impl, *args, **fp8):
        checked.append(impl)
        return {"rel_err": 1e-3, "reference": "cudnn"}

    def fake_timed_call(impl, *args, **fp8):
        if impl == "fa2":
            raise bench_attention.Unavailable("NotImplementedError: no")
        return (lambda: None), {}

    monkeypatch.setattr(bench_attention, "check", fake_check)
    monkeypatch.setattr(bench_attention, "timed_call", fake_timed_call)
    monkeypatch.setattr(bench_attention, "time_in_rounds",
                        lambda calls, rounds, rep_ms, interleaved=None: {i: [2.0, 1.0][:rounds] for i in calls})
    args = SimpleNamespace(rounds=2, rep_ms=10, interleave=True)
    records = bench_attention.measure_point(
        ["fa3", "cudnn", "fa2"], {"pass": "fwd"}, "fwd", None, None, None, True, None, None, 3e9, args
    )
    assert checked == ["fa3"]
    assert records["fa3"]["rel_err"] == 1e-3 and records["fa3"]["tflops"] == 2.25
    assert records["cudnn"]["tflops_rounds"] == [1.5, 3.0] and records["cudnn"]["timing"] == "interleaved"
    assert records["fa2"]["tflops"] is None and records["fa2"]["error"].startswith("NotImplementedError")
    fp8_bwd = bench_attention.measure_point(
        ["fa3"], {"pass": "bwd"}, "bwd", None, None, None, True, None, None, 3e9, args, q_descale=1
    )
    assert fp8_bwd["fa3"]["error"] == "e4m3: forward only"
