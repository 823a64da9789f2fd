"""fa3's torch integration: custom ops, fake (shape-only) implementations, autograd
registration, and torch.compile(fullgraph=True) tracing flash_attn_func.

CPU tensors and the aot_eager backend (which traces like inductor but generates no
code), so it runs anywhere with PyTorch; test_gpu.py compiles with inductor on a GPU.
The tests parametrized by device run on CUDA tensors too where a Hopper GPU and
fa3's kernels are present, and are reported as skipped elsewhere.
"""

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from gpu_support import BUILT_DTYPES, BUILT_HEAD_DIMS, gpu_skip_reason  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))),
]


def make_qkv(
    batch,
    seqlen_q,
    seqlen_k,
    nheads,
    nheads_k,
    head_dim,
    dtype=torch.bfloat16,
    requires_grad=False,
    device="cpu",
    head_dim_v=None,
):
    """q, k of head_dim; v of head_dim_v (default: head_dim)."""
    gen = torch.Generator().manual_seed(11)
    tensors = [
        torch.randn(batch, seqlen_q, nheads, head_dim, generator=gen).to(device, dtype),
        torch.randn(batch, seqlen_k, nheads_k, head_dim, generator=gen).to(device, dtype),
        torch.randn(batch, seqlen_k, nheads_k, head_dim_v or head_dim, generator=gen).to(device, dtype),
    ]
    return [t.requires_grad_(requires_grad) for t in tensors]


def kernel_case(device):
    """(head_dim, dtype) that `device` runs: on CUDA, one this build compiled."""
    return (64, torch.bfloat16) if device == "cpu" else (BUILT_HEAD_DIMS[0], BUILT_DTYPES[0])


@pytest.mark.parametrize(
    "dtype, out_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.float8_e4m3fn, torch.bfloat16)],
)
def test_fake_shapes(dtype, out_dtype):
    with FakeTensorMode():
        q = torch.empty(3, 100, 8, 128, dtype=dtype)
        k = torch.empty(3, 70, 2, 128, dtype=dtype)
        out, lse = fa3.flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
        assert out.shape == (3, 100, 8, 128) and out.dtype == out_dtype
        assert lse.shape == (3, 8, 100) and lse.dtype == torch.float32
        dq, dk, dv, dsinks = torch.ops.fa3.bwd(out, q, k, k, out, lse, None, 0.0, True, -1, 0, 0.0, False)
        assert (dq.shape, dk.shape, dv.shape, dsinks.shape) == (q.shape, k.shape, k.shape, (0,))
        sinks = torch.empty(8)
        assert fa3.flash_attn_func(q, k, k, causal=True, sinks=sinks).shape == (3, 100, 8, 128)
        dsinks = torch.ops.fa3.bwd(out, q, k, k, out, lse, sinks, 0.0, True, -1, 0, 0.0, False)[3]
        assert dsinks.shape == (8,) and dsinks.dtype == torch.float32


