"""FP8 (e4m3) attention as PyTorch custom operators: fa3::fwd_fp8 and, for packed
variable-length batches, fa3::varlen_fwd_fp8.

Forward only, as in FlashAttention-3 (its FP8 path has no backward): e4m3 q, k, v and
their optional scales in, (out, lse) out, out in bfloat16. Ops of their own rather
than more inputs to fa3::fwd and fa3::varlen_fwd, whose autograd formulas would have
nothing to do with them; opaque to torch.compile like those (their fake
implementations give the shapes).
"""

from typing import Optional

import torch
from torch import Tensor

from ._torch_ops import _forward_outputs, _run_forward
from ._torch_varlen_ops import _index_args, _varlen_outputs


@torch.library.custom_op("fa3::fwd_fp8", mutates_args=())
def attention_forward_fp8(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Optional[Tensor],
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    q_block_scale: Optional[Tensor],
    k_block_scale: Optional[Tensor],
    v_block_scale: Optional[Tensor],
    block_rows: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    attention_chunk: int,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (out, lse); the scales' shapes and meaning are fa3/attention.h's Fp8Args."""
    return _run_forward(
        q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, q_block_scale=q_block_scale,
        k_block_scale=k_block_scale, v_block_scale=v_block_scale, block_rows=block_rows, sm_margin=sm_margin,
    )


@attention_forward_fp8.register_fake
def _attention_forward_fp8_fake(q, k, v, *_):
    return _forward_outputs(q, v)


@torch.library.custom_op("fa3::varlen_fwd_fp8", mutates_args=())
def varlen_forward_fp8(
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
    q_descale: Optional[Tensor],
    k_descale: Optional[Tensor],
    v_descale: Optional[Tensor],
    q_block_scale: Optional[Tensor],
    k_block_scale: Optional[Tensor],
    v_block_scale: Optional[Tensor],
    block_rows: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    attention_chunk: int,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (out, lse) of a varlen call, out (total_q, nheads, headdim_v) and lse
    (nheads, total_q); the scales are per sequence (fa3/attention.h's Fp8Args)."""
    return _run_forward(
        q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk,
        outputs=_varlen_outputs, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
        q_block_scale=q_block_scale, k_block_scale=k_block_scale, v_block_scale=v_block_scale, block_rows=block_rows,
        sm_margin=sm_margin,
        **_index_args(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k),
    )


@varlen_forward_fp8.register_fake
def _varlen_forward_fp8_fake(q, k, v, *_):
    return _varlen_outputs(q, v)
