"""Checks of flash_attn_func's arguments, run before anything reaches C++.

They look at metadata only (type, rank, device, dtype, strides), so they cost
nothing under torch.compile. Rules that need the problem's sizes (batch and head
dims agreeing, nheads divisible, supported head dims) stay in the C++ layer,
which reports them with the argument's name too.
"""

import math
import operator

import torch

# Element types the C++ layer knows; which of them run where (fp32 on the CPU
# path only, fp8 not yet) is the C++ layer's answer.
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
# "meta" tensors take the shape-only path (the fake implementation).
_DEVICE_TYPES = ("cuda", "cpu", "meta")


def check_qkv(q, k, v, packed=False):
    """q, k (batch, seqlen_q | seqlen_k, nheads | nheads_k, headdim); v (batch, seqlen_k,
    nheads_k, headdim_v). packed (a varlen call): (total_q | total_k, nheads | nheads_k,
    headdim | headdim_v) instead.

    Runs on every call, so each tensor attribute is read once (each read is a call
    into torch)."""
    rank, layout = (3, "(total, nheads, headdim)") if packed else (4, "(batch, seqlen, nheads, headdim)")
    q_device = q_dtype = None
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        shape = t.shape
        if len(shape) != rank:
            raise ValueError(f"{name}: expected a {rank}-d tensor {layout}, got shape {tuple(shape)}")
        device = t.device
        if device.type not in _DEVICE_TYPES:
            raise ValueError(
                f"{name}: tensors on {device} are not supported; fa3 runs on CUDA tensors "
                "(Hopper GPUs) and on CPU tensors"
            )
        dtype = t.dtype
        if q_device is None:
            q_device, q_dtype = device, dtype
        if device != q_device:
            raise ValueError(f"{name}: is on {device} but q is on {q_device}; q, k and v must share a device")
        if dtype not in _DTYPES:
            raise ValueError(
                f"{name}: dtype {dtype} is not supported; use torch.bfloat16 or torch.float16 "
                "(torch.float32 on CPU tensors)"
            )
        if dtype != q_dtype:
            raise ValueError(f"{name}: dtype {dtype} does not match q's dtype {q_dtype}")
        # Each size against 1 (not min()), so that torch.compile guards no more than that.
        if any(size < 1 for size in shape):
            raise ValueError(f"{name}: every dimension must be at least 1, got shape {tuple(shape)}")
        # An e4m3 v may have its seqlen dimension contiguous instead (FlashAttention-3's
        # V_colmajor, the layout FP8 wgmma reads).
        if t.stride(-1) != 1 and not (name == "v" and dtype == torch.float8_e4m3fn and t.stride(-3) == 1):
            raise ValueError(
                f"{name}: the last dimension (headdim) must be contiguous (stride 1), got strides "
                f"{tuple(t.stride())}; pass {name}.contiguous()"
            )


def check_varlen_indices(q, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k):
    """The index tensors of flash_attn_varlen_func: int32, 1-d, on q's device (seqused
    optional). Their lengths and values are the C++ layer's rules, like the other sizes."""
    for name, t, optional in (
        ("cu_seqlens_q", cu_seqlens_q, False),
        ("cu_seqlens_k", cu_seqlens_k, False),
        ("seqused_q", seqused_q, True),
        ("seqused_k", seqused_k, True),
    ):
        if t is None and optional:
            continue
        if not isinstance(t, torch.Tensor):
            kind = "a torch.Tensor or None" if optional else "a torch.Tensor"
            raise TypeError(f"{name}: expected {kind}, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-d tensor, got shape {tuple(t.shape)}")
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: dtype {t.dtype} is not supported; use torch.int32")
        if t.device != q.device:
            raise ValueError(f"{name}: is on {t.device} but q is on {q.device}; it must be on q's device")


