"""Autotuning: time fa3's forward kernels on a problem and keep the fastest for its class.

fa3.tune(q, k, v, causal=...) times every compiled forward kernel on CUDA tensors (a
Hopper GPU) and adds the fastest to the tuning cache of their GPU, a text file keyed by
GPU name, SM count, CUDA driver and fa3 version (see tune_cache_path). With autotuning
on (FA3_AUTOTUNE=1 in the environment, or set_autotune(True)) the forward pass runs the
cached kernel for each problem's class, and fa3's built-in choice where the cache holds
none. A class is (dtype, head dim, causal, seqlen_q bucket, seqlen_k bucket, GQA ratio
bucket), a bucket being the smallest power of two at or above the value; only the
forward pass is tuned, the backward having one kernel per configuration.

Needs no PyTorch but for tune(), which allocates its outputs with torch.
"""

from . import _C
from ._handoff import call
from ._info import _device_index


def set_autotune(enabled):
    """Turns autotuning on or off for this process (the default comes from FA3_AUTOTUNE)."""
    _C.set_autotune(bool(enabled))


def autotune_enabled():
    """Whether the forward pass uses the tuning cache."""
    return _C.autotune_enabled()


def tune(q, k, v, causal=False, softmax_scale=None, *, warmup=5, iters=20, store=True):
    """Times every compiled forward kernel on q, k, v (torch CUDA tensors in
    FlashAttention's layout, as flash_attn_func takes them) on the current stream of
    their device, and with `store` adds the fastest to that GPU's tuning cache.

    Returns a dict: the class ("class" describes it; direction, dtype, head_dim,
    causal, seqlen_q, seqlen_k and gqa are its fields, the sequence lengths and the GQA
    ratio as buckets), "kernel" and "kernel_ms" (the fastest and its median time),
    "heuristic" and "heuristic_ms" (the built-in choice), "kernels" and "median_ms"
    (every kernel timed, the built-in choice first) and "cache_path" ('' when not
    stored). Raises NotImplementedError without a Hopper GPU.
    """
    if not all(hasattr(t, "new_empty") for t in (q, k, v)):
        raise TypeError("fa3.tune takes torch tensors (fa3._C.tune_forward takes any DLPack tensor)")
    import torch

    # DLPack refuses to export tensors that require grad; the data is the same.
    q, k, v = (t.detach() for t in (q, k, v))
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty(q.shape)
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    return call(
        _C.tune_forward,
        q,
        k,
        v,
        out,
        lse,
        softmax_scale=0.0 if softmax_scale is None else float(softmax_scale),
        causal=bool(causal),
        warmup=warmup,
        iters=iters,
        store=store,
        stream=stream,
    )


def tune_cache_path(device=None):
    """The tuning cache file of a CUDA device (None: the current one; an index,
    "cuda:N" or a torch.device): $FA3_TUNE_CACHE when set, else a file named after
    the GPU, its SM count, the CUDA driver and fa3's version under
    $XDG_CACHE_HOME/fa3 or ~/.cache/fa3."""
    return _C.tune_cache_path(_C.tune_key(_device_index(device)))


def tune_cache_entries(device=None):
    """The tuning cache's entries for a CUDA device (as tune() returns them, without
    kernels, median_ms and cache_path). Raises ValueError saying why for a cache that
    the forward pass ignores."""
    key = _C.tune_key(_device_index(device))
    return _C.read_tune_cache(_C.tune_cache_path(key), key)
