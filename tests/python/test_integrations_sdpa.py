"""fa3 as the flash backend of torch's scaled_dot_product_attention: registration,
activation and restoration through torch.nn.attention, and SDPA's results and gradients
with fa3 active against torch's math backend, on the CPU flash backend here and the GPU
one on a Hopper machine. Skipped when torch has no flash-attention registry.
"""

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
    pytest.skip("this torch has no torch.nn.attention.register_flash_attention_impl", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import fa3.interface  # noqa: E402
import fa3.integrations.sdpa as fa3_sdpa  # noqa: E402
from gpu_support import gpu_skip_reason  # noqa: E402

attention = torch.nn.attention


@pytest.fixture
def fa3_active(monkeypatch):
    """fa3 active for one test, restored after it; counts fa3's forward calls."""
    calls = []
    forward = fa3.interface.flash_attn_func

    def counted(*args, **kwargs):
        calls.append(args[0].device.type)
        return forward(*args, **kwargs)

    monkeypatch.setattr(fa3.interface, "flash_attn_func", counted)
    fa3_sdpa.register()
    attention.activate_flash_attention_impl("fa3")
    yield calls
    attention.restore_flash_attention_impl()


def _inputs(batch, heads, heads_k, seqlen_q, seqlen_k, head_dim, dtype=torch.float32, device="cpu"):
    generator = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, heads, seqlen_q, head_dim, dtype=dtype, device=device, generator=generator)
    k, v = (
        torch.randn(batch, heads_k, seqlen_k, head_dim, dtype=dtype, device=device, generator=generator)
        for _ in range(2)
    )
    return tuple(t.requires_grad_() for t in (q, k, v))


def _sdpa(backend, q, k, v, **options):
    """SDPA's output and gradients of sum(out * weights) on one backend."""
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **options)
    weights = torch.randn(out.shape, generator=torch.Generator(device=out.device).manual_seed(1), device=out.device)
    grads = torch.autograd.grad((out * weights.to(out.dtype)).sum(), (q, k, v))
    return (out,) + grads


def _max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


def test_register_lists_fa3_and_is_idempotent():
    fa3_sdpa.register()
    fa3_sdpa.register()
    assert attention.list_flash_attention_impls().count("fa3") == 1


def test_activation_and_restoration(fa3_active):
    assert attention.current_flash_attention_impl() == "fa3"
    q, k, v = _inputs(1, 2, 2, 5, 5, 16)
    _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v)
    assert fa3_active == ["cpu"]
    attention.restore_flash_attention_impl()
    assert attention.current_flash_attention_impl() is None
    # torch's own CPU flash kernel again: fa3 is not called.
    _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v)
    assert fa3_active == ["cpu"]
    attention.activate_flash_attention_impl("fa3")


@pytest.mark.parametrize(
    "shape",
    [
        (2, 4, 4, 9, 9, 16),  # MHA
        (2, 4, 2, 17, 17, 32),  # GQA
        (1, 3, 1, 5, 11, 8),  # MQA, more keys than queries
        (1, 2, 2, 13, 6, 24),  # more queries than keys
    ],
)
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpu_flash_backend_equals_math(fa3_active, shape, is_causal):
    q, k, v = _inputs(*shape)
    if is_causal and shape[4] > shape[3]:
        with pytest.raises(NotImplementedError, match="is_causal"):
            _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, is_causal=True)
        return
    got = _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, is_causal=is_causal, scale=0.3)
    want = _sdpa(SDPBackend.MATH, q, k, v, is_causal=is_causal, scale=0.3)
    assert fa3_active == ["cpu"]
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert _max_diff(a, b) <= 1e-5, name


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_cpu_explicit_masks_equal_math(fa3_active, monkeypatch, mask_dtype, is_causal):
    masked_calls = []
    masked_forward = fa3_sdpa._masked_forward
    monkeypatch.setattr(
        fa3_sdpa, "_masked_forward", lambda *args: masked_calls.append(1) or masked_forward(*args)
    )
    q, k, v = _inputs(2, 4, 2, 7, 7, 16)
    keep = torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(2)) > 0.3
    keep[:, :, :, 0] = True  # every row keeps a key, as the math backend needs
    if mask_dtype == torch.bool:
        mask = keep
    else:
        mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf")) + torch.randn(keep.shape)
    if is_causal:
        # SDPA takes a mask or is_causal; the operator itself takes both.
        q, k, v = (t.detach() for t in (q, k, v))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True, attn_mask=mask)
        causal = torch.ones(7, 7, dtype=torch.bool).tril()
        both = (mask & causal) if mask_dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=both, enable_gqa=True)
        assert _max_diff(out, want) <= 1e-5
        assert masked_calls
        return
    got = _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, attn_mask=mask)
    want = _sdpa(SDPBackend.MATH, q, k, v, attn_mask=mask)
    assert fa3_active == [] and masked_calls
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert _max_diff(a, b) <= 1e-5, name