def test_fake_shapes_of_a_separate_head_dim_v():
    """out and dout have v's head dim, dv v's shape (DeepSeek-V3's (192, 128))."""
    with FakeTensorMode():
        q = torch.empty(3, 100, 8, 192, dtype=torch.bfloat16)
        k = torch.empty(3, 70, 2, 192, dtype=torch.bfloat16)
        v = torch.empty(3, 70, 2, 128, dtype=torch.bfloat16)
        out, lse = fa3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == (3, 100, 8, 128) and lse.shape == (3, 8, 100)
        dq, dk, dv, _ = torch.ops.fa3.bwd(out, q, k, v, out, lse, None, 0.0, True, -1, 0, 0.0, False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_meta_tensors_give_shapes():
    q = torch.empty(2, 33, 8, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 40, 4, 64, device="meta", dtype=torch.bfloat16)
    out, lse = fa3.flash_attn_func(q, k, k, return_attn_probs=True)
    assert out.device.type == "meta" and out.shape == q.shape
    assert lse.shape == (2, 8, 33)
    v = torch.empty(2, 40, 4, 512, device="meta", dtype=torch.bfloat16)
    assert fa3.flash_attn_func(q, k, v).shape == (2, 33, 8, 512)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("heads, causal", [((4, 2), True), ((4, 4), False), ((4, 1), True)], ids=["gqa", "mha", "mqa"])
def test_opcheck_forward_and_backward(device, deterministic, heads, causal):
    """torch.library.opcheck: schema, fake implementation, autograd registration, AOT dispatch."""
    head_dim, dtype = kernel_case(device)
    q, k, v = make_qkv(2, 17, 23, *heads, head_dim, dtype, requires_grad=True, device=device)
    options = (0.0, causal, -1, 0 if causal else -1, 0.0, deterministic)
    torch.library.opcheck(torch.ops.fa3.fwd.default, (q, k, v, None, *options))
    out, lse = torch.ops.fa3.fwd(q, k, v, None, *options)
    dout = torch.randn_like(out)
    args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, None, *options)
    torch.library.opcheck(torch.ops.fa3.bwd.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_sm_margin(device):
    """opcheck with sm_margin, the ops' last argument, which autograd carries from the
    forward to the backward as it carries the other options."""
    head_dim, dtype = kernel_case(device)
    q, k, v = make_qkv(2, 17, 23, 4, 2, head_dim, dtype, requires_grad=True, device=device)
    options = (0.0, True, -1, 0, 0.0, True, 0, 3)
    torch.library.opcheck(torch.ops.fa3.fwd.default, (q, k, v, None, *options))
    out, lse = torch.ops.fa3.fwd(q, k, v, None, *options)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, None, *options)
    torch.library.opcheck(torch.ops.fa3.bwd.default, args)
    # The same gradients as without a margin (deterministic: bitwise on the GPU too).
    grads = torch.autograd.grad(fa3.flash_attn_func(q, k, v, causal=True, deterministic=True, sm_margin=3).sum(),
                                (q, k, v))
    plain = torch.autograd.grad(fa3.flash_attn_func(q, k, v, causal=True, deterministic=True).sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(grads, plain))


@pytest.mark.parametrize("heads, causal", [((4, 2), True), ((4, 4), False)], ids=["gqa", "mha"])
def test_opcheck_with_sinks(heads, causal):
    """opcheck with sinks, an input that requires grad (on CPU tensors: the GPU has no sinks yet)."""
    q, k, v = make_qkv(2, 17, 23, *heads, 64, requires_grad=True)
    sinks = torch.randn(heads[0], generator=torch.Generator().manual_seed(12)).requires_grad_()
    options = (0.0, causal, -1, 0 if causal else -1, 0.0, False)
    torch.library.opcheck(torch.ops.fa3.fwd.default, (q, k, v, sinks, *options))
    out, lse = torch.ops.fa3.fwd(q, k, v, sinks, *options)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, sinks.detach(), *options)
    torch.library.opcheck(torch.ops.fa3.bwd.default, args)


@pytest.mark.parametrize("head_dims", [(192, 128), (40, 72)], ids=["d192-dv128", "d40-dv72"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_opcheck_separate_head_dim_v(head_dims, causal):
    """opcheck with v of a head dim of its own (on CPU tensors: the GPU refuses one yet)."""
    q, k, v = make_qkv(2, 17, 23, 4, 2, head_dims[0], requires_grad=True, head_dim_v=head_dims[1])
    options = (0.0, causal, -1, 0 if causal else -1, 0.0, False)
    torch.library.opcheck(torch.ops.fa3.fwd.default, (q, k, v, None, *options))
    out, lse = torch.ops.fa3.fwd(q, k, v, None, *options)
    args = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse, None, *options)
    torch.library.opcheck(torch.ops.fa3.bwd.default, args)


def attention_block(q, k, v):
    """A small graph around flash_attn_func, as a model would have it."""
    out = fa3.flash_attn_func(q * 0.5, k, v, causal=True)
    return out.float().square().sum(dim=-1)


def test_compile_fullgraph_forward():
    q, k, v = make_qkv(2, 40, 40, 4, 2, 64)
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k, v), attention_block(q, k, v))


