"""flash_attn_varlen_func on CPU tensors: FlashAttention-3's signature, results and
gradients equal to a loop of flash_attn_func over the sequences (lengths 0 and 1,
seqused, rows past the last sequence, every option), argument checks naming the
argument, and the custom ops under opcheck and torch.compile. On CUDA tensors (a Hopper
GPU, in a build with the GPU varlen paths, FA3_GPU_VARLEN): the forward against the CPU
path by the accuracy rule, with NaN in the rows no sequence uses; the backward (head dim
128) against the reference on each sequence alone by the backward rule, with NaN in the
rows of dout no sequence uses, and its refusal at other head dims.
"""

import inspect
import re

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import ABS_CAP, check_close, reference, reference_grads  # noqa: E402
from gpu_support import BUILT_DTYPES, BUILT_HEAD_DIMS, gpu_skip_reason  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

# FlashAttention-3's hopper/flash_attn_interface.py flash_attn_varlen_func: names, order,
# defaults; fa3's own keywords (sinks, the FP8 block scales) follow them.
FA3_VARLEN_SIGNATURE = [
    ("q", inspect.Parameter.empty),
    ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty),
    ("cu_seqlens_q", inspect.Parameter.empty),
    ("cu_seqlens_k", inspect.Parameter.empty),
    ("max_seqlen_q", inspect.Parameter.empty),
    ("max_seqlen_k", inspect.Parameter.empty),
    ("seqused_q", None),
    ("seqused_k", None),
    ("softmax_scale", None),
    ("causal", False),
    ("qv", None),
    ("q_descale", None),
    ("k_descale", None),
    ("v_descale", None),
    ("window_size", (-1, -1)),
    ("attention_chunk", 0),
    ("softcap", 0.0),
    ("num_splits", 1),
    ("pack_gqa", None),
    ("deterministic", False),
    ("sm_margin", 0),
    ("return_attn_probs", False),
    ("sinks", None),
    ("block_scales", None),
    ("block_rows", 128),
]

# Query lengths 1, 0, odd ones and one past a 64-row tile; a query sequence without keys
# (the fourth) and keys without queries (the second).
Q_LENS = [1, 0, 17, 5, 70, 2]
K_LENS = [3, 4, 33, 0, 129, 1]


def offsets(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)


def make_varlen(q_lens=Q_LENS, k_lens=K_LENS, heads=(4, 2), head_dim=32, dtype=torch.bfloat16, extra=(3, 2), seed=0,
                requires_grad=False):
    """Packed q, k, v with `extra` rows past the last sequence, and the offsets."""
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(q_lens) + extra[0], sum(k_lens) + extra[1]
    q = torch.randn(total_q, heads[0], head_dim, generator=gen).to(dtype)
    k = torch.randn(total_k, heads[1], head_dim, generator=gen).to(dtype)
    v = torch.randn(total_k, heads[1], head_dim, generator=gen).to(dtype)
    for t in (q, k, v):
        t.requires_grad_(requires_grad)
    return q, k, v, offsets(q_lens), offsets(k_lens)


