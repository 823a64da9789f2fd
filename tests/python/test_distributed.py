"""fa3.distributed on CPU tensors over gloo: ring and all-gather context parallelism
against one process computing the whole attention, forward and backward, with and
without causal (zigzag shards), MHA and GQA, world sizes 2, 3 and 4; the zigzag
helpers; and the errors every rank must raise alike.

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

# (function name, causal, nheads, nheads_k, dtype)
CASES = [
    (fn_name, causal, nheads, nheads_k, dtype)
    for fn_name in ("ring_flash_attn_func", "allgather_flash_attn_func")
    for causal in (False, True)
    for nheads, nheads_k in ((4, 4), (4, 2), (4, 1))
    for dtype in (torch.float32, torch.bfloat16)
]
# Shard length per rank: two zigzag chunks of 3.
SHARD = 6


def full_inputs(world_size, nheads, nheads_k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    seqlen = SHARD * world_size
    q = torch.randn(2, seqlen, nheads, 16, generator=gen).to(dtype)
    k = torch.randn(2, seqlen, nheads_k, 16, generator=gen).to(dtype)
    v = torch.randn(2, seqlen, nheads_k, 16, generator=gen).to(dtype)
    dout = torch.randn(2, seqlen, nheads, 16, generator=gen).to(dtype)
    return q, k, v, dout


def shard(x, rank, world_size, causal):
    if causal:
        return cp.zigzag_shard(x, rank, world_size)
    return x.chunk(world_size, dim=1)[rank]


def check_case(rank, world_size, group, fn_name, causal, nheads, nheads_k, dtype, seed):
    q, k, v, dout = full_inputs(world_size, nheads, nheads_k, dtype, seed)
    # One process computing the whole attention: fa3's CPU path, exact backward.
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = fa3.flash_attn_func(*full, causal=causal, return_attn_probs=True)
    ref_out.backward(dout)
    local = [shard(t, rank, world_size, causal).clone().requires_grad_() for t in (q, k, v)]
    out, lse = getattr(cp, fn_name)(*local, causal=causal, group=group, return_attn_probs=True)
    out.backward(shard(dout, rank, world_size, causal))
    # fp32: the merges' and the exact backward's rounding only. bf16: the blocks' outputs
    # and gradients are rounded to bf16 as the whole call's are, at other points, so
    # results may differ by a bf16 rounding or two (2^-8 relative each).
    atol, rtol = (2e-5, 0) if dtype == torch.float32 else (3e-2, 1.6e-2)
    label = f"{fn_name} causal={causal} heads={nheads}:{nheads_k} {dtype} rank {rank}/{world_size}"
    want_out = shard(ref_out, rank, world_size, causal).float()
    torch.testing.assert_close(out.float(), want_out, atol=atol, rtol=rtol, msg=lambda m: f"{label}: {m}")
    ref_lse_shard = shard(ref_lse.transpose(1, 2), rank, world_size, causal).transpose(1, 2)
    torch.testing.assert_close(lse, ref_lse_shard, atol=2e-5, rtol=0, msg=lambda m: f"{label}: {m}")
    for name, got, want in zip("qkv", local, full):
        torch.testing.assert_close(
            got.grad.float(), shard(want.grad, rank, world_size, causal).float(), atol=atol, rtol=rtol,
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


def errors_worker(rank, world_size, port):
    init(rank, world_size, port)
    q = torch.randn(1, 4, 2, 8)
    same_problem = "every rank must hold a shard of one problem"
    for fn in (cp.ring_flash_attn_func, cp.allgather_flash_attn_func):
        bad_len = torch.randn(1, 4 + 2 * rank, 2, 8)
        with pytest.raises(ValueError, match=f"q: {same_problem}; sequence length is 6"):
            fn(bad_len, bad_len, bad_len)
        heads = torch.randn(1, 4, 1 + rank, 8)
        with pytest.raises(ValueError, match=f"k: {same_problem}; key/value heads is 2"):
            fn(q, heads, heads)
        typed = q.to(torch.bfloat16 if rank else torch.float32)
        with pytest.raises(ValueError, match=f"q: {same_problem}; dtype is torch.bfloat16 on rank 1 but torch.float32"):
            fn(typed, typed, typed)
        with pytest.raises(ValueError, match=f"causal: {same_problem}; value is True on rank 1 but False"):
            fn(q, q, q, causal=bool(rank))
        odd = torch.randn(1, 3, 2, 8)
        with pytest.raises(ValueError, match="q: causal attention takes zigzag shards"):
            fn(odd, odd, odd, causal=True)
        with pytest.raises(ValueError, match="k: each rank holds the same positions"):
            fn(q, odd, odd)
        # Shards that are views of a larger tensor (not contiguous) give the same result.
        wide = torch.randn(2, 8, 2, 8, generator=torch.Generator().manual_seed(rank))
        torch.testing.assert_close(fn(wide[:, :4], wide[:, :4], wide[:, :4]), fn(*(wide[:, :4].contiguous(),) * 3))
        # A group of one rank is the plain local call; new_group is collective: every
        # rank creates every group.
        groups = [dist.new_group([r]) for r in range(world_size)]
        out = fn(q, q, q, causal=True, group=groups[rank])
        torch.testing.assert_close(out, fa3.flash_attn_func(q, q, q, causal=True))
        # sm_margin reaches the local kernels (SMs left to the transfers) and changes no
        # result; a negative one is refused on every rank.
        torch.testing.assert_close(fn(q, q, q, causal=True, sm_margin=4), fn(q, q, q, causal=True), atol=0, rtol=0)
        with pytest.raises(ValueError, match="sm_margin must be >= 0"):
            fn(q, q, q, sm_margin=-1)
    leave()


def test_errors_are_raised_on_every_rank():
    run_world(errors_worker, 2)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_zigzag_shard_and_unshard_round_trip(world_size):
    x = torch.arange(2 * world_size * 3).reshape(1, -1)
    shards = [cp.zigzag_shard(x, r, world_size) for r in range(world_size)]
    assert torch.equal(shards[0][0, :3], x[0, :3])
    assert torch.equal(shards[0][0, 3:], x[0, -3:])
    assert torch.equal(cp.zigzag_unshard(shards), x)


def test_zigzag_shard_rejects_a_length_that_does_not_split():
    with pytest.raises(ValueError, match="x: zigzag sharding cuts dim 1 in 2 \\* world_size = 4 equal chunks"):
        cp.zigzag_shard(torch.zeros(1, 6), 0, 2)
    with pytest.raises(ValueError, match=r"rank: must be in \[0, world_size\)"):
        cp.zigzag_shard(torch.zeros(1, 8), 2, 2)
