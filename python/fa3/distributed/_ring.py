"""Ring attention: K/V shards travel around the ring of ranks, one hop per step.

Step i, rank r holds the K/V shard of rank (r - i) mod W, attends its query shard to
the part of it that is visible (_zigzag.visible_block) and merges the result into its
running (out, lse) in fp32, while the shard for step i + 1 is already on its way. The
backward pass runs the same ring: every block's gradient is computed with the global
out and lse (_blocks.block_backward), dQ stays home, and dK/dV accumulators travel
with their K/V shard, arriving back at their owner after the last step.

Fixed-length and packed (varlen) shards run the same loops through a layout
(_blocks.Dense, _varlen_blocks.Packed) that reads and writes a shard's zigzag halves
and computes one block.
"""

import torch
import torch.distributed as dist

from .. import _checks as _fa3_checks
from .._merge import merge_attention_states_list
from ..interface import flash_attn_func, flash_attn_varlen_func
from . import _blocks, _checks, _varlen_blocks
from ._zigzag import visible_block


class _Ring:
    """The ring's neighbours in a group, and the exchange of tensors with them."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)
        # On CUDA the transfers run on a stream of their own, so that they overlap the
        # kernels on the caller's stream.
        self.stream = None

    def start(self, tensors):
        """Sends tensors to the next rank and receives their like from the previous
        one; returns (wait, received) where wait() blocks until both are done."""
        # Transports send whole buffers: a view of a larger tensor is copied first.
        tensors = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        if tensors[0].device.type == "cuda":
            caller = torch.cuda.current_stream(tensors[0].device)
            if self.stream is None:
                self.stream = torch.cuda.Stream(tensors[0].device)
            self.stream.wait_stream(caller)
            with torch.cuda.stream(self.stream):
                requests = dist.batch_isend_irecv(ops)
        else:
            requests = dist.batch_isend_irecv(ops)

        def wait():
            for request in requests:
                request.wait()
            if self.stream is not None:
                torch.cuda.current_stream(tensors[0].device).wait_stream(self.stream)
                for t in tensors + received:
                    t.record_stream(self.stream)

        return wait, received


def _ring_forward(q, k, v, scale, causal, ring, shards=_blocks.DENSE):
    out = torch.zeros(q.shape[:3] + (v.shape[3],), dtype=torch.float32, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=torch.float32, device=q.device)
    for step in range(ring.size):
        if step + 1 < ring.size:
            wait, (next_k, next_v) = ring.start([k, v])
        q_half, kv_half, block_causal = visible_block(ring.rank, (ring.rank - step) % ring.size, causal)
        block_out, block_lse = shards.forward(q, k, v, q_half, kv_half, scale, block_causal)
        rows_out, rows_lse = shards.rows(out, q_half), shards.rows(lse, q_half, dim=2)
        merged_out, merged_lse = merge_attention_states_list([rows_out, block_out], [rows_lse, block_lse])
        shards.set_rows(out, q_half, merged_out)
        shards.set_rows(lse, q_half, merged_lse, dim=2)
        if step + 1 < ring.size:
            wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, scale, causal, deterministic, ring, shards):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for step in range(ring.size):
        if step + 1 < ring.size:
            wait_kv, (next_k, next_v) = ring.start([k, v])
        q_half, kv_half, block_causal = visible_block(ring.rank, (ring.rank - step) % ring.size, causal)
        block_dq, block_dk, block_dv = shards.backward(
            dout, q, k, v, out, lse, q_half, kv_half, scale, block_causal, deterministic
        )
        shards.add_rows(dq, q_half, block_dq)
        shards.add_rows(dk, kv_half, block_dk)
        shards.add_rows(dv, kv_half, block_dv)
        # The accumulators follow their K/V shard; after the last step they hop home.
        wait_grads, (dk, dv) = ring.start([dk, dv])
        if step + 1 < ring.size:
            wait_kv()
            k, v = next_k, next_v
        wait_grads()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, deterministic, ring, shards=_blocks.DENSE):
        out, lse = _ring_forward(q, k, v, scale, causal, ring, shards)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (scale, causal, deterministic, ring, shards)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.options)
        return dq, dk, dv, None, None, None, None, None


def ring_flash_attn_func(
    q, k, v, softmax_scale=None, causal=False, group=None, deterministic=False, return_attn_probs=False, sm_margin=0
):
    """Exact attention over a sequence sharded across the ranks of `group` (default:
    the whole world), by ring passing of K/V.

    q (batch, seqlen, nheads, headdim), k and v (batch, seqlen, nheads_k, headdim |
    headdim_v): this rank's shard, the same positions of each; every rank's shard has
    the same shape and dtype. causal=True takes zigzag shards (zigzag_shard), seqlen
    even; otherwise shards are consecutive in rank order (or any order: without a mask
    the order of keys does not matter). GQA/MQA: only the nheads_k K/V heads travel.
    softmax_scale, deterministic and sm_margin act as in fa3.flash_attn_func: with a
    margin the attention kernels leave SMs to the ring's transfers, which run beside
    them.

    Returns this rank's shard of the output, or (out, softmax_lse) with
    return_attn_probs, as flash_attn_func does; differentiable in q, k and v. A group
    of one rank is plain flash_attn_func. Mismatched shards across ranks raise the same
    ValueError on every rank.
    """
    _checks.check_local(q, k, v, causal)
    group = group or dist.group.WORLD
    if dist.get_world_size(group) == 1:
        return flash_attn_func(
            q, k, v, softmax_scale, causal, deterministic=deterministic, return_attn_probs=return_attn_probs,
            sm_margin=sm_margin,
        )
    _checks.check_across_ranks(q, k, v, causal, group)
    scale = _fa3_checks.softmax_scale_arg(softmax_scale) or q.shape[3] ** -0.5
    shards = _blocks.Dense(_fa3_checks.sm_margin_arg(sm_margin))
    out, lse = _RingAttention.apply(q, k, v, scale, bool(causal), bool(deterministic), _Ring(group), shards)
    return (out, lse) if return_attn_probs else out


def ring_flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    softmax_scale=None,
    causal=False,
    group=None,
    deterministic=False,
    return_attn_probs=False,
    sm_margin=0,
):
    """ring_flash_attn_func on packed batches: exact attention over sequences packed
    without padding, each sequence sharded across the ranks of `group` (default: the
    whole world).

    q (total, nheads, headdim), k and v (total, nheads_k, headdim | headdim_v): this
    rank's shard of every sequence, packed in sequence order, as zigzag_shard_varlen
    (causal) or shard_varlen give them. cu_seqlens_q, cu_seqlens_k (int32, batch + 1),
    max_seqlen_q, max_seqlen_k: this rank's shard's, as flash_attn_varlen_func takes
    them; the shard's offsets are the whole batch's divided by the world size, and
    alike on every rank. q, k and v hold the same positions, so cu_seqlens_k must equal
    cu_seqlens_q. causal=True takes zigzag shards (each sequence's local length even);
    without causal, any cut of each sequence into equal pieces, one per rank, works.
    Empty sequences are allowed. The offsets are read on the host (on CUDA, one
    synchronization per call).

    Returns this rank's shard of the output (total, nheads, headdim_v), or (out,
    softmax_lse) with return_attn_probs, softmax_lse being (nheads, total) in float32
    as flash_attn_varlen_func returns it; differentiable in q, k and v. A group of one
    rank is plain flash_attn_varlen_func. Mismatched shards across ranks (offsets,
    heads, head dims, dtype, causal) raise the same ValueError on every rank.
    """
    offsets = _checks.check_local_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    group = group or dist.group.WORLD
    if dist.get_world_size(group) > 1:
        _checks.check_across_ranks_varlen(q, k, v, offsets, causal, group)
    _checks.check_varlen_layout(offsets, causal)
    if dist.get_world_size(group) == 1:
        return flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=softmax_scale,
            causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, sm_margin=sm_margin,
        )
    scale = _fa3_checks.softmax_scale_arg(softmax_scale) or q.shape[2] ** -0.5
    shards = _varlen_blocks.Packed(offsets, bool(causal), q.device, _fa3_checks.sm_margin_arg(sm_margin))
    # The ring's loops take the packed rows as one sequence of a batch of one.
    out, lse = _RingAttention.apply(
        q[None], k[None], v[None], scale, bool(causal), bool(deterministic), _Ring(group), shards
    )
    out, lse = out[0], lse[0]
    return (out, lse) if return_attn_probs else out
