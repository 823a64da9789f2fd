"""flash_attn_func on CPU tensors (fa3's CPU path) against the torch reference.

Runs on any machine with PyTorch; shapes are small so the module takes seconds.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import ABS_CAP, check_close, reference, reference_dtype, reference_grads  # noqa: E402

SEQLENS = [(1, 1), (2, 3), (17, 17), (113, 127), (128, 129), (1, 239), (239, 1), (65, 33)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, seed=0, head_dim_v=None):
    """q, k of head_dim; v of head_dim_v (default: head_dim)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim_v or head_dim, generator=gen).to(dtype)
    return q, k, v


def check_forward(q, k, v, **options):
    """Runs fa3 and both references; checks out and lse by the accuracy rule."""
    mask = {key: options[key] for key in ("causal", "softcap", "softmax_scale", "sinks") if key in options}
    if "window_size" in options:
        mask["window"] = options["window_size"]
    out, lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True, **options)
    assert out.shape == (*q.shape[:3], v.shape[3]) and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    ref_out, ref_lse = reference(q, k, v, dtype=reference_dtype(q.dtype), **mask)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP.get(q.dtype))
    check_close("lse", lse, ref_lse, low_lse)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqlens(dtype, seqlens, causal):
    q, k, v = make_qkv(2, *seqlens, 4, 2, 64, dtype)
    check_forward(q, k, v, causal=causal)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (8, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_head_dims_and_groups(head_dim, heads, causal):
    q, k, v = make_qkv(1, 67, 80, *heads, head_dim, torch.bfloat16)
    check_forward(q, k, v, causal=causal)


@pytest.mark.parametrize("window", [(16, 0), (8, 4), (-1, 5), (0, 0)])
def test_sliding_window(window):
    q, k, v = make_qkv(2, 70, 90, 4, 2, 64, torch.bfloat16)
    check_forward(q, k, v, window_size=window)


# Chunked attention (attention_chunk): alone, causal, with a window across chunk edges,
# and with more queries than keys (the first queries' chunks hold no key).
CHUNK_CASES = [
    ((70, 90), {"attention_chunk": 16}),
    ((70, 90), {"attention_chunk": 7, "causal": True}),
    ((70, 90), {"attention_chunk": 32, "window_size": (5, 3)}),
    ((90, 40), {"attention_chunk": 8, "causal": True}),
]


@pytest.mark.parametrize("seqlens, options", CHUNK_CASES, ids=["chunk", "causal", "window", "more-queries"])
def test_attention_chunk(seqlens, options):
    q, k, v = make_qkv(2, *seqlens, 4, 2, 64, torch.bfloat16, seed=21)
    mask = {"causal": options.get("causal", False), "window": options.get("window_size", (-1, -1))}
    mask["chunk"] = options["attention_chunk"]
    out, lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True, **options)
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, **mask)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP.get(q.dtype))
    check_close("lse", lse, ref_lse, low_lse)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(22)).to(q.dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, **options).backward(dout)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, **mask)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, **mask)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        check_close(name, leaf.grad, r, lo, factor=3.0)


def test_attention_chunk_rules():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="attention_chunk must be >= 0"):
        fa3.flash_attn_func(q, k, v, attention_chunk=-2)
    with pytest.raises(TypeError, match="attention_chunk: expected an int"):
        fa3.flash_attn_func(q, k, v, attention_chunk=2.5)
    # A chunk covering every key is plain attention.
    assert torch.equal(fa3.flash_attn_func(q, k, v, attention_chunk=64), fa3.flash_attn_func(q, k, v))


# V head dims of their own: DeepSeek-V3's prefill (192, 128), FlashAttention-3's (64, 256)
# and (64, 512), and V narrower and wider than q at head dims no vector width divides.
HEAD_DIMS_V = [(192, 128), (64, 256), (64, 512), (40, 24), (24, 40)]


@pytest.mark.parametrize("head_dims", HEAD_DIMS_V, ids=lambda d: f"d{d[0]}-dv{d[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_separate_head_dim_v(head_dims, causal):
    """out has v's head dim, the default scale is q's, and the gradients have their
    inputs' shapes (dv v's), forward and backward by the accuracy rule."""
    head_dim, head_dim_v = head_dims
    q, k, v = make_qkv(2, 65, 80, 4, 2, head_dim, torch.bfloat16, seed=31, head_dim_v=head_dim_v)
    out = check_forward(q, k, v, causal=causal)
    assert out.shape == (2, 65, 4, head_dim_v)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(32)).to(out.dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, causal=causal).backward(dout)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, causal=causal)
    low = reference_grads(q, k, v, dout, dtype=torch.bfloat16, causal=causal)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        assert leaf.grad.shape == leaf.shape, name
        check_close(name, leaf.grad, r, lo, factor=3.0)


