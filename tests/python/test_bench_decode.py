"""bench/bench_decode.py where no GPU is needed: its sweep, byte counts and records, the
shuffled paged cache it builds (against fa3's CPU path), and a whole point on the CPU,
with fa3 refusing (as on CUDA tensors before its KV-cache kernels) and running.
"""

import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_decode  # noqa: E402

import fa3  # noqa: E402


def test_sweep_keeps_points_of_at_most_4m_tokens():
    points = bench_decode.points(bench_decode.BATCHES, bench_decode.SEQLENS, bench_decode.MAX_TOKENS)
    k = 1024
    expected = [(b, s) for b in (1, 8, 32) for s in (k, 8 * k, 32 * k, 128 * k)]
    expected += [(128, k), (128, 8 * k), (128, 32 * k)]
    assert points == expected


def test_kv_bytes_count_k_and_v_of_every_attended_entry():
    # 8 KV heads x 128 x 2 bytes, for K and for V: 4 KiB per token.
    assert bench_decode.kv_bytes(1, 1) == 4096
    assert bench_decode.kv_bytes(32, 128 * 1024) == 16 * 2**30
    assert bench_decode.kv_bytes(3, 5, nheads_kv=2, hdim=64, itemsize=4) == 2 * 3 * 5 * 2 * 64 * 4


def test_record_fields_and_bandwidth():
    r = bench_decode.record("fa3", False, 32, 131072, 4.0, "H200")
    assert r["tbs"] == pytest.approx(16 * 2**30 / 4e-3 / 1e12)
    assert {k: r[k] for k in ("pass", "impl", "paged", "batch", "seqlen_k", "ms", "gpu")} == {
        "pass": "decode",
        "impl": "fa3",
        "paged": False,
        "batch": 32,
        "seqlen_k": 131072,
        "ms": 4.0,
        "gpu": "H200",
    }
    assert (r["dtype"], r["hdim"], r["nheads"], r["nheads_kv"]) == ("bf16", 128, 32, 8)
    assert "num_splits" not in r and "page_size" not in r


def test_record_of_a_paged_split_run_and_of_a_failed_one():
    r = bench_decode.record("fa3", True, 8, 8192, 0.5, "H200", 4, rel_err=1e-3)
    assert (r["page_size"], r["num_splits"], r["rel_err"]) == (64, 4, 1e-3)
    failed = bench_decode.record("cudnn", False, 8, 8192, None, "H200", error="RuntimeError: no")
    assert failed["tbs"] is None and failed["ms"] is None and failed["error"] == "RuntimeError: no"


def caches(batch=3, seqlen=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 1, 32, 128, generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(batch, seqlen, 8, 128, generator=gen).to(torch.bfloat16) for _ in range(2))
    return q, k, v


def test_paged_cache_holds_each_sequences_pages_where_the_table_says():
    _, k, v = caches()
    k_pages, v_pages, table = bench_decode.paged_cache(k, v, 64, torch.Generator().manual_seed(1))
    assert k_pages.shape == (12, 64, 8, 128) and table.shape == (3, 4) and table.dtype == torch.int32
    assert sorted(table.flatten().tolist()) == list(range(12))
    assert table.flatten().tolist() != list(range(12))  # shuffled
    for pages, cache in ((k_pages, k), (v_pages, v)):
        gathered = pages[table.long()].reshape(cache.shape)
        assert torch.equal(gathered, cache)


def test_paged_cache_refuses_a_partial_page():
    _, k, v = caches(seqlen=100)
    with pytest.raises(ValueError, match="seqlen_k 100 is not a multiple of the page size 64"):
        bench_decode.paged_cache(k, v, 64)


def test_fa3_reads_the_paged_cache_as_the_contiguous_one():
    q, k, v = caches()
    k_pages, v_pages, table = bench_decode.paged_cache(k, v, 64, torch.Generator().manual_seed(2))
    contiguous = fa3.flash_attn_with_kvcache(q, k, v, cache_seqlens=256)
    paged = fa3.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=256, page_table=table)
    assert torch.equal(contiguous, paged)
    ref = bench_decode.fp32_reference(q, k, v, rows=3)
    assert bench_decode.relative_error(paged, ref) < bench_decode.MAX_REL_ERR


