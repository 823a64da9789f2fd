"""One block of context-parallel attention: a query shard against one K/V shard,
forward and backward, with the global out and lse in the backward.

The block backward takes the merged (global) out and lse, so that its probabilities
exp(s - lse) and its D = rowsum(dout * out) are those of the whole row: the sum of the
blocks' gradients is then the gradient of the whole attention. On CUDA tensors this is
fa3::bwd, whose kernels read the out and lse they are given. fa3's CPU backward
recomputes out and lse from its own q, k, v instead (it is the exact reference), which
for one block would give the block's own statistics; on CPU tensors the block
backward is therefore written here in torch operations, in fp32.

The ring (_ring) sees blocks through a layout: Dense here for (batch, seqlen, nheads,
headdim) shards, _varlen_blocks.Packed for packed batches. A layout reads and writes
the rows of a zigzag half of a shard (half None: the whole shard; 0 or 1: its first
or second chunk), rows along dim 1 of q, k, v and out and dim 2 of lse, and computes
a block from whole shards and the halves that take part.
"""

import torch

from .. import _torch_ops
from ..interface import flash_attn_func


def block_forward(q, k, v, scale, causal, sm_margin=0):
    """(out, lse) of one block, out in fp32 for the merges."""
    out, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_attn_probs=True, sm_margin=sm_margin)
    return out.float(), lse


def block_backward(dout, q, k, v, out, lse, scale, causal, deterministic, sm_margin=0):
    """(dq, dk, dv) of one block in fp32; out and lse are the whole row's."""
    if q.device.type == "cuda":
        # lse arrives as a slice of the shard's (batch, nheads, seqlen) rows.
        dq, dk, dv, _ = _torch_ops.attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, scale, causal, -1, 0 if causal else -1, 0.0, deterministic, 0,
            sm_margin,
        )
        return dq.float(), dk.float(), dv.float()
    return block_backward_with_torch(dout, q, k, v, out, lse, scale, causal)


class Dense:
    """Fixed-length shards: a zigzag half is a chunk of the sequence dim, a view. The
    blocks' kernels leave `sm_margin` SMs free (for the ring's transfers)."""

    def __init__(self, sm_margin=0):
        self.sm_margin = sm_margin

    @staticmethod
    def rows(t, half, dim=1):
        return t if half is None else t.chunk(2, dim=dim)[half]

    def set_rows(self, t, half, value, dim=1):
        self.rows(t, half, dim).copy_(value)

    def add_rows(self, t, half, value, dim=1):
        self.rows(t, half, dim).add_(value)

    def forward(self, q, k, v, q_half, kv_half, scale, causal):
        return block_forward(
            self.rows(q, q_half), self.rows(k, kv_half), self.rows(v, kv_half), scale, causal, self.sm_margin
        )

    def backward(self, dout, q, k, v, out, lse, q_half, kv_half, scale, causal, deterministic):
        return block_backward(
            self.rows(dout, q_half),
            self.rows(q, q_half),
            self.rows(k, kv_half),
            self.rows(v, kv_half),
            self.rows(out, q_half),
            self.rows(lse, q_half, dim=2),
            scale,
            causal,
            deterministic,
            self.sm_margin,
        )


DENSE = Dense()


def block_backward_with_torch(dout, q, k, v, out, lse, scale, causal):
    group = q.shape[2] // k.shape[2]
    qf, dof, of = q.float(), dout.float(), out.float()
    kf = k.float().repeat_interleave(group, dim=2)
    vf = v.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        rows = torch.arange(seqlen_q, device=q.device)[:, None] + (seqlen_k - seqlen_q)
        scores = scores.masked_fill(torch.arange(seqlen_k, device=q.device)[None, :] > rows, float("-inf"))
    # Rows that saw no key anywhere (lse -inf) have no gradient.
    finite_lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    probs = torch.exp(scores - finite_lse.unsqueeze(-1))
    dprobs = torch.einsum("bqhd,bkhd->bhqk", dof, vf)
    delta = (dof * of).sum(-1).transpose(1, 2).unsqueeze(-1)
    dscores = probs * (dprobs - delta) * scale
    dq = torch.einsum("bhqk,bkhd->bqhd", dscores, kf)
    dk = torch.einsum("bhqk,bqhd->bkhd", dscores, qf)
    dv = torch.einsum("bhqk,bqhd->bkhd", probs, dof)
    batch, seqlen_k, nheads_k = k.shape[:3]
    dk = dk.reshape(batch, seqlen_k, nheads_k, group, -1).sum(3)
    dv = dv.reshape(batch, seqlen_k, nheads_k, group, -1).sum(3)
    return dq, dk, dv
