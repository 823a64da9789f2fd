"""fa3.merge_attention_states: partial results over parts of the keys merge to the
attention over all of them; rows that saw no key; dtypes; the rules on its arguments.
CPU tensors run fa3's C++ merge, checked here also against a merge in torch operations;
CUDA tensors (on a Hopper GPU) run fa3's merge kernel, checked against the C++ merge.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from fa3 import _merge  # noqa: E402
from gpu_support import hopper_skip_reason  # noqa: E402

needs_hopper = pytest.mark.skipif(hopper_skip_reason() is not None, reason=str(hopper_skip_reason()))


def torch_merge(outs, lses):
    """The merge in torch operations, fp32 throughout: a reference independent of fa3's."""
    lse_parts = torch.stack([t.detach().float() for t in lses])
    lse = torch.logsumexp(lse_parts, dim=0)
    # A row that saw no key anywhere has lse -inf; measured from 0 instead, each part's
    # weight is exp(-inf) = 0 rather than exp(-inf - -inf) = NaN.
    finite_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(lse_parts - finite_lse).permute(0, 1, 3, 2).unsqueeze(-1)
    out = torch.zeros(outs[0].shape, dtype=torch.float32, device=outs[0].device)
    for weight, part in zip(weights, outs):
        # A part that saw none of a row's keys (weight 0) adds nothing, whatever it holds.
        out += torch.where(weight > 0, weight * part.detach().float(), 0.0)
    return out.to(outs[0].dtype), lse


def make_qkv(seqlen_q=9, seqlen_k=20, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, seqlen_q, 4, 16, generator=gen).to(dtype)
    k = torch.randn(2, seqlen_k, 2, 16, generator=gen).to(dtype)
    v = torch.randn(2, seqlen_k, 2, 16, generator=gen).to(dtype)
    return q, k, v


