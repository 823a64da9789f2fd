"""Packed (varlen) shards: which rows of a packed batch each rank holds.

A packed batch holds its sequences back to back along dim 0, sequence b in rows
cu_seqlens[b] to cu_seqlens[b + 1]. Sharded, each sequence is cut into W equal pieces
(shard_varlen), or into 2W equal chunks of which rank r holds r and 2W - 1 - r
(zigzag_shard_varlen, for causal attention: every rank then does the same work in
every sequence). Rank r holds its part of every sequence, in sequence order, so that
every rank's shard has the same layout: local cu_seqlens = global cu_seqlens / W.

Everything here is index arithmetic on the host's copy of the offsets, done once per
call; the row indices it gives are gathered with index_select, on any device.
"""

import torch


def offsets_arg(name, cu_seqlens, total, of):
    """cu_seqlens as a list of ints, checked: 1-d, at least one sequence, starting at 0,
    never decreasing and ending at `total`, the rows of tensor `of`, so that every row
    belongs to a sequence."""
    offsets = torch.as_tensor(cu_seqlens)
    if offsets.dim() != 1 or offsets.numel() < 2 or offsets.is_floating_point():
        raise ValueError(f"{name}: expected 1-d integer offsets (batch + 1) with batch >= 1, got {cu_seqlens!r}")
    offsets = offsets.tolist()  # one copy to the host, on CUDA a synchronization
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])) or offsets[-1] != total:
        raise ValueError(
            f"{name}: must start at 0, never decrease and end at {of}'s {total} rows (every row belongs to a "
            f"sequence); got {offsets}"
        )
    return offsets


def lengths(offsets):
    return [b - a for a, b in zip(offsets, offsets[1:])]


def piece_rows(starts, counts):
    """The rows start .. start + count - 1 of each piece, concatenated (a LongTensor)."""
    starts = torch.as_tensor(starts, dtype=torch.int64)
    counts = torch.as_tensor(counts, dtype=torch.int64)
    # Row i of the result, in piece p, is starts[p] + (i - where piece p begins).
    shifts = (starts - (counts.cumsum(0) - counts)).repeat_interleave(counts)
    return torch.arange(shifts.numel()) + shifts


def global_rows(local_offsets, world_size, zigzag):
    """For every rank's shard concatenated in rank order (rank r's rows at r * T, T its
    total), the row holding each row of the whole batch, in the whole batch's order."""
    total = local_offsets[-1]
    starts, counts = [], []
    for start, length in zip(local_offsets, lengths(local_offsets)):
        if zigzag:
            # Chunk j < W is rank j's first half, chunk j >= W rank 2W-1-j's second.
            half = length // 2
            starts += [r * total + start for r in range(world_size)]
            starts += [r * total + start + half for r in reversed(range(world_size))]
            counts += [half] * (2 * world_size)
        else:
            starts += [r * total + start for r in range(world_size)]
            counts += [length] * world_size
    return piece_rows(starts, counts)


def half_rows(local_offsets, half):
    """The rows of the first (half 0) or second (half 1) chunk of each sequence of a
    zigzag shard, in sequence order; their offsets are local_offsets / 2."""
    halves = [length // 2 for length in lengths(local_offsets)]
    return piece_rows([start + half * h for start, h in zip(local_offsets, halves)], halves)


def _local_offsets(cu_seqlens, world_size, zigzag, total, of):
    """The shard's offsets, global ones / W, checking that each sequence splits."""
    offsets = offsets_arg("cu_seqlens", cu_seqlens, total, of)
    parts = 2 * world_size if zigzag else world_size
    for b, length in enumerate(lengths(offsets)):
        if length % parts:
            how = "2 * world_size" if zigzag else "world_size"
            raise ValueError(
                f"cu_seqlens: sharding cuts each sequence in {how} = {parts} equal pieces; sequence {b}'s length "
                f"{length} is not divisible by {parts}"
            )
    return [o // world_size for o in offsets]


def _shard(x, cu_seqlens, rank, world_size, dim, zigzag):
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, world_size) = [0, {world_size}), got {rank}")
    local = _local_offsets(cu_seqlens, world_size, zigzag, x.shape[dim], "x")
    order = global_rows(local, world_size, zigzag)
    # order[p] is where global row p sits among the shards; invert it, then take rank's.
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    mine = position[rank * local[-1] : (rank + 1) * local[-1]]
    return x.index_select(dim, mine.to(x.device))


def _unshard(shards, cu_seqlens, dim, zigzag):
    shards = list(shards)
    if not shards:
        raise ValueError("shards: expected one shard per rank, got none")
    joined = torch.cat(shards, dim=dim)
    local = _local_offsets(cu_seqlens, len(shards), zigzag, joined.shape[dim], "the shards joined")
    return joined.index_select(dim, global_rows(local, len(shards), zigzag).to(joined.device))


def shard_varlen(x, cu_seqlens, rank, world_size, dim=0):
    """Rank `rank`'s shard of the packed batch x (sequences along dim, at the global
    offsets cu_seqlens): piece `rank` of W equal contiguous pieces of each sequence, in
    sequence order. Its offsets are cu_seqlens / W."""
    return _shard(x, cu_seqlens, rank, world_size, dim, zigzag=False)


def unshard_varlen(shards, cu_seqlens, dim=0):
    """The packed batch from every rank's shard_varlen shard, shards[r] being rank r's;
    cu_seqlens: the batch's (global) offsets."""
    return _unshard(shards, cu_seqlens, dim, zigzag=False)


def zigzag_shard_varlen(x, cu_seqlens, rank, world_size, dim=0):
    """Rank `rank`'s zigzag shard of the packed batch x (sequences along dim, at the
    global offsets cu_seqlens): chunks rank and 2 * world_size - 1 - rank of 2 *
    world_size equal chunks of each sequence, in sequence order. Its offsets are
    cu_seqlens / W."""
    return _shard(x, cu_seqlens, rank, world_size, dim, zigzag=True)


def zigzag_unshard_varlen(shards, cu_seqlens, dim=0):
    """The packed batch from every rank's zigzag_shard_varlen shard, shards[r] being
    rank r's; cu_seqlens: the batch's (global) offsets."""
    return _unshard(shards, cu_seqlens, dim, zigzag=True)
