#!/usr/bin/env python3
"""Summarizes the forward kernel's timeline file (a build with FA3_FWD_TIMELINE=ON, run
with the environment's FA3_FWD_TIMELINE naming the file; src/hopper/timeline.h).

Each consumer warpgroup stamped its SM's cycle counter at every key block: its GEMMs'
turn, the scores' arrival, the softmax's end and the previous P·V's end. Per launch
this prints the medians and 90th percentiles, in cycles, of the spans between them:

  issue->S     from the turn (Q·Kᵀ and the last P·V issued) to the scores in registers
  softmax      from the scores to P (the mask, the statistics, the exponentials)
  P·V wait     from P to the previous block's P·V complete
  ->turn       from there to the next block's turn (P's conversion, the wait for K and
               for the other warpgroup to hand the turn on)
  block        from one turn to the next
and per tile the set-up before its first turn, its last P·V, the end after it (O's
normalization and store) and the time to the next tile's start.

    python scripts/timeline.py timeline.bin [--json out.json]
"""
import argparse
import json
import statistics
import struct
import sys

MAGIC = b"fa3tl01\0"
HEADER = struct.Struct("<8s6I")  # magic, streams, warpgroups, capacity, block_n, clock_khz, name_bytes
TILE_START, TURN, SCORES, PROBS, PV_DONE, TILE_END = range(6)


def unpack(word):
    """(event, key block, query block, (batch, head) pair) of a record's second word."""
    return word & 0xFF, (word >> 8) & 0xFFFF, (word >> 24) & 0xFFFF, (word >> 40) & 0xFFFF


def read_launches(data):
    """Yields (header dict, kernel name, streams), a stream a list of (clock, word)."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < HEADER.size:
            raise ValueError(f"truncated header at byte {offset}")
        magic, streams, warpgroups, capacity, block_n, clock_khz, name_bytes = HEADER.unpack_from(data, offset)
        if magic != MAGIC:
            raise ValueError(f"not a timeline launch at byte {offset}")
        offset += HEADER.size
        name = data[offset:offset + name_bytes].decode("utf-8", "replace")
        offset += name_bytes
        words_per_stream = 1 + 2 * capacity
        need = 8 * streams * words_per_stream
        if len(data) - offset < need:
            raise ValueError(f"truncated launch at byte {offset}")
        body = struct.unpack_from(f"<{streams * words_per_stream}Q", data, offset)
        offset += need
        out = []
        for s in range(streams):
            base = s * words_per_stream
            count = min(body[base], capacity)
            out.append([(body[base + 1 + 2 * i], body[base + 2 + 2 * i]) for i in range(count)])
        header = dict(streams=streams, warpgroups=warpgroups, capacity=capacity, block_n=block_n, clock_khz=clock_khz)
        yield header, name, out


SPANS = ("issue->S", "softmax", "P·V wait", "->turn", "block", "tile set-up", "last P·V", "tile end", "between tiles")


def spans(stream):
    """The spans of one stream's records, by name: lists of cycles."""
    out = {k: [] for k in SPANS}
    last = {}  # the tile's latest clock of each event
    step = set()  # events since the latest turn
    end = None  # the latest of the step's P and P·V's end: the next turn's "->turn" start
    tile_end = None
    for clock, word in stream:
        event = unpack(word)[0]
        if event == TILE_START:
            if tile_end is not None:
                out["between tiles"].append(clock - tile_end)
            last, step, end = {TILE_START: clock}, set(), None
        elif event == TURN:
            if TURN in last:
                out["block"].append(clock - last[TURN])
                if end is not None:
                    out["->turn"].append(clock - end)
            elif TILE_START in last:
                out["tile set-up"].append(clock - last[TILE_START])
            step, end = set(), None
        elif event == SCORES and TURN in last:
            out["issue->S"].append(clock - last[TURN])
        elif event == PROBS and SCORES in step:
            out["softmax"].append(clock - last[SCORES])
            end = clock
        elif event == PV_DONE:
            if PROBS in step:
                out["P·V wait"].append(clock - last[PROBS])
            elif TURN in last:
                out["last P·V"].append(clock - last[TURN])
            end = clock
        elif event == TILE_END:
            if PV_DONE in last:
                out["tile end"].append(clock - last[PV_DONE])
            tile_end = clock
        last[event] = clock
        step.add(event)
    return out


def summarize(streams):
    merged = {}
    for stream in streams:
        for key, values in spans(stream).items():
            merged.setdefault(key, []).extend(values)
    table = {}
    for key, values in merged.items():
        if values:
            values = sorted(values)
            table[key] = {
                "n": len(values),
                "median": statistics.median(values),
                "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
            }
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--json", help="write the summaries here too")
    args = parser.parse_args(argv)
    with open(args.file, "rb") as f:
        data = f.read()
    results = []
    for i, (header, name, streams) in enumerate(read_launches(data)):
        table = summarize(streams)
        full = sum(len(s) >= header["capacity"] for s in streams)
        print(f"launch {i}: {header['streams']} streams, block_n {header['block_n']}, "
              f"{sum(len(s) for s in streams)} stamps{f', {full} streams full' if full else ''}, "
              f"cycles at up to {header['clock_khz'] / 1000:.0f} MHz")
        print(f"  {name[:160]}")
        for key, row in table.items():
            print(f"  {key:12s} median {row['median']:9.0f}  p90 {row['p90']:9.0f}  ({row['n']})")
        results.append({"header": header, "kernel": name, "spans": table})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
