#!/usr/bin/env python3
"""Summarizes repeated `fa3 bench --json` runs of several kernels (bench_kernels.sh).

Arguments are KERNEL=FILE pairs, one per run; a kernel may appear any number of times.
Prints one row per kernel, in order of first appearance, with the median TFLOP/s at
each sequence length and, in parentheses, the spread of its runs (max - min) as a
percentage of the median.
"""
import json
import statistics
import sys


def collect(pairs):
    """{kernel: {seqlen: [tflops, ...]}}, kernels in order of first appearance."""
    runs = {}
    for pair in pairs:
        kernel, sep, path = pair.partition("=")
        if not sep or not kernel or not path:
            raise ValueError(f"expected KERNEL=FILE, got '{pair}'")
        with open(path) as f:
            records = json.load(f)
        points = runs.setdefault(kernel, {})
        for record in records:
            if record.get("tflops") is not None:
                points.setdefault(record["seqlen"], []).append(record["tflops"])
    return runs


def table(runs):
    seqlens = sorted({s for points in runs.values() for s in points})
    width = max([len("kernel")] + [len(k) for k in runs])
    lines = [f"{'kernel':<{width}}" + "".join(f"{s:>14}" for s in seqlens)]
    for kernel, points in runs.items():
        cells = []
        for s in seqlens:
            values = points.get(s)
            if not values:
                cells.append(f"{'-':>14}")
                continue
            median = statistics.median(values)
            spread = 100.0 * (max(values) - min(values)) / median if median else 0.0
            cells.append(f"{median:>8.1f} ({spread:>2.0f})")
        lines.append(f"{kernel:<{width}}" + "".join(cells))
    return "\n".join(lines)


def main(argv):
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        runs = collect(argv)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"kernel_medians: {e}", file=sys.stderr)
        return 1
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
