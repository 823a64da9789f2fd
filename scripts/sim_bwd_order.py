#!/usr/bin/env python3
"""A model of the causal backward's tile order, to see what deterministic dQ sums cost.

The persistent grid (one CTA per SM) draws tiles, one key block of one head each, from
a global counter (hopper/tile_scheduler.cuh, BwdKernel::tile_block). A tile walks its
query blocks upwards from its diagonal, one step each; after each step its dQ part is
added to the accumulator. In deterministic mode a query block's parts are added in a
fixed order (the diagonal key block's first, then the next lower one's ...), so a
tile's add waits for the one before it in that order (BwdKernel::dq_turn). The model:
every step costs `step` us of compute, an add `add` us, a passed turn is seen `lat` us
after it is published, a step's dQ part waits in the staging buffer until the previous
step's add is done (the consumers run at most one step ahead of their adds), and a
tile switch costs `switch` us. A CTA draws its next tile as its
current one starts (early) or a few steps before it ends (late).

    python scripts/sim_bwd_order.py --key-blocks 128 --query-blocks 256 --heads 16

prints the modelled time of the default order and of deterministic mode with either
draw. With --non-causal it models the static order of non-causal calls instead
(simulate_noncausal): every tile walks every query block, from 0 or, spread, from a
block of its own (hopper/bwd_dq_order.h). It is a model: it leaves out memory, the L2 and the tail's uneven clocks, and
only tells which order makes tiles wait for each other, and about how much.
"""
import argparse
import heapq


class Turns:
    """The dQ adds published so far, and the CTAs parked until the add before theirs is."""

    def __init__(self, lat):
        self.lat = lat
        self.published = {}  # add -> time it was done
        self.parked = {}  # add -> CTAs waiting for it

    def wait(self, before, state, c, now):
        """When CTA c may add after add `before` (None: it waits for none), or None after
        parking it until `before` is published."""
        if before is None:
            return 0.0
        if before not in self.published:
            state[c]["since"] = now
            self.parked.setdefault(before, []).append(c)
            return None
        return self.published[before] + self.lat

    def publish(self, key, done, state, events):
        self.published[key] = done
        for w in self.parked.pop(key, []):
            heapq.heappush(events, (max(state[w]["since"], done + self.lat), w))


