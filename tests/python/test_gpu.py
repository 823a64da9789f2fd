"""flash_attn_func on CUDA tensors (fa3's Hopper kernels) against the torch reference,
forward and backward, plus the backward's workspace as fa3._C takes it.

Skipped, and reported as skipped, without PyTorch, without a CUDA device, on a GPU
other than Hopper (compute capability 9.0), or in a build without GPU kernels.
torch.library.opcheck on CUDA tensors lives with the CPU one, in test_compile.py.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import ABS_CAP, check_close, reference, reference_grads  # noqa: E402
from fa3 import _C, _torch_ops  # noqa: E402
from gpu_support import BUILT_DTYPES, BUILT_HEAD_DIMS, capture, gpu_skip_reason  # noqa: E402

pytestmark = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))

SEQLENS = [
    (1, 1),
    (3, 17),
    (113, 127),
    (127, 128),
    (128, 128),
    (129, 239),
    (799, 1023),
    (1024, 1025),
    (1, 4224),
    (4224, 1),
    (1023, 239),
]


@pytest.fixture(autouse=True)
def exact_fp32_reference():
    """TF32 would make the fp32 reference no better than the kernel."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, seed=0, head_dim_v=None):
    """q, k of head_dim; v of head_dim_v (default: head_dim)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape_q = (batch, seqlen_q, nheads, head_dim)
    shape_k = (batch, seqlen_k, nheads_k, head_dim)
    shape_v = (batch, seqlen_k, nheads_k, head_dim_v or head_dim)
    return [torch.randn(s, generator=gen, device="cuda").to(dtype) for s in (shape_q, shape_k, shape_v)]


def check_forward(q, k, v, causal=False):
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, causal=causal)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, causal=causal)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])
    check_close("lse", lse, ref_lse, low_lse)
    return out


def make_dout(like, seed=1):
    """A random gradient for an output shaped like `like`, on its device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(like.shape, generator=gen).to(like.device, like.dtype)


