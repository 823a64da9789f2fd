"""Argument checks of the context-parallel functions, across ranks.

Each rank checks its own shard; one all_gather of a few integers per call then
checks that every rank holds shards of one problem, so that a mismatch raises the
same ValueError on every rank instead of hanging a transfer or corrupting a merge.
"""

import torch
import torch.distributed as dist

from .. import _checks

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)
# What every rank must agree on: the argument it belongs to, what it is, and how a
# value (an integer, to travel in one tensor) reads in a message.
_FIELDS = (
    ("q", "sequence length", int),
    ("q", "batch", int),
    ("q", "query heads", int),
    ("k", "key/value heads", int),
    ("q", "head dim", int),
    ("v", "head dim", int),
    ("q", "dtype", lambda code: _DTYPES[code]),
    ("causal", "value", bool),
)


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
    mine = [q.shape[1], q.shape[0], q.shape[2], k.shape[2], q.shape[3], v.shape[3], _DTYPES.index(q.dtype), int(causal)]
    # gloo's collectives take CPU tensors, NCCL's CUDA ones.
    device = q.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    local = torch.tensor(mine, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, local, group=group)
    table = torch.stack(gathered).cpu().tolist()
    for rank, row in enumerate(table):
        for (arg, what, read), value, first in zip(_FIELDS, row, table[0]):
            if value != first:
                raise ValueError(
                    f"{arg}: every rank must hold a shard of one problem; {what} is {read(value)} on rank {rank} "
                    f"but {read(first)} on rank 0"
                )
