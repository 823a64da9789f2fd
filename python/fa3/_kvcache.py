"""The mechanics of flash_attn_with_kvcache, flash_attn_combine and get_scheduler_metadata
(interface.py): argument forms FlashAttention-3 accepts turned into what the extension
takes, outputs allocated, and the extension called. The cache is written in place (the
append), so these calls are plain functions, not custom operators: there is no gradient
to carry and nothing for torch.compile to trace through.
"""

import torch

from . import _C
from ._handoff import call
from ._torch_ops import _out_dtype, _placement
from ._workspace import cached_workspace

_GPU_LATER = "is not implemented on the GPU yet; it runs on CPU tensors"
# Whether this build runs KV-cache calls on the GPU (FA3_GPU_KVCACHE).
_GPU_KVCACHE = _C.build_info()["gpu_kvcache"]


def cache_seqlens_tensor(cache_seqlens, batch, capacity, device):
    """cache_seqlens as an int32 tensor (batch,): an int applies to every sequence, and
    None means every sequence's cache is full (`capacity` entries)."""
    if cache_seqlens is None:
        cache_seqlens = capacity
    if isinstance(cache_seqlens, int):
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"cache_seqlens: expected an int, a tensor or None, got {type(cache_seqlens).__name__}")
    return cache_seqlens


def require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def refuse_cuda(name, t, what):
    """Refuses CUDA tensors unless this build runs KV-cache calls on the GPU."""
    if t.device.type == "cuda" and not _GPU_KVCACHE:
        raise NotImplementedError(f"{name}: {what} {_GPU_LATER}")


def run_kvcache(q, k_cache, v_cache, cache_seqlens, optional, options, return_softmax_lse):
    """Allocates out (and lse when asked for) and runs the extension; returns
    FlashAttention-3's result."""
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v_cache.shape[-1]), dtype=_out_dtype(q.dtype))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32) if return_softmax_lse else None
    workspace = _workspace(q, k_cache, v_cache, cache_seqlens, out, lse, optional, options)
    call(
        _C.forward_with_kvcache,
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        out,
        lse,
        **optional,
        **options,
        workspace=workspace,
        **_placement(q),
    )
    return (out, lse) if return_softmax_lse else out


def _workspace(q, k_cache, v_cache, cache_seqlens, out, lse, optional, options):
    """The GPU call's scratch memory (q's rotated copy, the splits' partial results);
    None for CPU tensors or a call that needs none."""
    if q.device.type != "cuda":
        return None
    return cached_workspace(
        _C.kvcache_workspace_size, q.device, q, k_cache, v_cache, cache_seqlens, out, lse, **optional, **options
    )


def combine(out_partial, lse_partial, out, out_dtype):
    """flash_attn_combine on (num_splits, batch, seqlen, nheads, headdim) partials, or on
    (num_splits, total, nheads, headdim) ones; the extension takes batch and seqlen as
    one row dimension. CUDA tensors run fa3's merge kernel on the current stream."""
    if out_partial.dim() not in (4, 5) or lse_partial.dim() != out_partial.dim() - 1:
        raise ValueError(
            "out_partial / lse_partial: expected (num_splits, batch, seqlen, nheads, headdim) and "
            "(num_splits, batch, seqlen, nheads), or (num_splits, total, nheads, headdim) and "
            f"(num_splits, total, nheads); got shapes {tuple(out_partial.shape)} and {tuple(lse_partial.shape)}"
        )
    lead = out_partial.shape[1:-2]
    splits, nheads, headdim = out_partial.shape[0], out_partial.shape[-2], out_partial.shape[-1]
    rows = out_partial.new_empty(lead).numel()
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else out_partial.dtype)
    flat_out = torch.empty((rows, nheads, headdim), dtype=dtype, device=out_partial.device)
    flat_lse = torch.empty((rows, nheads), dtype=torch.float32, device=out_partial.device)
    call(
        _C.combine,
        out_partial.reshape(splits, rows, nheads, headdim),
        lse_partial.reshape(splits, rows, nheads),
        flat_out,
        flat_lse,
        stream=_placement(out_partial).get("stream", 0),
    )
    result = flat_out.view(*lead, nheads, headdim)
    if out is not None:
        out.copy_(result)
        result = out
    return result, flat_lse.view(*lead, nheads)