def test_separate_head_dim_v_with_every_option():
    """A window, softcap, scale, chunk and sinks, fp16, on strided views of a V head dim
    of its own."""
    gen = torch.Generator().manual_seed(33)
    q = torch.randn(2, 4, 70, 192, generator=gen).to(torch.float16).transpose(1, 2)
    k = torch.randn(2, 2, 90, 192, generator=gen).to(torch.float16).transpose(1, 2)
    v = torch.randn(2, 90, 4, 128, generator=gen).to(torch.float16)[:, :, ::2]
    sinks = make_sinks(4, seed=34, requires_grad=True)
    options = {"window_size": (30, 5), "softcap": 5.0, "softmax_scale": 0.2, "attention_chunk": 48}
    mask = {"window": (30, 5), "softcap": 5.0, "softmax_scale": 0.2, "chunk": 48, "sinks": sinks.detach()}
    out, lse = fa3.flash_attn_func(q, k, v, sinks=sinks, return_attn_probs=True, **options)
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, **mask)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])
    check_close("lse", lse, ref_lse, low_lse)
    dout = torch.randn(out.shape, generator=gen).to(out.dtype)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, sinks=sinks, **options).backward(dout)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, **mask)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, **mask)
    for name, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), [t.grad for t in leaves] + [sinks.grad], ref, low):
        check_close(name, g, r, lo, factor=3.0)


@pytest.mark.parametrize("padding", [(4, 4), (0, 4), (4, 0)], ids=["qk-and-v", "v-only", "qk-only"])
def test_padded_head_dims_give_the_callers_shapes_and_values(monkeypatch, padding):
    """The zero columns the GPU's copies need (head_dim_padding, which pads CUDA tensors
    only), forced on CPU tensors: out is cut back to v's head dim and the gradients to
    their inputs' shapes, with the values of the unpadded call, bit for bit (zero columns
    add exact zeros to every sum)."""
    q, k, v = make_qkv(2, 33, 40, 4, 2, 36, torch.float32, seed=36, head_dim_v=20)
    dout = torch.randn(2, 33, 4, 20, generator=torch.Generator().manual_seed(37))

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fa3.flash_attn_func(*leaves, softmax_scale=0.3, causal=True)
        out.backward(dout)
        return out.detach(), [t.grad for t in leaves]

    want_out, want_grads = run()
    monkeypatch.setattr(fa3._checks, "head_dim_padding", lambda q, k, v: padding)
    out, grads = run()
    assert out.shape == (2, 33, 4, 20) and torch.equal(out, want_out)
    for name, g, w, t in zip(("dq", "dk", "dv"), grads, want_grads, (q, k, v)):
        assert g.shape == t.shape and torch.equal(g, w), name


def test_softcap_and_scale():
    q, k, v = make_qkv(2, 50, 60, 4, 4, 64, torch.bfloat16)
    check_forward(q, k, v, softcap=5.0, softmax_scale=0.3, causal=True)


def test_strided_inputs():
    """Views whose last dim is contiguous but whose other strides are not packed."""
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(3, 45, 3, 4, 64, generator=gen).to(torch.bfloat16)
    q = qkv[:, :, 0]
    k_bhsd = torch.randn(3, 4, 52, 64, generator=gen).to(torch.bfloat16)
    k = k_bhsd.transpose(1, 2)
    v = torch.randn(6, 52, 4, 64, generator=gen).to(torch.bfloat16)[::2]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out = check_forward(q, k, v, causal=True)
    dense = fa3.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, dense)


def test_rows_past_the_views_are_not_read():
    """NaN stored just past each view's rows must not reach the result."""
    q_buf, k_buf, v_buf = make_qkv(2, 40, 50, 4, 2, 64, torch.bfloat16)
    for buf in (q_buf, k_buf, v_buf):
        buf[:, -7:] = float("nan")
    q, k, v = q_buf[:, :33], k_buf[:, :43], v_buf[:, :43]
    check_forward(q, k, v)