def simulate(key_blocks, query_blocks, heads, group, ctas, step, add, lat, switch, deterministic, late,
             late_steps=2):
    """Modelled time (us) of one causal backward."""
    per_key = query_blocks // key_blocks  # query blocks per key block
    tiles = key_blocks * heads

    def coord(t):
        # Groups of `group` heads, head fastest; the scheduler's blocks highest first,
        # which deterministic mode runs as they come (shortest first) and the default
        # order reverses (longest first).
        per_group = key_blocks * group
        first = t // per_group * group
        r = t % per_group
        here = min(group, heads - first)
        block = key_blocks - 1 - r // here
        return first + r % here, (block if deterministic else key_blocks - 1 - block)

    drawn = [ctas]

    def draw():
        t = drawn[0]
        drawn[0] += 1
        return t if t < tiles else None

    turns = Turns(lat)  # adds keyed (head, key block, query block)
    state = [dict(tile=c, step=0, next=None, free=0.0, since=0.0) for c in range(ctas)]
    events = [(0.0, c) for c in range(ctas)]
    heapq.heapify(events)
    end = 0.0
    while events:
        now, c = heapq.heappop(events)
        s = state[c]
        if s["tile"] is None:
            continue
        head, n = coord(s["tile"])
        first_q = per_key * n
        length = query_blocks - first_q
        k = s["step"]
        if s["next"] is None and (k == 0 and not late or late and k >= length - late_steps):
            s["next"] = draw()
        q = first_q + k
        computed = max(now + step, s["free"])
        turn = turns.wait((head, n + 1, q) if deterministic and n + 1 <= q // per_key else None, state, c, now)
        if turn is None:
            continue
        done = max(computed, turn) + add
        turns.publish((head, n, q), done, state, events)
        s["free"] = done
        s["step"] = k + 1
        end = max(end, done)
        if s["step"] < length:
            heapq.heappush(events, (computed, c))
            continue
        if s["next"] is None:
            s["next"] = draw()
        s.update(tile=s["next"], next=None, step=0)
        heapq.heappush(events, (computed + switch, c))
    return end


def simulate_noncausal(key_blocks, query_blocks, heads, ctas, step, add, lat, switch, deterministic, spread):
    """Modelled time (us) of one non-causal backward in the static order: CTA c runs tiles
    c, c + ctas, ... (round t // ctas), each a key block walking every query block. In
    deterministic mode the sums at a query block go key block by key block (`spread`
    False: every tile from query block 0 up) or, with `spread`, in order of arrival, each
    tile of a round starting at a query block of its own (hopper/bwd_dq_order.h)."""
    tiles = key_blocks * heads

    def start(t):
        if not spread:
            return 0
        head = t // key_blocks
        begin = max(t // ctas * ctas, head * key_blocks)
        end = min(t // ctas * ctas + ctas, head * key_blocks + key_blocks)
        return (t - begin) * query_blocks // (end - begin)

    before = {}  # (tile, query block) -> the tile whose add comes just before
    if deterministic:
        for head in range(heads):
            ts = range(head * key_blocks, (head + 1) * key_blocks)
            for m in range(query_blocks):
                order = sorted(ts, key=lambda t: (t // ctas, (m - start(t)) % query_blocks, t))
                for a, b in zip(order, order[1:]):
                    before[(b, m)] = a

    turns = Turns(lat)  # adds keyed (tile, query block)
    state = [dict(tile=c if c < tiles else None, step=0, free=0.0, since=0.0) for c in range(ctas)]
    events = [(0.0, c) for c in range(ctas)]
    heapq.heapify(events)
    end = 0.0
    while events:
        now, c = heapq.heappop(events)
        s = state[c]
        t = s["tile"]
        if t is None:
            continue
        m = (start(t) + s["step"]) % query_blocks
        computed = max(now + step, s["free"])
        turn = turns.wait((before[(t, m)], m) if (t, m) in before else None, state, c, now)
        if turn is None:
            continue
        done = max(computed, turn) + add
        turns.publish((t, m), done, state, events)
        s["free"] = done
        s["step"] += 1
        end = max(end, done)
        if s["step"] < query_blocks:
            heapq.heappush(events, (computed, c))
            continue
        s.update(tile=t + ctas if t + ctas < tiles else None, step=0)
        heapq.heappush(events, (computed + switch, c))
    return end


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key-blocks", type=int, default=128)
    parser.add_argument("--query-blocks", type=int, default=256)
    parser.add_argument("--heads", type=int, default=16, help="(batch, head) pairs")
    parser.add_argument("--group", type=int, default=4, help="heads interleaved in the order")
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--step", type=float, default=2.3, help="us of compute per step")
    parser.add_argument("--add", type=float, default=0.3, help="us per dQ add")
    parser.add_argument("--lat", type=float, default=1.0, help="us until a passed turn is seen")
    parser.add_argument("--switch", type=float, default=1.0, help="us per tile switch")
    parser.add_argument("--non-causal", action="store_true", help="the static order of non-causal calls")
    a = parser.parse_args()
    if a.non_causal:
        shape = (a.key_blocks, a.query_blocks, a.heads, a.ctas, a.step, a.add, a.lat, a.switch)
        base = simulate_noncausal(*shape, deterministic=False, spread=False)
        print(f"default order           {base:9.1f} us")
        for spread in (False, True):
            t = simulate_noncausal(*shape, deterministic=True, spread=spread)
            name = "spread starts" if spread else "from 0 starts"
            print(f"deterministic, {name} {t:9.1f} us  ({base / t:.2f} of the default's speed)")
        return
    shape = (a.key_blocks, a.query_blocks, a.heads, a.group, a.ctas, a.step, a.add, a.lat, a.switch)
    base = simulate(*shape, deterministic=False, late=False)
    print(f"default order        {base:9.1f} us")
    for late in (False, True):
        t = simulate(*shape, deterministic=True, late=late)
        print(f"deterministic, {'late' if late else 'early'} draw {t:9.1f} us  ({base / t:.2f} of the default's speed)")


if __name__ == "__main__":
    main()
