"""flash_attn_with_kvcache, flash_attn_combine and get_scheduler_metadata on CPU tensors:
FlashAttention-3's signatures; results against a torch reference that appends and rotates
outside fa3 (the caller's cache changed in place, as in FlashAttention-3); paged caches
equal to contiguous ones; the combine against a direct logsumexp merge; argument errors
that name the argument and leave the cache untouched; CUDA tensors refused by the KV-cache
call in a build without the GPU KV-cache path. On a Hopper GPU the combine of CUDA tensors
(fa3's merge kernel) against the CPU's and, with the GPU KV-cache path, the call on CUDA
tensors against the CPU path (the accuracy rule, the appended cache bit for bit, every
split count).
"""

import inspect
import math

import pytest

torch = pytest.importorskip("torch")

import fa3  # noqa: E402
from attention_reference import ABS_CAP, check_close, reference  # noqa: E402
from gpu_support import BUILT_DTYPES, capture, gpu_skip_reason, hopper_skip_reason  # noqa: E402

# FlashAttention-3's hopper/flash_attn_interface.py: names, order, defaults; fa3's own
# keyword `sinks` follows them.
FA3_KVCACHE_SIGNATURE = [
    ("q", inspect.Parameter.empty),
    ("k_cache", inspect.Parameter.empty),
    ("v_cache", inspect.Parameter.empty),
    ("k", None),
    ("v", None),
    ("qv", None),
    ("rotary_cos", None),
    ("rotary_sin", None),
    ("cache_seqlens", None),
    ("cache_batch_idx", None),
    ("cache_leftpad", None),
    ("page_table", None),
    ("cu_seqlens_q", None),
    ("cu_seqlens_k_new", None),
    ("max_seqlen_q", None),
    ("rotary_seqlens", None),
    ("q_descale", None),
    ("k_descale", None),
    ("v_descale", None),
    ("softmax_scale", None),
    ("causal", False),
    ("window_size", (-1, -1)),
    ("attention_chunk", 0),
    ("softcap", 0.0),
    ("rotary_interleaved", True),
    ("scheduler_metadata", None),
    ("num_splits", 0),
    ("pack_gqa", None),
    ("sm_margin", 0),
    ("return_softmax_lse", False),
    ("sinks", None),
]

BATCH, NHEADS, NHEADS_K, HEADDIM, CAPACITY = 3, 4, 2, 32, 48


def test_signature_is_flash_attention_3s():
    params = inspect.signature(fa3.flash_attn_with_kvcache).parameters
    assert [(p.name, p.default) for p in params.values()] == FA3_KVCACHE_SIGNATURE
    combine = inspect.signature(fa3.flash_attn_combine).parameters
    assert [(p.name, p.default) for p in combine.values()] == [
        ("out_partial", inspect.Parameter.empty),
        ("lse_partial", inspect.Parameter.empty),
        ("out", None),
        ("out_dtype", None),
    ]


def rotate(x, cos, sin, positions, interleaved):
    """x (batch, seqlen, nheads, headdim) rotated in float64 at positions (batch, seqlen)."""
    half = cos.shape[1]
    c = cos.double()[positions][:, :, None, :]
    s = sin.double()[positions][:, :, None, :]
    xr = x[..., : 2 * half].double()
    x0, x1 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    r0, r1 = x0 * c - x1 * s, x0 * s + x1 * c
    rotated = torch.stack([r0, r1], -1).flatten(-2) if interleaved else torch.cat([r0, r1], -1)
    return torch.cat([rotated.to(x.dtype), x[..., 2 * half :]], -1)


def rotary_tables(rotary_dim, seqlen_ro=CAPACITY + 8):
    angles = torch.arange(seqlen_ro, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    )
    return angles.cos().float(), angles.sin().float()


