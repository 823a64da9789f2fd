"""All-gather context parallelism: gather K/V once, attend in one call per chunk.

Every rank gathers the whole K/V sequence (all_gather of its shards, only the KV
heads), puts it in sequence order and attends its query shard to it with
flash_attn_func, whose own backward gives dK/dV for the whole sequence; the backward
of the gather sums them over ranks and hands each rank its own shard's
(reduce-scatter; on gloo, which has none, an all-reduce and a slice).
"""

import torch
import torch.distributed as dist

from ..interface import flash_attn_func
from . import _checks


def _shard_order(world_size, causal):
    """Sequence order of the gathered chunks: with causal, rank r's shard is chunks r
    and 2W-1-r (zigzag), else it is one chunk, rank r's."""
    if not causal:
        return list(range(world_size)), 1
    return [r for r in range(world_size)] + [r for r in reversed(range(world_size))], 2


class _GatherSequence(torch.autograd.Function):
    """Forward: the whole sequence from every rank's shard. Backward: each rank's
    shard of the sum over ranks of the gradient of the whole sequence."""

    @staticmethod
    def forward(ctx, shard, causal, group):
        ctx.causal, ctx.group = causal, group
        world_size = dist.get_world_size(group)
        parts = [torch.empty_like(shard) for _ in range(world_size)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        order, per_rank = _shard_order(world_size, causal)
        chunks = [p.chunk(per_rank, dim=1) for p in parts]
        seen = [0] * world_size
        ordered = []
        for r in order:
            ordered.append(chunks[r][seen[r]])
            seen[r] += 1
        return torch.cat(ordered, dim=1)

    @staticmethod
    def backward(ctx, grad):
        world_size = dist.get_world_size(ctx.group)
        rank = dist.get_rank(ctx.group)
        order, per_rank = _shard_order(world_size, ctx.causal)
        chunks = grad.contiguous().chunk(world_size * per_rank, dim=1)
        by_rank = [[] for _ in range(world_size)]
        for r, chunk in zip(order, chunks):
            by_rank[r].append(chunk)
        shards = [torch.cat(c, dim=1).float() for c in by_rank]
        if dist.get_backend(ctx.group) == "gloo":
            total = torch.stack(shards)
            dist.all_reduce(total, group=ctx.group)
            mine = total[rank]
        else:
            mine = torch.empty_like(shards[rank])
            dist.reduce_scatter(mine, shards, group=ctx.group)
        return mine.to(grad.dtype), None, None


def allgather_flash_attn_func(
    q, k, v, softmax_scale=None, causal=False, group=None, deterministic=False, return_attn_probs=False
):
    """ring_flash_attn_func's arguments, shards and results, computed by gathering K/V
    on every rank instead of passing it around a ring (memory: the whole K/V sequence
    per rank)."""
    _checks.check_local(q, k, v, causal)
    group = group or dist.group.WORLD
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return flash_attn_func(
            q, k, v, softmax_scale, causal, deterministic=deterministic, return_attn_probs=return_attn_probs
        )
    _checks.check_across_ranks(q, k, v, causal, group)
    full_k = _GatherSequence.apply(k, bool(causal), group)
    full_v = _GatherSequence.apply(v, bool(causal), group)
    if not causal:
        return flash_attn_func(
            q, full_k, full_v, softmax_scale, deterministic=deterministic, return_attn_probs=return_attn_probs
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
        )
        for q_half, end in zip(q.chunk(2, dim=1), ((rank + 1) * chunk, (2 * world_size - rank) * chunk))
    ]
    out = torch.cat([r[0] for r in results], dim=1)
    lse = torch.cat([r[1] for r in results], dim=2)
    return (out, lse) if return_attn_probs else out