def test_fully_masked_rows_give_zero_and_minus_inf():
    q, k, v = make_qkv(1, 6, 2, 2, 2, 64, torch.float32)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    # Bottom-right alignment: queries 0..3 of 6 see none of the 2 keys.
    assert torch.all(out[:, :4] == 0)
    assert torch.all(lse[:, :, :4] == float("-inf"))
    assert torch.isfinite(lse[:, :, 4:]).all()


def test_forward_is_deterministic():
    q, k, v = make_qkv(2, 130, 130, 4, 2, 64, torch.bfloat16)
    first = fa3.flash_attn_func(q, k, v, causal=True)
    for _ in range(3):
        assert torch.equal(fa3.flash_attn_func(q, k, v, causal=True), first)


def test_return_value_forms():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64, torch.bfloat16)
    out = fa3.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)
    pair = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(pair, tuple) and len(pair) == 2
    assert torch.equal(pair[0], out)


def test_accepted_performance_options():
    """Options that only steer performance in FlashAttention-3 and have a value fa3 honours."""
    q, k, v = make_qkv(1, 20, 20, 4, 2, 64, torch.bfloat16)
    base = fa3.flash_attn_func(q, k, v)
    for options in ({"num_splits": 0}, {"pack_gqa": False}, {"deterministic": True}, {"sm_margin": 0}):
        assert torch.equal(fa3.flash_attn_func(q, k, v, **options), base), options


@pytest.mark.parametrize("packed", ["5d", "4d"])
def test_qkvpacked(packed):
    gen = torch.Generator().manual_seed(5)
    if packed == "5d":
        qkv = torch.randn(2, 30, 3, 4, 64, generator=gen).to(torch.bfloat16)
        q, k, v = qkv.unbind(2)
        out = fa3.flash_attn_qkvpacked_func(qkv, causal=True)
    else:
        qkv = torch.randn(2, 30, 4 + 2 * 2, 64, generator=gen).to(torch.bfloat16)
        q, k, v = qkv.split([4, 2, 2], dim=2)
        out = fa3.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=4)
    assert torch.equal(out, fa3.flash_attn_func(q, k, v, causal=True))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("seqlens", [(17, 17), (33, 20), (20, 33)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward(dtype, seqlens, causal):
    q, k, v = make_qkv(2, *seqlens, 4, 2, 64, dtype, seed=7)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8)).to(dtype)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, causal=causal).backward(dout)
    got = [t.grad for t in leaves]
    ref = reference_grads(q, k, v, dout, dtype=reference_dtype(dtype), causal=causal)
    low = reference_grads(q, k, v, dout, dtype=dtype, causal=causal)
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        assert g.dtype == dtype
        check_close(name, g, r, lo, factor=3.0)


def test_backward_of_rows_that_see_no_key():
    """Rows that see no key have output 0 whatever q holds: their dq is 0, and their
    dout, however large, reaches no dk or dv."""
    q, k, v = make_qkv(2, 40, 15, 4, 2, 64, torch.float32, seed=9)
    dout = 100 * torch.randn(q.shape, generator=torch.Generator().manual_seed(10))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, causal=True).backward(dout)
    # Bottom-right alignment: queries 0..24 of 40 see none of the 15 keys.
    assert torch.all(leaves[0].grad[:, :25] == 0)
    ref = reference_grads(q, k, v, dout, dtype=torch.float64, causal=True)
    low = reference_grads(q, k, v, dout, dtype=torch.float32, causal=True)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        check_close(name, leaf.grad, r, lo, factor=3.0)


@pytest.mark.parametrize("packed", ["5d", "4d"])
def test_qkvpacked_backward(packed):
    """The gradient lands in qkv: dq, dk and dv in the slots q, k and v came from."""
    gen = torch.Generator().manual_seed(6)
    if packed == "5d":
        qkv = torch.randn(2, 30, 3, 4, 64, generator=gen).to(torch.bfloat16)
        num_heads_q = None

        def split(t):
            return t.unbind(2)

    else:
        qkv = torch.randn(2, 30, 4 + 2 * 2, 64, generator=gen).to(torch.bfloat16)
        num_heads_q = 4

        def split(t):
            return t.split([4, 2, 2], dim=2)

    qkv.requires_grad_()
    out = fa3.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=num_heads_q)
    dout = torch.randn(out.shape, generator=gen).to(torch.bfloat16)
    out.backward(dout)
    q, k, v = split(qkv.detach())
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, causal=True)
    low = reference_grads(q, k, v, dout, dtype=torch.bfloat16, causal=True)
    for name, g, r, lo in zip(("dq", "dk", "dv"), split(qkv.grad), ref, low):
        check_close(name, g, r, lo, factor=3.0)