def test_fp32_reference_is_gqa_attention():
    q, k, v = caches(batch=2, seqlen=64)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(t.float().transpose(1, 2) for t in (q, k, v)), enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(bench_decode.fp32_reference(q, k, v), expected, rtol=1e-5, atol=1e-5)


def test_relative_error_of_a_nan_output_is_infinite():
    q, k, v = caches(batch=2, seqlen=64)
    ref = bench_decode.fp32_reference(q, k, v)
    out = ref.clone()
    out[1, 0, 3, 7] = float("nan")
    assert bench_decode.relative_error(out, ref) == float("inf")


@pytest.fixture
def two_ms(monkeypatch):
    """Every timed call takes 2 ms."""
    monkeypatch.setattr(bench_decode, "median_ms", lambda fn, rep_ms: 2.0)


def test_a_point_on_the_cpu_times_fa3_per_layout_and_split(two_ms):
    args = bench_decode.parse_args(["--num-splits", "0", "3"])
    records = bench_decode.run_point(2, 128, args, "cpu", device="cpu")
    fa3_records = [r for r in records if r["impl"] == "fa3"]
    assert [(r["paged"], r.get("num_splits")) for r in fa3_records] == [
        (False, None),
        (False, 3),
        (True, None),
        (True, 3),
    ]
    for r in fa3_records:
        assert r["reference"] == "fp32" and r["rel_err"] < bench_decode.MAX_REL_ERR
        assert r["tbs"] == pytest.approx(bench_decode.kv_bytes(2, 128) / 2e-3 / 1e12)
    # No cuDNN on the CPU: its records say why, and the paged one which cache it would read.
    cudnn = [r for r in records if r["impl"] == "cudnn"]
    assert [r["paged"] for r in cudnn] == [False, True]
    assert all(r["tbs"] is None and r["error"] for r in cudnn)
    assert cudnn[1]["cudnn_cache"] == "contiguous" and "cudnn_cache" not in cudnn[0]


def test_graph_mode_times_the_replay_and_marks_every_record(two_ms, monkeypatch):
    timed = []

    def graph_of(make):
        fn = make()
        timed.append(fn)
        return types.SimpleNamespace(replay=fn)

    # No CUDA graph on the CPU: the capture is stood in for, and its replay must be what
    # is timed.
    monkeypatch.setattr(bench_decode, "graph_of", graph_of)
    measured = []
    monkeypatch.setattr(bench_decode, "median_ms", lambda fn, rep_ms: measured.append(fn) or 2.0)
    args = bench_decode.parse_args(["--graph"])
    assert args.graph
    records = bench_decode.run_point(2, 128, args, "cpu", device="cpu")
    impls = [(r["impl"], r["paged"]) for r in records]
    assert impls == [("fa3", False), ("cudnn", False), ("fa3", True), ("cudnn", True)]
    assert all(r["variant"] == "graph" for r in records)
    assert records[3]["cudnn_cache"] == "contiguous"
    # fa3 per layout (cuDNN fails on the CPU before it is timed).
    assert len(timed) == 2 and measured == timed
    assert "variant" not in bench_decode.run_point(1, 64, bench_decode.parse_args([]), "cpu", device="cpu")[0]


def test_a_point_where_fa3_refuses_records_cudnn_alone_with_a_note(two_ms, monkeypatch):
    def refuse(*args, **kwargs):
        raise NotImplementedError("k_cache: KV-cache attention is not implemented on the GPU yet")

    monkeypatch.setattr(bench_decode.fa3, "flash_attn_with_kvcache", refuse)
    # cuDNN stands in as the fp32 reference.
    monkeypatch.setattr(bench_decode, "cudnn_decode", lambda q, k, v: bench_decode.fp32_reference(q, k, v, len(q)))
    records = bench_decode.run_point(2, 128, bench_decode.parse_args([]), "cpu", device="cpu")
    assert [(r["impl"], r["paged"]) for r in records] == [("cudnn", False), ("cudnn", True)]
    for r in records:
        assert r["ms"] == 2.0 and "error" not in r
        assert r["fa3_unavailable"] == (
            "NotImplementedError: k_cache: KV-cache attention is not implemented on the GPU yet"
        )


