"""All-gather context parallelism: gather K/V once, attend in one call per chunk.

Every rank gathers the whole K/V sequence (all_gather of its shards, only the KV
heads), puts it in sequence order and attends its query shard to it with
flash_attn_func, whose own backward gives dK/dV for the whole sequence; the backward
of the gather sums them over ranks and hands each rank its own shard's
(reduce-scatter; on gloo, which has none, an all-reduce and a slice).

Packed (varlen) shards attend in one flash_attn_varlen_func call: with causal, each
sequence's two zigzag chunks of queries are two sequences of that call, each with
the keys of its sequence up to its own end. The keys up to the first chunk's end are
then read twice, and their two gradients summed by index_select's backward: two addends
onto zero, a sum that does not depend on their order, so deterministic stays so.
"""

import torch
import torch.distributed as dist

from ..interface import flash_attn_func, flash_attn_varlen_func
from . import _checks, _varlen_shards
from ._zigzag import zigzag_unshard


class _AllGather(torch.autograd.Function):
    """Forward: every rank's shard, concatenated along dim in rank order. Backward: this
    rank's part of the sum over ranks of the gradient of the concatenation."""

    @staticmethod
    def forward(ctx, shard, dim, group):
        ctx.dim, ctx.group = dim, group
        parts = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        world_size = dist.get_world_size(ctx.group)
        # Summed in fp32: a sum in bf16 would round at each of its W - 1 additions.
        parts = [p.float().contiguous() for p in grad.chunk(world_size, dim=ctx.dim)]
        if dist.get_backend(ctx.group) == "gloo":
            total = torch.stack(parts)
            dist.all_reduce(total, group=ctx.group)
            mine = total[dist.get_rank(ctx.group)]
        else:
            mine = torch.empty_like(parts[0])
            dist.reduce_scatter(mine, parts, group=ctx.group)
        return mine.to(grad.dtype), None, None


def _whole_sequence(shard, causal, group):
    """The whole K or V sequence from every rank's shard, in sequence order."""
    gathered = _AllGather.apply(shard, 1, group)
    if not causal:
        return gathered
    return zigzag_unshard(gathered.chunk(dist.get_world_size(group), dim=1))


def allgather_flash_attn_func(
    q, k, v, softmax_scale=None, causal=False, group=None, deterministic=False, return_attn_probs=False, sm_margin=0
):
    """ring_flash_attn_func's arguments, shards and results, computed by gathering K/V
    on every rank instead of passing it around a ring (memory: the whole K/V sequence
    per rank)."""
    _checks.check_local(q, k, v, causal)
    group = group or dist.group.WORLD
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return flash_attn_func(
            q, k, v, softmax_scale, causal, deterministic=deterministic, return_attn_probs=return_attn_probs,
            sm_margin=sm_margin,
        )
    _checks.check_across_ranks(q, k, v, causal, group)
    full_k = _whole_sequence(k, causal, group)
    full_v = _whole_sequence(v, causal, group)
    if not causal:
        return flash_attn_func(
            q, full_k, full_v, softmax_scale, deterministic=deterministic, return_attn_probs=return_attn_probs,
            sm_margin=sm_margin,
        )
    # Zigzag: the first chunk (r) sees keys up to its own end, the second (2W-1-r) too;
    # bottom-right causal alignment puts each chunk's queries at the end of its keys.
    rank, chunk = dist.get_rank(group), q.shape[1] // 2
    results = [
        flash_attn_func(
            q_half,
            full_k[:, :end],
            full_v[:, :end],
            softmax_scale,
            True,
            deterministic=deterministic,
            return_attn_probs=True,
            sm_margin=sm_margin,
        )
        for q_half, end in zip(q.chunk(2, dim=1), ((rank + 1) * chunk, (2 * world_size - rank) * chunk))
    ]
    out = torch.cat([r[0] for r in results], dim=1)
    lse = torch.cat([r[1] for r in results], dim=2)
    return (out, lse) if return_attn_probs else out


def _varlen_keys(offsets, rank, world_size, causal):
    """(key_rows, q_offsets, k_offsets): the rows of the gathered K/V (every rank's
    shard in rank order) that each query sequence of the call attends to, and the
    call's offsets. Without causal, the call's sequences are the shard's, each with all
    keys of its sequence; with causal, each zigzag chunk is a sequence of its own,
    with the keys up to its end (bottom-right causal alignment puts it there)."""
    whole = _varlen_shards.global_rows(offsets, world_size, zigzag=causal)
    if not causal:
        return whole, offsets, [o * world_size for o in offsets]
    q_offsets, starts, counts = [], [], []
    for start, length in zip(offsets, _varlen_shards.lengths(offsets)):
        half = length // 2
        q_offsets += [start, start + half]
        # Chunk rank ends at (rank + 1) halves into the sequence, chunk 2W-1-rank at 2W - rank.
        starts += [start * world_size] * 2
        counts += [(rank + 1) * half, (2 * world_size - rank) * half]
    k_offsets = torch.tensor([0] + counts).cumsum(0).tolist()
    return whole[_varlen_shards.piece_rows(starts, counts)], q_offsets + [offsets[-1]], k_offsets


def allgather_flash_attn_varlen_func(
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
    """ring_flash_attn_varlen_func's arguments, shards and results, computed by
    gathering K/V on every rank instead of passing it around a ring (memory: the whole
    K/V batch per rank, and with causal a copy of the keys each query chunk sees)."""
    offsets = _checks.check_local_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    group = group or dist.group.WORLD
    world_size = dist.get_world_size(group)
    if world_size > 1:
        _checks.check_across_ranks_varlen(q, k, v, offsets, causal, group)
    _checks.check_varlen_layout(offsets, causal)
    if world_size == 1:
        return flash_attn_varlen_func(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=softmax_scale,
            causal=causal, deterministic=deterministic, return_attn_probs=return_attn_probs, sm_margin=sm_margin,
        )
    key_rows, q_offsets, k_offsets = _varlen_keys(offsets, dist.get_rank(group), world_size, bool(causal))
    key_rows = key_rows.to(q.device)
    full_k = _AllGather.apply(k, 0, group).index_select(0, key_rows)
    full_v = _AllGather.apply(v, 0, group).index_select(0, key_rows)
    return flash_attn_varlen_func(
        q,
        full_k,
        full_v,
        torch.tensor(q_offsets, dtype=torch.int32, device=q.device),
        torch.tensor(k_offsets, dtype=torch.int32, device=q.device),
        max(_varlen_shards.lengths(q_offsets)),
        max(_varlen_shards.lengths(k_offsets)),
        softmax_scale=softmax_scale,
        causal=causal,
        deterministic=deterministic,
        return_attn_probs=return_attn_probs,
        sm_margin=sm_margin,
    )
