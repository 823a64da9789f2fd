"""fa3's variable-length attention as PyTorch custom operators: fa3::varlen_fwd and
fa3::varlen_bwd, the packed-layout twins of fa3::fwd and fa3::bwd (_torch_ops).

q, k, v are (total, nheads, headdim), out (total_q, nheads, headdim_v) and lse
(nheads, total_q); cu_seqlens_q / cu_seqlens_k (int32, batch + 1) and the optional
seqused_q / seqused_k (int32, batch) say which rows form each sequence. The CPU path
runs both; on CUDA tensors both run on the GPU kernels where the build has them switched
on (FA3_GPU_VARLEN; the backward at FA3_BWD_VARLEN_HEAD_DIMS), and the extension refuses them
otherwise. The fake implementations give
shapes anywhere, so that flash_attn_varlen_func traces under torch.compile. Eager calls
skip the ops' dispatch as fixed-length ones do (forward(), _torch_ops.eager_way).
"""

from typing import Optional

import torch
from torch import Tensor

from ._torch_ops import _dsinks_like, _out_dtype, _run_backward, _run_forward, eager_way


def _varlen_outputs(q, v):
    total_q, nheads, _ = q.shape
    out = q.new_empty((total_q, nheads, v.shape[-1]), dtype=_out_dtype(q.dtype))
    lse = q.new_empty((nheads, total_q), dtype=torch.float32)
    return out, lse


def _index_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k):
    """The extension's keywords for the index tensors and bounds of a varlen call."""
    return {
        "cu_seqlens_q": cu_seqlens_q,
        "cu_seqlens_k": cu_seqlens_k,
        "seqused_q": seqused_q,
        "seqused_k": seqused_k,
        "max_seqlen_q": max_seqlen_q,
        "max_seqlen_k": max_seqlen_k,
    }


@torch.library.custom_op("fa3::varlen_fwd", mutates_args=())
def varlen_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    sinks: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    attention_chunk: int,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (out, lse) of a varlen call; `deterministic` is the backward's setting,
    carried here so that autograd can see it; sm_margin (SMs left free) is both passes'."""
    return _direct_forward(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks, softmax_scale,
        causal, window_left, window_right, softcap, deterministic, attention_chunk, sm_margin,
    )


def _direct_forward(
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks, softmax_scale, causal,
    window_left, window_right, softcap, _deterministic, attention_chunk, sm_margin=0,
):
    """fa3::varlen_fwd's work, the extension called directly."""
    return _run_forward(
        q,
        k,
        v,
        sinks,
        softmax_scale,
        causal,
        window_left,
        window_right,
        softcap,
        attention_chunk,
        outputs=_varlen_outputs,
        sm_margin=sm_margin,
        **_index_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k),
    )


@varlen_forward.register_fake
def _varlen_forward_fake(q, k, v, *args):
    return _varlen_outputs(q, v)


@torch.library.custom_op("fa3::varlen_bwd", mutates_args=())
def varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    seqused_q: Optional[Tensor],
    seqused_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    sinks: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    attention_chunk: int,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, dsinks) in q's, k's and v's packed shapes; dsinks is empty
    (0 elements) when sinks is None. Rows of no sequence get zero gradients."""
    return _direct_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks,
        softmax_scale, causal, window_left, window_right, softcap, deterministic, attention_chunk, sm_margin,
    )


def _direct_backward(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks,
    softmax_scale, causal, window_left, window_right, softcap, deterministic, attention_chunk, sm_margin=0,
):
    """fa3::varlen_bwd's work, the extension called directly."""
    return _run_backward(
        dout, q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic,
        attention_chunk, sm_margin=sm_margin,
        **_index_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k),
    )


@varlen_backward.register_fake
def _varlen_backward_fake(dout, q, k, v, out, lse, *args):
    sinks = args[6]  # after the four index tensors and the two bounds
    return tuple(t.new_empty(t.shape) for t in (q, k, v)) + (_dsinks_like(q, sinks),)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, sinks, out, lse)
    ctx.bounds = (max_seqlen_q, max_seqlen_k)
    ctx.options = options
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, dout, run_backward):
    """The autograd formula's result, by `run_backward` (fa3::varlen_bwd or the
    extension directly)."""
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, sinks, out, lse = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv, dsinks = run_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, *ctx.bounds, sinks, *ctx.options
    )
    # No gradient for the index tensors, the bounds or the options.
    return (dq, dk, dv) + (None,) * 6 + (dsinks if sinks is not None else None,) + (None,) * len(ctx.options)


def _varlen_forward_grad(ctx, dout, _dlse):
    return _gradients(ctx, dout, varlen_backward)


varlen_forward.register_autograd(_varlen_forward_grad, setup_context=_setup_context)


class _EagerVarlenAttention(torch.autograd.Function):
    """fa3::varlen_fwd with its autograd formula, without the ops' dispatch, for eager
    calls that need autograd alone (_torch_ops._EagerAttention says why)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _direct_forward(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        return _gradients(ctx, dout, _direct_backward)


def forward(
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks, softmax_scale, causal,
    window_left, window_right, softcap, deterministic, attention_chunk, sm_margin=0,
):
    """fa3::varlen_fwd's (out, lse), through the op or without it (eager_way). The
    arguments are flash_attn_varlen_func's, already checked (_checks)."""
    run = eager_way(q, k, v, sinks, _direct_forward, _EagerVarlenAttention.apply) or varlen_forward
    return run(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k, sinks, softmax_scale,
        causal, window_left, window_right, softcap, deterministic, attention_chunk, sm_margin,
    )