def test_a_wrong_fa3_result_is_not_timed(two_ms, monkeypatch):
    monkeypatch.setattr(
        bench_decode.fa3, "flash_attn_with_kvcache", lambda q, **kw: torch.zeros(q.shape, dtype=q.dtype)
    )
    records = bench_decode.run_point(1, 64, bench_decode.parse_args(["--layouts", "contiguous"]), "cpu", "cpu")
    assert [r["impl"] for r in records] == ["cudnn"]
    assert records[0]["fa3_unavailable"].startswith("wrong result: relative error 1.00e+00 against fp32")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seqlens", "1000"], "--seqlens: 1000 must be positive and, for the paged layout, a multiple of 64"),
        (["--batches", "0"], "--batches: every batch must be positive"),
        (["--num-splits", "-1"], "--num-splits: 0 (the heuristic) or a positive count"),
        (["--batches", "128", "--seqlens", "131072"], "no (batch, seqlen) point has batch x seqlen <= --max-tokens"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_decode.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_contiguous_only_sweep_takes_any_cache_length():
    assert bench_decode.parse_args(["--layouts", "contiguous", "--seqlens", "1000"]).seqlens == [1000]


def test_plot_draws_each_batch(tmp_path):
    pytest.importorskip("matplotlib")
    import plot

    records = []
    for batch, seqlen in ((1, 1024), (1, 8192), (8, 1024)):
        for impl, paged, ms in (("fa3", False, 1.0), ("fa3", True, 1.1), ("cudnn", False, 1.2), ("cudnn", True, 1.2)):
            records.append(bench_decode.record(impl, paged, batch, seqlen, ms, "H200"))
    lines = plot._decode_lines([r for r in records if r["batch"] == 1])
    assert sorted(label for label, _, _ in lines) == ["cuDNN (SDPA)", "fa3, contiguous", "fa3, paged"]
    path = plot.plot_decode(records, tmp_path / "decode.png")
    assert path.stat().st_size > 0


def test_quantize_kv_shares_a_descale_per_kv_head():
    q, k, _ = caches(batch=2, seqlen=64)
    codes, scale = bench_decode.quantize_kv(q)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == q.shape and scale.shape == (2, 8)
    group = q.float().view(2, 1, 8, 4, 128)
    assert torch.allclose(scale, group.abs().amax(dim=(1, 3, 4)) / 448)
    back = bench_decode.dequantize_kv(codes, scale)
    assert ((back - q.float()).abs() <= q.float().abs() / 8 + scale.repeat_interleave(4, 1)[:, None, :, None]).all()
    assert bench_decode.quantize_kv(k)[1].shape == (2, 8)


def test_paged_cache_moves_e4m3_pages_as_bytes():
    _, k, v = caches()
    k8, v8 = (bench_decode.quantize_kv(t)[0] for t in (k, v))
    k_pages, v_pages, table = bench_decode.paged_cache(k8, v8, 64, torch.Generator().manual_seed(3))
    assert k_pages.dtype == torch.float8_e4m3fn
    gathered = k_pages.view(torch.uint8)[table.long()].reshape(k8.shape)
    assert torch.equal(gathered, k8.view(torch.uint8))


def test_an_e4m3_point_on_the_cpu_reads_the_fp8_cache(two_ms):
    args = bench_decode.parse_args(["--kv-dtype", "e4m3"])
    records = bench_decode.run_point(2, 128, args, "cpu", device="cpu")
    fa3_records = [r for r in records if r["impl"] == "fa3"]
    assert [r["paged"] for r in fa3_records] == [False, True]
    for r in fa3_records:
        assert r["dtype"] == "e4m3" and r["reference"] == "fp32"
        assert 0 < r["rel_err"] < bench_decode.MAX_REL_ERR_FP8
        assert r["tbs"] == pytest.approx(bench_decode.kv_bytes(2, 128, itemsize=1) / 2e-3 / 1e12)
    assert all(r["dtype"] == "bf16" for r in records if r["impl"] == "cudnn")
