#!/usr/bin/env python3
"""A model of the forward's tile orders on a varlen batch: what the order costs a batch of
mixed lengths against a fixed-length batch of the same work.

A varlen call's tiles cover the longest sequence's query blocks for every (sequence,
head) pair (hopper/tile_scheduler.cuh): the slots past a sequence's own blocks are
empty, and the producer draws and skips each of them (FwdKernel::skip_empty), at
`skip` us a slot: a read of the sequence's bounds, and in a dynamic order an atomic
draw too. A tile costs `overhead` us plus `step` us per key block it visits (all the
sequence's blocks without a mask; up to its diagonal with one). One CTA per SM.

Orders modelled:
  static    the non-causal order: each (sequence, head) pair's query blocks in a row,
            CTA c taking slots c, c + ctas, ... (heads_per_group 1); kernels with CTA
            pairs and the FP8 kernels take it
  groups    the causal order: pairs in groups, query blocks from the last, the group's
            heads fastest, drawn from a counter as CTAs finish (`group` pairs a group);
            the FP8 kernels take it
  compact   only real tiles, sequence by sequence in the call's order, query blocks
            from the last, heads fastest, drawn from a counter (the 16-bit kernels
            without CTA pairs take it: FA3_VARLEN_DYNAMIC_ORDER)
  sorted    compact with the longest sequences first (not in the kernels)

    python scripts/sim_varlen_order.py
    python scripts/sim_varlen_order.py --lengths 1664 1664 1664 --skip 0.5

prints each order's modelled time on the batch and on the fixed-length batch of its
tokens and work (bench_variants.equal_work_shape's), with and without a mask. It is a
model: it leaves out memory, the L2 and clocks, and tells only how much the order and
the empty slots can cost. It also leaves out the sequences' partial blocks, which cost
more than their padded work (docs/perf-log.md): on an H100 the compact order ran the
bench batch at 1.14x the fixed batch's time without a mask, where it models 1.02-1.03x.
"""
import argparse
import heapq
import math

# The batch of bench_variants.py's varlen variant (mixed_lengths(16384, 100, 4096), seed 0).
BENCH_LENGTHS = (2299, 1668, 477, 261, 667, 450, 1836, 308, 587, 872, 2912, 651, 285, 1654, 993, 253, 211)


def blocks(n, block):
    return (n + block - 1) // block


def tile_steps(n, m, causal, block_m, block_n):
    """Key blocks query block m of a sequence of n tokens visits (bottom-right causal, as
    seqlen_q == seqlen_k here)."""
    if not causal:
        return blocks(n, block_n)
    return min(blocks(n, block_n), blocks(min(n, (m + 1) * block_m), block_n))


def slots(lengths, heads, order, block_m, group):
    """The order's slots as (sequence, query block); a query block past its sequence's
    blocks is an empty slot."""
    most = max(blocks(n, block_m) for n in lengths)
    pairs = len(lengths) * heads
    out = []
    if order == "static":
        for bh in range(pairs):
            out += [(bh // heads, m) for m in range(most)]
    elif order == "groups":
        groups = max(1, math.ceil(pairs / max(group, 1)))
        small = pairs // groups
        big_pairs = pairs % groups * (small + 1)
        first = 0
        while first < pairs:
            here = small + 1 if first < big_pairs else small
            for m in reversed(range(most)):
                out += [(bh // heads, m) for bh in range(first, min(first + here, pairs))]
            first += here
    elif order in ("compact", "sorted"):
        seqs = range(len(lengths))
        if order == "sorted":
            seqs = sorted(seqs, key=lambda b: -lengths[b])
        for b in seqs:
            for m in reversed(range(blocks(lengths[b], block_m))):
                out += [(b, m)] * heads
    else:
        raise ValueError(f"unknown order {order!r}")
    return out


def simulate(lengths, heads, order, causal, ctas=132, step=1.9, overhead=1.0, skip=1.0, block_m=128, block_n=128,
             group=23):
    """Modelled time (us) of one forward call in `order`."""
    durations = []
    for b, m in slots(lengths, heads, order, block_m, group):
        real = m < blocks(lengths[b], block_m)
        durations.append(overhead + step * tile_steps(lengths[b], m, causal, block_m, block_n) if real else skip)
    return static_time(durations, ctas) if order == "static" else drawn_time(durations, ctas)


def static_time(tile_durations, ctas):
    """CTA c runs tiles c, c + ctas, ..."""
    busy = [0.0] * ctas
    for i, d in enumerate(tile_durations):
        busy[i % ctas] += d
    return max(busy)


def drawn_time(tile_durations, ctas):
    """Each CTA takes the next tile as it finishes (its first one is its own index)."""
    free = [(0.0, c) for c in range(ctas)]
    heapq.heapify(free)
    for d in tile_durations:
        now, c = heapq.heappop(free)
        heapq.heappush(free, (now + d, c))
    return max(t for t, _ in free)


def equal_work_lengths(lengths, causal, block=128):
    """The fixed-length batch of the same tokens and (query, key) pairs, its length a
    multiple of `block` (as bench_variants.equal_work_shape)."""
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) // 2 if causal else n * n for n in lengths)
    mean = 2 * pairs / tokens - 1 if causal else pairs / tokens
    seqlen = max(block, round(mean / block) * block)
    return [seqlen] * max(1, round(tokens / seqlen))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(BENCH_LENGTHS))
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--step", type=float, default=1.9, help="us per key block of a tile (hdim 128, H100)")
    parser.add_argument("--overhead", type=float, default=1.0, help="us per tile besides its key blocks")
    parser.add_argument("--skip", type=float, default=1.0, help="us per empty slot drawn")
    parser.add_argument("--group", type=int, default=23, help="pairs a group of the causal order")
    a = parser.parse_args()
    for causal in (False, True):
        fixed = equal_work_lengths(a.lengths, causal)
        model = dict(heads=a.heads, causal=causal, ctas=a.ctas, step=a.step, overhead=a.overhead, skip=a.skip,
                     group=a.group)
        base = simulate(fixed, order="compact", **model)
        print(f"{'causal' if causal else 'no mask'}: fixed {len(fixed)} x {fixed[0]} {base:8.1f} us")
        for order in ("static", "groups", "compact", "sorted"):
            t = simulate(a.lengths, order=order, **model)
            print(f"  {order:8s} {t:8.1f} us  {t / base:.2f}x the fixed batch's time")


if __name__ == "__main__":
    main()
