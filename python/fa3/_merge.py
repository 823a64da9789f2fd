"""Exact merge of partial attention results: fa3.merge_attention_states.

Attention over keys split in parts (the blocks of ring attention, split-KV) gives per
part an output and a logsumexp; with lse = logsumexp_i(lse_i), the attention over all
keys is out = sum_i exp(lse_i - lse) * out_i, exactly. CPU tensors run fa3's C++ merge,
CUDA tensors fa3's merge kernel on the current stream, both in fp32. Neither is
differentiable (the results carry no gradient): ring attention, its user, has its own
backward pass.
"""

import torch

from . import _C
from ._handoff import call
from ._torch_ops import _placement


def merge_attention_states(out_a, lse_a, out_b, lse_b):
    """Merges two partial results, (out_a, lse_a) and (out_b, lse_b), into (out, lse).

    out_*: (batch, seqlen, nheads, headdim), each fp32, fp16 or bf16; lse_*:
    (batch, nheads, seqlen) float32, as flash_attn_func(..., return_attn_probs=True)
    returns them. Computed in fp32; out comes back in out_a's dtype, lse in fp32. A
    row whose lse is -inf in both (it saw no key) gives out 0 and lse -inf.
    """
    return merge_attention_states_list([out_a, out_b], [lse_a, lse_b])


def merge_attention_states_list(outs, lses):
    """merge_attention_states over any number of parts: outs and lses are sequences of
    the same length (one part or more), lses[i] belonging to outs[i]. On CUDA tensors one
    call takes at most 128 parts (NotImplementedError beyond: merge them in groups)."""
    outs, lses = _check_parts(outs, lses)
    out = torch.empty_like(outs[0], memory_format=torch.contiguous_format)
    lse = torch.empty_like(lses[0], memory_format=torch.contiguous_format)
    stream = _placement(outs[0]).get("stream", 0)
    call(_C.merge_attention_states, [t.detach() for t in outs], [t.detach() for t in lses], out, lse, stream=stream)
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
