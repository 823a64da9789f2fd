"""FP8 (e4m3) attention inputs: block quantization with incoherent processing.

quantize() prepares q, k and v for flash_attn_func's FP8 path the way the
FlashAttention-3 paper (section 3.3) gets its accuracy: one scale per block of
`block` rows of each (batch, head) (absmax / 448), and for q and k first a
random-sign Hadamard transform along the head dim, the same for both (same seed), which
leaves q kᵀ unchanged and spreads outliers over many columns. Head dims that are not
powers of two (96, 192) take a block-diagonal transform of power-of-two blocks (3 of 32,
3 of 64). The definition, step by step, is in include/fa3/fp8.h; CPU tensors run its CPU
version, CUDA tensors one kernel per tensor (bitwise equal to the CPU version on an H200).

    qkv8 = fa3.fp8.quantize(q, k, v)
    out = fa3.flash_attn_func(qkv8.q, qkv8.k, qkv8.v, block_scales=qkv8.block_scales)

A packed batch (flash_attn_varlen_func's layout) quantizes per sequence, its blocks
counted from each sequence's first row:

    qkv8 = fa3.fp8.quantize(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
    out = fa3.flash_attn_varlen_func(qkv8.q, qkv8.k, qkv8.v, cu_q, cu_k, mq, mk, block_scales=qkv8.block_scales)
"""

from typing import NamedTuple

import torch

from . import _C
from ._handoff import call

_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Quantized(NamedTuple):
    """e4m3 q, k, v (their inputs' shapes) and their float32 block scales: q_scale
    (batch, nheads, ceil(seqlen_q / block)), k_scale and v_scale (batch, nheads_k,
    ceil(seqlen_k / block)); a block's real values are its codes times its scale."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    block: int

    @property
    def block_scales(self):
        """(q_scale, k_scale, v_scale), as flash_attn_func's block_scales takes them."""
        return self.q_scale, self.k_scale, self.v_scale


def quantize_tensor(x, block=128, hadamard=False, seed=0, cu_seqlens=None, max_seqlen=None):
    """One (batch, seqlen, nheads, headdim) tensor to (e4m3 codes, float32 scales of
    shape (batch, nheads, ceil(seqlen / block))), after the transform of `seed` when
    hadamard is set (headdim a multiple of 32). With cu_seqlens (int32, batch + 1, on x's
    device) x is a varlen batch (total, nheads, headdim): each sequence's blocks start at
    its first row, the scales are (batch, nheads, ceil(max_seqlen / block)) (1 past a
    sequence's rows), and rows of no sequence are left as zeros."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input: expected a torch.Tensor, got {type(x).__name__}")
    packed = cu_seqlens is not None
    rank, layout = (3, "(total, nheads, headdim)") if packed else (4, "(batch, seqlen, nheads, headdim)")
    if x.dim() != rank:
        raise ValueError(f"input: expected a {rank}-d tensor {layout}, got shape {tuple(x.shape)}")
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"input: dtype {x.dtype} is not supported; use torch.float32, torch.float16 or torch.bfloat16")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if packed:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise TypeError(f"cu_seqlens: expected a torch.Tensor, got {type(cu_seqlens).__name__}")
        if max_seqlen is None:
            raise ValueError("max_seqlen: required with cu_seqlens (the longest sequence's rows)")
        batch, seqlen, nheads = cu_seqlens.shape[0] - 1, int(max_seqlen), x.shape[1]
        codes = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    else:
        batch, seqlen, nheads, _ = x.shape
        codes = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((batch, nheads, -(-seqlen // block) if block > 0 else 1), dtype=torch.float32, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.device.type == "cuda" else 0
    varlen = {"cu_seqlens": cu_seqlens, "max_seqlen": seqlen} if packed else {}
    call(_C.fp8_quantize, x.detach(), codes, scale, block_rows=block, hadamard=hadamard, seed=seed, stream=stream,
         **varlen)
    return codes, scale


def quantize(q, k, v, block=128, hadamard=True, seed=0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
             max_seqlen_k=None):
    """q, k, v (flash_attn_func's layouts) to e4m3 with per-block scales; q and k
    transformed with the signs of `seed` when hadamard is set, v never (the transform
    would have to be undone on the output). Returns a Quantized. flash_attn_func takes
    its block_scales with block_rows=block; the GPU's FP8 kernel will read 128-row
    blocks. With cu_seqlens_q and cu_seqlens_k (and max_seqlen_q, max_seqlen_k), q, k, v
    are flash_attn_varlen_func's packed (total, nheads, headdim) tensors, quantized per
    sequence, and the scales are what it takes as block_scales."""
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q, cu_seqlens_k: give both (a varlen batch) or neither")
    q8, q_scale = quantize_tensor(q, block, hadamard, seed, cu_seqlens_q, max_seqlen_q)
    k8, k_scale = quantize_tensor(k, block, hadamard, seed, cu_seqlens_k, max_seqlen_k)
    v8, v_scale = quantize_tensor(v, block, False, seed, cu_seqlens_k, max_seqlen_k)
    return Quantized(q8, k8, v8, q_scale, k_scale, v_scale, block)


def hadamard_transform(x, seed=0):
    """x (..., headdim) through the transform quantize() applies, in float32 on the CPU
    (for checking and for references): the same signs and block sizes."""
    if x.shape[-1] % 32 != 0:
        raise ValueError(f"x: head dim {x.shape[-1]} is not a multiple of 32, as the Hadamard transform needs")
    head_dim = x.shape[-1]
    n = head_dim & -head_dim
    signs = torch.tensor([-1.0 if s else 1.0 for s in _C.hadamard_signs(seed, head_dim)], dtype=torch.float32)
    y = (x.float().cpu() * signs).reshape(*x.shape[:-1], head_dim // n, n)
    h = 1
    while h < n:
        y = y.reshape(*y.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(*x.shape[:-1], head_dim // n, n)
        h *= 2
    norm = torch.tensor(1.0 / (n**0.5), dtype=torch.float32)
    return y.reshape(x.shape) * norm
