"""FlashAttention-3's Python interface on fa3's kernels.

The functions here take FlashAttention-3's arguments (hopper/flash_attn_interface.py)
with the same names, order, defaults, tensor layout and return values, so that
code written for it runs with ``import fa3 as flash_attn_interface``. Every one of
FlashAttention-3's options is accepted by name; one that fa3 does not implement
yet raises NotImplementedError naming it, and none is ignored. fa3 adds keywords of
its own after them: ``sinks`` (attention sinks, as in gpt-oss) and, for FP8 inputs,
``block_scales`` and ``block_rows`` (block quantization, fa3.fp8.quantize).

Tensors are (batch, seqlen, nheads, headdim), or packed (total, nheads, headdim)
for flash_attn_varlen_func; flash_attn_varlen_func and flash_attn_with_kvcache run
on CPU tensors only for now. CUDA tensors run fa3's Hopper
kernels on the current stream of their device; CPU tensors run fa3's CPU path
(slow, exact enough to test against). Errors: TypeError / ValueError for bad
arguments, NotImplementedError for what fa3 does not support, RuntimeError for
CUDA failures.
"""

import torch

from . import _checks
from . import _kvcache
from . import _torch_fp8_ops
from . import _torch_ops
from . import _torch_varlen_ops


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    sinks=None,
    block_scales=None,
    block_rows=128,
):
    """Exact attention softmax(q kᵀ · softmax_scale) v, per head.

    q: (batch, seqlen_q, nheads, headdim); k: (batch, seqlen_k, nheads_k, headdim);
    v: (batch, seqlen_k, nheads_k, headdim_v), with nheads a multiple of nheads_k
    (GQA/MQA: query head h reads key/value head h // (nheads / nheads_k)). The last
    dimension of each must be contiguous; other strides are free. Any headdim from 1
    to 256 runs: on CUDA tensors on the next head dim fa3 has kernels for (64, 96,
    128, 192, 256), with no copy when headdim is a multiple of 8; otherwise rows are
    not whole 16-byte units, as the GPU's tensor copies need, so q and k (v alike,
    for headdim_v) are first copied with zero columns added (and out is a view of the
    padded result). headdim_v may differ from headdim, as in DeepSeek-V3's (192, 128)
    or (64, 512), from 1 to 512: on CUDA tensors the forward runs on the narrowest
    kernel at least as wide in both (one wider than every kernel's in column slices of
    v, each on its own kernel), the backward on the kernel of the larger head dim, up
    to the largest built one (NotImplementedError naming v beyond).

    softmax_scale: default 1/sqrt(headdim), q's head dim. causal: query i sees keys
    j <= i + seqlen_k - seqlen_q (aligned to the bottom-right corner); a row that
    sees no key gives 0. window_size (left, right): query i sees keys in
    [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right], -1 meaning
    unbounded. softcap > 0: scores become softcap * tanh(scores / softcap).

    sinks: attention sinks (gpt-oss), a float32 tensor (nheads,) on q's device, or
    None. Head h's sink is a logit that joins each row's softmax denominator as
    given (not scaled, not capped) but brings no value: row i's weights are
    exp(s_ij - lse_i) with lse_i = log(exp(sinks[h]) + sum_j exp(s_ij)), and sum to
    less than 1. A row that sees no key gives 0 and softmax_lse sinks[h].

    Differentiable in q, k, v and sinks (softmax_lse carries no gradient); with
    GQA/MQA, dk and dv sum over each group of query heads, and sinks.grad[h] is
    -sum over the rows i of head h (every batch) of exp(sinks[h] - lse_i) * D_i,
    D_i = rowsum(dout_i * out_i). On CUDA tensors the backward pass runs fa3's
    Hopper kernels, with scratch memory from torch's allocator on the current
    stream. deterministic=True makes dq, dk and dv bitwise identical from run to
    run, at some cost in speed; the forward pass always is.

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) when
    return_attn_probs is True, softmax_lse being the natural-log logsumexp of each
    row of scaled scores (and of the row's sink, with sinks), (batch, nheads,
    seqlen_q) in float32.

    attention_chunk=C > 0 (chunked attention, as Llama 4 uses): a query also sees only
    the keys of its own chunk of C positions, j // C == (i + seqlen_k - seqlen_q) // C.

    FP8 (forward only; CUDA tensors in an extension built with FA3_GPU_FP8, head dim up
    to 256 and 128-row block scales, fa3.build_info()["gpu_fp8"], else they raise
    NotImplementedError): q, k, v in torch.float8_e4m3fn give out in bfloat16.
    Their real values are the codes times q/k/v_descale, float32 (batch, nheads_k) as
    in FlashAttention-3 (query head h reads row h // (nheads / nheads_k)), times, with
    block_scales = (q_scale, k_scale, v_scale) (fa3's own keyword, what
    fa3.fp8.quantize returns), one float32 scale per block of block_rows rows of each
    (batch, head): q_scale (batch, nheads, ceil(seqlen_q / block_rows)), k_scale and
    v_scale (batch, nheads_k, ceil(seqlen_k / block_rows)). Each scale is optional (1).
    The numerics are the FP8 kernel's (include/fa3/attention.h): P is rounded to e4m3
    before P V. An e4m3 v may have its seqlen dimension contiguous instead of its head
    dim (FlashAttention-3's V_colmajor layout).

    sm_margin: SMs the GPU kernels leave free for other work on the device (e.g.
    communication overlapping attention), both passes; results never depend on it.

    Not supported yet (NotImplementedError): qv, num_splits > 1, pack_gqa=True.
    """
    _checks.reject_unsupported(qv, None, None, None, num_splits, pack_gqa, sm_margin)
    margin = _checks.sm_margin_arg(sm_margin)
    chunk = _checks.attention_chunk_arg(attention_chunk)
    _checks.check_qkv(q, k, v)
    _checks.check_sinks(sinks, q)
    scale = _checks.softmax_scale_arg(softmax_scale)
    is_causal, window_left, window_right = _checks.mask_args(causal, window_size, q.shape[1], k.shape[1])
    fp8_scales = _checks.fp8_scales(q, q_descale, k_descale, v_descale, block_scales)
    if q.dtype == torch.float8_e4m3fn or fp8_scales is not None:
        out, softmax_lse = _torch_fp8_ops.attention_forward_fp8(
            q, k, v, sinks, *(fp8_scales or (None,) * 6), int(block_rows), scale, is_causal, window_left,
            window_right, float(softcap), chunk, margin
        )
        return (out, softmax_lse) if return_attn_probs else out
    head_dim, head_dim_v = q.shape[3], v.shape[3]
    pad_qk, pad_v = _checks.head_dim_padding(q, k, v)
    if pad_qk:
        # Zero columns change no score; the default scale stays the one of the caller's
        # head dim.
        scale = scale or head_dim**-0.5
        q, k = (torch.nn.functional.pad(t, (0, pad_qk)) for t in (q, k))
    if pad_v:
        # Zero columns of v give output columns of zeros, which are cut off.
        v = torch.nn.functional.pad(v, (0, pad_v))
    out, softmax_lse = _torch_ops.forward(
        q, k, v, sinks, scale, is_causal, window_left, window_right, float(softcap), bool(deterministic), chunk, margin
    )
    if pad_v:
        out = out[..., :head_dim_v]
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_qkvpacked_func(
    qkv,
    softmax_scale=None,
    causal=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    deterministic=False,
    num_heads_q=None,
    sm_margin=0,
    return_attn_probs=False,
    sinks=None,
    block_scales=None,
    block_rows=128,
):
    """flash_attn_func on q, k, v packed in one tensor.

    qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, nheads_q + 2 *
    nheads_k, headdim) with num_heads_q given (GQA/MQA); packed, v has q's and k's
    head dim. q, k and v are taken as
    views, so the gradient lands in one (batch, seqlen, ...) tensor like qkv;
    deterministic, sinks ((nheads_q,)) and the FP8 scales act as in flash_attn_func.
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv: expected a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv: a 5-d qkv must be (batch, seqlen, 3, nheads, headdim), got {tuple(qkv.shape)}")
        q, k, v = qkv.unbind(dim=2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError("num_heads_q: required when qkv is 4-d (batch, seqlen, nheads_q + 2 * nheads_k, headdim)")
        num_heads_k, extra = divmod(qkv.shape[2] - num_heads_q, 2)
        if num_heads_q < 1 or num_heads_k < 1 or extra:
            raise ValueError(
                f"num_heads_q: {num_heads_q} does not split qkv's {qkv.shape[2]} heads into "
                "nheads_q + 2 * nheads_k with nheads_k >= 1"
            )
        q, k, v = qkv.split([num_heads_q, num_heads_k, num_heads_k], dim=2)
    else:
        raise ValueError(f"qkv: expected a 5-d or 4-d tensor, got shape {tuple(qkv.shape)}")
    return flash_attn_func(
        q,
        k,
        v,
        softmax_scale=softmax_scale,
        causal=causal,
        q_descale=q_descale,
        k_descale=k_descale,
        v_descale=v_descale,
        window_size=window_size,
        attention_chunk=attention_chunk,
        softcap=softcap,
        deterministic=deterministic,
        sm_margin=sm_margin,
        return_attn_probs=return_attn_probs,
        sinks=sinks,
        block_scales=block_scales,
        block_rows=block_rows,
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
    sinks=None,
    block_scales=None,
    block_rows=128,
):
    """flash_attn_func on a batch of sequences of different lengths, packed without padding.

    q: (total_q, nheads, headdim); k: (total_k, nheads_k, headdim); v: (total_k, nheads_k,
    headdim_v). cu_seqlens_q and cu_seqlens_k: int32 (batch + 1), starting at 0 and
    non-decreasing: sequence b's queries are q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] and its
    keys k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]] (v alike). seqused_q / seqused_k: None, or
    int32 (batch), only the first seqused[b] rows of each sequence taking part. max_seqlen_q
    and max_seqlen_k: ints at least the longest (used) query and key sequence.

    Every option acts as in flash_attn_func within each sequence, with that sequence's own
    lengths (causal aligned to each one's bottom-right corner). A sequence may be empty;
    queries whose sequence has no key give 0 (softmax_lse -inf, or the head's sink). Query
    rows of no sequence (past seqused_q, or past cu_seqlens_q[-1]) give 0 and softmax_lse
    -inf, and rows of no sequence get zero gradients.

    Returns out (total_q, nheads, headdim_v), or (out, softmax_lse) when return_attn_probs
    is True, softmax_lse being (nheads, total_q) in float32. Differentiable in q, k, v and
    sinks.

    Runs on CPU tensors (fa3's CPU path) and on CUDA tensors where the extension was built
    with the GPU varlen paths (FA3_GPU_VARLEN, on by default; otherwise CUDA tensors raise
    NotImplementedError naming cu_seqlens_q), the backward at the kernel head dims of
    build_info()["gpu_varlen_backward_head_dims"] (FA3_BWD_VARLEN_HEAD_DIMS, every
    head dim by default; those left out raise NotImplementedError naming cu_seqlens_q). The index tensors then stay on the
    GPU and are not checked there: their values (offsets, lengths, max_seqlen at least the
    longest sequence) are the caller's contract, as in FlashAttention-3. Not supported
    either (NotImplementedError):
    qv, num_splits > 1, pack_gqa=True.

    FP8 (forward only): q, k, v in torch.float8_e4m3fn give out in bfloat16, as in
    flash_attn_func, with scales per sequence: q/k/v_descale float32 (batch, nheads_k),
    and block_scales = (q_scale, k_scale, v_scale) with one float32 scale per block of
    block_rows rows counted from each sequence's first row, q_scale (batch, nheads,
    ceil(max_seqlen_q / block_rows)), k_scale and v_scale (batch, nheads_k,
    ceil(max_seqlen_k / block_rows)). CPU tensors run on fa3's CPU path; CUDA tensors in
    an extension built with FA3_GPU_FP8_VARLEN (fa3.build_info()["gpu_fp8_varlen"]),
    else they raise NotImplementedError naming q.
    """
    _checks.reject_unsupported(qv, None, None, None, num_splits, pack_gqa, sm_margin)
    margin = _checks.sm_margin_arg(sm_margin)
    chunk = _checks.attention_chunk_arg(attention_chunk)
    _checks.check_qkv(q, k, v, packed=True)
    _checks.check_varlen_indices(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k)
    _checks.check_sinks(sinks, q)
    max_q = _checks.max_seqlen_arg("max_seqlen_q", max_seqlen_q)
    max_k = _checks.max_seqlen_arg("max_seqlen_k", max_seqlen_k)
    scale = _checks.softmax_scale_arg(softmax_scale)
    is_causal, window_left, window_right = _checks.mask_args(causal, window_size, max_q, max_k)
    fp8_scales = _checks.fp8_scales(q, q_descale, k_descale, v_descale, block_scales)
    if q.dtype == torch.float8_e4m3fn or fp8_scales is not None:
        out, softmax_lse = _torch_fp8_ops.varlen_forward_fp8(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_q, max_k, sinks,
            *(fp8_scales or (None,) * 6), int(block_rows), scale, is_causal, window_left, window_right,
            float(softcap), chunk, margin
        )
        return (out, softmax_lse) if return_attn_probs else out
    out, softmax_lse = _torch_varlen_ops.forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_q,
        seqused_k,
        max_q,
        max_k,
        sinks,
        scale,
        is_causal,
        window_left,
        window_right,
        float(softcap),
        bool(deterministic),
        chunk,
        margin,
    )
    return (out, softmax_lse) if return_attn_probs else out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    rotary_seqlens=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
    sinks=None,
):
    """Attention of q over a KV cache, after appending new keys and values to it (decoding).

    q: (batch, seqlen_q, nheads, headdim). k_cache / v_cache: (batch_cache, seqlen_cache,
    nheads_k, headdim / headdim_v), or paged, (num_pages, page_size, nheads_k, headdim) with
    page_table int32 (batch, max_pages_per_seq) naming each sequence's pages in order (any
    page_size). cache_seqlens: int32 (batch), or an int, the valid entries of each
    sequence's cache (None: the whole cache). cache_batch_idx: int32 (batch), the cache row
    of each sequence (contiguous cache only). cache_leftpad: int32 (batch), the first valid
    entry of each sequence's cache.

    k / v: None, or (batch, seqlen_new, nheads_k, headdim / headdim_v), written into the
    cache IN PLACE at positions cache_seqlens[b] .. + seqlen_new - 1 before attending, so
    that sequence b attends over cache entries [cache_leftpad[b], cache_seqlens[b] +
    seqlen_new). rotary_cos / rotary_sin: None, or (seqlen_ro, rotary_dim / 2) in q's
    dtype, only with k and v: the first rotary_dim columns of k are rotated at their
    positions cache_seqlens[b] + i (rotary_seqlens[b] + i when given), and those of q at
    the same positions when causal or windowed (q being the new tokens), else all at
    cache_seqlens[b]; rotary_interleaved: pairs (0, 1), (2, 3)... (GPT-J) when True,
    halves (GPT-NeoX) when False. The cache receives the rotated k.

    causal, window_size, attention_chunk, softcap, softmax_scale and sinks act as in
    flash_attn_func within each sequence, aligned to the bottom-right corner of its
    (seqlen_q, keys) square. num_splits and scheduler_metadata (get_scheduler_metadata's)
    steer how the GPU splits the keys; the result never depends on them, and the CPU path
    ignores both.

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) when
    return_softmax_lse is True, softmax_lse being (batch, nheads, seqlen_q) in float32.
    No gradient (as in FlashAttention-3).

    FP8: q, k_cache, v_cache (and k, v) in torch.float8_e4m3fn, with q/k/v_descale
    float32 (batch, nheads_k) as in FlashAttention-3, give out in bfloat16; new rows are
    appended as the codes they are (quantized with the cache's scales); no rotary
    embedding. CUDA tensors in a build with FA3_GPU_FP8_KVCACHE
    (fa3.build_info()["gpu_fp8_kvcache"], on by default; otherwise NotImplementedError
    naming q).

    Runs on CPU tensors (fa3's CPU path), and on CUDA tensors in a build with the GPU
    KV-cache path (fa3.build_info()["gpu_kvcache"], the FA3_GPU_KVCACHE option; otherwise
    they raise NotImplementedError), on the current stream; sm_margin leaves SMs free as
    in flash_attn_func (here by splitting the keys for fewer SMs). pack_gqa takes any
    value: the query heads of a KV head always share one tile here (packed GQA, what
    pack_gqa=True asks for). Not supported either (NotImplementedError): qv,
    cu_seqlens_q / cu_seqlens_k_new / max_seqlen_q (packed queries).
    """
    _checks.reject_unsupported(qv, None, None, None, 1, None, sm_margin)
    packed = (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k_new", cu_seqlens_k_new), ("max_seqlen_q", max_seqlen_q))
    for name, value in packed:
        if value is not None:
            raise NotImplementedError(
                f"{name}: packed (variable-length) queries in flash_attn_with_kvcache are not supported by fa3 yet; "
                f"pass {name}=None"
            )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _kvcache.require_tensor(name, t)
    _kvcache.refuse_cuda("k_cache", q, "KV-cache attention")
    chunk = _checks.attention_chunk_arg(attention_chunk)
    _checks.check_sinks(sinks, q)
    capacity = k_cache.shape[1] * (page_table.shape[1] if page_table is not None else 1)
    seqlens = _kvcache.cache_seqlens_tensor(cache_seqlens, q.shape[0], capacity, q.device)
    scale = _checks.softmax_scale_arg(softmax_scale)
    is_causal, window_left, window_right = _checks.mask_args(causal, window_size, q.shape[1], capacity)
    optional = {
        "k_new": k,
        "v_new": v,
        "page_table": page_table,
        "cache_batch_idx": cache_batch_idx,
        "cache_leftpad": cache_leftpad,
        "rotary_cos": rotary_cos,
        "rotary_sin": rotary_sin,
        "rotary_seqlens": rotary_seqlens,
        "sinks": sinks,
    }
    fp8_scales = _checks.fp8_scales(q, q_descale, k_descale, v_descale, None)
    if fp8_scales is not None:
        optional.update(zip(("q_descale", "k_descale", "v_descale"), fp8_scales[:3]))
    options = {
        "rotary_interleaved": bool(rotary_interleaved),
        "softmax_scale": scale,
        "causal": is_causal,
        "window_left": window_left,
        "window_right": window_right,
        "softcap": float(softcap),
        "attention_chunk": chunk,
        "num_splits": int(num_splits),
        "sm_margin": _checks.sm_margin_arg(sm_margin),
    }
    return _kvcache.run_kvcache(q, k_cache, v_cache, seqlens, optional, options, return_softmax_lse)


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """The exact merge of attention results computed over disjoint parts of the keys (split KV).

    out_partial: (num_splits, batch, seqlen, nheads, headdim) float32; lse_partial:
    (num_splits, batch, seqlen, nheads) float32, any strides (FlashAttention-3's layouts;
    (num_splits, total, nheads, headdim) and (num_splits, total, nheads) also work). With
    lse = logsumexp over the splits of lse_partial, out = sum over the splits of
    exp(lse_partial - lse) * out_partial; a row whose partial lse are all -inf gives 0
    (and lse -inf), whatever its partial outputs hold.

    out: None, or a tensor (batch, seqlen, nheads, headdim) to write the result into;
    out_dtype: the result's dtype (float32, float16 or bfloat16; default out's, else
    float32). Returns (out, lse), lse (batch, seqlen, nheads) in float32. CPU tensors run
    fa3's C++ combine, CUDA tensors fa3's merge kernel on the current stream.
    """
    _kvcache.require_tensor("out_partial", out_partial)
    _kvcache.require_tensor("lse_partial", lse_partial)
    return _kvcache.combine(out_partial, lse_partial, out, out_dtype)


def get_scheduler_metadata(
    batch_size,
    max_seqlen_q,
    max_seqlen_k,
    num_heads_q,
    num_heads_kv,
    headdim,
    cache_seqlens,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    cache_leftpad=None,
    page_size=None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """Precomputed scheduling for flash_attn_with_kvcache(scheduler_metadata=...).

    Takes FlashAttention-3's arguments and returns an int32 tensor on cache_seqlens' device,
    as FlashAttention-3 does. fa3 schedules nothing ahead yet: the tensor holds, per
    sequence, the number of key splits it would use (num_splits, or 1 when 0), and
    flash_attn_with_kvcache accepts it and ignores it; results never depend on it.
    """
    del max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim, qkv_dtype, headdim_v
    del cu_seqlens_q, cu_seqlens_k_new, cache_leftpad, page_size, max_seqlen_k_new, causal, window_size
    del attention_chunk, has_softcap, pack_gqa, sm_margin
    device = cache_seqlens.device if isinstance(cache_seqlens, torch.Tensor) else "cpu"
    return torch.full((batch_size,), max(int(num_splits), 1), dtype=torch.int32, device=device)