def check_backward(q, k, v, causal=False, deterministic=False, dout=None):
    """Runs fa3's forward and backward through autograd (q, k and v as they are, strides
    included) and checks dq, dk and dv by the backward rule; returns them."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fa3.flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
    dout = make_dout(out) if dout is None else dout
    out.backward(dout)
    grads = [t.grad for t in leaves]
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, causal=causal)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, causal=causal)
    for name, g, r, lo in zip(("dq", "dk", "dv"), grads, ref, low):
        assert g.shape == r.shape and g.dtype == q.dtype, name
        check_close(name, g, r, lo, factor=3.0)
    return grads


@pytest.mark.parametrize("dtype", BUILT_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward(dtype, head_dim, seqlens, causal):
    check_forward(*make_qkv(2, *seqlens, 4, 4, head_dim, dtype), causal=causal)


@pytest.mark.parametrize("heads", [(8, 2), (8, 1), (6, 3)], ids=["gqa", "mqa", "gqa-2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_query_heads(heads, causal):
    check_forward(*make_qkv(2, 300, 257, *heads, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]), causal=causal)


def test_many_batches_beyond_the_sm_count():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    check_forward(*make_qkv(sms + 7, 128, 128, 2, 1, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]), causal=True)


def test_strided_inputs_and_rows_past_the_views():
    dtype, head_dim = BUILT_DTYPES[0], BUILT_HEAD_DIMS[0]
    qkv = torch.randn(2, 200, 3, 4, head_dim, device="cuda").to(dtype)
    qkv[:, 150:] = float("nan")  # past the views' seqlen: must never be read
    q, k, v = qkv[:, :150].unbind(2)
    assert not q.is_contiguous()
    check_forward(q, k, v, causal=True)


def test_forward_is_deterministic():
    q, k, v = make_qkv(2, 1000, 1000, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    first = fa3.flash_attn_func(q, k, v, causal=True)
    for _ in range(20):
        assert torch.equal(fa3.flash_attn_func(q, k, v, causal=True), first)


def test_runs_on_the_current_stream():
    q, k, v = make_qkv(2, 512, 512, 4, 4, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    expected = fa3.flash_attn_func(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fa3.flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


def test_calls_take_the_current_streams_handle():
    q = torch.zeros(1, device="cuda")
    assert _torch_ops._placement(q) == {"stream": torch.cuda.current_stream().cuda_stream}
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert _torch_ops._placement(q) == {"stream": side.cuda_stream}
    if torch.cuda.device_count() > 1:
        other = torch.zeros(1, device="cuda:1")
        assert _torch_ops._placement(other) == {"stream": torch.cuda.current_stream(1).cuda_stream}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device():
    q, k, v = (t.to("cuda:1") for t in make_qkv(1, 256, 256, 4, 4, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]))
    with torch.cuda.device(0):
        out = check_forward(q, k, v)
        grads = check_backward(q, k, v, causal=True)
        assert torch.cuda.current_device() == 0
    assert out.device == q.device
    assert all(g.device == q.device for g in grads)


# Head dims between and below the built ones (some not a multiple of 8, which the
# Python layer pads by a copy), up to the largest built one.
ANY_HEAD_DIMS = [
    d for d in (1, 40, 80, 111, 160, 255) if d <= max(BUILT_HEAD_DIMS, default=0) and d not in BUILT_HEAD_DIMS
]


@pytest.mark.parametrize("head_dim", ANY_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_any_head_dim_runs_on_the_next_built_kernel(head_dim, causal):
    """Forward and backward (GQA) at head dims no kernel was built for, with the default
    scale of the caller's head dim; out and the gradients have the caller's shapes."""
    q, k, v = make_qkv(2, 300, 257, 8, 2, head_dim, BUILT_DTYPES[0])
    out = check_forward(q, k, v, causal=causal)
    assert out.shape == q.shape
    grads = check_backward(q, k, v, causal=causal)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def run_or_skip_separate_head_dim_v(call):
    """call(), or a skip when the GPU refuses a separate V head dim, which its kernels do
    not take yet (src/api/targets.cpp); any other error fails the test."""
    try:
        return call()
    except NotImplementedError as e:
        if "a separate V head dim is not implemented on the GPU" not in str(e):
            raise
        pytest.skip(f"the GPU does not run a separate V head dim yet ({e})")


def skip_unless_built(*head_dims):
    largest = max(BUILT_HEAD_DIMS, default=0)
    if max(head_dims) > largest:
        pytest.skip(f"head dims {head_dims} past the largest built one ({largest})")


# V head dims of their own: DeepSeek-V3's prefill (192, 128), FlashAttention-3's
# (64, 256), and one whose q, k and v the Python layer pads (to 40 and 24) by a copy.
@pytest.mark.parametrize("head_dims", [(192, 128), (64, 256), (36, 20)], ids=lambda d: f"d{d[0]}-dv{d[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_separate_head_dim_v(head_dims, causal):
    skip_unless_built(*head_dims)
    head_dim, head_dim_v = head_dims
    q, k, v = make_qkv(2, 300, 257, 8, 2, head_dim, BUILT_DTYPES[0], head_dim_v=head_dim_v)
    out = run_or_skip_separate_head_dim_v(lambda: check_forward(q, k, v, causal=causal))
    assert out.shape == (2, 300, 8, head_dim_v)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_separate_head_dim_v(causal):
    """DeepSeek-V3's prefill head dims (192, 128): dv has v's shape, dq and dk q's and k's."""
    skip_unless_built(192, 128)
    q, k, v = make_qkv(2, 300, 257, 8, 2, 192, BUILT_DTYPES[0], head_dim_v=128)
    grads = run_or_skip_separate_head_dim_v(lambda: check_backward(q, k, v, causal=causal))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_head_dims_past_the_largest_built_and_unbuilt_dtypes_are_refused():
    # Multiples of 8: others are padded to one first, and the refusal names that.
    for head_dim in (max(BUILT_HEAD_DIMS) + 8, 264):
        with pytest.raises(NotImplementedError, match=f"head dim {head_dim} is not supported"):
            fa3.flash_attn_func(*make_qkv(1, 64, 64, 2, 2, head_dim, BUILT_DTYPES[0]))
    with pytest.raises(NotImplementedError, match="fp32 is not supported on the GPU"):
        fa3.flash_attn_func(*make_qkv(1, 64, 64, 2, 2, BUILT_HEAD_DIMS[0], torch.float32))


def test_head_dims_past_the_largest_built_and_unbuilt_dtypes_are_refused_by_the_backward():
    head_dims = (max(BUILT_HEAD_DIMS) + 8, 264)
    cases = [(d, BUILT_DTYPES[0], f"head dim {d} is not supported") for d in head_dims]
    cases.append((BUILT_HEAD_DIMS[0], torch.float32, "fp32 is not supported on the GPU"))
    for head_dim, dtype, message in cases:
        q, k, v = make_qkv(1, 64, 64, 2, 2, head_dim, dtype)
        lse = torch.zeros(1, 2, 64, device="cuda")
        with pytest.raises(NotImplementedError, match=message):
            torch.ops.fa3.bwd(q, q, k, v, q, lse, None, 0.0, False, -1, -1, 0.0, False)


@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("options", [{}, {"causal": True}, {"window_size": (100, 37), "softcap": 5.0}],
                         ids=["full", "causal", "window-softcap"])
def test_sinks(head_dim, options):
    """Sinks join each row's denominator on the GPU, forward and backward (their own
    gradient included). Causal with 400 queries on 300 keys leaves the first 100 rows
    without keys (lse: the sink, out 0)."""
    q, k, v = make_qkv(2, 400, 300, 4, 2, head_dim, BUILT_DTYPES[0])
    sinks = torch.tensor([0.5, -1.0, 2.5, -30.0], device="cuda")
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = fa3.flash_attn_func(*leaves[:3], sinks=leaves[3], return_attn_probs=True, **options)
    mask = reference_mask(options.get("causal", False), options.get("window_size", (-1, -1)),
                          options.get("softcap", 0.0))
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, sinks=sinks, **mask)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, sinks=sinks, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])
    check_close("lse", lse, ref_lse, low_lse)
    dout = make_dout(q)
    out.backward(dout)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, sinks=sinks, **mask)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, sinks=sinks, **mask)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        check_close(name, leaf.grad, r, lo, factor=3.0)
    # dsinks sums exp(sink - L_i) * rowsum(dout_i * out_i) over every row of a head, and
    # out is the forward's bf16/fp16 output, whose rounding does not cancel in that sum:
    # even an exact computation from it is ~1e-3 off the exact gradient. So the formula
    # on this call's out and lse to fp32 rounding, and the exact gradient within the
    # backward's cap (as the C++ tests, common/gpu_test_util.cu).
    d = (dout.double() * out.detach().double()).sum(-1).transpose(1, 2)  # (batch, heads, seqlen)
    own = -(torch.exp(sinks.double()[None, :, None] - lse.double()) * d).sum((0, 2))
    dsinks = leaves[3].grad.double()
    assert (dsinks - own).abs().max().item() <= 1e-5 + 1e-4 * own.abs().max().item()
    assert (dsinks - ref[3].double()).abs().max().item() <= 3e-2 * max(1.0, ref[3].abs().max().item())
    # The gradient is summed in a fixed order: the same bits again.
    again = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    fa3.flash_attn_func(*again[:3], sinks=again[3], **options).backward(dout)
    assert torch.equal(again[3].grad, leaves[3].grad)
    with pytest.raises(ValueError, match="sinks: is on cpu but q is on cuda"):
        fa3.flash_attn_func(q, k, v, sinks=sinks.cpu())


# Chunked attention (attention_chunk) on the general kernels: alone, causal, and under a
# window that crosses chunk edges; chunks of whole blocks, of fewer keys than a block
# (48) and of a number that is not a multiple of one (200). With more queries than keys
# the first queries' chunks hold no key: their out and dq are 0 and their lse -inf.
CHUNK_CASES = [
    ((400, 300), {"attention_chunk": 128}),
    ((400, 300), {"attention_chunk": 200, "causal": True}),
    ((300, 400), {"attention_chunk": 48, "causal": True}),
    ((300, 400), {"attention_chunk": 200, "window_size": (100, 37)}),
    ((1000, 1000), {"attention_chunk": 48}),
]
CHUNK_IDS = ["chunk-128", "chunk-200-causal", "chunk-48-causal", "chunk-200-window", "chunk-48-square"]


@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("seqlens, options", CHUNK_CASES, ids=CHUNK_IDS)
def test_attention_chunk(head_dim, seqlens, options):
    q, k, v = make_qkv(2, *seqlens, 4, 2, head_dim, BUILT_DTYPES[0], seed=21)
    mask = reference_mask(options.get("causal", False), options.get("window_size", (-1, -1)), 0.0)
    mask["chunk"] = options["attention_chunk"]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = fa3.flash_attn_func(*leaves, return_attn_probs=True, **options)
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, **mask)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])
    check_close("lse", lse, ref_lse, low_lse)
    dout = make_dout(q)
    out.backward(dout)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, **mask)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, **mask)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        check_close(name, leaf.grad, r, lo, factor=3.0)
    blind = seqlens[0] - seqlens[1]  # queries before key 0
    if blind > 0:
        assert torch.all(out[:, :blind] == 0) and torch.all(leaves[0].grad[:, :blind] == 0)
        assert torch.all(lse[:, :, :blind] == float("-inf"))


def test_attention_chunk_deterministic_backward():
    """deterministic=True under chunks: the same gradients bit for bit."""
    q, k, v = make_qkv(2, 700, 600, 8, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    dout = make_dout(q)
    runs = []
    for _ in range(3):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fa3.flash_attn_func(*leaves, causal=True, attention_chunk=200, deterministic=True).backward(dout)
        runs.append([t.grad for t in leaves])
    for later in runs[1:]:
        for name, g, f in zip(("dq", "dk", "dv"), later, runs[0]):
            assert torch.equal(g, f), name


def test_mixed_devices_are_refused():
    q, k, v = make_qkv(1, 16, 16, 2, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    with pytest.raises(ValueError, match="k: is on cpu but q is on cuda"):
        fa3.flash_attn_func(q, k.cpu(), v)


# Windows and softcaps the general kernels run (causal, window, softcap), as
# flash_attn_func takes them: a window on both sides, causal with a left side, one
# that leaves the first rows of the longer query sequence without keys, the softcap
# alone and with a window.
GENERAL_OPTIONS = [
    (False, (100, 37), 0.0),
    (True, (64, -1), 0.0),
    (False, (0, 0), 0.0),
    (False, (-1, -1), 20.0),
    (True, (200, -1), 5.0),
]
GENERAL_IDS = ["window", "causal-left", "diagonal", "softcap", "causal-window-softcap"]


def reference_mask(causal, window, softcap):
    """The reference's keywords for flash_attn_func's (causal, window_size, softcap)."""
    left, right = window
    return {"causal": causal, "window": (left, 0 if causal else right), "softcap": softcap}


@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("options", GENERAL_OPTIONS, ids=GENERAL_IDS)
def test_window_and_softcap(head_dim, options):
    causal, window, softcap = options
    q, k, v = make_qkv(2, 400, 300, 4, 2, head_dim, BUILT_DTYPES[0])
    out = fa3.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap)
    mask = reference_mask(causal, window, softcap)
    ref_out, _ = reference(q, k, v, dtype=torch.float32, **mask)
    low_out, _ = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])


@pytest.mark.parametrize("dtype", BUILT_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"sq{s[0]}-sk{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward(dtype, head_dim, seqlens, causal):
    check_backward(*make_qkv(2, *seqlens, 4, 4, head_dim, dtype), causal=causal)


@pytest.mark.parametrize("dtype", BUILT_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("heads", [(8, 2), (8, 1), (6, 3)], ids=["gqa", "mqa", "gqa-2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_grouped_query_heads(dtype, head_dim, heads, causal):
    """dk and dv are sums over each KV head's group of query heads."""
    check_backward(*make_qkv(2, 300, 257, *heads, head_dim, dtype), causal=causal)


