"""scripts/sim_varlen_order.py: its orders' slots, hand-checked times of tiny schedules,
and the orders' relations on the benchmark's batch (empty slots and the static order
cost time; the compact order comes within a few percent of the fixed-length batch)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import sim_varlen_order as sim  # noqa: E402


def test_slots_cover_the_longest_sequence_for_every_pair():
    # Two sequences of 1 and 3 blocks, 2 heads: 2 pairs x 3 slots, 2 of them empty per
    # pair of the short sequence.
    static = sim.slots([100, 300], heads=2, order="static", block_m=128, group=1)
    assert static == [(0, 0), (0, 1), (0, 2)] * 2 + [(1, 0), (1, 1), (1, 2)] * 2
    groups = sim.slots([100, 300], heads=2, order="groups", block_m=128, group=4)
    assert sorted(groups) == sorted(static)
    assert groups[:4] == [(0, 2), (0, 2), (1, 2), (1, 2)]  # the last query block first, heads fastest
    compact = sim.slots([100, 300], heads=2, order="compact", block_m=128, group=1)
    assert compact == [(0, 0)] * 2 + [(1, 2)] * 2 + [(1, 1)] * 2 + [(1, 0)] * 2
    assert sim.slots([100, 300], heads=2, order="sorted", block_m=128, group=1)[:2] == [(1, 2), (1, 2)]


def test_causal_tiles_visit_keys_up_to_their_diagonal():
    assert [sim.tile_steps(300, m, True, 128, 128) for m in range(3)] == [1, 2, 3]
    assert [sim.tile_steps(300, m, False, 128, 128) for m in range(3)] == [3, 3, 3]


def test_one_cta_runs_every_tile_and_skips_every_empty_slot():
    model = dict(heads=1, causal=False, ctas=1, step=1.0, overhead=0.5, skip=0.25)
    # Tiles: 1 block (1.5) and three of 3 blocks (3.5 each); empty slots: 2.
    for order in ("static", "groups"):
        assert sim.simulate([100, 300], order=order, **model) == pytest.approx(1.5 + 3 * 3.5 + 2 * 0.25)
    assert sim.simulate([100, 300], order="compact", **model) == pytest.approx(1.5 + 3 * 3.5)


def test_equal_work_lengths_keep_tokens_and_work():
    assert sim.equal_work_lengths([1024] * 4, causal=False) == [1024] * 4
    fixed = sim.equal_work_lengths(list(sim.BENCH_LENGTHS), causal=False)
    assert fixed == [1664] * 10


@pytest.mark.parametrize("causal", [False, True])
def test_orders_on_the_benchmarks_batch(causal):
    model = dict(heads=16, causal=causal, ctas=132, step=1.9, overhead=1.0, skip=1.0)
    lengths = list(sim.BENCH_LENGTHS)
    base = sim.simulate(sim.equal_work_lengths(lengths, causal), order="compact", **model)
    times = {order: sim.simulate(lengths, order=order, **model) for order in ("static", "groups", "compact", "sorted")}
    assert times["static"] > 1.15 * base
    assert times["groups"] > times["compact"] >= times["sorted"]
    assert times["compact"] < 1.05 * base
    # Without empty slots to skip, the counter's order is as good as the compact one.
    free_skips = sim.simulate(lengths, order="groups", **{**model, "skip": 0.0})
    assert free_skips < 1.06 * base


def test_unknown_order_is_an_error():
    with pytest.raises(ValueError, match="unknown order"):
        sim.slots([100], heads=1, order="random", block_m=128, group=1)
