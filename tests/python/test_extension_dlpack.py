"""The extension fa3._C without PyTorch: NumPy arrays through DLPack on the CPU path,
build_info() and device_info(). Runs on any machine, PyTorch or not.
"""

import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")

import fa3  # noqa: E402
from fa3 import _C  # noqa: E402


def reference(q, k, v, causal=False, scale=None, sinks=None):
    """(out, lse, probs) in float64 for (b, s, h, d) arrays, GQA by repeating k/v heads;
    sinks (h,) join each row's denominator (fa3/attention.h)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        allowed = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
        scores = np.where(allowed, scores, -np.inf)
    sink = np.full(q.shape[2], -np.inf) if sinks is None else sinks.astype(np.float64)
    sink = sink[None, :, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):  # rows that see no key and no sink: 0/0
        peak = np.maximum(scores.max(axis=-1, keepdims=True), sink)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=-1, keepdims=True) + np.exp(sink - peak)
        probs = weights / total
    out = np.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, (np.log(total) + peak)[..., 0], probs


def reference_grads(q, k, v, dout, causal=False, sinks=None):
    """dq, dk, dv (and dsinks, with sinks) of sum(out * dout), in float64, with k/v
    gradients summed over each GQA group."""
    out, lse, probs = reference(q, k, v, causal, sinks=sinks)
    q64, k64, v64, do = (a.astype(np.float64) for a in (q, k, v, dout))
    group = q.shape[2] // k.shape[2]
    k_rep, v_rep = np.repeat(k64, group, axis=2), np.repeat(v64, group, axis=2)
    scale = q.shape[-1] ** -0.5
    dprobs = np.einsum("bqhd,bkhd->bhqk", do, v_rep)
    row_dot = np.einsum("bqhd,bqhd->bhq", do, out)[..., None]
    dscores = probs * (dprobs - row_dot) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", dscores, k_rep)
    dk_rep = np.einsum("bhqk,bqhd->bkhd", dscores, q64)
    dv_rep = np.einsum("bhqk,bqhd->bkhd", probs, do)

    def fold(g):
        b, s, _, d = g.shape
        return g.reshape(b, s, k.shape[2], group, d).sum(axis=3)

    if sinks is None:
        return dq, fold(dk_rep), fold(dv_rep)
    dsinks = -(np.exp(sinks.astype(np.float64)[None, :, None] - lse) * row_dot[..., 0]).sum(axis=(0, 2))
    return dq, fold(dk_rep), fold(dv_rep), dsinks


def random_qkv(seqlen_q, seqlen_k, nheads=4, nheads_k=2, head_dim=32, dtype=np.float32, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((batch, seqlen_q, nheads, head_dim)).astype(dtype),
        rng.standard_normal((batch, seqlen_k, nheads_k, head_dim)).astype(dtype),
        rng.standard_normal((batch, seqlen_k, nheads_k, head_dim)).astype(dtype),
    )


def test_build_info():
    info = fa3.build_info()
    assert info["version"] == fa3.__version__
    assert set(info["head_dims"]) <= {64, 96, 128, 192, 256}
    assert set(info["dtypes"]) <= {"fp16", "bf16"}
    assert info["gpu_kernels"] == bool(info["head_dims"] and info["dtypes"])
    assert info["cutlass_version"].count(".") == 2


def test_device_info_never_raises():
    info = fa3.device_info()
    assert isinstance(info["present"], bool)
    if info["present"]:
        assert info["name"] and info["sm_count"] > 0
        assert info["is_hopper"] == (info["compute_capability"] == (9, 0))
    else:
        assert info["error"] and not info["is_hopper"]
    missing = fa3.device_info(1000)
    assert not missing["present"] and missing["error"]


@pytest.mark.parametrize(
    "device, message", [(-2, "index must be >= 0"), ("cpu", "expected 'cuda'"), ("cuda:x", "expected 'cuda'")]
)
def test_device_info_bad_device(device, message):
    with pytest.raises(ValueError, match=message):
        fa3.device_info(device)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", [(1, 1), (17, 17), (33, 70), (70, 33)])
def test_forward_float32(seqlens, causal):
    q, k, v = random_qkv(*seqlens)
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _C.forward(q, k, v, out, lse, causal=causal)
    ref_out, ref_lse, _ = reference(q, k, v, causal)
    # Rows that see no key: out 0, lse -inf (the reference divides 0 by 0 there).
    seen = np.isfinite(ref_lse)
    assert np.all(lse[~seen] == -np.inf)
    assert np.all(out.transpose(0, 2, 1, 3)[~seen] == 0)
    assert np.abs(lse[seen] - ref_lse[seen]).max(initial=0) < 1e-5
    assert np.abs(out.transpose(0, 2, 1, 3)[seen] - ref_out.transpose(0, 2, 1, 3)[seen]).max(initial=0) < 1e-5


def test_forward_float16_strided_without_lse():
    q_all, k, v = random_qkv(40, 40, dtype=np.float16)
    q = q_all[:, ::2]  # every other row: a strided view
    out = np.empty(q.shape, np.float16)
    _C.forward(q, k, v, out, None, softmax_scale=0.1)
    ref_out, _, _ = reference(q, k, v, scale=0.1)
    low_out = reference(q.astype(np.float16), k, v, scale=0.1)[0].astype(np.float16)
    bound = 2 * np.abs(low_out - ref_out).max() + 1e-5
    assert np.abs(out - ref_out).max() <= min(bound, 4e-3)


def test_varlen_forward_and_backward_float32():
    """Packed sequences with int32 offsets (NumPy's int32 through DLPack): each equals the
    sequence run alone, forward and backward; the row past the last sequence gets out 0,
    lse -inf and dq 0."""
    q_all, k_all, v_all = random_qkv(12, 15, batch=1, seed=6)
    q, k, v = q_all[0, :12].copy(), k_all[0].copy(), v_all[0].copy()
    cu_q, cu_k = np.array([0, 5, 11], np.int32), np.array([0, 6, 15], np.int32)
    dout = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    out, lse = np.empty_like(q), np.empty((q.shape[1], q.shape[0]), np.float32)
    index = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 6, "max_seqlen_k": 9}
    _C.forward(q, k, v, out, lse, causal=True, **index)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _C.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True, **index)
    for b in range(2):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        one = (q[None, qs], k[None, ks], v[None, ks])
        ref_out, ref_lse, _ = reference(*one, causal=True)
        assert np.abs(out[qs] - ref_out[0]).max() < 1e-5
        assert np.abs(lse[:, qs] - ref_lse[0]).max() < 1e-5
        ref_dq, ref_dk, ref_dv = reference_grads(*one, dout[None, qs], causal=True)
        assert np.abs(dq[qs] - ref_dq[0]).max() < 1e-4
        assert np.abs(dk[ks] - ref_dk[0]).max() < 1e-4
        assert np.abs(dv[ks] - ref_dv[0]).max() < 1e-4
    assert np.all(out[11] == 0) and np.all(lse[:, 11] == -np.inf) and np.all(dq[11] == 0)


def test_backward_float32():
    q, k, v = random_qkv(23, 31, seed=4)
    dout = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _C.forward(q, k, v, out, lse, causal=True)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    _C.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True)
    for got, want in zip((dq, dk, dv), reference_grads(q, k, v, dout, causal=True)):
        assert np.abs(got - want).max() < 1e-4


def test_sinks_forward_and_backward_float32():
    """sinks (a strided view) in both passes; dsinks receives their gradient."""
    q, k, v = random_qkv(23, 17, seed=8)
    sinks = (3 * np.random.default_rng(9).standard_normal(8)).astype(np.float32)[::2]
    dout = np.random.default_rng(10).standard_normal(q.shape).astype(np.float32)
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _C.forward(q, k, v, out, lse, sinks=sinks, causal=True)
    ref_out, ref_lse, _ = reference(q, k, v, causal=True, sinks=sinks)
    assert np.abs(out - ref_out).max() < 1e-5
    assert np.abs(lse - ref_lse).max() < 1e-5
    grads = [np.empty_like(a) for a in (q, k, v, sinks)]
    _C.backward(dout, q, k, v, out, lse, *grads[:3], sinks=sinks, dsinks=grads[3], causal=True)
    for got, want in zip(grads, reference_grads(q, k, v, dout, causal=True, sinks=sinks)):
        assert np.abs(got - want).max() < 1e-4


def test_forward_workspace_on_host():
    """Host arrays run the CPU path, which needs no workspace: the size query answers 0
    (FP8 calls included) and a workspace given anyway changes nothing."""
    q, k, v = random_qkv(9, 12, seed=8)
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    assert _C.forward_workspace_size(q, k, v, out, lse, causal=True) == 0
    _C.forward(q, k, v, out, lse, causal=True)
    again, again_lse = np.empty_like(out), np.empty_like(lse)
    _C.forward(q, k, v, again, again_lse, causal=True, workspace=np.zeros(64, np.uint8))
    assert np.array_equal(out, again) and np.array_equal(lse, again_lse)


def test_backward_workspace_on_host():
    """Host arrays run the CPU path, which needs no workspace: the size query answers 0
    and a workspace given anyway changes nothing."""
    q, k, v = random_qkv(9, 12, seed=6)
    dout = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    out = np.empty_like(q)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), np.float32)
    _C.forward(q, k, v, out, lse, causal=True)
    grads = [np.empty_like(a) for a in (q, k, v)]
    assert _C.backward_workspace_size(dout, q, k, v, out, lse, *grads, causal=True, deterministic=True) == 0
    _C.backward(dout, q, k, v, out, lse, *grads, causal=True)
    again = [np.empty_like(a) for a in (q, k, v)]
    _C.backward(dout, q, k, v, out, lse, *again, causal=True, workspace=np.zeros(64, np.uint8))
    for first, second in zip(grads, again):
        assert np.array_equal(first, second)


def test_errors_map_to_exceptions():
    q, k, v = random_qkv(8, 8)
    out = np.empty_like(q)
    with pytest.raises(ValueError, match="k: head dim 16 does not match q's head dim 32"):
        _C.forward(q, k[..., :16], v, out, None)
    with pytest.raises(NotImplementedError, match="head dim 320 is not supported"):
        wide = random_qkv(8, 8, head_dim=320)
        _C.forward(*wide, np.empty_like(wide[0]), None)
    with pytest.raises(ValueError, match="q: element type float64 is not supported"):
        _C.forward(q.astype(np.float64), k, v, out, None)
    with pytest.raises(ValueError, match="expected at most 4 dimensions"):
        _C.forward(q[None], k, v, out, None)
    with pytest.raises(ValueError, match="num_threads"):
        _C.forward(q, k, v, out, None, num_threads=-1)
    with pytest.raises(ValueError, match=r"sinks: shape \(2\) must be \(nheads_q\) = \(4\)"):
        _C.forward(q, k, v, out, None, sinks=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="dsinks: given without sinks"):
        grads = [np.empty_like(a) for a in (q, k, v)]
        _C.backward(q, q, k, v, q, np.zeros((2, 4, 8), np.float32), *grads, dsinks=np.empty(4, np.float32))


def test_read_only_output_is_refused():
    q, k, v = random_qkv(8, 8)
    out = np.zeros_like(q)
    out.flags.writeable = False
    with pytest.raises(TypeError):
        _C.forward(q, k, v, out, None)
    assert not out.any()


def test_rejected_call_leaves_outputs_untouched():
    q, k, v = random_qkv(8, 8)
    out = np.full_like(q, np.nan)
    with pytest.raises(ValueError):
        _C.forward(q, k, v, out, None, softmax_scale=-1.0)
    assert np.isnan(out).all()


def test_import_without_torch():
    """Without PyTorch the package imports, build_info() works, and the torch API says what it needs."""
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "import fa3\n"
        "assert fa3.build_info()['version']\n"
        "try:\n"
        "    fa3.flash_attn_func\n"
        "except ImportError as e:\n"
        "    assert 'needs PyTorch' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('flash_attn_func without torch')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