def test_backward_many_batches_beyond_the_sm_count():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    check_backward(*make_qkv(sms + 7, 128, 128, 2, 1, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]), causal=True)


def test_backward_strided_inputs_and_rows_past_the_views():
    dtype, head_dim = BUILT_DTYPES[0], BUILT_HEAD_DIMS[0]
    qkv = torch.randn(2, 200, 3, 4, head_dim, device="cuda").to(dtype)
    qkv[:, 150:] = float("nan")  # past the views' seqlen: must never be read
    q, k, v = qkv[:, :150].unbind(2)
    dout_heads = torch.randn(2, 150, 8, head_dim, device="cuda").to(dtype)
    dout_heads[:, :, 4:] = float("nan")  # beside the dout view: must never be read
    dout = dout_heads[:, :, :4]
    assert not (q.is_contiguous() or dout.is_contiguous())
    check_backward(q, k, v, causal=True, dout=dout)


@pytest.mark.parametrize("seqlens", [(300, 100), (129, 128), (4224, 1)], ids=lambda s: f"sq{s[0]}-sk{s[1]}")
def test_backward_rows_that_see_no_key_are_zero(seqlens):
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k queries see no key.
    Their dq is exactly 0, and their dout, however large, reaches no dk or dv."""
    seqlen_q, seqlen_k = seqlens
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    dout = 100 * make_dout(q)
    dq, _, _ = check_backward(q, k, v, causal=True, dout=dout)
    assert torch.all(dq[:, : seqlen_q - seqlen_k] == 0)


@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("packed", ["5d", "4d"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked_backward(head_dim, packed, causal):
    """The gradient lands in qkv: dq, dk and dv in the slots q, k and v came from."""
    gen = torch.Generator().manual_seed(6)
    if packed == "5d":
        qkv = torch.randn(2, 333, 3, 4, head_dim, generator=gen)
        num_heads_q = None

        def split(t):
            return t.unbind(2)

    else:
        qkv = torch.randn(2, 333, 8 + 2 * 2, head_dim, generator=gen)
        num_heads_q = 8

        def split(t):
            return t.split([8, 2, 2], dim=2)

    qkv = qkv.to("cuda", BUILT_DTYPES[0]).requires_grad_()
    out = fa3.flash_attn_qkvpacked_func(qkv, causal=causal, num_heads_q=num_heads_q)
    dout = make_dout(out)
    out.backward(dout)
    q, k, v = split(qkv.detach())
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, causal=causal)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, causal=causal)
    for name, g, r, lo in zip(("dq", "dk", "dv"), split(qkv.grad), ref, low):
        check_close(name, g, r, lo, factor=3.0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_is_deterministic(causal):
    """deterministic=True: dq, dk and dv bitwise identical over 100 repeats. GQA, so that
    dk and dv are sums over query heads as well as over query blocks."""
    q, k, v = make_qkv(2, 1000, 1000, 8, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    dout = make_dout(q)
    first = check_backward(q, k, v, causal=causal, deterministic=True, dout=dout)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fa3.flash_attn_func(*leaves, causal=causal, deterministic=True)
    for repeat in range(100):
        grads = torch.autograd.grad(out, leaves, dout, retain_graph=True)
        for name, g, f in zip(("dq", "dk", "dv"), grads, first):
            assert torch.equal(g, f), f"{name} differs from the first run in repeat {repeat}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_graph_replays_forward_and_backward_as_eager(causal):
    """A training step's attention, forward and backward, captured into a CUDA graph
    (torch.cuda.graph, which captures on a side stream: autograd runs the backward on
    the forward's stream) replays to the eager step's out, dq, dk and dv bit for bit
    (deterministic mode, so that dq's sums run in one order), twice.

    Autograd nodes remember the stream they were made on, and the leaves' gradient
    accumulators live as long as a graph that reaches them: had the eager step's out
    kept its graph, the captured backward would make the legacy default stream, where
    those accumulators were made, wait on the capturing stream, which CUDA refuses
    (cudaErrorStreamCaptureImplicit). So the eager results are kept detached."""
    q, k, v = make_qkv(2, 300, 257, 8, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    dout = make_dout(q)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def step():
        out = fa3.flash_attn_func(*leaves, causal=causal, deterministic=True)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    eager = tuple(t.detach() for t in step())
    graph, captured = capture(step)
    for replay in range(2):
        for t in captured:
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, eager):
            assert torch.equal(got, want), f"{name} differs from the eager step in replay {replay}"


def test_backward_runs_on_the_current_stream():
    q, k, v = make_qkv(2, 512, 512, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    dout = make_dout(q)

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fa3.flash_attn_func(*leaves, causal=True, deterministic=True).backward(dout)
        return [t.grad for t in leaves]

    expected = grads()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = grads()
    torch.cuda.current_stream().wait_stream(side)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        assert torch.equal(g, e), name


_OPTION_NAMES = ("softmax_scale", "causal", "window_left", "window_right", "softcap", "deterministic")


def test_backward_takes_its_workspace_from_torch(monkeypatch):
    """fa3::bwd hands the extension a uint8 tensor on the inputs' device, of the size the
    size query gives, and 256-byte aligned as torch's caching allocator promises."""
    calls = []
    handoff = _torch_ops.call

    # Recorded before the handoff turns the tensors into DLPack capsules.
    def recording(fn, *args, **kwargs):
        if fn is _C.backward:
            calls.append((args, kwargs))
        return handoff(fn, *args, **kwargs)

    monkeypatch.setattr(_torch_ops, "call", recording)
    for deterministic in (False, True):
        for heads, seqlens in (((4, 4), (300, 257)), ((8, 2), (129, 1000)), ((8, 1), (17, 3))):
            q, k, v = make_qkv(2, *seqlens, *heads, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
            check_backward(q, k, v, causal=True, deterministic=deterministic)
    assert len(calls) == 6
    for args, kwargs in calls:
        workspace = kwargs["workspace"]
        assert workspace.dtype == torch.uint8 and workspace.dim() == 1 and workspace.device == args[1].device
        options = {name: kwargs[name] for name in _OPTION_NAMES}
        assert workspace.numel() == _C.backward_workspace_size(*args, **options)
        assert workspace.data_ptr() % 256 == 0


def backward_call(causal=True):
    """(tensors, options) for a direct _C.backward call, its dq, dk, dv filled with NaN."""
    q, k, v = make_qkv(2, 300, 257, 8, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    # What flash_attn_func passes for causal: the right window side is 0.
    options = {"causal": causal, "window_right": 0 if causal else -1, "deterministic": True}
    return (make_dout(q), q, k, v, out, lse, *grads), options


def test_workspace_contents_and_surplus_do_not_matter():
    """A workspace full of 0xFF, larger than needed and starting 256 bytes into its
    tensor, gives the gradients autograd gives (deterministic, so bit for bit)."""
    tensors, options = backward_call()
    dout, q, k, v = tensors[:4]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    fa3.flash_attn_func(*leaves, causal=True, deterministic=True).backward(dout)
    nbytes = _C.backward_workspace_size(*tensors, **options)
    dirty = torch.full((nbytes + 4096,), 0xFF, dtype=torch.uint8, device="cuda")[256:]
    _C.backward(*tensors, **options, workspace=dirty, stream=torch.cuda.current_stream().cuda_stream)
    for name, g, leaf in zip(("dq", "dk", "dv"), tensors[6:], leaves):
        assert torch.equal(g, leaf.grad), name


def test_bad_workspace_is_refused_and_outputs_untouched():
    tensors, options = backward_call()
    q = tensors[1]
    nbytes = _C.backward_workspace_size(*tensors, **options)
    assert nbytes > 0
    buffer = torch.empty(nbytes + 512, dtype=torch.uint8, device="cuda")
    cases = [
        (None, "workspace: .*null"),
        (buffer[: nbytes - 1], f"workspace: {nbytes - 1} bytes given"),
        (buffer[1 : nbytes + 1], "workspace: .*256-byte aligned"),
        (buffer[: nbytes // 4 * 4].view(torch.float32), "workspace: expected a 1-d uint8 array, got a 1-d float32"),
        (buffer[:nbytes].view(1, nbytes), "workspace: expected a 1-d uint8 array, got a 2-d uint8"),
        (buffer[::2], "workspace: must be contiguous"),
        (buffer.cpu(), f"workspace: is on cpu but q is on cuda:{q.device.index}"),
    ]
    stream = torch.cuda.current_stream().cuda_stream
    for workspace, message in cases:
        with pytest.raises(ValueError, match=message):
            _C.backward(*tensors, **options, workspace=workspace, stream=stream)
    torch.cuda.synchronize()
    for name, g in zip(("dq", "dk", "dv"), tensors[6:]):
        assert torch.isnan(g).all(), f"{name} was written by a rejected call"


@pytest.mark.parametrize("head_dim", BUILT_HEAD_DIMS)
@pytest.mark.parametrize("options", GENERAL_OPTIONS, ids=GENERAL_IDS)
def test_backward_window_and_softcap(head_dim, options):
    causal, window, softcap = options
    q, k, v = make_qkv(2, 400, 300, 4, 2, head_dim, BUILT_DTYPES[0])
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fa3.flash_attn_func(*leaves, causal=causal, window_size=window, softcap=softcap)
    dout = make_dout(q)
    out.backward(dout)
    mask = reference_mask(causal, window, softcap)
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, **mask)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, **mask)
    for name, leaf, r, lo in zip(("dq", "dk", "dv"), leaves, ref, low):
        check_close(name, leaf.grad, r, lo, factor=3.0)


def test_compile_with_inductor_forward_and_backward():
    """torch.compile(fullgraph=True) with inductor around flash_attn_func: the forward
    as eager's, and (deterministic) the same gradients bit for bit."""
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 256, 256, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]))

    def block(q, k, v):
        return fa3.flash_attn_func(q * 0.5, k, v, causal=True, deterministic=True).float().square().sum(dim=-1)

    expected = block(q, k, v)
    expected.sum().backward()
    eager_grads = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    result = torch.compile(block, fullgraph=True)(q, k, v)
    result.sum().backward()
    torch.testing.assert_close(result, expected, rtol=1e-3, atol=1e-3)
    for name, t, e in zip(("dq", "dk", "dv"), (q, k, v), eager_grads):
        assert torch.equal(t.grad, e), f"{name} differs between eager and compiled"
