#!/usr/bin/env python3
"""A model of the varlen backward's tile order: what the order costs a batch of mixed
lengths against the fixed-length call of the same work.

A varlen backward call's tiles are one key block of one (sequence, head) pair each, and
cover the longest sequence's key blocks for every pair (hopper/tile_scheduler.cuh,
BwdKernel::skip_empty): a slot past its sequence's keys is empty, drawn and skipped at
`skip` us. The persistent grid (one CTA per SM) draws slots from a counter as CTAs
finish, the pairs in groups (bwd_launch.cuh's rule: `causal_heads_per_group` with a
causal mask, `fitting_heads_per_group` without), the group's pairs fastest, its key
blocks lowest first. A tile costs `overhead` us plus `step` us per query block it walks:
all of its sequence's without a mask, from its diagonal up with one (bottom-right, equal
query and key lengths).

Orders modelled:
  kernel   as above, the sequences in the call's order
  sorted   the same with the longest sequences first (not in the kernels)
The fixed-length call of equal work (sim_varlen_order.equal_work_lengths) runs in its own
kernel's order: the same groups causal, the static order without a mask (CTA c takes
tiles c, c + ctas, ..., one pair's key blocks in a row).

    python scripts/sim_bwd_varlen_order.py --head-dim 64
    python scripts/sim_bwd_varlen_order.py --lengths 1664 1664 --head-dim 128

prints each order's modelled time on the batch against the fixed-length call's, with
and without a mask, beside the work's even share per CTA. It is a model: it leaves out
memory, the L2, clocks and what a sequence's partial blocks cost beyond their padded
work, and tells only how much of a mix's time the order and the empty slots can take.
"""
import argparse
import math

from sim_varlen_order import BENCH_LENGTHS, blocks, drawn_time, equal_work_lengths, static_time

# hopper/bwd_config.h: (block_m, block_n) of each head dim's kernel.
TILES = {64: (128, 128), 96: (64, 128), 128: (64, 128), 192: (64, 96), 256: (64, 80)}

L2_BUDGET = 16.0 * 1024 * 1024  # both group rules' (tile_scheduler.cuh)


def even_split(pairs, group):
    """The size of each group when `pairs` go into groups of at most `group`, as even as
    whole pairs allow (TileScheduler: the first groups hold one pair more)."""
    groups = max(1, math.ceil(pairs / max(group, 1)))
    small = pairs // groups
    return [small + 1] * (pairs % groups) + [small] * (groups - pairs % groups)


def group_size(lengths, heads, causal, head_dim, ctas):
    """Pairs a group, as bwd_launch.cuh sizes them for the longest sequence."""
    block_m, block_n = TILES[head_dim]
    longest = max(lengths)
    key_blocks = blocks(longest, block_n)
    pairs = len(lengths) * heads
    q_do_bytes = 2.0 * longest * head_dim * 2
    one_grid = blocks(ctas, key_blocks)
    if causal:
        fit = max(1, int(L2_BUDGET / q_do_bytes))
        balanced = min(blocks(4 * ctas, key_blocks), max(block_n // 4, 1))
        group = min(max(fit, one_grid, balanced), pairs)
    else:
        head_bytes = q_do_bytes + 4.0 * longest * head_dim
        group = min(max(max(1, int(L2_BUDGET / head_bytes)), one_grid), pairs)
    return max(even_split(pairs, group))


def tile_steps(n, key_block, causal, block_m, block_n):
    """Query blocks key block `key_block` of a sequence of n tokens walks (0: none, a
    slot past the sequence's keys)."""
    if key_block >= blocks(n, block_n):
        return 0
    first = key_block * block_n // block_m if causal else 0
    return blocks(n, block_m) - first


def slots(lengths, heads, order, block_n, group):
    """The order's slots as (sequence, key block), in draw order."""
    seqs = list(range(len(lengths)))
    if order == "sorted":
        seqs.sort(key=lambda b: -lengths[b])
    elif order != "kernel":
        raise ValueError(f"unknown order {order!r}")
    most = max(blocks(n, block_n) for n in lengths)
    pairs = [b for b in seqs for _ in range(heads)]
    out = []
    first = 0
    for here in even_split(len(pairs), group):
        for n in range(most):
            out += [(b, n) for b in pairs[first:first + here]]
        first += here
    return out


def durations(lengths, heads, order, causal, head_dim, step, overhead, skip, group):
    block_m, block_n = TILES[head_dim]
    out = []
    for b, n in slots(lengths, heads, order, block_n, group):
        steps = tile_steps(lengths[b], n, causal, block_m, block_n)
        out.append(overhead + step * steps if steps else skip)
    return out


def simulate(lengths, heads, order, causal, head_dim=64, ctas=132, step=1.0, overhead=1.0, skip=0.1):
    """Modelled time of one varlen backward call in `order`."""
    group = group_size(lengths, heads, causal, head_dim, ctas)
    return drawn_time(durations(lengths, heads, order, causal, head_dim, step, overhead, skip, group), ctas)


def simulate_fixed(lengths, heads, causal, head_dim=64, ctas=132, step=1.0, overhead=1.0):
    """Modelled time of the fixed-length call of `lengths` (all equal): the causal
    kernel's groups, or without a mask the static order, one pair's key blocks in a row."""
    if causal:
        return simulate(lengths, heads, "kernel", True, head_dim, ctas, step, overhead, 0.0)
    return static_time(durations(lengths, heads, "kernel", False, head_dim, step, overhead, 0.0, 1), ctas)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(BENCH_LENGTHS))
    parser.add_argument("--head-dim", type=int, choices=sorted(TILES), default=64)
    parser.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head dim")
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--overhead", type=float, default=1.0, help="a tile's cost besides its steps, in steps")
    parser.add_argument("--skip", type=float, default=0.1, help="an empty slot's cost, in steps")
    a = parser.parse_args()
    heads = a.hidden // a.head_dim
    block_m, block_n = TILES[a.head_dim]
    model = dict(head_dim=a.head_dim, ctas=a.ctas, step=1.0, overhead=a.overhead)
    for causal in (False, True):
        fixed = equal_work_lengths(a.lengths, causal)
        base = simulate_fixed(fixed, heads, causal, **model)
        work = sum(durations(a.lengths, heads, "kernel", causal, a.head_dim, 1.0, a.overhead, 0.0, 1))
        group = group_size(a.lengths, heads, causal, a.head_dim, a.ctas)
        print(f"{'causal' if causal else 'no mask'}, head dim {a.head_dim} ({block_m} x {block_n} tiles), "
              f"{heads} heads: fixed {len(fixed)} x {fixed[0]} {base:8.1f} steps; the mix's even share "
              f"{work / a.ctas / base:.3f}x; groups of {group} pairs")
        for order in ("kernel", "sorted"):
            t = simulate(a.lengths, heads, order, causal, skip=a.skip, **model)
            print(f"  {order:7s} {t:8.1f} steps  {t / base:.3f}x the fixed call's time")


if __name__ == "__main__":
    main()
