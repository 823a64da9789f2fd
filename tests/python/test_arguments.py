"""flash_attn_func's interface: FlashAttention-3's signature, argument checks with
messages naming the argument, and the options fa3 refuses instead of ignoring.

CPU and meta tensors only, so it runs on any machine with PyTorch.
"""

import inspect
import re

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402

# FlashAttention-3's hopper/flash_attn_interface.py flash_attn_func: names, order, defaults.
FA3_SIGNATURE = [
    ("q", inspect.Parameter.empty),
    ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty),
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
]


def qkv(batch=1, seqlen_q=8, seqlen_k=8, nheads=4, nheads_k=2, head_dim=64, dtype=torch.bfloat16, device="cpu"):
    shape_q = (batch, seqlen_q, nheads, head_dim)
    shape_k = (batch, seqlen_k, nheads_k, head_dim)
    return (
        torch.randn(shape_q, device=device).to(dtype),
        torch.randn(shape_k, device=device).to(dtype),
        torch.randn(shape_k, device=device).to(dtype),
    )


# fa3's own keywords, after all of FlashAttention-3's so that positional calls stay its.
FA3_ADDITIONS = [("sinks", None), ("block_scales", None), ("block_rows", 128)]


def test_signature_matches_flash_attention_3():
    params = list(inspect.signature(fa3.flash_attn_func).parameters.values())
    assert [(p.name, p.default) for p in params] == FA3_SIGNATURE + FA3_ADDITIONS


def test_qkvpacked_signature_matches_flash_attention_3():
    names = list(inspect.signature(fa3.flash_attn_qkvpacked_func).parameters)
    assert names == [
        "qkv",
        "softmax_scale",
        "causal",
        "q_descale",
        "k_descale",
        "v_descale",
        "window_size",
        "attention_chunk",
        "softcap",
        "deterministic",
        "num_heads_q",
        "sm_margin",
        "return_attn_probs",
    ] + [name for name, _ in FA3_ADDITIONS]


def test_positional_arguments_follow_flash_attention_3():
    q, k, v = qkv()
    by_name = fa3.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True)
    assert torch.equal(fa3.flash_attn_func(q, k, v, 0.25, True), by_name)


@pytest.mark.parametrize(
    "option, value, names",
    [
        ("qv", "tensor", "qv"),
        ("num_splits", 2, "num_splits"),
        ("pack_gqa", True, "pack_gqa"),
    ],
)
def test_unsupported_options_raise(option, value, names):
    q, k, v = qkv()
    if value == "tensor":
        value = torch.ones(1)
    with pytest.raises(NotImplementedError, match=names):
        fa3.flash_attn_func(q, k, v, **{option: value})


BAD_INPUTS = [
    # (what to do to (q, k, v), exception, message pattern)
    (lambda q, k, v: (q.tolist(), k, v), TypeError, "q: expected a torch.Tensor, got list"),
    (lambda q, k, v: (q[0], k, v), ValueError, r"q: expected a 4-d tensor .* got shape \(8, 4, 64\)"),
    (lambda q, k, v: (q, k[..., None], v), ValueError, "k: expected a 4-d tensor"),
    (lambda q, k, v: (q.to(torch.float64), k, v), ValueError, "q: dtype torch.float64 is not supported"),
    (lambda q, k, v: (q, k.to(torch.int32), v), ValueError, "k: dtype torch.int32 is not supported"),
    (lambda q, k, v: (q, k, v.half()), ValueError, "v: dtype torch.float16 does not match q's dtype torch.bfloat16"),
    (lambda q, k, v: (q, k, v.to("meta")), ValueError, "v: is on meta but q is on cpu"),
    (lambda q, k, v: (q, k[:, :0], v[:, :0]), ValueError, "k: every dimension must be at least 1"),
    (
        lambda q, k, v: (q, k, v.transpose(2, 3).contiguous().transpose(2, 3)),
        ValueError,
        "v: the last dimension .* must be contiguous",
    ),
    # Rules that need the sizes come back from the C++ layer.
    (lambda q, k, v: (q, k[..., :32], v), ValueError, "k: head dim 32 does not match q's head dim 64"),
    (lambda q, k, v: (q, k[:1].expand(2, -1, -1, -1), v), ValueError, "k: batch 2 does not match q's batch 1"),
    (lambda q, k, v: (q[:, :, :3], k, v), ValueError, "q: nheads 3 is not a multiple of k's nheads 2"),
    (lambda q, k, v: (q, k, v[:, :5]), ValueError, "v: shape .* must match k's shape"),
]


@pytest.mark.parametrize("mutate, error, message", BAD_INPUTS, ids=[case[2] for case in BAD_INPUTS])
def test_bad_inputs_name_the_argument(mutate, error, message):
    with pytest.raises(error, match=message):
        fa3.flash_attn_func(*mutate(*qkv()))


BAD_SINKS = [
    # (sinks for q with 4 heads, exception, message pattern)
    ([0.0] * 4, TypeError, "sinks: expected a torch.Tensor or None, got list"),
    (torch.zeros(1, 4), ValueError, r"sinks: expected a 1-d tensor \(nheads,\), got shape \(1, 4\)"),
    (torch.zeros(4, dtype=torch.bfloat16), ValueError, "sinks: dtype torch.bfloat16 is not supported"),
    (torch.zeros(4, dtype=torch.float64), ValueError, "sinks: dtype torch.float64 is not supported; use torch.float32"),
    (torch.zeros(4, device="meta"), ValueError, "sinks: is on meta but q is on cpu"),
    # Its length against nheads comes back from the C++ layer.
    (torch.zeros(2), ValueError, r"sinks: shape \(2\) must be \(nheads_q\) = \(4\)"),
    (torch.zeros(5), ValueError, r"sinks: shape \(5\) must be \(nheads_q\) = \(4\)"),
]