@pytest.mark.parametrize(
    "seqlens, options",
    [
        ((5, 7), {}),
        ((7, 5), {"causal": True}),
        ((6, 6), {"window_size": (2, 1)}),
        ((5, 7), {"softcap": 1.5, "softmax_scale": 0.7, "causal": True}),
    ],
    ids=["full", "causal-rows-without-keys", "window", "softcap-scale"],
)
def test_gradcheck(seqlens, options):
    """torch.autograd.gradcheck of the CPU path against finite differences.

    The CPU path takes fp32 at most, so fp64 leaves are rounded to fp32 at the call.
    With that rounding, finite differences over eps=1e-3 are good to about 1e-4, hence
    tolerances of 1e-3 instead of gradcheck's fp64 defaults; a gradient 1 % off still
    fails."""
    gen = torch.Generator().manual_seed(12)
    shapes = [(1, seqlens[0], 2, 8), (1, seqlens[1], 1, 8), (1, seqlens[1], 1, 8)]  # MQA 2:1
    leaves = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]

    def attention(q, k, v):
        return fa3.flash_attn_func(q.float(), k.float(), v.float(), **options).double()

    assert torch.autograd.gradcheck(attention, leaves, eps=1e-3, atol=1e-3, rtol=1e-3)


def test_gradcheck_separate_head_dim_v():
    """gradcheck (as above) with v's head dim 12 against q's and k's 8, GQA, causal."""
    gen = torch.Generator().manual_seed(35)
    shapes = [(1, 6, 4, 8), (1, 5, 2, 8), (1, 5, 2, 12)]
    leaves = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]

    def attention(q, k, v):
        return fa3.flash_attn_func(q.float(), k.float(), v.float(), causal=True).double()

    assert torch.autograd.gradcheck(attention, leaves, eps=1e-3, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("deterministic", [False, True])
def test_autograd_passes_deterministic_to_the_extension(monkeypatch, deterministic):
    calls = []
    backward = fa3._C.backward

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return backward(*args, **kwargs)

    monkeypatch.setattr(fa3._C, "backward", recording)
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 9, 9, 4, 2, 64, torch.bfloat16))
    fa3.flash_attn_func(q, k, v, deterministic=deterministic).float().sum().backward()
    qkv = torch.randn(1, 9, 3, 4, 64, dtype=torch.bfloat16, requires_grad=True)
    fa3.flash_attn_qkvpacked_func(qkv, deterministic=deterministic).float().sum().backward()
    assert [call["deterministic"] for call in calls] == [deterministic, deterministic]
    # The CPU path takes no workspace.
    assert all(call["workspace"] is None for call in calls)