def partial(q, k, v, begin, end):
    return fa3.flash_attn_func(q, k[:, begin:end], v[:, begin:end], return_attn_probs=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_two_halves_merge_to_the_whole(dtype):
    q, k, v = make_qkv(dtype=dtype)
    full_out, full_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    out, lse = fa3.merge_attention_states(*partial(q, k, v, 0, 7), *partial(q, k, v, 7, 20))
    assert out.dtype == dtype and lse.dtype == torch.float32
    # Each part's output is rounded to dtype once before the merge, the whole once.
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    torch.testing.assert_close(out.float(), full_out.float(), atol=tol, rtol=0)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("merge", [_merge.merge_attention_states_list, torch_merge])
def test_list_of_parts(merge):
    q, k, v = make_qkv()
    parts = [partial(q, k, v, b, e) for b, e in ((0, 1), (1, 8), (8, 20))]
    out, lse = merge([p[0] for p in parts], [p[1] for p in parts])
    full_out, full_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.testing.assert_close(out, full_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("merge", [_merge.merge_attention_states_list, torch_merge])
def test_rows_that_saw_no_key_give_zero_and_minus_infinity(merge):
    out_a = torch.zeros(1, 3, 2, 4)
    out_b = torch.randn(1, 3, 2, 4)
    lse_a = torch.full((1, 2, 3), -math.inf)
    lse_b = torch.full((1, 2, 3), -math.inf)
    lse_b[0, 1, 2] = 0.25
    out, lse = merge([out_a, out_b], [lse_a, lse_b])
    assert not out.isnan().any() and not lse.isnan().any()
    expected = torch.zeros_like(out)
    expected[0, 2, 1] = out_b[0, 2, 1]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    expected_lse = torch.full_like(lse, -math.inf)
    expected_lse[0, 1, 2] = 0.25
    assert torch.equal(lse, expected_lse)


def test_the_torch_merge_equals_the_cpp_merge():
    gen = torch.Generator().manual_seed(3)
    outs = [torch.randn(2, 5, 3, 8, generator=gen).to(torch.bfloat16) for _ in range(3)]
    lses = [torch.randn(2, 3, 5, generator=gen) * 4 for _ in range(3)]
    cpp = fa3.merge_attention_states_list(outs, lses)
    ref = torch_merge(outs, lses)
    torch.testing.assert_close(cpp[1], ref[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(cpp[0].float(), ref[0].float(), atol=1e-2, rtol=0)


def test_parts_of_mixed_dtypes_merge_in_fp32():
    """An fp32 running result takes in a bf16 part, as ring attention's steps do."""
    gen = torch.Generator().manual_seed(5)
    outs = [torch.randn(2, 5, 3, 8, generator=gen), torch.randn(2, 5, 3, 8, generator=gen).to(torch.bfloat16)]
    lses = [torch.randn(2, 3, 5, generator=gen) * 4 for _ in range(2)]
    out, lse = fa3.merge_attention_states_list(outs, lses)
    ref_out, ref_lse = torch_merge(outs, lses)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=0)


def test_strided_parts():
    outs = [torch.randn(2, 4, 5, 3).transpose(1, 2) for _ in range(2)]
    lses = [torch.randn(2, 4, 5) for _ in range(2)]
    cpp = fa3.merge_attention_states_list(outs, lses)
    ref = torch_merge(outs, lses)
    torch.testing.assert_close(cpp, ref, atol=1e-6, rtol=0)


def test_results_carry_no_gradient():
    outs = [torch.randn(1, 2, 1, 4, requires_grad=True) for _ in range(2)]
    lses = [torch.randn(1, 1, 2) for _ in range(2)]
    out, lse = fa3.merge_attention_states_list(outs, lses)
    assert not out.requires_grad and not lse.requires_grad


BAD = [
    (lambda o, l: ([], []), ValueError, "outs: at least one part is needed, got none"),
    (lambda o, l: (o, l[:1]), ValueError, "lses: one per part is needed: got 1 for 2 outs"),
    (lambda o, l: ([o[0], "x"], l), TypeError, r"outs\[1\]: expected a torch.Tensor, got str"),
    (lambda o, l: (o, [l[0], l[1].half()]), ValueError, r"lses\[1\]: dtype must be fp32, got fp16"),
    (lambda o, l: ([o[0], o[1][:, :2]], l), ValueError, r"outs\[1\]: shape \(2, 2, 4, 8\) differs"),
    (lambda o, l: (o, [l[0], l[1].transpose(1, 2)]), ValueError, r"lses\[1\]: shape \(2, 3, 4\) must be"),
    (lambda o, l: (o, [l[0], l[1].to("meta")]), ValueError, r"lses\[1\]: on meta, but outs\[0\] is on cpu"),
]


@pytest.mark.parametrize("breaks, error, message", BAD)
def test_bad_arguments_name_the_argument(breaks, error, message):
    outs = [torch.randn(2, 3, 4, 8) for _ in range(2)]
    lses = [torch.randn(2, 4, 3) for _ in range(2)]
    with pytest.raises(error, match=message):
        fa3.merge_attention_states_list(*breaks(outs, lses))


# ---- CUDA tensors: fa3's merge kernel ----


def random_parts(parts, shape, dtype, device, seed, make_out=None):
    """parts partial results with rows no part saw (every seventh) and, in the others,
    parts that saw none of a row's keys (lse -inf, NaN in their output)."""
    gen = torch.Generator().manual_seed(seed)
    batch, seqlen, nheads, _ = shape
    outs, lses = [], []
    rows = torch.arange(batch * nheads * seqlen).view(batch, nheads, seqlen)
    for i in range(parts):
        out = torch.randn(*shape, generator=gen).to(dtype)
        lse = torch.randn(batch, nheads, seqlen, generator=gen) * 3
        dead = (rows % 7 == 3) | ((rows + i) % 5 == 0) if parts > 1 else rows % 7 == 3
        lse[dead] = -math.inf
        out.permute(0, 2, 1, 3)[dead] = math.nan
        outs.append((make_out or (lambda t: t))(out.to(device)))
        lses.append(lse.to(device))
    return outs, lses


def assert_matches_the_cpp_merge(outs, lses, out, lse):
    want_out, want_lse = fa3.merge_attention_states_list([t.cpu() for t in outs], [t.cpu() for t in lses])
    assert out.device == outs[0].device and out.dtype == outs[0].dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    # fp32 sums in another order, then each result rounded to the 16-bit type: where the
    # two fp32 values straddle a rounding boundary they land on adjacent values, one unit
    # in the last place apart (2^-10 relative for fp16, 2^-7 for bf16, at most).
    rel = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}[out.dtype]
    torch.testing.assert_close(out.cpu().float(), want_out.float(), atol=1e-5, rtol=rel)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)
    dead = torch.isneginf(want_lse)
    assert torch.equal(lse.cpu()[dead], want_lse[dead])
    assert torch.all(out.cpu().permute(0, 2, 1, 3)[dead] == 0)


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("parts", [1, 2, 3, 17])
@pytest.mark.parametrize("headdim", [8, 20, 64, 128, 256])
def test_cuda_merge_matches_the_cpp_merge(dtype, parts, headdim):
    outs, lses = random_parts(parts, (2, 37, 3, headdim), dtype, "cuda", seed=parts * 1000 + headdim)
    out, lse = fa3.merge_attention_states_list(outs, lses)
    assert_matches_the_cpp_merge(outs, lses, out, lse)


STRIDED = {
    # (batch, nheads, seqlen, headdim) storage seen as (batch, seqlen, nheads, headdim)
    "transposed": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2),
    # rows 3 values apart more than they are long: off 16-byte alignment
    "padded": lambda t: torch.nn.functional.pad(t, (0, 3))[..., : t.shape[-1]],
    # the view starts one value into its storage
    "offset": lambda t: torch.cat([t.flatten().new_zeros(1), t.flatten()])[1:].view(t.shape),
    # every other value
    "every_other": lambda t: t.repeat_interleave(2, dim=-1)[..., ::2],
}


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", sorted(STRIDED))
def test_cuda_merge_takes_strided_views(dtype, layout):
    outs, lses = random_parts(3, (2, 9, 4, 64), dtype, "cuda", seed=5, make_out=STRIDED[layout])
    assert not outs[0].is_contiguous() or layout == "offset"
    lses = [lse.transpose(1, 2).contiguous().transpose(1, 2) for lse in lses]
    out, lse = fa3.merge_attention_states_list(outs, lses)
    assert_matches_the_cpp_merge(outs, lses, out, lse)


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_two_halves_merge_to_the_whole(dtype):
    q, k, v = make_qkv(dtype=dtype)
    full_out, full_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    parts = [tuple(t.cuda() for t in partial(q, k, v, b, e)) for b, e in ((0, 7), (7, 20))]
    out, lse = fa3.merge_attention_states(*parts[0], *parts[1])
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    torch.testing.assert_close(out.cpu().float(), full_out.float(), atol=tol, rtol=0)
    torch.testing.assert_close(lse.cpu(), full_lse, atol=1e-5, rtol=0)


