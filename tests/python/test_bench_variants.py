"""bench/bench_variants.py where no GPU is needed: its options, the FLOPs of its
records, its fp32 reference with a V head dim of its own (against fa3's CPU path),
and the head dim pairs it skips.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_variants  # noqa: E402

import fa3  # noqa: E402


def test_head_dim_v_pairs_default_to_deepseek_v3s():
    assert bench_variants.parse_args([]).head_dim_v_pairs == [(192, 128)]


@pytest.mark.parametrize(
    "text, pairs",
    [("192:128", [(192, 128)]), ("192:128,64:256", [(192, 128), (64, 256)]), ("", [])],
)
def test_head_dim_v_pairs_parse(text, pairs):
    assert bench_variants.parse_args(["--head-dim-v-pairs", text]).head_dim_v_pairs == pairs


@pytest.mark.parametrize(
    "text, message",
    [
        ("192", "expected QK:V head dims such as 192:128, got '192'"),
        ("192:", "got '192:'"),
        ("a:128", "got 'a:128'"),
        ("192:0", "got '192:0'"),
        ("192:-128", "got '192:-128'"),
        ("192:128;64:256", "got '192:128;64:256'"),
        ("128:128", "128:128: V's head dim equals QK's"),
    ],
)
def test_bad_head_dim_v_pairs_are_usage_errors(text, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_variants.parse_args([f"--head-dim-v-pairs={text}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--head-dim-v-pairs" in err and message in err


@pytest.fixture
def two_ms(monkeypatch):
    """Every timed call takes 2 ms."""
    monkeypatch.setattr(bench_variants, "median_ms", lambda fn, rep_ms: 2.0)


def shape(**sizes):
    return {"causal": False, "seqlen": 1024, "batch": 16, "nheads": 16, "pairs": 1024 * 1024, **sizes}


def test_record_counts_each_head_dims_gemm(two_ms):
    args = SimpleNamespace(rep_ms=200)
    record = bench_variants.timed_record(
        None, "fwd", "qk192v128", "hdim192", shape(hdim=192, hdim_v=128), args, "gpu", rel_err=0.0
    )
    assert list(record)[5:8] == ["hdim", "hdim_v", "causal"]
    assert (record["hdim"], record["hdim_v"]) == (192, 128)
    assert record["tflops"] == pytest.approx(2 * 16 * 16 * 1024 * 1024 * (192 + 128) / 2e-3 / 1e12)


def test_record_of_equal_head_dims_keeps_the_plain_count(two_ms):
    args = SimpleNamespace(rep_ms=200)
    for pass_, factor in (("fwd", 1.0), ("bwd", 2.5)):
        record = bench_variants.timed_record(None, pass_, "none", "none", shape(hdim=128), args, "gpu")
        assert record["hdim_v"] == 128
        assert record["tflops"] == pytest.approx(factor * 4 * 16 * 16 * 1024 * 1024 * 128 / 2e-3 / 1e12)


def qkv(hdim, hdim_v, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, 96, 3, hdim, generator=gen).to(torch.bfloat16) for _ in range(2))
    return q, k, torch.randn(1, 96, 3, hdim_v, generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_has_vs_head_dim_and_qs_scale(causal):
    q, k, v = qkv(192, 128)
    ref = bench_variants.reference(q, k, v, causal, (-1, -1), 0.0, None)
    assert ref.shape == (1, 96, 2, 128)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t[:, :, :2].float().transpose(1, 2) for t in (q, k, v)), is_causal=causal
    ).transpose(1, 2)
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_check_passes_fa3s_output_with_its_own_v_head_dim(causal):
    q, k, v = qkv(192, 128)
    out = fa3.flash_attn_func(q, k, v, causal=causal)
    assert bench_variants.check(out, q, k, v, causal, (-1, -1), 0.0, None) < bench_variants.MAX_REL_ERR


def test_check_fails_an_output_of_other_values():
    q, k, v = qkv(192, 128)
    out = fa3.flash_attn_func(q, k, qkv(192, 128, seed=1)[2])
    with pytest.raises(SystemExit, match="fa3 output off by"):
        bench_variants.check(out, q, k, v, False, (-1, -1), 0.0, None)


def test_pairs_skip_a_build_without_the_qk_head_dim(monkeypatch, capsys):
    monkeypatch.setattr(fa3, "build_info", lambda: {"head_dims": [64, 128]})
    args = bench_variants.parse_args(["--passes", "fwd", "--head-dim-v-pairs", "192:128"])
    assert bench_variants.run_head_dim_pairs(args, "gpu") == []
    assert "skipping qk192v128: this build has no head dim 192 kernels" in capsys.readouterr().err


@pytest.mark.parametrize("low, high, seed", [(100, 4096, 0), (100, 4096, 7), (512, 8192, 0), (1, 16384, 3)])
def test_mixed_lengths_cover_the_tokens_within_the_range(low, high, seed):
    lengths = bench_variants.mixed_lengths(16384, low, high, seed)
    assert sum(lengths) == 16384
    assert all(low <= n <= high for n in lengths)
    assert lengths == bench_variants.mixed_lengths(16384, low, high, seed)
    assert len(set(lengths)) > 1


def test_mixed_lengths_refuse_an_impossible_cut():
    with pytest.raises(ValueError, match="cannot cut 50 tokens"):
        bench_variants.mixed_lengths(50, 100, 4096)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_lengths_give_their_own_fixed_shape(causal):
    assert bench_variants.equal_work_shape([1024] * 16, causal) == (1024, 16)


@pytest.mark.parametrize("causal", [False, True])
def test_equal_work_shape_keeps_the_tokens_and_the_pairs(causal):
    lengths = bench_variants.mixed_lengths(16384, 100, 4096)
    seqlen, batch = bench_variants.equal_work_shape(lengths, causal)
    assert seqlen % 128 == 0
    pairs = sum(bench_variants.visible_pairs(n, causal, (-1, -1)) for n in lengths)
    fixed_pairs = batch * bench_variants.visible_pairs(seqlen, causal, (-1, -1))
    # Rounding the length to 128 and the batch to a whole number moves both by a few percent.
    assert abs(batch * seqlen - 16384) <= seqlen / 2
    assert fixed_pairs == pytest.approx(pairs, rel=0.15)


def test_varlen_lengths_parse():
    assert bench_variants.parse_args([]).varlen_lengths == (100, 4096)
    assert bench_variants.parse_args(["--varlen-lengths", "512:8192"]).varlen_lengths == (512, 8192)


@pytest.mark.parametrize("text", ["100", "0:100", "200:100", "a:100", "100:20000"])
def test_bad_varlen_lengths_are_usage_errors(text, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_variants.parse_args([f"--varlen-lengths={text}"])
    assert exit_info.value.code == 2
    assert "expected LOW:HIGH sequence lengths" in capsys.readouterr().err


def test_varlen_skips_a_build_without_gpu_varlen(monkeypatch, capsys):
    monkeypatch.setattr(fa3, "build_info", lambda: {"gpu_varlen": False})
    assert bench_variants.run_varlen(bench_variants.parse_args(["--passes", "fwd"]), "gpu") == []
    assert "skipping varlen: this build runs varlen calls on the CPU" in capsys.readouterr().err


def test_varlen_only_and_no_varlen_exclude_each_other(capsys):
    assert bench_variants.parse_args(["--varlen-only"]).varlen_only
    with pytest.raises(SystemExit):
        bench_variants.parse_args(["--varlen-only", "--no-varlen"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_order_models_batch_is_the_benchmarks():
    """scripts/sim_varlen_order.py models this benchmark's batch and its fixed-length
    baseline: both stay the ones bench_variants times."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import sim_varlen_order

    lengths = bench_variants.mixed_lengths(16384, 100, 4096)
    assert list(sim_varlen_order.BENCH_LENGTHS) == lengths
    for causal in (False, True):
        seqlen, batch = bench_variants.equal_work_shape(lengths, causal)
        assert sim_varlen_order.equal_work_lengths(lengths, causal) == [seqlen] * batch


