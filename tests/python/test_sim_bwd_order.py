"""scripts/sim_bwd_order.py: hand-checked times of tiny schedules, and the orders'
relations on a larger one (deterministic sums never make a call faster; the late
draw keeps deterministic mode near the default)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import sim_bwd_order  # noqa: E402


def run(**kw):
    shape = dict(key_blocks=2, query_blocks=2, heads=1, group=1, ctas=1, step=1.0, add=0.0, lat=0.0, switch=0.0,
                 deterministic=False, late=False)
    shape.update(kw)
    return sim_bwd_order.simulate(**shape)


def test_one_cta_runs_every_step_once():
    # Key block 0 sees query blocks 0 and 1, key block 1 query block 1: three steps.
    assert run() == 3.0
    assert run(deterministic=True) == 3.0
    assert run(deterministic=True, late=True) == 3.0
    assert run(switch=0.5) == 3.5  # one switch between the two tiles
    assert run(add=0.5) == 3.5  # each step's add overlaps the next step; the last one ends the call


def test_turn_waits_for_the_diagonal_tile():
    # Two CTAs, one tile each. At query block 1 key block 1 (its diagonal, one step)
    # adds first; key block 0 reaches it at its second step and adds at once, unless the
    # turn's latency holds it.
    assert run(ctas=2, deterministic=True, add=0.5) == 2.5
    assert run(ctas=2, deterministic=True, add=0.5, lat=2.0) == 1.5 + 2.0 + 0.5


def test_orders_on_a_long_causal_call():
    shape = dict(key_blocks=32, query_blocks=64, heads=32, group=8, ctas=132, step=2.3, add=0.3, lat=1.0,
                 switch=1.0)
    default = sim_bwd_order.simulate(**shape, deterministic=False, late=False)
    early = sim_bwd_order.simulate(**shape, deterministic=True, late=False)
    late = sim_bwd_order.simulate(**shape, deterministic=True, late=True)
    assert default <= late < early
    assert late < 1.1 * default


def run_noncausal(**kw):
    shape = dict(key_blocks=2, query_blocks=2, heads=1, ctas=2, step=1.0, add=0.0, lat=0.0, switch=0.0,
                 deterministic=False, spread=False)
    shape.update(kw)
    return sim_bwd_order.simulate_noncausal(**shape)


def test_noncausal_chain_and_spread_starts():
    # Two tiles of one head on two CTAs, two query blocks each, a turn seen 1 us late.
    assert run_noncausal(lat=1.0) == 2.0
    # From query block 0 both: key block 1 waits a turn at each block.
    assert run_noncausal(lat=1.0, deterministic=True) == 3.0
    # Spread: key block 1 starts at block 1, so at each block the other tile's add is a
    # step old when a tile gets there.
    assert run_noncausal(lat=1.0, deterministic=True, spread=True) == 2.0
    # Tiles past the grid: a second round after the first, every tile once.
    assert run_noncausal(heads=2, ctas=2, deterministic=True, spread=True) == 4.0


def test_noncausal_orders_on_a_short_call():
    # hdim 128 at 2k: 16 key blocks, 32 query blocks, 128 (batch, head) pairs.
    shape = dict(key_blocks=16, query_blocks=32, heads=128, ctas=132, step=2.3, add=0.3, lat=1.0, switch=1.0)
    default = sim_bwd_order.simulate_noncausal(**shape, deterministic=False, spread=False)
    chained = sim_bwd_order.simulate_noncausal(**shape, deterministic=True, spread=False)
    spread = sim_bwd_order.simulate_noncausal(**shape, deterministic=True, spread=True)
    assert chained > 1.2 * default
    assert default <= spread < 1.05 * default
