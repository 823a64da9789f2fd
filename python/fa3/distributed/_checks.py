"""Argument checks of the context-parallel functions, across ranks.

Each rank checks its own shard; one all_gather of a few integers per call (two for
packed shards: their offsets, once their counts agree) then checks that every rank
holds shards of one problem, so that a mismatch raises the same ValueError on every
rank instead of hanging a transfer or corrupting a merge.
"""

import torch
import torch.distributed as dist

from .. import _checks
from . import _varlen_shards

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


def _dtype(code):
    return _DTYPES[code]


def _problem_fields(q, k, v, causal, heads_dim):
    """The fields every rank must agree on for q, k, v (heads along heads_dim, head dim
    last) and causal: (argument, what it is, value as an int, how a value reads)."""
    return [
        ("q", "query heads", q.shape[heads_dim], int),
        ("k", "key/value heads", k.shape[heads_dim], int),
        ("q", "head dim", q.shape[-1], int),
        ("v", "head dim", v.shape[-1], int),
        ("q", "dtype", _DTYPES.index(q.dtype), _dtype),
        ("causal", "value", int(causal), bool),
    ]


def check_local(q, k, v, causal):
    _checks.check_qkv(q, k, v)
    if q.shape[1] != k.shape[1]:
        raise ValueError(
            f"k: each rank holds the same positions of q, k and v; got {q.shape[1]} queries and {k.shape[1]} keys"
        )
    if causal and q.shape[1] % 2:
        raise ValueError(
            f"q: causal attention takes zigzag shards (fa3.distributed.zigzag_shard) of two equal chunks; "
            f"a shard of length {q.shape[1]} does not split in two"
        )


def check_across_ranks(q, k, v, causal, group):
    """Raises the same ValueError on every rank unless all ranks hold shards of one problem."""
    fields = [("q", "sequence length", q.shape[1], int), ("q", "batch", q.shape[0], int)]
    _same_on_every_rank(fields + _problem_fields(q, k, v, causal, 2), q.device, group)


def check_local_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    """The checks of one rank's packed shard; returns its offsets (a list of ints)."""
    _checks.check_qkv(q, k, v, packed=True)
    _checks.check_varlen_indices(q, cu_seqlens_q, cu_seqlens_k, None, None)
    offsets = _varlen_shards.offsets_arg("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q")
    offsets_k = _varlen_shards.offsets_arg("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k")
    if offsets_k != offsets:
        raise ValueError(
            f"cu_seqlens_k: each rank holds the same positions of q, k and v, so cu_seqlens_k must equal "
            f"cu_seqlens_q; got {offsets_k} and {offsets}"
        )
    longest = max(_varlen_shards.lengths(offsets))
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if _checks.max_seqlen_arg(name, value) < longest:
            raise ValueError(f"{name}: {value} is less than the longest sequence of this rank's shard, {longest}")
    return offsets


def check_across_ranks_varlen(q, k, v, offsets, causal, group):
    """check_across_ranks for packed shards: the same sequences (local cu_seqlens) too."""
    fields = [("cu_seqlens_q", "number of sequences", len(offsets) - 1, int)]
    _same_on_every_rank(fields + _problem_fields(q, k, v, causal, 1), q.device, group)
    # Now that the counts agree, so do the rows' lengths.
    _same_on_every_rank(
        [("cu_seqlens_q", f"cu_seqlens_q[{i}]", offset, int) for i, offset in enumerate(offsets)], q.device, group
    )


def check_varlen_layout(offsets, causal):
    """Causal attention takes zigzag shards: each sequence's local length is even. Run
    after the agreement across ranks, this raises alike on every rank."""
    if not causal:
        return
    for b, length in enumerate(_varlen_shards.lengths(offsets)):
        if length % 2:
            raise ValueError(
                f"cu_seqlens_q: causal attention takes zigzag shards (fa3.distributed.zigzag_shard_varlen), two "
                f"equal chunks of each sequence; sequence {b}'s local length {length} does not split in two"
            )


def _same_on_every_rank(fields, device, group):
    """One all_gather of the fields' values; a value that differs from rank 0's raises
    on every rank, naming the field's argument."""
    # gloo's collectives take CPU tensors, NCCL's CUDA ones.
    if dist.get_backend(group) != "nccl":
        device = torch.device("cpu")
    local = torch.tensor([value for _, _, value, _ in fields], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    table = torch.stack(gathered).cpu().tolist()
    for rank, row in enumerate(table):
        for (arg, what, _, read), value, first in zip(fields, row, table[0]):
            if value != first:
                raise ValueError(
                    f"{arg}: every rank must hold a shard of one problem; {what} is {read(value)} on rank {rank} "
                    f"but {read(first)} on rank 0"
                )