def test_lse_is_not_differentiable():
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 8, 8, 2, 2, 64, torch.float32))
    out, lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def make_sinks(nheads, seed, scale=2.0, requires_grad=False):
    """Sink logits of a few units: from next to nothing to most of a short row's weight."""
    sinks = scale * torch.randn(nheads, generator=torch.Generator().manual_seed(seed))
    return sinks.requires_grad_(requires_grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("seqlens", [(17, 17), (65, 33), (33, 65)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_forward(dtype, seqlens, causal):
    q, k, v = make_qkv(2, *seqlens, 4, 2, 64, dtype, seed=13)
    check_forward(q, k, v, causal=causal, sinks=make_sinks(4, seed=14))


def test_sinks_with_window_softcap_and_strided_views():
    q, k, v = make_qkv(2, 50, 60, 4, 4, 64, torch.bfloat16, seed=15)
    sinks = make_sinks(8, seed=16)[::2]  # every other element: a strided view
    assert not sinks.is_contiguous()
    options = {"window_size": (9, 3), "softcap": 5.0, "softmax_scale": 0.3}
    out = check_forward(q, k, v, sinks=sinks, **options)
    assert torch.equal(fa3.flash_attn_func(q, k, v, sinks=sinks.contiguous(), **options), out)


def test_sinks_of_rows_that_see_no_key():
    """Only the sink remains: out 0 and softmax_lse the head's sink."""
    q, k, v = make_qkv(2, 6, 2, 4, 2, 64, torch.float32, seed=17)
    sinks = make_sinks(4, seed=18)
    out, lse = fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks, return_attn_probs=True)
    # Bottom-right alignment: queries 0..3 of 6 see none of the 2 keys.
    assert torch.all(out[:, :4] == 0)
    torch.testing.assert_close(lse[:, :, :4], sinks[None, :, None].expand(2, 4, 4), rtol=0, atol=1e-6)
    assert torch.isfinite(lse[:, :, 4:]).all()


def test_minus_infinity_sinks_are_no_sinks():
    """Bitwise: forward, lse and gradients as without sinks, and a zero sinks gradient."""
    q, k, v = make_qkv(2, 20, 13, 4, 2, 64, torch.bfloat16, seed=19)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(20)).to(torch.bfloat16)
    sinks = torch.full((4,), float("-inf"), requires_grad=True)
    results = []
    for extra in ({}, {"sinks": sinks}):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, lse = fa3.flash_attn_func(*leaves, causal=True, return_attn_probs=True, **extra)
        out.backward(dout)
        results.append([out, lse] + [t.grad for t in leaves])
    for plain, sunk in zip(*results):
        assert torch.equal(plain, sunk)
    assert torch.equal(sinks.grad, torch.zeros(4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("seqlens", [(17, 17), (33, 20), (20, 33)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sinks_backward(dtype, seqlens, causal):
    """dq, dk, dv and the sinks' gradient by the backward rule (3x the `low` error)."""
    q, k, v = make_qkv(2, *seqlens, 4, 2, 64, dtype, seed=21)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(22)).to(dtype)
    sinks = make_sinks(4, seed=23, requires_grad=True)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, causal=causal, sinks=sinks).backward(dout)
    got = [t.grad for t in leaves] + [sinks.grad]
    ref = reference_grads(q, k, v, dout, dtype=reference_dtype(dtype), causal=causal, sinks=sinks.detach())
    low = reference_grads(q, k, v, dout, dtype=dtype, causal=causal, sinks=sinks.detach())
    for name, g, r, lo in zip(("dq", "dk", "dv", "dsinks"), got, ref, low):
        assert g.dtype == (torch.float32 if name == "dsinks" else dtype)
        check_close(name, g, r, lo, factor=3.0)


@pytest.mark.parametrize(
    "seqlens, options",
    [((5, 7), {}), ((7, 5), {"causal": True}), ((6, 6), {"window_size": (2, 1), "softcap": 1.5})],
    ids=["full", "causal-rows-without-keys", "window-softcap"],
)
def test_gradcheck_with_sinks(seqlens, options):
    """gradcheck in q, k, v and the sinks, as test_gradcheck (fp32 at the call)."""
    gen = torch.Generator().manual_seed(24)
    shapes = [(1, seqlens[0], 2, 8), (1, seqlens[1], 1, 8), (1, seqlens[1], 1, 8), (2,)]
    leaves = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]

    def attention(q, k, v, sinks):
        return fa3.flash_attn_func(q.float(), k.float(), v.float(), sinks=sinks.float(), **options).double()

    assert torch.autograd.gradcheck(attention, leaves, eps=1e-3, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("packed", ["5d", "4d"])
def test_qkvpacked_sinks(packed):
    """The sinks reach flash_attn_func, and their gradient the sinks tensor."""
    gen = torch.Generator().manual_seed(25)
    if packed == "5d":
        qkv = torch.randn(2, 30, 3, 4, 64, generator=gen)
        q, k, v = qkv.unbind(2)
        num_heads_q = None
    else:
        qkv = torch.randn(2, 30, 4 + 2 * 2, 64, generator=gen)
        q, k, v = qkv.split([4, 2, 2], dim=2)
        num_heads_q = 4
    sinks = make_sinks(4, seed=26, requires_grad=True)
    out = fa3.flash_attn_qkvpacked_func(qkv, causal=True, num_heads_q=num_heads_q, sinks=sinks)
    assert torch.equal(out, fa3.flash_attn_func(q, k, v, causal=True, sinks=sinks))
    out.sum().backward()
    assert sinks.grad is not None and sinks.grad.shape == (4,) and torch.isfinite(sinks.grad).all()
