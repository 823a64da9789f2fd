"""fa3.distributed on packed (varlen) batches, CPU tensors over gloo: ring and
all-gather context parallelism against one process computing
fa3.flash_attn_varlen_func over the whole batch, forward and backward, with and
without causal, MHA and GQA, fp32 and bf16, sequences of different lengths (empty
ones among them), groups of 2, 3 and 4 ranks; the shard helpers; and the errors
every rank must raise alike.

One world of 4 ranks runs every case on groups of its first 2, 3 and 4 ranks
(distributed_world).
"""

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torch.multiprocessing")

import fa3  # noqa: E402
from fa3 import distributed as cp  # noqa: E402

from distributed_world import GROUP_SIZES, groups_of_first_ranks, init, leave, run_world  # noqa: E402

# Each sequence's length in units of 2W (so that it splits into zigzag chunks on
# every group size): empty sequences first and last, and lengths that differ.
UNITS = (0, 2, 1, 3, 0)
# (function name, causal, zigzag shards, nheads, nheads_k, dtype). Without causal any
# cut of each sequence works: zigzag shards there too check that.
CASES = [
    (fn_name, causal, zigzag, nheads, nheads_k, dtype)
    for fn_name in ("ring_flash_attn_varlen_func", "allgather_flash_attn_varlen_func")
    for causal, zigzag in ((False, False), (False, True), (True, True))
    for nheads, nheads_k in ((4, 4), (4, 2), (4, 1))
    for dtype in (torch.float32, torch.bfloat16)
]


def offsets(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0).to(torch.int32)


def full_inputs(world_size, nheads, nheads_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    cu_seqlens = offsets([2 * world_size * u for u in UNITS])
    total = int(cu_seqlens[-1])
    q = torch.randn(total, nheads, 16, generator=gen).to(dtype)
    k = torch.randn(total, nheads_k, 16, generator=gen).to(dtype)
    v = torch.randn(total, nheads_k, 16, generator=gen).to(dtype)
    dout = torch.randn(total, nheads, 16, generator=gen).to(dtype)
    return cu_seqlens, q, k, v, dout


def check_case(rank, world_size, group, fn_name, causal, zigzag, nheads, nheads_k, dtype, seed):
    cu_seqlens, q, k, v, dout = full_inputs(world_size, nheads, nheads_k, dtype, seed)
    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())

    def shard(x, dim=0):
        split = cp.zigzag_shard_varlen if zigzag else cp.shard_varlen
        return split(x, cu_seqlens, rank, world_size, dim=dim)

    # One process computing the whole attention: fa3's CPU path, exact backward.
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = fa3.flash_attn_varlen_func(
        *full, cu_seqlens, cu_seqlens, longest, longest, causal=causal, return_attn_probs=True
    )
    ref_out.backward(dout)
    local = [shard(t).clone().requires_grad_() for t in (q, k, v)]
    local_cu = cu_seqlens // world_size
    out, lse = getattr(cp, fn_name)(
        *local, local_cu, local_cu, longest // world_size, longest // world_size, causal=causal, group=group,
        return_attn_probs=True,
    )
    out.backward(shard(dout))
    # Tolerances as in test_distributed.py, for the same reasons: fp32, the merges' and
    # the exact backward's rounding only; bf16, the blocks' outputs and gradients are
    # rounded to bf16 as the whole call's are, at other points (2^-8 relative each).
    atol, rtol = (2e-5, 0) if dtype == torch.float32 else (3e-2, 1.6e-2)
    label = f"{fn_name} causal={causal} zigzag={zigzag} heads={nheads}:{nheads_k} {dtype} rank {rank}/{world_size}"
    torch.testing.assert_close(out.float(), shard(ref_out).float(), atol=atol, rtol=rtol, msg=lambda m: f"{label}: {m}")
    torch.testing.assert_close(lse, shard(ref_lse, dim=1), atol=2e-5, rtol=0, msg=lambda m: f"{label}: {m}")
    for name, got, want in zip("qkv", local, full):
        torch.testing.assert_close(
            got.grad.float(), shard(want.grad).float(), atol=atol, rtol=rtol,
            msg=lambda m, name=name: f"d{name}: {label}: {m}",
        )


def all_cases_worker(rank, world_size, port):
    init(rank, world_size, port)
    for size, group in groups_of_first_ranks(rank, world_size):
        for seed, case in enumerate(CASES):
            check_case(rank, size, group, *case, seed)
    leave()


def test_equal_to_one_process_on_2_3_and_4_ranks():
    run_world(all_cases_worker, GROUP_SIZES[-1])


def packed(lengths, nheads=2):
    """(q, cu_seqlens, longest) of a packed shard of these local lengths."""
    cu_seqlens = offsets(lengths)
    return torch.randn(int(cu_seqlens[-1]), nheads, 8), cu_seqlens, max(lengths)


