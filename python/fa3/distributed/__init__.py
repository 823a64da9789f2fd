"""Context parallelism: one exact attention over a sequence sharded across ranks.

Each rank of a torch.distributed process group holds its shard of q, k and v along
the sequence (dim 1). Two ways to attend over the whole sequence:

- ring_flash_attn_func passes K/V blocks around the ring of ranks with point-to-point
  sends, computing each block with fa3's kernels while the next is in flight, and
  merges the partial results exactly (fa3.merge_attention_states). Memory per rank
  stays one shard of K/V (two while one is in flight).
- allgather_flash_attn_func gathers K/V once and attends to it in one call; its
  backward reduces dK/dV back to their shards.

Which to choose (a hypothesis, to be measured on GPUs over NCCL): ring moves the same
K/V bytes as the all-gather but overlaps them with compute, at the cost of W smaller
kernel calls and W merges; the all-gather pays its transfer up front but attends in
one large call. With few KV heads (GQA/MQA: K/V much smaller than Q), the transfer is
cheap next to the attention, and the all-gather should win; with many KV heads and long
shards, the ring should.

causal=True takes zigzag shards (zigzag_shard): the sequence is cut in 2W chunks and
rank r holds chunks r and 2W - 1 - r, so that every rank does the same causal work.
Without causal, any split into equal contiguous shards in rank order works.

Packed batches (several sequences in one (total, nheads, headdim) tensor, as
fa3.flash_attn_varlen_func takes them) have the same two functions,
ring_flash_attn_varlen_func and allgather_flash_attn_varlen_func. Every sequence is
sharded across the ranks: rank r holds its piece of each sequence, packed in sequence
order, so every rank's shard has the same offsets, the whole batch's divided by W;
the functions take that shard's cu_seqlens and max_seqlen (the local ones, what each
rank holds). causal=True takes each sequence's zigzag chunks (zigzag_shard_varlen:
lengths divisible by 2W); otherwise any cut of each sequence into W equal pieces
works (shard_varlen: contiguous pieces in rank order). zigzag_unshard_varlen and
unshard_varlen put the shards back together; all four take the whole batch's
cu_seqlens.
"""

from ._allgather import allgather_flash_attn_func, allgather_flash_attn_varlen_func
from ._ring import ring_flash_attn_func, ring_flash_attn_varlen_func
from ._varlen_shards import shard_varlen, unshard_varlen, zigzag_shard_varlen, zigzag_unshard_varlen
from ._zigzag import zigzag_shard, zigzag_unshard

__all__ = [
    "ring_flash_attn_func",
    "allgather_flash_attn_func",
    "zigzag_shard",
    "zigzag_unshard",
    "ring_flash_attn_varlen_func",
    "allgather_flash_attn_varlen_func",
    "zigzag_shard_varlen",
    "zigzag_unshard_varlen",
    "shard_varlen",
    "unshard_varlen",
]