def test_refusals_name_the_argument(fa3_active):
    q, k, v = _inputs(1, 2, 2, 5, 5, 16)
    # SDPA never picks the CPU flash backend with dropout; the operator itself still refuses.
    with pytest.raises(NotImplementedError, match="dropout_p"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.5)


def _packed(device="cpu", dtype=torch.float32, head_dim=32):
    """A packed batch of three sequences (lengths 5, 0, 9), 4 query heads on 2 KV heads."""
    generator = torch.Generator(device=device).manual_seed(2)
    cu = torch.tensor([0, 5, 5, 14], dtype=torch.int32, device=device)
    q = torch.randn(14, 4, head_dim, dtype=dtype, device=device, generator=generator)
    k, v = (torch.randn(14, 2, head_dim, dtype=dtype, device=device, generator=generator) for _ in range(2))
    dout = torch.randn(14, 4, head_dim, dtype=dtype, device=device, generator=generator)
    return q, k, v, dout, cu


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("window", [(None, None), (3, 0)])
def test_flash_operators_run_packed_batches_forward_and_backward(is_causal, window):
    """aten's flash forward and backward on a packed batch (torch.nn.attention.varlen's
    way in) give fa3.flash_attn_varlen_func's out, lse and gradients, bitwise (the
    operators called directly, on the CPU path)."""
    q, k, v, dout, cu = _packed()
    left, right = window
    out, lse, *_ = fa3_sdpa._flash_forward(
        q, k, v, cu, cu, 9, 9, 0.0, is_causal, False, window_size_left=left, window_size_right=right
    )
    grads = fa3_sdpa._flash_backward(
        dout, q, k, v, out, lse, cu, cu, 9, 9, 0.0, is_causal, torch.empty(0), torch.empty(0),
        window_size_left=left, window_size_right=right,
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    window_size = (-1 if left is None else left, -1 if right is None else right)
    want, want_lse = fa3.interface.flash_attn_varlen_func(
        *leaves, cu, cu, 9, 9, causal=is_causal, window_size=window_size, return_attn_probs=True
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    want_grads = torch.autograd.grad(want, leaves, dout)
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
@pytest.mark.skipif(not hasattr(attention, "varlen"), reason="this torch has no torch.nn.attention.varlen")
def test_gpu_varlen_attn_trains_on_fa3(fa3_active):
    """torch.nn.attention.varlen.varlen_attn with fa3 active, forward and backward, per
    sequence within bf16's rule of the math backend in fp32."""
    q, k, v, dout, cu = _packed("cuda", torch.bfloat16, 128)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention.varlen.varlen_attn(*leaves, cu, cu, 9, 9, is_causal=True)
    grads = torch.autograd.grad(out, leaves, dout)
    for start, end in ((0, 5), (5, 14)):
        seq = [t[start:end].detach().float().transpose(0, 1).requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(*seq, is_causal=True, enable_gqa=True)
        ref_grads = torch.autograd.grad(ref, seq, dout[start:end].float().transpose(0, 1))
        assert _max_diff(out[start:end], ref.transpose(0, 1)) < 2e-2
        for got, want in zip(grads, ref_grads):
            assert _max_diff(got[start:end], want.transpose(0, 1)) < 5e-2


@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
@pytest.mark.parametrize("is_causal", [False, True])
def test_gpu_flash_backend_within_the_rule(fa3_active, is_causal):
    q, k, v = _inputs(2, 8, 2, 300, 300, 128, torch.bfloat16, "cuda")
    got = _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, is_causal=is_causal)
    assert "cuda" in fa3_active
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = _sdpa(SDPBackend.MATH, *exact, is_causal=is_causal)
    low = _sdpa(SDPBackend.MATH, q, k, v, is_causal=is_causal)
    # TESTING.md's rule: 2x the low-precision reference's error forward, 3x backward.
    for factor, a, r, lo in zip((2, 3, 3, 3), got, ref, low):
        assert _max_diff(a, r) <= factor * _max_diff(lo, r) + 1e-5


def test_transformers_sdpa_model_with_padding_while_fa3_is_active(fa3_active):
    # transformers' "sdpa" attention passes 4-d boolean masks, which the CPU flash
    # backend takes and fa3 computes plainly: the logits stay those of eager attention.
    transformers = pytest.importorskip("transformers")
    config = dict(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )
    input_ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(5))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    logits = {}
    for name in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(attn_implementation=name, **config)).eval()
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            logits[name] = model(input_ids=input_ids, attention_mask=attention_mask).logits
    kept = attention_mask.bool()
    assert _max_diff(logits["sdpa"][kept], logits["eager"][kept]) <= 1e-5