def test_yardstick_needs_the_varlen_variant(capsys):
    assert bench_variants.parse_args(["--varlen-only", "--yardstick"]).yardstick
    with pytest.raises(SystemExit):
        bench_variants.parse_args(["--no-varlen", "--yardstick"])
    assert "not with --no-varlen" in capsys.readouterr().err


def test_yardstick_without_flashattention3_is_a_clear_exit(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    with pytest.raises(SystemExit, match="needs FlashAttention-3's flash_attn_interface"):
        bench_variants.yardstick()


def test_table_rates_each_implementation_against_its_own_baseline(capsys):
    def record(impl, variant, ms):
        return {"impl": impl, "pass": "fwd", "causal": False, "variant": variant, "baseline": "fixed", "ms": ms,
                "tflops": 1.0}

    bench_variants.print_table([record("fa3", "varlen", 1.2), record("fa3", "fixed", 1.0),
                                record("flashattention3", "varlen", 3.0), record("flashattention3", "fixed", 2.0)])
    rows = capsys.readouterr().out.splitlines()
    assert "| fa3 | fwd | no | varlen | 1.200 | 1 | 1.200 (fixed) |" in rows
    assert "| flashattention3 | fwd | no | varlen | 3.000 | 1 | 1.500 (fixed) |" in rows


def test_first_output_takes_out_of_either_form():
    assert bench_variants.first_output(("out", "lse")) == "out"
    assert bench_variants.first_output("out") == "out"


def test_varlen_error_checks_the_shortest_middle_and_longest_sequences():
    lengths = [5, 17, 9]
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lengths), 2, 32, dtype=torch.bfloat16) for _ in range(3))
    out = fa3.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 17, 17, causal=True)
    assert bench_variants.varlen_error(out, q, k, v, lengths, cu_seqlens, True) < bench_variants.MAX_REL_ERR
    wrong = out.clone()
    wrong[5:22] = 0  # the longest sequence's rows
    with pytest.raises(SystemExit, match="off by"):
        bench_variants.varlen_error(wrong, q, k, v, lengths, cu_seqlens, True)