def errors_worker(rank, world_size, port):
    init(rank, world_size, port)
    q, cu, longest = packed([2, 4])
    same_problem = "every rank must hold a shard of one problem"
    for fn in (cp.ring_flash_attn_varlen_func, cp.allgather_flash_attn_varlen_func):
        count_q, count_cu, count_max = packed([2] * (1 + rank))
        with pytest.raises(ValueError, match=f"cu_seqlens_q: {same_problem}; number of sequences is 2 on rank 1 but 1"):
            fn(count_q, count_q, count_q, count_cu, count_cu, count_max, count_max)
        len_q, len_cu, len_max = packed([2, 4 + 2 * rank])
        with pytest.raises(ValueError, match=rf"cu_seqlens_q: {same_problem}; cu_seqlens_q\[2\] is 8 on rank 1 but 6"):
            fn(len_q, len_q, len_q, len_cu, len_cu, len_max, len_max)
        heads, _, _ = packed([2, 4], nheads=1 + rank)
        with pytest.raises(ValueError, match=f"k: {same_problem}; key/value heads is 2"):
            fn(q, heads, heads, cu, cu, longest, longest)
        typed = q.to(torch.bfloat16 if rank else torch.float32)
        with pytest.raises(ValueError, match=f"q: {same_problem}; dtype is torch.bfloat16 on rank 1 but torch.float32"):
            fn(typed, typed, typed, cu, cu, longest, longest)
        with pytest.raises(ValueError, match=f"causal: {same_problem}; value is True on rank 1 but False"):
            fn(q, q, q, cu, cu, longest, longest, causal=bool(rank))
        odd_q, odd_cu, odd_max = packed([2, 3])
        with pytest.raises(ValueError, match="cu_seqlens_q: causal attention takes zigzag shards .* sequence 1's"):
            fn(odd_q, odd_q, odd_q, odd_cu, odd_cu, odd_max, odd_max, causal=True)
        other_cu = offsets([4, 2])
        with pytest.raises(ValueError, match="cu_seqlens_k: each rank holds the same positions of q, k and v"):
            fn(q, q, q, cu, other_cu, longest, longest)
        with pytest.raises(ValueError, match="cu_seqlens_q: must start at 0, never decrease and end at q's 6 rows"):
            fn(q, q, q, offsets([2, 2]), offsets([2, 2]), longest, longest)
        with pytest.raises(ValueError, match="max_seqlen_k: 3 is less than the longest sequence of this rank's shard"):
            fn(q, q, q, cu, cu, longest, 3)
        # Shards that are views of a larger tensor (not contiguous) give the same result.
        wide = torch.randn(6, 4, 8, generator=torch.Generator().manual_seed(rank))
        view = wide[:, :2]
        torch.testing.assert_close(
            fn(view, view, view, cu, cu, longest, longest, causal=True),
            fn(*(view.contiguous(),) * 3, cu, cu, longest, longest, causal=True),
        )
        # A group of one rank is the plain local call; new_group is collective: every
        # rank creates every group.
        groups = [dist.new_group([r]) for r in range(world_size)]
        out = fn(q, q, q, cu, cu, longest, longest, causal=True, group=groups[rank])
        torch.testing.assert_close(out, fa3.flash_attn_varlen_func(q, q, q, cu, cu, longest, longest, causal=True))
    leave()


def test_errors_are_raised_on_every_rank():
    run_world(errors_worker, 2)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("zigzag", [False, True])
def test_shard_and_unshard_round_trip(world_size, zigzag):
    parts = 2 * world_size if zigzag else world_size
    cu_seqlens = offsets([parts * u for u in (2, 0, 1)])
    x = torch.arange(int(cu_seqlens[-1]) * 2).reshape(-1, 2)
    shard, unshard = (
        (cp.zigzag_shard_varlen, cp.zigzag_unshard_varlen) if zigzag else (cp.shard_varlen, cp.unshard_varlen)
    )
    shards = [shard(x, cu_seqlens, r, world_size) for r in range(world_size)]
    for r, s in enumerate(shards):
        assert s.shape[0] == int(cu_seqlens[-1]) // world_size
        # The first sequence is `parts` pieces of 2 rows; rank r's shard starts with its
        # own: piece r, or with zigzag chunks r and 2W - 1 - r.
        first = [r, 2 * world_size - 1 - r] if zigzag else [r]
        assert torch.equal(s[: 2 * len(first)], torch.cat([x[2 * c : 2 * c + 2] for c in first]))
    assert torch.equal(unshard(shards, cu_seqlens), x)
    # Along another dim (an lse (nheads, total)), with the offsets as a list.
    lse = x.T.contiguous()
    lse_shards = [shard(lse, cu_seqlens.tolist(), r, world_size, dim=1) for r in range(world_size)]
    assert all(torch.equal(a, b.T) for a, b in zip(lse_shards, shards))
    assert torch.equal(unshard(lse_shards, cu_seqlens, dim=1), lse)


def test_shard_varlen_rejects_a_sequence_that_does_not_split():
    cu_seqlens = offsets([8, 6])
    x = torch.zeros(14)
    zigzag_rule = r"cu_seqlens: sharding cuts each sequence in 2 \* world_size = 4 equal pieces; sequence 1's length 6"
    with pytest.raises(ValueError, match=zigzag_rule):
        cp.zigzag_shard_varlen(x, cu_seqlens, 0, 2)
    with pytest.raises(ValueError, match="cu_seqlens: sharding cuts each sequence in world_size = 4 equal pieces"):
        cp.shard_varlen(x, cu_seqlens, 0, 4)
    with pytest.raises(ValueError, match=r"rank: must be in \[0, world_size\)"):
        cp.shard_varlen(x, cu_seqlens, 2, 2)
    with pytest.raises(ValueError, match="cu_seqlens: must start at 0, never decrease and end at x's 13 rows"):
        cp.shard_varlen(x[:13], cu_seqlens, 0, 2)
    with pytest.raises(ValueError, match="shards: expected one shard per rank"):
        cp.unshard_varlen([], cu_seqlens)