def max_seqlen_arg(name, value):
    """max_seqlen_q / max_seqlen_k as an int; the C++ layer checks it against the sequences."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {value!r}") from None


def head_dim_padding(q, k, v):
    """(pad_qk, pad_v): zero columns to add to q and k, and to v, on CUDA so that rows
    are whole 16-byte units.

    The GPU's tensor copies (TMA) need every stride a multiple of 16 bytes; with a
    head dim that is not a multiple of 8 elements the rows of a packed tensor are not.
    q and k share a head dim and are padded alike; v's (out's) may differ and is padded
    on its own. (0, 0) on the CPU path, and when q's and k's head dims differ (the C++
    layer then names the mismatch with the caller's sizes)."""
    if q.device.type != "cuda":
        return 0, 0
    head_dim = q.shape[3]
    if k.shape[3] != head_dim:
        return 0, 0
    unit = 16 // q.element_size()
    return -head_dim % unit, -v.shape[3] % unit


def check_sinks(sinks, q):
    """sinks: None, or one float32 logit per query head, (nheads,), on q's device.

    Whether its length is q's nheads is the C++ layer's rule, like the other sizes."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks: expected a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.dim() != 1:
        raise ValueError(f"sinks: expected a 1-d tensor (nheads,), got shape {tuple(sinks.shape)}")
    if sinks.dtype != torch.float32:
        raise ValueError(f"sinks: dtype {sinks.dtype} is not supported; use torch.float32")
    if sinks.device != q.device:
        raise ValueError(f"sinks: is on {sinks.device} but q is on {q.device}; sinks must be on q's device")


def softmax_scale_arg(softmax_scale):
    """The scale handed to C++, where 0.0 stands for the default 1/sqrt(headdim)."""
    if softmax_scale is None:
        return 0.0
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        raise TypeError(f"softmax_scale: expected a float or None, got {type(softmax_scale).__name__}") from None
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"softmax_scale: must be finite and > 0 (or None for 1/sqrt(headdim)), got {softmax_scale}")
    return scale


def mask_args(causal, window_size, seqlen_q, seqlen_k):
    """FlashAttention-3's mask arguments in the form the C++ layer takes.

    Returns (causal, window_left, window_right). As in FlashAttention-3: a negative
    window side is unbounded; a side that covers every key anyway (left >=
    seqlen_k - 1, right >= seqlen_q - 1) is unbounded too; causal means right = 0;
    and a window of (unbounded, 0) is causal. Each rewrite leaves the mask
    unchanged, and lets windows that restrict nothing run where windows are not
    implemented.
    """
    try:
        left, right = (operator.index(side) for side in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair of ints (left, right), got {window_size!r}") from None
    if left < 0 or left >= seqlen_k - 1:
        left = -1
    if right < 0 or right >= seqlen_q - 1:
        right = -1
    if causal:
        right = 0
    return right == 0, left, right


def attention_chunk_arg(attention_chunk):
    """attention_chunk as an int (0: none); a negative one is the C++ layer's to refuse."""
    try:
        return operator.index(attention_chunk)
    except TypeError:
        raise TypeError(f"attention_chunk: expected an int, got {attention_chunk!r}") from None


def fp8_scales(q, q_descale, k_descale, v_descale, block_scales):
    """The six optional FP8 scales (q/k/v_descale, then q/k/v block scales) as the C++
    layer takes them, or None when none is given. Each must be a tensor on q's device;
    dtypes, shapes and whether q is e4m3 are the C++ layer's rules."""
    if block_scales is None:
        blocks = (None, None, None)
    else:
        try:
            blocks = tuple(block_scales)
        except TypeError:
            blocks = ()
        if len(blocks) != 3:
            raise TypeError(
                f"block_scales: expected (q_scale, k_scale, v_scale) or None, got {type(block_scales).__name__}"
            )
    scales = (q_descale, k_descale, v_descale) + blocks
    names = ("q_descale", "k_descale", "v_descale", "block_scales[0]", "block_scales[1]", "block_scales[2]")
    for name, t in zip(names, scales):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name}: is on {t.device} but q is on {q.device}; FP8 scales must be on q's device")
    if all(t is None for t in scales):
        return None
    return scales


def reject_unsupported(qv, q_descale, k_descale, v_descale, num_splits, pack_gqa, sm_margin):
    """Raises NotImplementedError for any FlashAttention-3 option fa3 lacks, naming it
    (and the errors of a bad sm_margin)."""
    if qv is not None:
        raise NotImplementedError("qv: the extra query-times-value input is not supported by fa3 yet; pass qv=None")
    for name, value in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if value is not None:
            raise NotImplementedError(
                f"{name}: FP8 is not supported by this function yet (flash_attn_func takes it); pass {name}=None"
            )
    if num_splits > 1:
        raise NotImplementedError(
            f"num_splits={num_splits}: split-KV is not supported by fa3 yet; pass 1 (or 0 to let fa3 choose)"
        )
    if pack_gqa:
        raise NotImplementedError("pack_gqa=True: packed GQA is not supported by fa3 yet; pass None or False")
    sm_margin_arg(sm_margin)


def sm_margin_arg(sm_margin):
    """sm_margin as an int (SMs the GPU kernels leave free); a negative one is refused."""
    try:
        margin = operator.index(sm_margin)
    except TypeError:
        raise TypeError(f"sm_margin: expected an int, got {sm_margin!r}") from None
    if margin < 0:
        raise ValueError(f"sm_margin must be >= 0 (SMs left free), got {margin}")
    return margin