@needs_hopper
def test_cuda_merge_runs_on_the_current_stream():
    outs, lses = random_parts(2, (4, 256, 8, 128), torch.bfloat16, "cuda", seed=11)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = fa3.merge_attention_states_list(outs, lses)
    side.synchronize()
    assert_matches_the_cpp_merge(outs, lses, out, lse)


@needs_hopper
def test_cuda_merge_takes_at_most_128_parts():
    outs, lses = random_parts(1, (1, 2, 1, 8), torch.float32, "cuda", seed=1)
    out, lse = fa3.merge_attention_states_list(outs * 128, lses * 128)
    assert_matches_the_cpp_merge(outs * 128, lses * 128, out, lse)
    with pytest.raises(NotImplementedError, match="outs: the GPU merge takes at most 128 parts, got 129"):
        fa3.merge_attention_states_list(outs * 129, lses * 129)


@needs_hopper
@pytest.mark.parametrize("breaks, message", [(breaks, message) for breaks, _, message in BAD[3:7]])
def test_cuda_bad_arguments_name_the_argument(breaks, message):
    outs = [torch.randn(2, 3, 4, 8, device="cuda") for _ in range(2)]
    lses = [torch.randn(2, 4, 3, device="cuda") for _ in range(2)]
    with pytest.raises(ValueError, match=message.replace("is on cpu", "is on cuda:0")):
        fa3.merge_attention_states_list(*breaks(outs, lses))
