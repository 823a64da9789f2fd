"""Exact merge of partial attention results: fa3.merge_attention_states.

Attention over keys split in parts (the blocks of ring attention, split-KV) gives per
part an output and a logsumexp; with lse = logsumexp_i(lse_i), the attention over all
keys is out = sum_i exp(lse_i - lse) * out_i, exactly. CPU tensors run fa3's C++ merge;
CUDA tensors run the few torch operations of _merge_with_torch, in fp32 too, until a
CUDA kernel of fa3's replaces them. Neither is differentiable (the results carry no
gradient): ring attention, its user, has its own backward pass.
"""

import torch

from . import _C


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merges two partial results, (out_a, lse_a) and (out_b, lse_b), into (out, lse).

    out_*: (batch, seqlen, nheads, headdim), one dtype (fp32, fp16 or bf16); lse_*:
    (batch, nheads, seqlen) float32, as flash_attn_func(..., return_attn_probs=True)
    returns them. Computed in fp32; out comes back in the inputs' dtype, lse in fp32. A
    row whose lse is -inf in both (it saw no key) gives out 0 and lse -inf.
    """
    return merge_attention_states_list([out_a, out_b], [lse_a, lse_b])


def merge_attention_states_list(outs, lses):
    """merge_attention_states over any number of parts: outs and lses are sequences of
    the same length (one part or more), lses[i] belonging to outs[i]."""
    outs, lses = _check_parts(outs, lses)
    if outs[0].device.type == "cuda":
        _check_shapes(outs, lses)
        return _merge_with_torch(outs, lses)
    out = torch.empty_like(outs[0], memory_format=torch.contiguous_format)
    lse = torch.empty_like(lses[0], memory_format=torch.contiguous_format)
    _C.merge_attention_states([t.detach() for t in outs], [t.detach() for t in lses], out, lse)
    return out, lse


def _check_parts(outs, lses):
    outs, lses = list(outs), list(lses)
    for name, parts in (("outs", outs), ("lses", lses)):
        for i, t in enumerate(parts):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}]: expected a torch.Tensor, got {type(t).__name__}")
    if not outs:
        raise ValueError("outs: at least one part is needed, got none")
    if len(lses) != len(outs):
        raise ValueError(f"lses: one per part is needed: got {len(lses)} for {len(outs)} outs")
    device = outs[0].device
    for name, parts in (("outs", outs), ("lses", lses)):
        for i, t in enumerate(parts):
            if t.device != device:
                raise ValueError(f"{name}[{i}]: on {t.device}, but outs[0] is on {device}")
    return outs, lses


def _check_shapes(outs, lses):
    """The C++ merge's rules, for the tensors it does not see (CUDA ones)."""
    first = outs[0]
    if first.dim() != 4:
        raise ValueError(f"outs[0]: expected a 4-d tensor (batch, seqlen, nheads, head_dim), got rank {first.dim()}")
    if first.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"outs[0]: dtype must be float32, float16 or bfloat16, got {first.dtype}")
    batch, seqlen, nheads, _ = first.shape
    for i, (o, l) in enumerate(zip(outs, lses)):
        if o.dtype != first.dtype or o.shape != first.shape:
            raise ValueError(
                f"outs[{i}]: {o.dtype} {tuple(o.shape)} differs from outs[0]'s {first.dtype} {tuple(first.shape)}"
            )
        if l.dtype != torch.float32 or tuple(l.shape) != (batch, nheads, seqlen):
            raise ValueError(
                f"lses[{i}]: must be float32 (batch, nheads, seqlen) = {(batch, nheads, seqlen)}, "
                f"got {l.dtype} {tuple(l.shape)}"
            )


def _merge_with_torch(outs, lses):
    """The merge in torch operations, fp32 throughout; any device."""
    lse_parts = torch.stack([t.detach().float() for t in lses])
    lse = torch.logsumexp(lse_parts, dim=0)
    # A row that saw no key anywhere has lse -inf; measured from 0 instead, each part's
    # weight is exp(-inf) = 0 rather than exp(-inf - -inf) = NaN.
    finite_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weights = torch.exp(lse_parts - finite_lse).permute(0, 1, 3, 2).unsqueeze(-1)
    out = torch.zeros(outs[0].shape, dtype=torch.float32, device=outs[0].device)
    for weight, part in zip(weights, outs):
        # A part that saw none of a row's keys (weight 0) adds nothing, whatever it holds.
        out += torch.where(weight > 0, weight * part.detach().float(), 0.0)
    return out.to(outs[0].dtype), lse
