"""fa3.merge_attention_states: partial results over parts of the keys merge to the
attention over all of them; rows that saw no key; dtypes; the rules on its arguments.
The CPU path runs fa3's C++ merge; the torch implementation CUDA tensors use is checked
here on CPU tensors against it.
"""

import math

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from fa3 import _merge  # noqa: E402


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


@pytest.mark.parametrize("merge", [_merge.merge_attention_states_list, lambda o, l: _merge._merge_with_torch(o, l)])
def test_list_of_parts(merge):
    q, k, v = make_qkv()
    parts = [partial(q, k, v, b, e) for b, e in ((0, 1), (1, 8), (8, 20))]
    out, lse = merge([p[0] for p in parts], [p[1] for p in parts])
    full_out, full_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.testing.assert_close(out, full_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, full_lse, atol=1e-5, rtol=0)


@pytest.mark.parametrize("merge", [_merge.merge_attention_states_list, _merge._merge_with_torch])
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


def test_torch_merge_equals_the_cpp_merge():
    gen = torch.Generator().manual_seed(3)
    outs = [torch.randn(2, 5, 3, 8, generator=gen).to(torch.bfloat16) for _ in range(3)]
    lses = [torch.randn(2, 3, 5, generator=gen) * 4 for _ in range(3)]
    cpp = fa3.merge_attention_states_list(outs, lses)
    ref = _merge._merge_with_torch(outs, lses)
    torch.testing.assert_close(cpp[1], ref[1], atol=1e-6, rtol=0)
    torch.testing.assert_close(cpp[0].float(), ref[0].float(), atol=1e-2, rtol=0)


def test_strided_parts():
    outs = [torch.randn(2, 4, 5, 3).transpose(1, 2) for _ in range(2)]
    lses = [torch.randn(2, 4, 5) for _ in range(2)]
    cpp = fa3.merge_attention_states_list(outs, lses)
    ref = _merge._merge_with_torch(outs, lses)
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
    (lambda o, l: ([o[0], o[1].half()], l), ValueError, r"outs\[1\]: dtype fp16 differs from outs\[0\]'s fp32"),
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
