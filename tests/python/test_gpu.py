"""flash_attn_func on CUDA tensors (fa3's Hopper kernels) against the torch reference.

Skipped, and reported as skipped, without PyTorch, without a CUDA device, on a GPU
other than Hopper (compute capability 9.0), or in a build without GPU kernels.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import ABS_CAP, check_close, reference, reference_grads  # noqa: E402

_BUILD = fa3.build_info()
_DTYPE_NAMES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BUILT_DTYPES = [_DTYPE_NAMES[name] for name in _BUILD["dtypes"]]
BUILT_HEAD_DIMS = _BUILD["head_dims"]


def _skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"{torch.cuda.get_device_name()} is not a Hopper GPU (compute capability 9.0)"
    if not _BUILD["gpu_kernels"]:
        return "fa3 was built without GPU kernels"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))

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


def make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape_q = (batch, seqlen_q, nheads, head_dim)
    shape_k = (batch, seqlen_k, nheads_k, head_dim)
    return [torch.randn(s, generator=gen, device="cuda").to(dtype) for s in (shape_q, shape_k, shape_k)]


def check_forward(q, k, v, causal=False):
    out, lse = fa3.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    ref_out, ref_lse = reference(q, k, v, dtype=torch.float32, causal=causal)
    low_out, low_lse = reference(q, k, v, dtype=q.dtype, causal=causal)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])
    check_close("lse", lse, ref_lse, low_lse)
    return out


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


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_another_device():
    q, k, v = (t.to("cuda:1") for t in make_qkv(1, 256, 256, 4, 4, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]))
    with torch.cuda.device(0):
        out = check_forward(q, k, v)
        assert torch.cuda.current_device() == 0
    assert out.device == q.device


def test_unbuilt_head_dims_and_dtypes_are_refused():
    for head_dim in sorted({64, 96, 128, 192, 256} - set(BUILT_HEAD_DIMS)) + [72]:
        with pytest.raises(NotImplementedError, match=f"head dim {head_dim} is not supported"):
            fa3.flash_attn_func(*make_qkv(1, 64, 64, 2, 2, head_dim, BUILT_DTYPES[0]))
    with pytest.raises(NotImplementedError, match="fp32 is not supported on the GPU"):
        fa3.flash_attn_func(*make_qkv(1, 64, 64, 2, 2, BUILT_HEAD_DIMS[0], torch.float32))


def test_mixed_devices_are_refused():
    q, k, v = make_qkv(1, 16, 16, 2, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    with pytest.raises(ValueError, match="k: is on cpu but q is on cuda"):
        fa3.flash_attn_func(q, k.cpu(), v)


@pytest.mark.parametrize("options", [{"window_size": (64, 0)}, {"softcap": 20.0}], ids=["window", "softcap"])
def test_window_and_softcap_match_or_are_refused(options):
    """The GPU kernels lack these for now: the C++ layer refuses them by name. Once
    implemented, the same call must match the reference."""
    q, k, v = make_qkv(2, 300, 300, 4, 4, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])
    try:
        out = fa3.flash_attn_func(q, k, v, **options)
    except NotImplementedError as e:
        assert ("window" in str(e)) if "window_size" in options else ("softcap" in str(e))
        return
    mask = {"window": options["window_size"]} if "window_size" in options else options
    ref_out, _ = reference(q, k, v, dtype=torch.float32, **mask)
    low_out, _ = reference(q, k, v, dtype=q.dtype, **mask)
    check_close("out", out, ref_out, low_out, abs_cap=ABS_CAP[q.dtype])


def test_backward_matches_or_is_refused():
    """fa3::backward is not implemented on the GPU yet: .backward() must raise
    NotImplementedError saying so. Once implemented, it must match the reference."""
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 200, 200, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0]))
    out = fa3.flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(out)
    try:
        out.backward(dout)
    except NotImplementedError as e:
        assert "backward" in str(e)
        return
    got = [t.grad for t in (q, k, v)]
    ref = reference_grads(q, k, v, dout, dtype=torch.float32, causal=True)
    low = reference_grads(q, k, v, dout, dtype=q.dtype, causal=True)
    for name, g, r, lo in zip(("dq", "dk", "dv"), got, ref, low):
        check_close(name, g, r, lo, factor=3.0)


def test_compile_with_inductor():
    q, k, v = make_qkv(2, 256, 256, 4, 2, BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])

    def block(q, k, v):
        return fa3.flash_attn_func(q * 0.5, k, v, causal=True).float().square().sum(dim=-1)

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), rtol=1e-3, atol=1e-3)