@pytest.mark.parametrize("sinks, error, message", BAD_SINKS, ids=[case[2] for case in BAD_SINKS])
def test_bad_sinks_name_the_argument(sinks, error, message):
    with pytest.raises(error, match=message):
        fa3.flash_attn_func(*qkv(), sinks=sinks)


def test_bad_sinks_of_qkvpacked():
    with pytest.raises(ValueError, match=r"sinks: shape \(2\) must be \(nheads_q\) = \(4\)"):
        fa3.flash_attn_qkvpacked_func(torch.randn(1, 8, 3, 4, 64), sinks=torch.zeros(2))


def test_unsupported_head_dim_on_cpu():
    with pytest.raises(NotImplementedError, match="head dim 320 is not supported"):
        fa3.flash_attn_func(*qkv(head_dim=320))
    q, k, _ = qkv()
    v = torch.randn(1, 8, 2, 600).to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match=re.escape("v: head dim 600 is not supported; supported: 1 to 512")):
        fa3.flash_attn_func(q, k, v)


class _CudaStandIn:
    """What head_dim_padding reads of a CUDA tensor, without a GPU."""

    def __init__(self, head_dim, element_size=2):
        self.device = torch.device("cuda")
        self.shape = (1, 8, 2, head_dim)
        self._element_size = element_size

    def element_size(self):
        return self._element_size


@pytest.mark.parametrize(
    "dims, padding",
    [
        ((64, 64, 64), (0, 0)),
        ((36, 36, 36), (4, 4)),
        ((192, 192, 128), (0, 0)),
        ((36, 36, 20), (4, 4)),
        ((40, 40, 20), (0, 4)),
        ((36, 36, 128), (4, 0)),
        ((36, 32, 20), (0, 0)),  # q and k disagree: the C++ layer names it with the caller's sizes
    ],
    ids=str,
)
def test_cuda_head_dim_padding(dims, padding):
    """On CUDA, q and k are padded to whole 16-byte rows together, v on its own."""
    q, k, v = (_CudaStandIn(d) for d in dims)
    assert fa3._checks.head_dim_padding(q, k, v) == padding


def test_no_head_dim_padding_on_the_cpu():
    q, k, _ = qkv(head_dim=36)
    v = torch.randn(1, 8, 2, 20).to(torch.bfloat16)
    assert fa3._checks.head_dim_padding(q, k, v) == (0, 0)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_softmax_scale(scale):
    with pytest.raises(ValueError, match="softmax_scale"):
        fa3.flash_attn_func(*qkv(), softmax_scale=scale)


def test_softmax_scale_type():
    with pytest.raises(TypeError, match="softmax_scale"):
        fa3.flash_attn_func(*qkv(), softmax_scale="big")


@pytest.mark.parametrize("window", [5, (1, 2, 3), (1.5, 2), None])
def test_bad_window_size(window):
    with pytest.raises(TypeError, match="window_size"):
        fa3.flash_attn_func(*qkv(), window_size=window)


def test_negative_softcap():
    with pytest.raises(ValueError, match="softcap"):
        fa3.flash_attn_func(*qkv(), softcap=-1.0)


@pytest.mark.parametrize("option", ["q_descale", "k_descale", "v_descale"])
def test_descales_need_fp8_inputs(option):
    """FP8 scales with bf16 inputs are refused by name (test_fp8.py runs FP8 calls)."""
    with pytest.raises(ValueError, match=re.escape(f"{option}: given, but q's dtype is bf16")):
        fa3.flash_attn_func(*qkv(), **{option: torch.ones(1, 2)})


def test_sm_margin_never_changes_the_result():
    """FlashAttention-3's sm_margin (SMs left free) is taken and checked; the CPU path
    ignores it, and on the GPU it only narrows the grid."""
    q, k, v = qkv()
    plain = fa3.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fa3.flash_attn_func(q, k, v, causal=True, sm_margin=4), plain)
    with pytest.raises(ValueError, match="sm_margin must be >= 0"):
        fa3.flash_attn_func(q, k, v, sm_margin=-1)
    with pytest.raises(TypeError, match="sm_margin: expected an int"):
        fa3.flash_attn_func(q, k, v, sm_margin=1.5)


def test_windows_that_restrict_nothing_are_plain_attention():
    q, k, v = qkv(seqlen_q=10, seqlen_k=12)
    plain = fa3.flash_attn_func(q, k, v)
    assert torch.equal(fa3.flash_attn_func(q, k, v, window_size=(11, 9)), plain)
    assert torch.equal(fa3.flash_attn_func(q, k, v, window_size=(-5, 100)), plain)
    causal = fa3.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fa3.flash_attn_func(q, k, v, window_size=(-1, 0)), causal)
    # As in FlashAttention-3, causal fixes the right side of the window to 0.
    assert torch.equal(fa3.flash_attn_func(q, k, v, causal=True, window_size=(-1, 3)), causal)


def test_qkvpacked_bad_shapes():
    with pytest.raises(ValueError, match="num_heads_q: required"):
        fa3.flash_attn_qkvpacked_func(torch.randn(1, 4, 6, 64))
    with pytest.raises(ValueError, match="num_heads_q: 3 does not split"):
        fa3.flash_attn_qkvpacked_func(torch.randn(1, 4, 6, 64), num_heads_q=3)
    with pytest.raises(ValueError, match=r"qkv: a 5-d qkv must be \(batch, seqlen, 3"):
        fa3.flash_attn_qkvpacked_func(torch.randn(1, 4, 2, 2, 64))