def per_sequence(q, k, v, cu_q, cu_k, used_q=None, used_k=None, sinks=None, **options):
    """(out, lse) of flash_attn_func run on each sequence alone, packed like
    flash_attn_varlen_func's; rows of no sequence 0 and -inf."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for b in range(len(cu_q) - 1):
        q0, k0 = int(cu_q[b]), int(cu_k[b])
        sq = int(used_q[b]) if used_q is not None else int(cu_q[b + 1]) - q0
        sk = int(used_k[b]) if used_k is not None else int(cu_k[b + 1]) - k0
        if sq == 0:
            continue
        if sk == 0:
            lse[:, q0 : q0 + sq] = sinks[:, None] if sinks is not None else float("-inf")
            continue
        o, l = fa3.flash_attn_func(
            q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk], sinks=sinks, return_attn_probs=True,
            **options
        )
        out[q0 : q0 + sq] = o[0]
        lse[:, q0 : q0 + sq] = l[0]
    return out, lse


def test_signature_matches_flashattention3():
    params = inspect.signature(fa3.flash_attn_varlen_func).parameters
    assert [(name, p.default) for name, p in params.items()] == FA3_VARLEN_SIGNATURE


OPTIONS = [
    {},
    {"causal": True},
    {"window_size": (8, 3), "softcap": 2.0},
    {"causal": True, "attention_chunk": 16},
    {"softmax_scale": 0.3, "window_size": (-1, 5)},
]


@pytest.mark.parametrize("options", OPTIONS, ids=["full", "causal", "window-softcap", "chunk", "scale-window"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (4, 1)], ids=["gqa", "mha", "mqa"])
def test_equals_each_sequence_alone(options, heads):
    q, k, v, cu_q, cu_k = make_varlen(heads=heads)
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, return_attn_probs=True, **options)
    want_out, want_lse = per_sequence(q, k, v, cu_q, cu_k, **options)
    assert out.shape == (q.shape[0], 4, 32) and lse.shape == (4, q.shape[0]) and lse.dtype == torch.float32
    assert torch.equal(out, want_out)
    assert torch.equal(lse, want_lse)


def test_seqused_ignores_the_unused_rows():
    """Rows past seqused take no part: NaN there changes nothing, and their out is 0."""
    q, k, v, cu_q, cu_k = make_varlen(dtype=torch.float32)
    used_q = torch.tensor([1, 0, 9, 5, 64, 0], dtype=torch.int32)
    used_k = torch.tensor([2, 4, 33, 0, 100, 1], dtype=torch.int32)
    for t, cu, used in ((q, cu_q, used_q), (k, cu_k, used_k), (v, cu_k, used_k)):
        for b in range(len(used)):
            t[int(cu[b]) + int(used[b]) : int(cu[b + 1])] = float("nan")
        t[int(cu[-1]) :] = float("nan")
    out, lse = fa3.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, 64, 100, seqused_q=used_q, seqused_k=used_k, causal=True, return_attn_probs=True
    )
    want_out, want_lse = per_sequence(q, k, v, cu_q, cu_k, used_q, used_k, causal=True)
    assert torch.equal(out, want_out)
    assert torch.equal(lse, want_lse)


def test_sinks_equal_each_sequence_alone():
    q, k, v, cu_q, cu_k = make_varlen()
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3)) * 2
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, causal=True, sinks=sinks,
                                          return_attn_probs=True)
    want_out, want_lse = per_sequence(q, k, v, cu_q, cu_k, sinks=sinks, causal=True)
    assert torch.equal(out, want_out)
    assert torch.equal(lse, want_lse)


@pytest.mark.parametrize("options", OPTIONS[:4], ids=["full", "causal", "window-softcap", "chunk"])
def test_gradients_equal_each_sequence_alone(options):
    q, k, v, cu_q, cu_k = make_varlen(requires_grad=True)
    sinks = (torch.randn(4, generator=torch.Generator().manual_seed(4)) * 2).requires_grad_()
    dout = torch.randn(q.shape[0], 4, 32, generator=torch.Generator().manual_seed(5)).to(q.dtype)
    out = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, sinks=sinks, **options)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)

    want = [torch.zeros_like(t) for t in (q, k, v, sinks)]
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        parts = (q[None, q0:q1], k[None, k0:k1], v[None, k0:k1])
        o = fa3.flash_attn_func(*parts, sinks=sinks, **options)
        dq, dk, dv, ds = torch.autograd.grad(o, (*parts, sinks), dout[None, q0:q1])
        want[0][q0:q1], want[1][k0:k1], want[2][k0:k1] = dq[0], dk[0], dv[0]
        want[3] += ds
    for name, got, expected in zip(("dq", "dk", "dv"), grads, want):
        assert torch.equal(got, expected), name
    torch.testing.assert_close(grads[3], want[3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", [{}, {"causal": True, "window_size": (3, 0)}], ids=["full", "causal-window"])
def test_gradcheck(options):
    """gradcheck against finite differences, with a sequence without queries, seqused_k
    and rows past the last sequence. The CPU path takes fp32 at most: fp64 leaves are
    rounded at the call, hence the tolerances of test_cpu_path's gradcheck."""
    q, k, v, cu_q, cu_k = make_varlen([3, 0, 4], [2, 3, 5], heads=(2, 1), head_dim=8, dtype=torch.float64,
                                      extra=(1, 1), requires_grad=True)
    used_k = torch.tensor([2, 1, 5], dtype=torch.int32)

    def attention(q, k, v):
        return fa3.flash_attn_varlen_func(q.float(), k.float(), v.float(), cu_q, cu_k, 4, 5, seqused_k=used_k,
                                          **options).double()

    assert torch.autograd.gradcheck(attention, (q, k, v), eps=1e-3, atol=1e-3, rtol=1e-3)


