"""fa3's attention as PyTorch custom operators: fa3::fwd and fa3::bwd.

As custom ops they are opaque to torch.compile: the compiler traces their fake
implementations (shapes and dtypes only) and calls the real ones at run time, so
flash_attn_func compiles with fullgraph=True. fa3::fwd's autograd formula calls
fa3::bwd. Outputs are allocated here, by torch, on the inputs' device; the
extension only writes them.
"""

import torch
from torch import Tensor

from . import _C


def _out_dtype(dtype):
    # FP8 inputs give a bf16 output, as in FlashAttention-3.
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


def _forward_outputs(q, v):
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]), dtype=_out_dtype(q.dtype))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


def _placement(t):
    """Where the extension runs the call: the caller's current stream on the
    tensor's GPU, or torch's intra-op thread count on the CPU."""
    if t.device.type == "cuda":
        return {"stream": torch.cuda.current_stream(t.device).cuda_stream}
    return {"num_threads": torch.get_num_threads()}


@torch.library.custom_op("fa3::fwd", mutates_args=())
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    """Returns (out, lse). softmax_scale 0.0 means 1/sqrt(headdim). `deterministic`
    is the backward pass's setting, carried here so that autograd can see it."""
    out, lse = _forward_outputs(q, v)
    # DLPack refuses to export tensors that require grad; the data is the same.
    _C.forward(
        q.detach(),
        k.detach(),
        v.detach(),
        out,
        lse,
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        **_placement(q),
    )
    return out, lse


@attention_forward.register_fake
def _attention_forward_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, deterministic):
    return _forward_outputs(q, v)


@torch.library.custom_op("fa3::bwd", mutates_args=())
def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv) for the forward call with the same options."""
    dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))
    _C.backward(
        dout.detach(),
        q.detach(),
        k.detach(),
        v.detach(),
        out.detach(),
        lse.detach(),
        dq,
        dk,
        dv,
        softmax_scale=softmax_scale,
        causal=causal,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
        deterministic=deterministic,
        **_placement(q),
    )
    return dq, dk, dv


@attention_backward.register_fake
def _attention_backward_fake(
    dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, deterministic
):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = options
    # As in FlashAttention-3, lse is a by-product: no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _attention_forward_grad(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    # A gradient arriving through a transpose or expand may have any strides;
    # the kernels read headdim contiguously.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv = attention_backward(dout, q, k, v, out, lse, *ctx.options)
    return (dq, dk, dv) + (None,) * len(ctx.options)


attention_forward.register_autograd(_attention_forward_grad, setup_context=_setup_context)