def kv_reference(q, k_cache, v_cache, seqlens, k_new=None, v_new=None, leftpad=None, batch_idx=None,
                 rotary=None, interleaved=True, causal=False, window=(-1, -1)):
    """(out, lse, k_cache, v_cache) of flash_attn_with_kvcache on a contiguous cache, built
    from its definition: append (rotated), then attend sequence by sequence."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    seqlen_q, seqlen_new = q.shape[1], 0 if k_new is None else k_new.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        row = b if batch_idx is None else int(batch_idx[b])
        length, left = int(seqlens[b]), 0 if leftpad is None else int(leftpad[b])
        qb = q[b : b + 1]
        if k_new is not None:
            kb = k_new[b : b + 1]
            if rotary is not None:
                kb = rotate(kb, *rotary, (length + torch.arange(seqlen_new))[None], interleaved)
            k_cache[row, length : length + seqlen_new] = kb[0]
            v_cache[row, length : length + seqlen_new] = v_new[b]
        if rotary is not None:
            per_row = causal or window != (-1, -1)
            positions = length + (torch.arange(seqlen_q) if per_row else torch.zeros(seqlen_q, dtype=torch.long))
            qb = rotate(qb, *rotary, positions[None], interleaved)
        keys = k_cache[row : row + 1, left : length + seqlen_new]
        values = v_cache[row : row + 1, left : length + seqlen_new]
        if keys.shape[1] == 0:
            outs.append(torch.zeros(1, seqlen_q, q.shape[2], v_cache.shape[-1], dtype=torch.float64))
            lses.append(torch.full((1, q.shape[2], seqlen_q), float("-inf")))
            continue
        out, lse = reference(qb, keys, values, dtype=torch.float64, causal=causal, window=window)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), k_cache, v_cache


def make_inputs(seed, seqlen_q=2, seqlen_new=2, seqlens=(5, 0, 30), batch_cache=BATCH):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(BATCH, seqlen_q, NHEADS, HEADDIM, generator=g)
    k_cache = torch.randn(batch_cache, CAPACITY, NHEADS_K, HEADDIM, generator=g)
    v_cache = torch.randn(batch_cache, CAPACITY, NHEADS_K, HEADDIM, generator=g)
    k_new = torch.randn(BATCH, seqlen_new, NHEADS_K, HEADDIM, generator=g) if seqlen_new else None
    v_new = torch.randn(BATCH, seqlen_new, NHEADS_K, HEADDIM, generator=g) if seqlen_new else None
    return q, k_cache, v_cache, k_new, v_new, torch.tensor(seqlens, dtype=torch.int32)


CASES = {
    "plain": {},
    "causal_rotary_interleaved": {"causal": True, "rotary": 16, "interleaved": True},
    "rotary_halves_not_causal": {"rotary": 32, "interleaved": False},
    "window_leftpad": {"window": (4, 0), "leftpad": (2, 0, 7)},
    "batch_idx_causal": {"causal": True, "batch_idx": (4, 1, 0)},
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_reference_and_appends_in_place(name):
    case = CASES[name]
    batch_cache = 5 if "batch_idx" in case else BATCH
    q, k_cache, v_cache, k_new, v_new, seqlens = make_inputs(1, batch_cache=batch_cache)
    rotary = rotary_tables(case["rotary"]) if "rotary" in case else None
    leftpad = torch.tensor(case["leftpad"], dtype=torch.int32) if "leftpad" in case else None
    batch_idx = torch.tensor(case["batch_idx"], dtype=torch.int32) if "batch_idx" in case else None
    causal, window, interleaved = case.get("causal", False), case.get("window", (-1, -1)), case.get("interleaved", True)
    want_out, want_lse, want_k, want_v = kv_reference(
        q, k_cache, v_cache, seqlens, k_new, v_new, leftpad, batch_idx, rotary, interleaved, causal, window
    )
    out, lse = fa3.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new,
        rotary_cos=None if rotary is None else rotary[0],
        rotary_sin=None if rotary is None else rotary[1],
        cache_seqlens=seqlens, cache_batch_idx=batch_idx, cache_leftpad=leftpad,
        causal=causal, window_size=window, rotary_interleaved=interleaved, return_softmax_lse=True,
    )
    torch.testing.assert_close(out.double(), want_out, atol=1e-4, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse.double(), atol=1e-4, rtol=0)
    torch.testing.assert_close(k_cache, want_k, atol=1e-5, rtol=0)
    assert torch.equal(v_cache, want_v)


def to_paged(cache, page_size, perm):
    """A contiguous (batch, capacity, ...) cache as pages in the order `perm`, and its table."""
    batch, capacity = cache.shape[:2]
    per_seq = capacity // page_size
    pages = torch.full((len(perm), page_size, *cache.shape[2:]), float("nan"))
    table = perm[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    pages[table.flatten().long()] = cache.reshape(batch * per_seq, page_size, *cache.shape[2:])
    return pages, table


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_paged_equals_contiguous(page_size):
    q, k_cache, v_cache, k_new, v_new, seqlens = make_inputs(2, seqlen_q=3, seqlen_new=3, seqlens=(14, 0, 31))
    cos, sin = rotary_tables(8)
    perm = torch.randperm(BATCH * CAPACITY // page_size + 2, generator=torch.Generator().manual_seed(3))
    k_pages, table = to_paged(k_cache, page_size, perm)
    v_pages, _ = to_paged(v_cache, page_size, perm)
    common = {"rotary_cos": cos, "rotary_sin": sin, "cache_seqlens": seqlens, "causal": True,
              "return_softmax_lse": True}
    want, want_lse = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **common)
    out, lse = fa3.flash_attn_with_kvcache(q, k_pages, v_pages, k_new, v_new, page_table=table, **common)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    rows = table.flatten().long()
    assert torch.equal(k_pages[rows].reshape(k_cache.shape), k_cache)
    assert torch.equal(v_pages[rows].reshape(v_cache.shape), v_cache)


def test_cache_seqlens_as_int_and_none():
    q, k_cache, v_cache, _, _, _ = make_inputs(4, seqlen_new=0)
    full = torch.full((BATCH,), CAPACITY, dtype=torch.int32)
    want = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=full)
    assert torch.equal(fa3.flash_attn_with_kvcache(q, k_cache, v_cache), want)
    assert torch.equal(fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=CAPACITY), want)


def test_inputs_requiring_grad_give_a_plain_output():
    # As FlashAttention-3's: no autograd through a KV-cache call, whatever q requires.
    q, k_cache, v_cache, k_new, v_new, seqlens = make_inputs(5)
    want = fa3.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k_new, v_new, cache_seqlens=seqlens)
    out = fa3.flash_attn_with_kvcache(
        q.requires_grad_(), k_cache, v_cache, k_new.requires_grad_(), v_new, cache_seqlens=seqlens
    )
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, want)


def test_scheduler_metadata_num_splits_and_pack_gqa_change_nothing():
    q, k_cache, v_cache, _, _, seqlens = make_inputs(5, seqlen_new=0)
    metadata = fa3.get_scheduler_metadata(BATCH, 2, CAPACITY, NHEADS, NHEADS_K, HEADDIM, seqlens,
                                           qkv_dtype=torch.float32, num_splits=3)
    assert metadata.dtype == torch.int32
    want = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    out = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, scheduler_metadata=metadata,
                                      num_splits=3)
    assert torch.equal(out, want)
    # The KV-cache kernels always pack a KV head's query heads into one tile.
    for pack_gqa in (True, False):
        packed = fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, pack_gqa=pack_gqa)
        assert torch.equal(packed, want), pack_gqa


@pytest.mark.parametrize(
    "change, exception, message",
    [
        ({"cache_seqlens": torch.tensor([5, 0, 47], dtype=torch.int32)}, ValueError,
         r"cache_seqlens: cache_seqlens\[2\] \+ seqlen_new = 47 \+ 2 exceeds the cache's 48 positions"),
        ({"cache_leftpad": torch.tensor([6, 0, 0], dtype=torch.int32)}, ValueError,
         r"cache_leftpad: cache_leftpad\[0\] = 6 is outside"),
        ({"v": None}, ValueError, "v_new: must be given with k_new"),
        ({"cache_batch_idx": torch.tensor([0, 1, 3], dtype=torch.int32)}, ValueError,
         r"cache_batch_idx: cache_batch_idx\[2\] = 3 is outside \[0, 3\)"),
        ({"qv": torch.ones(1)}, NotImplementedError, "qv"),
        ({"cu_seqlens_q": torch.ones(1)}, NotImplementedError, "cu_seqlens_q"),
    ],
)
def test_bad_arguments_name_the_argument_and_leave_the_cache(change, exception, message):
    q, k_cache, v_cache, k_new, v_new, seqlens = make_inputs(6)
    before = (k_cache.clone(), v_cache.clone())
    kwargs = {"k": k_new, "v": v_new, "cache_seqlens": seqlens, **change}
    with pytest.raises(exception, match=message):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_workspace_size_is_zero_for_cpu_tensors():
    q, k_cache, v_cache, k_new, v_new, seqlens = make_inputs(10)
    out = q.new_empty(q.shape)
    lse = q.new_empty((BATCH, NHEADS, q.shape[1]))
    assert fa3._C.kvcache_workspace_size(q, k_cache, v_cache, seqlens, out, lse, k_new=k_new, v_new=v_new,
                                         num_splits=3) == 0


def direct_merge(out_partial, lse_partial):
    lse = torch.logsumexp(lse_partial.double(), dim=0)
    weights = torch.exp(lse_partial.double() - lse).nan_to_num(0.0)
    out = (weights[..., None] * out_partial.double().nan_to_num(0.0)).sum(0)
    return out, lse


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_combine_matches_the_direct_merge(out_dtype):
    g = torch.Generator().manual_seed(7)
    splits, batch, seqlen, nheads, headdim = 3, 2, 5, 4, 16
    out_partial = torch.randn(splits, batch, seqlen, nheads, headdim, generator=g)
    # FlashAttention-3's tests make lse_partial this way: a transposed view.
    lse_partial = (torch.randn(splits, batch, nheads, seqlen, generator=g) * 3).transpose(-1, -2)
    lse_partial[0, 0, 1] = float("-inf")  # one split saw no key
    out_partial[0, 0, 1] = float("nan")
    lse_partial[:, 1, 2] = float("-inf")  # no split did
    out_partial[:, 1, 2] = float("nan")
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    want_out, want_lse = direct_merge(out_partial, lse_partial)
    assert out.dtype == (out_dtype or torch.float32) and out.shape == (batch, seqlen, nheads, headdim)
    atol = 1e-5 if out_dtype is None else 2e-2
    torch.testing.assert_close(out.double(), want_out, atol=atol, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)
    assert torch.all(out[1, 2] == 0) and torch.all(lse[1, 2] == float("-inf"))


def test_combine_takes_the_packed_layout():
    g = torch.Generator().manual_seed(9)
    out_partial = torch.randn(2, 7, 3, 8, generator=g)
    lse_partial = torch.randn(2, 7, 3, generator=g)
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial)
    want_out, want_lse = direct_merge(out_partial, lse_partial)
    assert out.shape == (7, 3, 8) and lse.shape == (7, 3)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=0)


def test_combine_of_key_halves_is_the_whole_call():
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 3, 4, 32, generator=g) for _ in range(3))
    k, v = torch.randn(2, 40, 4, 32, generator=g), torch.randn(2, 40, 4, 32, generator=g)
    whole, whole_lse = fa3.flash_attn_func(q, k, v, return_attn_probs=True)
    parts = [fa3.flash_attn_func(q, k[:, s], v[:, s], return_attn_probs=True) for s in (slice(0, 20), slice(20, 40))]
    out_partial = torch.stack([o for o, _ in parts])
    lse_partial = torch.stack([lse.transpose(1, 2) for _, lse in parts])
    target = torch.empty_like(whole)
    out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out=target)
    assert out is target
    torch.testing.assert_close(out, whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(lse, whole_lse.transpose(1, 2), atol=1e-5, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(fa3.build_info()["gpu_kvcache"], reason="the GPU KV-cache path is switched on")
def test_cuda_tensors_are_refused():
    q, k_cache, v_cache, _, _, seqlens = (t.cuda() if t is not None else None for t in make_inputs(9))
    with pytest.raises(NotImplementedError, match="k_cache: KV-cache attention is not implemented on the GPU yet"):
        fa3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)


def partials_with_dead_rows(splits, lead, nheads, headdim, seed):
    """out_partial / lse_partial (FlashAttention-3's transposed lse view) where every
    seventh row no split saw and, in the others, split s saw none of every fifth row's
    keys; NaN in the partial outputs there."""
    g = torch.Generator().manual_seed(seed)
    out_partial = torch.randn(splits, *lead, nheads, headdim, generator=g)
    lse_partial = (torch.randn(splits, *lead[:-1], nheads, lead[-1], generator=g) * 3).transpose(-1, -2)
    rows = torch.arange(math.prod(lead) * nheads).view(*lead, nheads)
    for s in range(splits):
        dead = (rows % 7 == 3) | (((rows + s) % 5 == 0) if splits > 1 else False)
        lse_partial[s][dead] = float("-inf")
        out_partial[s][dead] = float("nan")
    return out_partial, lse_partial


@pytest.mark.skipif(hopper_skip_reason() is not None, reason=str(hopper_skip_reason()))
@pytest.mark.parametrize("out_dtype", [None, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, 16, 33])
@pytest.mark.parametrize("lead", [(2, 37), (45,)], ids=["batch_seqlen", "packed"])
def test_cuda_combine_matches_the_cpu_combine(out_dtype, splits, lead):
    out_partial, lse_partial = partials_with_dead_rows(splits, lead, 4, 128, seed=splits)
    want_out, want_lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=out_dtype)
    out, lse = fa3.flash_attn_combine(out_partial.cuda(), lse_partial.cuda(), out_dtype=out_dtype)
    assert out.is_cuda and out.dtype == want_out.dtype and out.shape == want_out.shape and lse.shape == want_lse.shape
    assert not out.isnan().any() and not lse.isnan().any()
    # Both results rounded to the 16-bit type: adjacent values at most (test_merge.py).
    rel = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}[out.dtype]
    torch.testing.assert_close(out.cpu().float(), want_out.float(), atol=1e-5, rtol=rel)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)
    dead = torch.isneginf(want_lse)
    assert torch.equal(lse.cpu()[dead], want_lse[dead]) and torch.all(out.cpu()[dead] == 0)


@pytest.mark.skipif(hopper_skip_reason() is not None, reason=str(hopper_skip_reason()))
def test_cuda_combine_writes_into_out_on_the_current_stream():
    out_partial, lse_partial = partials_with_dead_rows(3, (2, 9), 4, 64, seed=4)
    want_out, want_lse = fa3.flash_attn_combine(out_partial, lse_partial, out_dtype=torch.bfloat16)
    target = torch.full((2, 9, 4, 64), float("nan"), dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    out_partial, lse_partial = out_partial.cuda(), lse_partial.cuda()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = fa3.flash_attn_combine(out_partial, lse_partial, out=target)
    side.synchronize()
    assert out is target
    torch.testing.assert_close(out.cpu().float(), want_out.float(), atol=1e-5, rtol=2**-8)
    torch.testing.assert_close(lse.cpu(), want_lse, atol=1e-5, rtol=1e-5)


_KV_GPU_SKIP = gpu_skip_reason() or (None if fa3.build_info()["gpu_kvcache"] else "the GPU KV-cache path is switched off")
needs_gpu_kvcache = pytest.mark.skipif(_KV_GPU_SKIP is not None, reason=str(_KV_GPU_SKIP))

GPU_CAPACITY = 512


def gpu_inputs(dtype, seqlen_q, heads, head_dim, seqlen_new, page_size, batch_idx, rotary, seed):
    """CPU tensors of a call over a cache of GPU_CAPACITY positions: four sequences, one
    empty, lengths across key blocks; paged in random page order when page_size > 0
    (NaN in the pages no sequence owns); rotary tables when rotary > 0."""
    g = torch.Generator().manual_seed(seed)
    nheads, nheads_k = heads
    seqlens = torch.tensor([0, 1, 200, GPU_CAPACITY - seqlen_new - 3], dtype=torch.int32)
    batch, batch_cache = len(seqlens), (6 if batch_idx else len(seqlens))
    q = torch.randn(batch, seqlen_q, nheads, head_dim, generator=g).to(dtype)
    k_cache = torch.randn(batch_cache, GPU_CAPACITY, nheads_k, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(batch_cache, GPU_CAPACITY, nheads_k, head_dim, generator=g).to(dtype)
    extra = {"cache_seqlens": seqlens}
    if seqlen_new:
        extra["k"] = torch.randn(batch, seqlen_new, nheads_k, head_dim, generator=g).to(dtype)
        extra["v"] = torch.randn(batch, seqlen_new, nheads_k, head_dim, generator=g).to(dtype)
    if batch_idx:
        extra["cache_batch_idx"] = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    if page_size:
        perm = torch.randperm(batch * GPU_CAPACITY // page_size + 2, generator=g)
        k_cache, table = to_paged(k_cache.float(), page_size, perm)
        v_cache, _ = to_paged(v_cache.float(), page_size, perm)
        k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
        extra["page_table"] = table
    if rotary:
        cos, sin = rotary_tables(rotary, GPU_CAPACITY + seqlen_q)
        extra["rotary_cos"], extra["rotary_sin"] = cos.to(dtype), sin.to(dtype)
    return q, k_cache, v_cache, extra


GPU_KV_CASES = {
    "decode_gqa": dict(seqlen_q=1, heads=(32, 8), seqlen_new=0, page_size=0, batch_idx=False, rotary=0, mask={}),
    "decode_mqa_append_paged16": dict(seqlen_q=1, heads=(8, 1), seqlen_new=1, page_size=16, batch_idx=False,
                                      rotary=0, mask={"causal": True}),
    "prefill5_rotary_paged1": dict(seqlen_q=5, heads=(32, 8), seqlen_new=5, page_size=1, batch_idx=False,
                                   rotary=64, mask={"causal": True}),
    "prefill5_batch_idx_window": dict(seqlen_q=5, heads=(8, 8), seqlen_new=0, page_size=0, batch_idx=True,
                                      rotary=0, mask={"window_size": (100, 0)}),
}


@needs_gpu_kvcache
@pytest.mark.parametrize("num_splits", [1, 3, 0])
@pytest.mark.parametrize("name", GPU_KV_CASES)
@pytest.mark.parametrize("dtype", BUILT_DTYPES)
def test_cuda_call_matches_the_cpu_path(dtype, name, num_splits):
    case = GPU_KV_CASES[name]
    q, k_cache, v_cache, extra = gpu_inputs(dtype, case["seqlen_q"], case["heads"], 128, case["seqlen_new"],
                                            case["page_size"], case["batch_idx"], case["rotary"], seed=len(name))
    mask = case["mask"]
    cuda = {key: t.cuda() for key, t in extra.items()}
    k_gpu, v_gpu = k_cache.cuda(), v_cache.cuda()
    out, lse = fa3.flash_attn_with_kvcache(q.cuda(), k_gpu, v_gpu, **cuda, **mask, num_splits=num_splits,
                                           return_softmax_lse=True)
    # ref: the CPU path on fp32 copies; low: the CPU path on the inputs themselves.
    floats = {key: (t.float() if t.is_floating_point() else t) for key, t in extra.items()}
    ref_out, ref_lse = fa3.flash_attn_with_kvcache(q.float(), k_cache.float(), v_cache.float(), **floats, **mask,
                                                   return_softmax_lse=True)
    low_k, low_v = k_cache.clone(), v_cache.clone()
    low_out, low_lse = fa3.flash_attn_with_kvcache(q, low_k, low_v, **extra, **mask, return_softmax_lse=True)
    check_close("out", out.cpu().float(), ref_out, low_out.float(), abs_cap=ABS_CAP[dtype])
    check_close("lse", lse.cpu(), ref_lse, low_lse)
    # The append wrote what the CPU path writes, bit for bit (NaN pages included).
    assert torch.equal(k_gpu.cpu().view(torch.int16), low_k.view(torch.int16))
    assert torch.equal(v_gpu.cpu().view(torch.int16), low_v.view(torch.int16))
    again, again_lse = fa3.flash_attn_with_kvcache(q.cuda(), k_gpu, v_gpu, **cuda, **mask, num_splits=num_splits,
                                                   return_softmax_lse=True)
    assert torch.equal(again, out) and torch.equal(again_lse, lse)


@needs_gpu_kvcache
@pytest.mark.parametrize("page_size", [0, 16])
def test_decode_steps_replayed_from_a_cuda_graph_match_eager_steps(page_size):
    """A serving loop as engines run it: one decode step (append the new token's k and v,
    attend over the cache) captured once in a CUDA graph, then replayed with new inputs
    copied into the captured tensors and cache_seqlens advanced in place. Every step's
    output and the cache equal those of the same steps called eagerly, bit for bit."""
    dtype = BUILT_DTYPES[0]
    q, k_cache, v_cache, extra = gpu_inputs(dtype, 1, (32, 8), 128, 1, page_size, False, 0, seed=77)
    g = torch.Generator().manual_seed(78)
    steps = [
        tuple(torch.randn(t.shape, generator=g).to(dtype).cuda() for t in (q, extra["k"], extra["v"]))
        for _ in range(3)
    ]
    tables = {"page_table": extra["page_table"].cuda()} if page_size else {}

    def run(static_q, static_k, static_v, k_cache, v_cache, seqlens):
        return fa3.flash_attn_with_kvcache(static_q, k_cache, v_cache, k=static_k, v=static_v,
                                           cache_seqlens=seqlens, causal=True, **tables)

    eager_k, eager_v = k_cache.cuda(), v_cache.cuda()
    eager_lens = extra["cache_seqlens"].cuda()
    eager_outs = []
    for step_q, step_k, step_v in steps:
        eager_outs.append(run(step_q, step_k, step_v, eager_k, eager_v, eager_lens))
        eager_lens += 1

    graph_k, graph_v = k_cache.cuda(), v_cache.cuda()
    graph_lens = extra["cache_seqlens"].cuda()
    static = [t.clone() for t in steps[0]]
    # capture()'s warm-up call appends too, so the cache is restored before the capture
    # (which does not run the step).
    saved_k, saved_v = graph_k.clone(), graph_v.clone()

    def restore():
        graph_k.copy_(saved_k)
        graph_v.copy_(saved_v)

    graph, graph_out = capture(lambda: run(*static, graph_k, graph_v, graph_lens), after_warmup=restore)
    for i, step in enumerate(steps):
        for dst, src in zip(static, step):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(graph_out, eager_outs[i]), f"step {i}"
        graph_lens += 1
    torch.cuda.synchronize()
    assert torch.equal(graph_k.view(torch.int16), eager_k.view(torch.int16))
    assert torch.equal(graph_v.view(torch.int16), eager_v.view(torch.int16))