def test_cuda_tensors_trace_to_packed_shapes():
    with FakeTensorMode():
        q = torch.empty(10, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(12, 2, 64, device="cuda", dtype=torch.bfloat16)
        cu = torch.tensor([0, 10], dtype=torch.int32, device="cuda")
        out, lse = fa3.flash_attn_varlen_func(q, k, k, cu, cu, 10, 12, return_attn_probs=True)
        assert out.shape == (10, 4, 64) and out.device.type == "cuda" and lse.shape == (4, 10)


_GPU_SKIP = gpu_skip_reason() or (None if fa3.build_info()["gpu_varlen"] else "the GPU varlen forward is switched off")
needs_gpu_varlen = pytest.mark.skipif(_GPU_SKIP is not None, reason=str(_GPU_SKIP))

# Lengths 0, 1, odd ones and multiples of the tiles on both sides; a sequence with
# queries and no key, one with keys and no query; seqlen_q != seqlen_k both ways.
GPU_Q_LENS = [1, 127, 128, 0, 129, 5, 300, 64, 2]
GPU_K_LENS = [1, 128, 200, 7, 129, 0, 1023, 80, 3]
GPU_OPTIONS = [
    ({}, {}),
    ({"causal": True}, {"causal": True}),
    ({"window_size": (100, 30)}, {"window": (100, 30)}),
    ({"causal": True, "softcap": 5.0}, {"causal": True, "softcap": 5.0}),
    ({"attention_chunk": 96}, {"chunk": 96}),
]


def packed_reference(q, k, v, cu_q, cu_k, used_q, used_k, dtype, sinks=None, **mask):
    """The torch reference run on each sequence alone in `dtype`, packed; rows of no
    sequence 0 and -inf."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)
    for b in range(len(cu_q) - 1):
        q0, k0, sq, sk = int(cu_q[b]), int(cu_k[b]), int(used_q[b]), int(used_k[b])
        if sq == 0:
            continue
        if sk == 0:
            lse[:, q0 : q0 + sq] = sinks[:, None] if sinks is not None else float("-inf")
            continue
        o, l = reference(q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk], dtype=dtype,
                         sinks=sinks, **mask)
        out[q0 : q0 + sq] = o[0]
        lse[:, q0 : q0 + sq] = l[0]
    return out, lse


def poisoned_gpu_batch(dtype, head_dim, heads, seqused, seed):
    """Packed CUDA q, k, v with NaN in every row no sequence uses, the offsets, and the
    used lengths (seqused or all)."""
    q, k, v, cu_q, cu_k = make_varlen(GPU_Q_LENS, GPU_K_LENS, heads=heads, head_dim=head_dim, dtype=dtype,
                                      extra=(37, 41), seed=seed)
    lens_q, lens_k = cu_q.diff(), cu_k.diff()
    used_q = (lens_q - lens_q // 3).to(torch.int32) if seqused else lens_q.to(torch.int32)
    used_k = (lens_k - lens_k // 4).to(torch.int32) if seqused else lens_k.to(torch.int32)
    for t, cu, used in ((q, cu_q, used_q), (k, cu_k, used_k), (v, cu_k, used_k)):
        for b in range(len(used)):
            t[int(cu[b]) + int(used[b]) : int(cu[b + 1])] = float("nan")
        t[int(cu[-1]) :] = float("nan")
    return [t.cuda() for t in (q, k, v, cu_q, cu_k, used_q, used_k)]


@needs_gpu_varlen
@pytest.mark.parametrize("options, mask", GPU_OPTIONS, ids=["full", "causal", "window", "causal-softcap", "chunk"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("seqused", [False, True], ids=["all-rows", "seqused"])
@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("dtype", BUILT_DTYPES)
def test_cuda_forward_matches_the_cpu_path(dtype, head_dim, seqused, heads, options, mask):
    q, k, v, cu_q, cu_k, used_q, used_k = poisoned_gpu_batch(dtype, head_dim, heads, seqused, seed=head_dim)
    used = {"seqused_q": used_q, "seqused_k": used_k} if seqused else {}
    max_q, max_k = int(used_q.max()), int(used_k.max())
    out, lse = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, return_attn_probs=True, **used,
                                          **options)
    # ref: the CPU path in fp32; low: the reference in the inputs' precision.
    cpu = [t.cpu() for t in (q, k, v)]
    ref_out, ref_lse = fa3.flash_attn_varlen_func(
        *(t.float() for t in cpu), cu_q.cpu(), cu_k.cpu(), max_q, max_k, return_attn_probs=True,
        **{name: t.cpu() for name, t in used.items()}, **options
    )
    low_out, low_lse = packed_reference(*cpu, cu_q.cpu(), cu_k.cpu(), used_q.cpu(), used_k.cpu(), dtype=dtype, **mask)
    check_close("out", out.cpu().float(), ref_out, low_out.float(), abs_cap=ABS_CAP[dtype])
    check_close("lse", lse.cpu(), ref_lse, low_lse)


@needs_gpu_varlen
def test_cuda_forward_with_sinks_and_repeats_bitwise():
    dtype, head_dim = BUILT_DTYPES[0], BUILT_HEAD_DIMS[0]
    q, k, v, cu_q, cu_k, used_q, used_k = poisoned_gpu_batch(dtype, head_dim, (8, 2), True, seed=11)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(2)).cuda()
    args = (q, k, v, cu_q, cu_k, int(used_q.max()), int(used_k.max()))
    options = {"seqused_q": used_q, "seqused_k": used_k, "causal": True, "sinks": sinks, "return_attn_probs": True}
    out, lse = fa3.flash_attn_varlen_func(*args, **options)
    low_out, low_lse = packed_reference(*(t.cpu() for t in (q, k, v, cu_q, cu_k, used_q, used_k)), dtype=dtype,
                                        sinks=sinks.cpu(), causal=True)
    ref_out, ref_lse = packed_reference(*(t.cpu() for t in (q, k, v, cu_q, cu_k, used_q, used_k)),
                                        dtype=torch.float32, sinks=sinks.cpu(), causal=True)
    check_close("out", out.cpu().float(), ref_out, low_out.float(), abs_cap=ABS_CAP[dtype])
    check_close("lse", lse.cpu(), ref_lse, low_lse)
    for _ in range(20):
        again, again_lse = fa3.flash_attn_varlen_func(*args, **options)
        assert torch.equal(again, out) and torch.equal(again_lse, lse)


# The GPU varlen backward runs at the kernel head dims that have a varlen instance
# (FA3_BWD_VARLEN_HEAD_DIMS); other head dims are refused naming cu_seqlens_q.
GPU_VARLEN_BWD_HEAD_DIMS = [d for d in fa3.build_info()["gpu_varlen_backward_head_dims"] if d in BUILT_HEAD_DIMS]
needs_gpu_varlen_backward = pytest.mark.skipif(
    _GPU_SKIP is not None or not GPU_VARLEN_BWD_HEAD_DIMS,
    reason=str(_GPU_SKIP or "no head dim with a GPU varlen backward was built"),
)


def packed_reference_grads(q, k, v, dout, cu_q, cu_k, used_q, used_k, dtype, sinks=None, **mask):
    """dq, dk, dv of the torch reference run on each sequence alone in `dtype`, packed, 0
    on the rows of no sequence; with sinks also dsinks, summed over the sequences."""
    dq, dk, dv = (torch.zeros(t.shape, dtype=dtype) for t in (q, k, v))
    dsinks = torch.zeros(q.shape[1]) if sinks is not None else None
    for b in range(len(cu_q) - 1):
        q0, k0, sq, sk = int(cu_q[b]), int(cu_k[b]), int(used_q[b]), int(used_k[b])
        if sq == 0 or sk == 0:
            continue
        grads = reference_grads(q[None, q0 : q0 + sq], k[None, k0 : k0 + sk], v[None, k0 : k0 + sk],
                                dout[None, q0 : q0 + sq], dtype=dtype, sinks=sinks, **mask)
        dq[q0 : q0 + sq] = grads[0][0]
        dk[k0 : k0 + sk] = grads[1][0]
        dv[k0 : k0 + sk] = grads[2][0]
        if sinks is not None:
            dsinks += grads[3].float()
    return dq, dk, dv, dsinks


def poisoned_dout(like, cu_q, used_q, seed):
    """A random gradient for a packed output, NaN on the rows of no sequence."""
    dout = torch.randn(like.shape, generator=torch.Generator().manual_seed(seed)).to(like.dtype)
    for b in range(len(used_q)):
        dout[int(cu_q[b]) + int(used_q[b]) : int(cu_q[b + 1])] = float("nan")
    dout[int(cu_q[-1]) :] = float("nan")
    return dout.to(like.device)


def cuda_backward(dtype, head_dim, heads, seqused, options, deterministic, sinks, seed):
    """flash_attn_varlen_func's forward and backward on a poisoned CUDA batch: the inputs
    (q, k, v, dout, index tensors) and the gradients (dq, dk, dv, and dsinks with sinks)."""
    q, k, v, cu_q, cu_k, used_q, used_k = poisoned_gpu_batch(dtype, head_dim, heads, seqused, seed)
    used = {"seqused_q": used_q, "seqused_k": used_k} if seqused else {}
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    sinks_leaf = sinks.detach().requires_grad_() if sinks is not None else None
    out = fa3.flash_attn_varlen_func(*leaves, cu_q, cu_k, int(used_q.max()), int(used_k.max()), **used,
                                     deterministic=deterministic, sinks=sinks_leaf, **options)
    dout = poisoned_dout(out, cu_q, used_q, seed + 1)
    out.backward(dout)
    got = [t.grad for t in leaves] + ([sinks_leaf.grad] if sinks is not None else [])
    return (q, k, v, dout, cu_q, cu_k, used_q, used_k), got


def check_cuda_backward(dtype, head_dim, heads, seqused, options, mask, deterministic, sinks=None, seed=0):
    """The gradients of cuda_backward against the reference on each sequence alone, by
    the backward rule; rows of no sequence must get exactly 0."""
    inputs, got = cuda_backward(dtype, head_dim, heads, seqused, options, deterministic, sinks, seed)
    cpu = [t.cpu() for t in inputs]
    cpu_sinks = sinks.cpu() if sinks is not None else None
    ref = packed_reference_grads(*cpu, dtype=torch.float32, sinks=cpu_sinks, **mask)
    low = packed_reference_grads(*cpu, dtype=dtype, sinks=cpu_sinks, **mask)
    for name, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        assert g.shape == r.shape, name
        check_close(name, g.cpu().float(), r.float(), lo.float(), factor=3.0)
    _, _, _, _, cu_q, cu_k, used_q, used_k = cpu
    for g, cu, used_rows in ((got[0], cu_q, used_q), (got[1], cu_k, used_k), (got[2], cu_k, used_k)):
        g = g.cpu()
        for b in range(len(used_rows)):
            assert (g[int(cu[b]) + int(used_rows[b]) : int(cu[b + 1])] == 0).all()
        assert (g[int(cu[-1]) :] == 0).all()
    return got


@needs_gpu_varlen_backward
@pytest.mark.parametrize("options, mask", GPU_OPTIONS[:3], ids=["full", "causal", "window"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("seqused", [False, True], ids=["all-rows", "seqused"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("dtype", BUILT_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_VARLEN_BWD_HEAD_DIMS)
def test_cuda_backward_matches_the_reference(head_dim, dtype, deterministic, seqused, heads, options, mask):
    check_cuda_backward(dtype, head_dim, heads, seqused, options, mask, deterministic, seed=5)


@needs_gpu_varlen_backward
def test_cuda_backward_with_sinks_and_deterministic_repeats_bitwise():
    dtype, head_dim = BUILT_DTYPES[0], GPU_VARLEN_BWD_HEAD_DIMS[0]
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(4)).cuda()
    options, mask = GPU_OPTIONS[1]
    first = check_cuda_backward(dtype, head_dim, (8, 2), True, options, mask, True, sinks=sinks, seed=13)
    for _ in range(20):
        _, again = cuda_backward(dtype, head_dim, (8, 2), True, options, True, sinks, seed=13)
        assert all(torch.equal(a, b) for a, b in zip(again, first))


def test_build_info_names_the_varlen_backward_head_dims():
    """The kernel head dims whose backward runs varlen calls: built ones, none without the
    GPU varlen paths."""
    info = fa3.build_info()
    dims = info["gpu_varlen_backward_head_dims"]
    assert all(isinstance(d, int) for d in dims)
    assert set(dims) <= set(info["head_dims"])
    if not info["gpu_varlen"]:
        assert dims == []


@needs_gpu_varlen
def test_cuda_backward_of_other_head_dims_is_refused():
    others = [d for d in BUILT_HEAD_DIMS if d not in GPU_VARLEN_BWD_HEAD_DIMS]
    if not others:
        pytest.skip("every built head dim has a GPU varlen backward")
    q, k, v, cu_q, cu_k, _, _ = poisoned_gpu_batch(BUILT_DTYPES[0], others[0], (4, 2), False, seed=3)
    q.requires_grad_()
    out = fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, int(cu_q.diff().max()), int(cu_k.diff().max()))
    with pytest.raises(NotImplementedError, match="cu_seqlens_q"):
        out.sum().backward()


@pytest.mark.parametrize(
    "option, value, names",
    [
        ("qv", "tensor", "qv"),
        ("num_splits", 2, "num_splits=2"),
        ("pack_gqa", True, "pack_gqa"),
    ],
)
def test_unsupported_options_raise(option, value, names):
    q, k, v, cu_q, cu_k = make_varlen()
    value = torch.ones(1) if value == "tensor" else value
    with pytest.raises(NotImplementedError, match=names):
        fa3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, **{option: value})


def bad_call(**changes):
    q, k, v, cu_q, cu_k = make_varlen()
    args = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k, "max_seqlen_q": 70,
            "max_seqlen_k": 129}
    args.update(changes)
    return args


BAD_CALLS = [
    ("q_4d", lambda: bad_call(q=torch.ones(1, 98, 4, 32)), ValueError,
     "q: expected a 3-d tensor (total, nheads, headdim), got shape (1, 98, 4, 32)"),
    ("cu_seqlens_q_int64", lambda: bad_call(cu_seqlens_q=offsets(Q_LENS).long()), ValueError,
     "cu_seqlens_q: dtype torch.int64 is not supported; use torch.int32"),
    ("cu_seqlens_k_list", lambda: bad_call(cu_seqlens_k=[0, 3]), TypeError,
     "cu_seqlens_k: expected a torch.Tensor, got list"),
    ("seqused_q_2d", lambda: bad_call(seqused_q=torch.zeros(1, 6, dtype=torch.int32)), ValueError,
     "seqused_q: expected a 1-d tensor, got shape (1, 6)"),
    ("max_seqlen_q_float", lambda: bad_call(max_seqlen_q=70.0), TypeError, "max_seqlen_q: expected an int, got 70.0"),
    ("cu_seqlens_q_decreasing", lambda: bad_call(cu_seqlens_q=torch.tensor([0, 1, 0, 18, 23, 93, 95],
                                                                            dtype=torch.int32)),
     ValueError, "cu_seqlens_q: cu_seqlens_q[2] = 0 is less than cu_seqlens_q[1] = 1 (must be non-decreasing)"),
    ("cu_seqlens_k_length", lambda: bad_call(cu_seqlens_k=offsets(K_LENS[:5])), ValueError,
     "cu_seqlens_k: shape (6) must be (batch + 1) = (7)"),
    ("max_seqlen_k_too_small", lambda: bad_call(max_seqlen_k=128), ValueError,
     "max_seqlen_k: 128 is less than the longest key sequence, 129 (sequence 4)"),
    ("seqused_k_past_length", lambda: bad_call(seqused_k=torch.tensor([4, 0, 0, 0, 0, 0], dtype=torch.int32)),
     ValueError, "seqused_k: seqused_k[0] = 4 is outside [0, 3], sequence 0's length in cu_seqlens_k"),
]


@pytest.mark.parametrize("make, error, message", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_name_the_argument(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        fa3.flash_attn_varlen_func(**make())


def test_fake_shapes():
    with FakeTensorMode():
        q = torch.empty(100, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(70, 2, 128, dtype=torch.bfloat16)
        v = torch.empty(70, 2, 64, dtype=torch.bfloat16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse = fa3.flash_attn_varlen_func(q, k, v, cu, cu, 50, 40, causal=True, return_attn_probs=True)
        assert out.shape == (100, 8, 64) and lse.shape == (8, 100) and lse.dtype == torch.float32
        grads = torch.ops.fa3.varlen_bwd(out, q, k, v, out, lse, cu, cu, None, None, 50, 40, None, 0.0, True, -1, 0,
                                         0.0, False, 0)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (0,)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_forward_and_backward(causal):
    q, k, v, cu_q, cu_k = make_varlen(requires_grad=True)
    used_q = torch.tensor([1, 0, 9, 5, 64, 0], dtype=torch.int32)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(6)).requires_grad_()
    bounds = (cu_q, cu_k, used_q, None, 70, 129)
    options = (0.0, causal, -1, 0 if causal else -1, 0.0, False, 0)
    torch.library.opcheck(torch.ops.fa3.varlen_fwd.default, (q, k, v, *bounds, sinks, *options))
    out, lse = torch.ops.fa3.varlen_fwd(q, k, v, *bounds, sinks, *options)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, *bounds, sinks.detach(),
            *options)
    torch.library.opcheck(torch.ops.fa3.varlen_bwd.default, args)


def varlen_block(q, k, v, cu_q, cu_k):
    out = fa3.flash_attn_varlen_func(q * 0.5, k, v, cu_q, cu_k, 70, 129, causal=True)
    return out.float().square().sum(dim=-1)


def test_compile_fullgraph_forward_and_backward():
    q, k, v, cu_q, cu_k = make_varlen(requires_grad=True)
    varlen_block(q, k, v, cu_q, cu_k).sum().backward()
    eager = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(varlen_block, fullgraph=True, backend="aot_eager")
    result = compiled(q, k, v, cu_q, cu_k)
    assert torch.equal(result, varlen_block(q, k, v, cu_q, cu_k))
    result.sum().backward()
    for name, t, want in zip("qkv", (q, k, v), eager):
        assert torch.equal(t.grad, want), name
