"""Blocks of context-parallel attention on packed (varlen) shards, the ring's layout
for them (see _blocks for the layout's role).

The ring holds a packed shard (total, nheads, headdim) as (1, total, nheads,
headdim), its lse (nheads, total) as (1, nheads, total), so that its rows run along
the same dims as a fixed-length shard's and fa3.merge_attention_states takes them
as they are. A zigzag half of a packed shard is not one slice but a chunk of each
sequence: its rows are gathered (index_select) and written back (index_copy_,
index_add_); each half's sequences have the offsets of the shard's halved.
"""

import torch

from .. import _torch_varlen_ops
from ..interface import flash_attn_varlen_func
from . import _varlen_shards
from ._blocks import block_backward_with_torch


class Packed:
    """The layout of a packed shard whose local offsets are `offsets` (a list of
    ints), with its zigzag halves when `zigzag`, index tensors on `device`; the blocks'
    kernels leave `sm_margin` SMs free."""

    def __init__(self, offsets, zigzag, device, sm_margin=0):
        self.sm_margin = sm_margin
        halved = [o // 2 for o in offsets]
        lengths = _varlen_shards.lengths(offsets)
        self.offsets = {None: offsets, 0: halved, 1: halved}
        cu_seqlens = torch.tensor(offsets, dtype=torch.int32, device=device)
        cu_halved = torch.tensor(halved, dtype=torch.int32, device=device)
        self.cu_seqlens = {None: cu_seqlens, 0: cu_halved, 1: cu_halved}
        self.max_seqlen = {None: max(lengths), 0: max(lengths) // 2, 1: max(lengths) // 2}
        self.index = {}
        if zigzag:
            self.index = {half: _varlen_shards.half_rows(offsets, half).to(device) for half in (0, 1)}

    def rows(self, t, half, dim=1):
        return t if half is None else t.index_select(dim, self.index[half])

    def set_rows(self, t, half, value, dim=1):
        if half is None:
            t.copy_(value)
        else:
            t.index_copy_(dim, self.index[half], value)

    def add_rows(self, t, half, value, dim=1):
        if half is None:
            t.add_(value)
        else:
            t.index_add_(dim, self.index[half], value)

    def forward(self, q, k, v, q_half, kv_half, scale, causal):
        """(out, lse) of one block, out in fp32 for the merges."""
        out, lse = flash_attn_varlen_func(
            self.rows(q, q_half)[0],
            self.rows(k, kv_half)[0],
            self.rows(v, kv_half)[0],
            self.cu_seqlens[q_half],
            self.cu_seqlens[kv_half],
            self.max_seqlen[q_half],
            self.max_seqlen[kv_half],
            softmax_scale=scale,
            causal=causal,
            return_attn_probs=True,
            sm_margin=self.sm_margin,
        )
        return out.float()[None], lse[None]

    def backward(self, dout, q, k, v, out, lse, q_half, kv_half, scale, causal, deterministic):
        """(dq, dk, dv) of one block in fp32, for the rows of its halves; out and lse are
        the whole rows' (see _blocks)."""
        dout, q, out = (self.rows(t, q_half)[0] for t in (dout, q, out))
        k, v = (self.rows(t, kv_half)[0] for t in (k, v))
        lse = self.rows(lse, q_half, dim=2)[0]
        if q.device.type == "cuda":
            dq, dk, dv, _ = _torch_varlen_ops.varlen_backward(
                dout,
                q,
                k,
                v,
                out,
                lse.contiguous(),
                self.cu_seqlens[q_half],
                self.cu_seqlens[kv_half],
                None,
                None,
                self.max_seqlen[q_half],
                self.max_seqlen[kv_half],
                None,
                scale,
                causal,
                -1,
                0 if causal else -1,
                0.0,
                deterministic,
                0,
                self.sm_margin,
            )
        else:
            dq, dk, dv = self._backward_with_torch(dout, q, k, v, out, lse, q_half, kv_half, scale, causal)
        return dq.float()[None], dk.float()[None], dv.float()[None]

    def _backward_with_torch(self, dout, q, k, v, out, lse, q_half, kv_half, scale, causal):
        """On CPU tensors, sequence by sequence with the fixed-length torch backward."""
        dq = torch.zeros(q.shape, dtype=torch.float32)
        dk = torch.zeros(k.shape, dtype=torch.float32)
        dv = torch.zeros(v.shape, dtype=torch.float32)
        q_offsets, kv_offsets = self.offsets[q_half], self.offsets[kv_half]
        for q_start, q_end, kv_start, kv_end in zip(q_offsets, q_offsets[1:], kv_offsets, kv_offsets[1:]):
            if q_start == q_end or kv_start == kv_end:
                continue  # an empty sequence: no gradient
            rows, keys = slice(q_start, q_end), slice(kv_start, kv_end)
            seq_dq, seq_dk, seq_dv = block_backward_with_torch(
                dout[None, rows], q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows],
                scale, causal,
            )
            dq[rows], dk[keys], dv[keys] = seq_dq[0], seq_dk[0], seq_dv[0]
        return dq, dk, dv
