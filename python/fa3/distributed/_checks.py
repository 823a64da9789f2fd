"""Argument checks of the context-parallel functions, across ranks.

Each rank checks its own shard; one all_gather of a few integers per call then
checks that every rank holds shards of one problem, so that a mismatch raises the
same ValueError on every rank instead of hanging a transfer or corrupting a merge.
"""

import torch
import torch.distributed as dist

from .. import _checks

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
