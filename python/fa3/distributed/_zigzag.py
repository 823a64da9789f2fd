"""Zigzag sharding for causal attention, and which part of a K/V block a query shard sees.

Causal attention in plain contiguous shards gives rank W - 1 W times the work of rank
0. Cut in 2W chunks, rank r holding chunks r and 2W - 1 - r, every rank holds one early
and one late chunk and does the same work.
"""

import torch


def zigzag_shard(x, rank, world_size, dim=1):
    """Rank `rank`'s zigzag shard of the full sequence x: chunks rank and
    2 * world_size - 1 - rank of 2 * world_size equal chunks along dim, concatenated."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, world_size) = [0, {world_size}), got {rank}")
    length = x.shape[dim]
    if length % (2 * world_size):
        raise ValueError(
            f"x: zigzag sharding cuts dim {dim} in 2 * world_size = {2 * world_size} equal chunks; "
            f"its length {length} is not divisible by {2 * world_size}"
        )
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unshard(shards, dim=1):
    """The full sequence from every rank's zigzag shard, shards[r] being rank r's."""
    shards = list(shards)
    if not shards:
        raise ValueError("shards: expected one shard per rank, got none")
    world_size = len(shards)
    halves = [s.chunk(2, dim=dim) for s in shards]
    firsts = [halves[r][0] for r in range(world_size)]
    seconds = [halves[r][1] for r in reversed(range(world_size))]
    return torch.cat(firsts + seconds, dim=dim)


def visible_block(rank, source, causal):
    """What the query shard of `rank` sees of the K/V shard of `source`, both zigzag
    when causal: (q_half, kv_half, causal) with halves None (whole shard), 0 or 1 (its
    first or second chunk), or None if nothing is visible.

    rank's chunks are r and 2W-1-r; source's s and 2W-1-s. s < r: both of rank's
    chunks come after chunk s and before 2W-1-s, so the whole query shard sees the
    first K/V chunk. s > r: only chunk 2W-1-r comes after chunks s and 2W-1-s (s < W
    <= 2W-1-r). s == r: the shard itself, causal (its positions are increasing).
    """
    if not causal:
        return None, None, False
    if source == rank:
        return None, None, True
    if source < rank:
        return None, 0, False
    return 1, None, False