def test_compile_fullgraph_backward():
    q, k, v = make_qkv(2, 40, 40, 4, 2, 64, requires_grad=True)
    attention_block(q, k, v).sum().backward()
    eager = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True, backend="aot_eager")
    compiled(q, k, v).sum().backward()
    for name, e, t in zip("qkv", eager, (q, k, v)):
        assert torch.equal(t.grad, e), f"d{name} differs between eager and compiled"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", ["5d", "4d"])
def test_compile_fullgraph_qkvpacked_deterministic_backward(device, packed):
    """Forward and backward of flash_attn_qkvpacked_func, deterministic, traced whole:
    the same gradients, bit for bit, as eager."""
    head_dim, dtype = kernel_case(device)
    heads = 8 + 2 * 2 if packed == "4d" else 4
    shape = (2, 37, 3, heads, head_dim) if packed == "5d" else (2, 37, heads, head_dim)
    qkv = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(device, dtype).requires_grad_()
    num_heads_q = None if packed == "5d" else 8  # 4d: GQA 8:2

    def block(qkv):
        out = fa3.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True, num_heads_q=num_heads_q)
        return out.float().square().sum()

    block(qkv).backward()
    eager = qkv.grad.clone()
    qkv.grad = None
    torch._dynamo.reset()
    torch.compile(block, fullgraph=True, backend="aot_eager")(qkv).backward()
    assert torch.equal(qkv.grad, eager)


def test_compile_fullgraph_with_sinks():
    """Forward and backward with sinks traced whole: out and every gradient, the sinks'
    included, bit for bit as eager."""
    q, k, v = make_qkv(2, 40, 30, 4, 2, 64, requires_grad=True)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(13)).requires_grad_()

    def block(q, k, v, sinks):
        return fa3.flash_attn_func(q * 0.5, k, v, causal=True, sinks=sinks).float().square().sum()

    expected = block(q, k, v, sinks)
    expected.backward()
    eager = [t.grad.clone() for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    torch._dynamo.reset()
    result = torch.compile(block, fullgraph=True, backend="aot_eager")(q, k, v, sinks)
    result.backward()
    assert torch.equal(result, expected)
    for name, e, t in zip(("dq", "dk", "dv", "dsinks"), eager, (q, k, v, sinks)):
        assert torch.equal(t.grad, e), f"{name} differs between eager and compiled"


def test_compile_fullgraph_separate_head_dim_v():
    """Forward and backward with v's head dim 128 against q's 192, traced whole: out and
    every gradient bit for bit as eager."""
    q, k, v = make_qkv(2, 40, 30, 4, 2, 192, requires_grad=True, head_dim_v=128)
    expected = attention_block(q, k, v).sum()
    expected.backward()
    eager = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    torch._dynamo.reset()
    result = torch.compile(attention_block, fullgraph=True, backend="aot_eager")(q, k, v).sum()
    result.backward()
    assert torch.equal(result, expected)
    for name, e, t in zip(("dq", "dk", "dv"), eager, (q, k, v)):
        assert t.grad.shape == t.shape and torch.equal(t.grad, e), f"{name} differs between eager and compiled"


def test_compile_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(attention_block, fullgraph=True, backend="aot_eager", dynamic=True)
    for seqlen in (24, 31, 57):
        q, k, v = make_qkv(1, seqlen, seqlen + 3, 4, 2, 64)
        assert torch.equal(compiled(q, k, v), attention_block(q, k, v))


def test_compile_with_options():
    q, k, v = make_qkv(1, 30, 30, 4, 4, 64)

    def windowed(q, k, v):
        return fa3.flash_attn_func(q, k, v, softmax_scale=0.2, window_size=(8, 2), softcap=10.0, return_attn_probs=True)

    torch._dynamo.reset()
    out, lse = torch.compile(windowed, fullgraph=True, backend="aot_eager")(q, k, v)
    eager_out, eager_lse = windowed(q, k, v)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_compile_rejects_unsupported_option_at_trace_time():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 64)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda q, k, v: fa3.flash_attn_func(q, k, v, num_splits=4), fullgraph=True, backend="aot_eager"
    )
    # Dynamo reports the error raised while tracing as an Unsupported graph break
    # that carries the original message.
    with pytest.raises((NotImplementedError, torch._dynamo.exc.Unsupported), match="num_splits=4: split-KV"):
        compiled(q, k, v)
