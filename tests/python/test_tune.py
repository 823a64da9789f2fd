"""Autotuning from Python: the switch, the tuning cache's files through fa3._C (keys and
entries as dicts), and fa3.tune. Runs anywhere; the tuning itself needs a Hopper GPU and
is skipped (reported as skipped) elsewhere.
"""

import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

import fa3
from fa3 import _C

KEY = {"gpu_name": "NVIDIA H200", "sm_count": 132, "cuda_driver": 13000, "fa3_version": "0.1.0"}


def entry(seqlen, kernel="128x128-c2", causal=False, gqa=1):
    return {
        "dtype": "bf16",
        "head_dim": 128,
        "causal": causal,
        "seqlen_q": seqlen,
        "seqlen_k": seqlen,
        "gqa": gqa,
        "kernel": kernel,
        "kernel_ms": seqlen / 2048,
        "heuristic": "128x128",
        "heuristic_ms": seqlen / 1024,
    }


def without_description(entries):
    return [{k: v for k, v in e.items() if k not in ("class", "direction")} for e in entries]


def autotune_in_fresh_process(value):
    """autotune_enabled() in a new interpreter whose FA3_AUTOTUNE is `value` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "FA3_AUTOTUNE"}
    if value is not None:
        env["FA3_AUTOTUNE"] = value
    script = "import fa3; print(fa3.autotune_enabled())"
    return subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("value, expected", [(None, "False"), ("0", "False"), ("1", "True"), ("true", "True")])
def test_switch_follows_the_environment(value, expected):
    assert autotune_in_fresh_process(value).strip() == expected


def test_switch_can_be_set():
    before = fa3.autotune_enabled()
    try:
        fa3.set_autotune(True)
        assert fa3.autotune_enabled()
        fa3.set_autotune(False)
        assert not fa3.autotune_enabled()
    finally:
        fa3.set_autotune(before)


def test_cache_path_rules(monkeypatch):
    name = "tune-NVIDIA-H200-132sm-cuda13.0-fa3-0.1.0.txt"
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    monkeypatch.setenv("FA3_TUNE_CACHE", "/data/mine.txt")
    assert _C.tune_cache_path(KEY) == "/data/mine.txt"
    monkeypatch.delenv("FA3_TUNE_CACHE")
    assert _C.tune_cache_path(KEY) == f"/xdg/fa3/{name}"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert _C.tune_cache_path(KEY) == f"/home/u/.cache/fa3/{name}"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert _C.tune_cache_path(KEY) == f"/home/u/.cache/fa3/{name}"
    monkeypatch.delenv("HOME")
    assert _C.tune_cache_path(KEY) == ""


def test_round_trip_and_merge(tmp_path):
    path = str(tmp_path / "sub" / "cache.txt")
    assert _C.read_tune_cache(path, KEY) == []
    _C.write_tune_cache(path, KEY, [entry(4096), entry(512)])
    _C.write_tune_cache(path, KEY, [entry(512, "128x128"), entry(1024, causal=True, gqa=4)])
    read = _C.read_tune_cache(path, KEY)
    assert without_description(read) == [entry(512, "128x128"), entry(4096), entry(1024, causal=True, gqa=4)]
    assert read[0]["class"] == "fwd bf16 hdim128 plain q<=512 k<=512 gqa1"
    assert read[0]["direction"] == "fwd"
    assert sorted(os.listdir(tmp_path / "sub")) == ["cache.txt", "cache.txt.lock"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t[: len(t) // 2], "truncated"),
        (lambda t: t.replace("fa3 tune cache\t1", "fa3 tune cache\t2"), "format version 2"),
        (lambda t: t.replace("NVIDIA H200", "NVIDIA H100"), "written for NVIDIA H100"),
        (lambda t: t.replace("fa3\t0.1.0", "fa3\t0.0.1"), "fa3 0.0.1"),
        (lambda t: t.replace("\tplain\t", "\tsideways\t"), "mask 'sideways'"),
        (lambda t: "not a cache\n", "not an fa3 tuning cache"),
    ],
    ids=["truncated", "format_version", "foreign_gpu", "fa3_version", "corrupt_entry", "foreign_file"],
)
def test_refused_caches_say_why(tmp_path, change, message):
    path = tmp_path / "cache.txt"
    _C.write_tune_cache(str(path), KEY, [entry(512), entry(1024)])
    path.write_text(change(path.read_text()))
    with pytest.raises(ValueError, match=message):
        _C.read_tune_cache(str(path), KEY)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kernel": "a b"}, r"entries\[0\]\.kernel: 'a b' is not a kernel name"),
        ({"seqlen_k": 1000}, r"entries\[0\]\.cls\.seqlen_k: 1000 is not a bucket"),
        ({"kernel_ms": float("nan")}, r"entries\[0\]\.kernel_ms: must be finite and > 0"),
        ({"dtype": "fp64"}, r"entries\[0\]\['dtype'\]: unknown dtype 'fp64'"),
        ({"head_dim": "128"}, r"entries\[0\]\['head_dim'\]: wrong type"),
        ({"direction": "bwd"}, r"entries\[0\]\['direction'\]: only 'fwd' is tuned"),
    ],
)
def test_bad_entries_are_refused(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _C.write_tune_cache(str(tmp_path / "cache.txt"), KEY, [{**entry(512), **change}])
    assert not (tmp_path / "cache.txt").exists()


def test_bad_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="key: missing 'sm_count'"):
        _C.read_tune_cache(str(tmp_path / "c.txt"), {k: v for k, v in KEY.items() if k != "sm_count"})
    with pytest.raises(ValueError, match="key.gpu_name: 'a\tb' is empty or holds a tab"):
        _C.write_tune_cache(str(tmp_path / "c.txt"), {**KEY, "gpu_name": "a\tb"}, [entry(512)])


def _write_entries(path, seqlen, count):
    for i in range(count):
        _C.write_tune_cache(path, KEY, [entry(seqlen, gqa=2**i)])


def test_concurrent_processes_leave_a_whole_file_with_every_entry(tmp_path):
    path = str(tmp_path / "cache.txt")
    with ProcessPoolExecutor(max_workers=4) as pool:
        for job in [pool.submit(_write_entries, path, 2**p, 6) for p in range(4)]:
            job.result()
    assert len(_C.read_tune_cache(path, KEY)) == 24


def test_tune_takes_torch_tensors():
    np = pytest.importorskip("numpy")
    q = np.zeros((1, 8, 2, 64), np.float32)
    with pytest.raises(TypeError, match="fa3.tune takes torch tensors"):
        fa3.tune(q, q, q)


def _gpu_skip_reason():
    try:
        from gpu_support import gpu_skip_reason
    except ImportError:
        return "needs PyTorch"
    return gpu_skip_reason()


def test_tune_without_a_hopper_gpu_is_not_supported():
    torch = pytest.importorskip("torch")
    if _gpu_skip_reason() is None:
        pytest.skip("a Hopper GPU is present")
    q = torch.randn(1, 8, 2, 64)
    with pytest.raises(NotImplementedError, match="needs a Hopper GPU"):
        fa3.tune(q, q, q)


@pytest.mark.skipif(_gpu_skip_reason() is not None, reason=str(_gpu_skip_reason()))
def test_tune_stores_the_fastest_and_forward_uses_it(tmp_path, monkeypatch):
    import torch
    from attention_reference import ABS_CAP, check_close, reference
    from gpu_support import BUILT_DTYPES, BUILT_HEAD_DIMS

    monkeypatch.setenv("FA3_TUNE_CACHE", str(tmp_path / "cache.txt"))
    dtype, head_dim = BUILT_DTYPES[0], BUILT_HEAD_DIMS[0]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 300, 8, head_dim, device="cuda", generator=gen).to(dtype)
    k = torch.randn(2, 700, 2, head_dim, device="cuda", generator=gen).to(dtype)
    v = torch.randn(2, 700, 2, head_dim, device="cuda", generator=gen).to(dtype)
    result = fa3.tune(q, k, v, causal=True, warmup=1, iters=3)
    assert result["class"].endswith(f"hdim{head_dim} causal q<=512 k<=1024 gqa4")
    assert result["kernels"][0] == result["heuristic"]
    assert result["kernel"] in result["kernels"]
    assert result["kernel_ms"] == min(result["median_ms"])
    assert result["cache_path"] == str(tmp_path / "cache.txt")
    assert [e["kernel"] for e in fa3.tune_cache_entries()] == [result["kernel"]]

    before = fa3.autotune_enabled()
    fa3.set_autotune(True)
    try:
        out = fa3.flash_attn_func(q, k, v, causal=True)
    finally:
        fa3.set_autotune(before)
    ref = reference(q, k, v, dtype=torch.float32, causal=True)[0]
    low = reference(q, k, v, dtype=q.dtype, causal=True)[0]
    check_close("out", out, ref, low, abs_cap=ABS_CAP[q.dtype])
