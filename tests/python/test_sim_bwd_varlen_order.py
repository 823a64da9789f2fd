"""scripts/sim_bwd_varlen_order.py: its slots and group sizes against the kernels' rules
(the sizes docs/perf-log.md gives for the bench batch), hand-checked times of tiny
schedules, and the orders' relations on the benchmark's batch."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import sim_bwd_varlen_order as sim  # noqa: E402


def test_slots_cover_the_longest_sequence_for_every_pair():
    # Sequences of 1 and 3 key blocks (128 keys a block), 2 heads, one group: the pairs
    # fastest, key blocks lowest first; the short sequence's slots past its block stay.
    kernel = sim.slots([100, 300], heads=2, order="kernel", block_n=128, group=4)
    assert kernel == [(0, 0), (0, 0), (1, 0), (1, 0), (0, 1), (0, 1), (1, 1), (1, 1), (0, 2), (0, 2), (1, 2), (1, 2)]
    # Groups of 2 pairs: each sequence's slots in a row.
    assert sim.slots([100, 300], heads=2, order="kernel", block_n=128, group=2)[:6] == [(0, 0), (0, 0), (0, 1),
                                                                                          (0, 1), (0, 2), (0, 2)]
    assert sim.slots([100, 300], heads=2, order="sorted", block_n=128, group=2)[:2] == [(1, 0), (1, 0)]
    with pytest.raises(ValueError):
        sim.slots([100], heads=1, order="static", block_n=128, group=1)


def test_groups_split_evenly():
    assert sim.even_split(32, 5) == [5, 5, 5, 5, 4, 4, 4]  # seven groups, 32 = 4 x 5 + 3 x 4
    assert sim.even_split(7, 10) == [7]


def test_group_sizes_follow_the_launch():
    lengths = list(sim.BENCH_LENGTHS)
    # docs/perf-log.md (2026-12-07): at head dim 128 without a mask 6 pairs on the mix
    # (5 fit 16 MB, 23 key blocks need 6 for a grid) and 11 at ten of 1664.
    assert sim.group_size(lengths, 16, False, 128, 132) == 6
    assert sim.group_size([1664] * 10, 16, False, 128, 132) == 11
    # Causal: four grids' worth (ceil(528 / 23) = 23) over 544 pairs, split evenly.
    assert sim.group_size(lengths, 32, True, 64, 132) == 23


def test_causal_tiles_walk_query_blocks_from_their_diagonal():
    assert [sim.tile_steps(300, n, True, 128, 128) for n in range(4)] == [3, 2, 1, 0]
    assert [sim.tile_steps(300, n, False, 64, 128) for n in range(4)] == [5, 5, 5, 0]


def test_one_cta_runs_every_tile_and_skips_every_empty_slot():
    model = dict(head_dim=64, ctas=1, step=1.0, overhead=0.5, skip=0.25)
    # No mask: one tile of 1 step, three of 3 (two heads each), two empty slots a head
    # of the short sequence.
    t = sim.simulate([100, 300], 2, "kernel", False, **model)
    assert t == pytest.approx(2 * 1.5 + 6 * 3.5 + 4 * 0.25)
    # Causal: the 300-token sequence's key blocks walk 3, 2 and 1 query blocks.
    t = sim.simulate([100, 300], 2, "kernel", True, **model)
    assert t == pytest.approx(2 * 1.5 + 2 * (3.5 + 2.5 + 1.5) + 4 * 0.25)


def test_fixed_call_without_a_mask_is_the_static_order():
    # Two pairs of two key blocks on 3 CTAs: CTA 0 runs tiles 0 and 3.
    assert sim.simulate_fixed([256] * 2, 1, False, head_dim=64, ctas=3, step=1.0, overhead=0.0) == pytest.approx(4.0)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_orders_on_the_benchmarks_batch(head_dim, causal):
    heads = 2048 // head_dim
    lengths = list(sim.BENCH_LENGTHS)
    fixed = sim.equal_work_lengths(lengths, causal)
    base = sim.simulate_fixed(fixed, heads, causal, head_dim=head_dim)
    kernel = sim.simulate(lengths, heads, "kernel", causal, head_dim=head_dim)
    ordered = sim.simulate(lengths, heads, "sorted", causal, head_dim=head_dim)
    # The longest sequences first never lose, and the order leaves the mix within 6 %
    # of the fixed-length call: far from the 9-18 % measured on an H100.
    assert ordered <= kernel < 1.06 * base
    # Equal lengths through the varlen order run as the fixed-length call.
    same = sim.simulate(fixed, heads, "kernel", causal, head_dim=head_dim)
    assert same == pytest.approx(base, rel=0.02)
