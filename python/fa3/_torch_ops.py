"""fa3's attention as PyTorch custom operators: fa3::fwd and fa3::bwd.

As custom ops they are opaque to torch.compile: the compiler traces their fake
implementations (shapes and dtypes only) and calls the real ones at run time, so
flash_attn_func compiles with fullgraph=True. fa3::fwd's autograd formula calls
fa3::bwd. Outputs, and the GPU backward's workspace, are allocated here, by torch,
on the inputs' device; the extension only writes them. Eager calls that need
nothing the op provides skip its dispatch (forward() below).

The attention sinks (one float32 logit per query head, or None) are an input of both
ops; fa3::bwd returns their gradient, which autograd hands to the sinks tensor.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _C
from ._handoff import call
from ._workspace import cached_workspace


def _out_dtype(dtype):
    # FP8 inputs give a bf16 output, as in FlashAttention-3.
    return torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype


def _forward_outputs(q, v):
    batch, seqlen_q, nheads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, v.shape[-1]), dtype=_out_dtype(q.dtype))
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)
    return out, lse


def _detached(t):
    # DLPack refuses to export tensors that require grad; the data is the same.
    return t.detach() if t is not None and t.requires_grad else t


def _run_forward(
    q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk, outputs=None, **extra
):
    """Allocates (out, lse) (by `outputs(q, v)`, the fixed-length shapes by default) and
    runs the extension's forward into them; `extra` carries the extension's other
    keywords: a varlen call's index tensors and bounds, an FP8 call's scales."""
    q, k, v, sinks = (_detached(t) for t in (q, k, v, sinks))
    out, lse = (outputs or _forward_outputs)(q, v)
    options = {
        "sinks": sinks,
        "softmax_scale": softmax_scale,
        "causal": causal,
        "window_left": window_left,
        "window_right": window_right,
        "softcap": softcap,
        "attention_chunk": attention_chunk,
        **extra,
    }
    workspace = _forward_workspace(q, k, v, out, lse, options)
    call(_C.forward, q, k, v, out, lse, **options, workspace=workspace, **_placement(q))
    return out, lse


def _forward_workspace(q, k, v, out, lse, options):
    """The scratch memory of a GPU FP8 call (V transposed), from torch's allocator (see
    _backward_workspace); None for every other call, which needs none: the size query
    is only asked where the answer can be other than 0."""
    if q.device.type != "cuda" or q.dtype != torch.float8_e4m3fn:
        return None
    return cached_workspace(_C.forward_workspace_size, q.device, q, k, v, out, lse, **options)


# The current stream's raw handle on a device, without the torch.cuda.Stream object
# that torch.cuda.current_stream builds on every call (a private function of torch's,
# which its compiler's generated code calls for the same purpose; absent, the public
# accessor is used).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _placement(t):
    """Where the extension runs the call: the caller's current stream on the
    tensor's GPU, or torch's intra-op thread count on the CPU."""
    if t.device.type == "cuda":
        if _raw_stream is not None:
            return {"stream": _raw_stream(t.device.index)}
        return {"stream": torch.cuda.current_stream(t.device).cuda_stream}
    return {"num_threads": torch.get_num_threads()}


@torch.library.custom_op("fa3::fwd", mutates_args=())
def attention_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    attention_chunk: int = 0,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor]:
    """Returns (out, lse); out has v's head dim. softmax_scale 0.0 means 1/sqrt(headdim),
    q's. `deterministic` is the backward pass's setting, carried here so that autograd
    can see it; sm_margin (SMs left free) is both passes'."""
    return _run_forward(
        q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin=sm_margin
    )


@attention_forward.register_fake
def _attention_forward_fake(
    q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, attention_chunk=0,
    sm_margin=0,
):
    return _forward_outputs(q, v)


@torch.library.custom_op("fa3::bwd", mutates_args=())
def attention_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    sinks: Optional[Tensor],
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    attention_chunk: int = 0,
    sm_margin: int = 0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (dq, dk, dv, dsinks), each gradient shaped like its input (dout like out,
    of v's head dim), for the forward call with the same sinks and options; dsinks is
    empty (0 elements) when sinks is None, since an op cannot return None."""
    return _run_backward(
        dout, q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic,
        attention_chunk, sm_margin=sm_margin,
    )


def _run_backward(
    dout, q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic,
    attention_chunk, sm_margin=0, **index
):
    """Allocates (dq, dk, dv, dsinks) like q, k, v and sinks and runs the extension's
    backward into them; `index` carries a varlen call's index tensors and bounds."""
    dq, dk, dv = (t.new_empty(t.shape) for t in (q, k, v))
    dsinks = _dsinks_like(q, sinks)
    tensors = (dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dq, dk, dv)
    options = {
        "sinks": _detached(sinks),
        "dsinks": dsinks if sinks is not None else None,
        "softmax_scale": softmax_scale,
        "causal": causal,
        "window_left": window_left,
        "window_right": window_right,
        "softcap": softcap,
        "deterministic": deterministic,
        "attention_chunk": attention_chunk,
        "sm_margin": sm_margin,
        **index,
    }
    call(_C.backward, *tensors, **options, workspace=_backward_workspace(tensors, options), **_placement(q))
    return dq, dk, dv, dsinks


def _dsinks_like(q, sinks):
    if sinks is None:
        return q.new_empty((0,), dtype=torch.float32)
    return sinks.new_empty(sinks.shape)


def _backward_workspace(tensors, options):
    """The scratch memory the GPU backward needs, taken from torch's allocator so that
    no call allocates behind torch's back; None for CPU tensors, which need none."""
    q = tensors[1]
    if q.device.type != "cuda":
        return None
    # The kernels need it 256-byte aligned. torch's CUDA caching allocator rounds every
    # block up to a multiple of 512 bytes and carves blocks out of segments that CUDA
    # aligns to at least 256 bytes, at offsets that are sums of block sizes, so a fresh
    # tensor's data is 256-byte aligned (test_gpu.py checks; an allocator that did
    # otherwise would get a ValueError from the extension, not a wrong result).
    # The tensor goes back to the allocator when the op returns, while the kernels may
    # still be running: the allocator hands the block out again only to work on the
    # same stream, the current one the kernels run on, so that work starts after them.
    return cached_workspace(_C.backward_workspace_size, q.device, *tensors, **options)


@attention_backward.register_fake
def _attention_backward_fake(
    dout, q, k, v, out, lse, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic,
    attention_chunk=0, sm_margin=0,
):
    return tuple(t.new_empty(t.shape) for t in (q, k, v)) + (_dsinks_like(q, sinks),)


def _setup_context(ctx, inputs, output):
    q, k, v, sinks, *options = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, sinks, out, lse)
    ctx.options = options
    # As in FlashAttention-3, lse is a by-product: no gradient flows through it.
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, dout, run_backward):
    """The autograd formula's result, by `run_backward` (fa3::bwd or the extension
    directly): gradients of q, k, v and sinks, None for every option."""
    q, k, v, sinks, out, lse = ctx.saved_tensors
    # A gradient arriving through a transpose or expand may have any strides;
    # the kernels read headdim contiguously.
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq, dk, dv, dsinks = run_backward(dout, q, k, v, out, lse, sinks, *ctx.options)
    return (dq, dk, dv, dsinks if sinks is not None else None) + (None,) * len(ctx.options)


def _attention_forward_grad(ctx, dout, _dlse):
    return _gradients(ctx, dout, attention_backward)


attention_forward.register_autograd(_attention_forward_grad, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """fa3::fwd with its autograd formula, without the ops' dispatch: for eager calls
    that need autograd and nothing else the op provides (eager_way). The custom
    ops' dispatch with autograd cost host time that a small training step pays on
    every layer, more than its kernels take at short sequences: on the H200 machine a
    flash_attn_func call on inputs that require grad took 190 us of host time through
    the op and 63 us this way, forward and backward 980 and 620 us (docs/perf-log.md).
    Same extension calls, same results; the backward is not differentiable again, as
    fa3::bwd is not."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, *options):
        softmax_scale, causal, window_left, window_right, softcap, _deterministic, attention_chunk, sm_margin = options
        output = _run_forward(
            q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk,
            sm_margin=sm_margin,
        )
        _setup_context(ctx, (q, k, v, sinks, *options), output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        return _gradients(ctx, dout, _run_backward)


# What the custom op's dispatch is for, asked of torch on every call: a torch.compile
# trace, a torch function or dispatch mode (FakeTensorMode, FlopCounterMode ...), a
# functorch transform (vmap, grad) or the profiler. These are private torch functions
# (plain C calls; the whole test below measured 3.5 us); if one is missing the fast
# path is off and every call takes the op.
_MODE_PROBES = (
    getattr(torch._C, "_len_torch_function_stack", None),
    getattr(torch._C, "_len_torch_dispatch_stack", None),
    getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", None),
    getattr(torch.autograd, "_profiler_enabled", None),
)
_FAST_PATH = all(probe is not None for probe in _MODE_PROBES)


def eager_way(q, k, v, sinks, direct, autograd):
    """How an eager call may run the extension without its custom op: `direct` (a
    function of the op's arguments that runs the extension), `autograd` (the same as
    an autograd.Function's apply), or None where only the op will do. The op's
    dispatch costs about 25 us a call in eager mode (measured on an H200 machine), more
    with autograd, and buys autograd, torch.compile tracing and visibility to torch's
    modes, tensor subclasses and profiler. An eager call on plain CPU or CUDA tensors
    that needs none of them runs `direct`; one that needs autograd alone, `autograd`."""
    if not _FAST_PATH or torch.compiler.is_compiling():
        return None
    # Exactly torch.Tensor: no subclass (FakeTensor included). The interface has
    # checked that q, k, v and sinks share a device, CUDA, CPU or meta.
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    if sinks is not None and type(sinks) is not torch.Tensor:
        return None
    if q.device.type == "meta":
        return None
    function_modes, dispatch_modes, functorch_stack, profiling = _MODE_PROBES
    if function_modes() or dispatch_modes() or functorch_stack() is not None or profiling():
        return None
    if torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (sinks is not None and sinks.requires_grad)
    ):
        return autograd
    return direct


def _direct_forward(q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, _deterministic,
                    attention_chunk, sm_margin):
    return _run_forward(
        q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, attention_chunk, sm_margin=sm_margin
    )


def forward(q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, attention_chunk,
            sm_margin=0):
    """fa3::fwd's (out, lse), through the op or without it (eager_way). The arguments
    are flash_attn_func's, already checked (_checks)."""
    run = eager_way(q, k, v, sinks, _direct_forward, _EagerAttention.apply) or attention_forward
    return run(
        q, k, v, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, attention_chunk,
        sm_margin,
    )
