#!/usr/bin/env python3
"""Summarizes an Nsight Compute per-instruction CSV (--page source --print-source sass).

Prints the instructions with the most warp-stall samples, with their share of all
samples and their largest stall reasons, then the total per stall reason, and for the
largest reasons the opcodes their samples sit on (MUFU, SHFL, HGMMA ...): two kernels'
profiles side by side (fa3 and FlashAttention-3, say) differ there first. Column names
differ between Nsight Compute versions, so columns are found by what their names
contain; when a needed column is missing the header is printed instead.
"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return 0.0


def opcode(sass):
    """An instruction's opcode without its predicate and modifiers:
    "@!P0 MUFU.EX2 R1, R2" -> "MUFU"."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def by_opcode(header, body, source, reasons, top_reasons=5, top_opcodes=6):
    """[(reason, samples, [(opcode, samples), ...])] for the reasons with the most
    samples, each with its opcodes in order. Reasons are the all-samples columns (the
    "(Not Issued)" ones are their subsets)."""
    table = []
    for i in reasons:
        if "not issued" in header[i].lower():
            continue
        per_op = {}
        for r in body:
            if len(r) > max(i, source):
                op = opcode(r[source])
                per_op[op] = per_op.get(op, 0.0) + number(r[i])
        ranked = sorted(((n, op) for op, n in per_op.items() if n > 0), reverse=True)[:top_opcodes]
        table.append((header[i], sum(per_op.values()), [(op, n) for n, op in ranked]))
    table.sort(key=lambda t: -t[1])
    return table[:top_reasons]


def main(path, top=40):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if header_at is None:
        print("no header row with a 'Source' column in", path)
        return 1
    header, body = rows[header_at], rows[header_at + 1 :]
    find = lambda *keys: next((i for i, c in enumerate(header) if all(k in c for k in keys)), None)
    source = find("Source")
    address = find("Address")
    total = find("Warp Stall Sampling", "All")
    if total is None:
        print("no 'Warp Stall Sampling (All Samples)' column; columns are:")
        print("\n".join(header))
        return 1
    # Per-reason sample columns, e.g. "stall_long_sb" or "Stall Long Scoreboard".
    reasons = [i for i, c in enumerate(header) if c.lower().startswith("stall") and i != total]
    all_samples = sum(number(r[total]) for r in body if len(r) > total) or 1.0
    ranked = sorted((r for r in body if len(r) > total), key=lambda r: -number(r[total]))
    print(f"{int(all_samples)} stall samples; top {top} instructions:")
    for r in ranked[:top]:
        share = 100.0 * number(r[total]) / all_samples
        why = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:3]
        why_text = ", ".join(f"{name} {int(n)}" for n, name in why if n > 0)
        where = r[address] if address is not None else ""
        print(f"{share:5.1f}%  {where:>8}  {r[source].strip()[:70]:70}  {why_text}")
    if reasons:
        print("\nsamples per stall reason:")
        sums = sorted(((sum(number(r[i]) for r in body if len(r) > i), header[i]) for i in reasons), reverse=True)
        for n, name in sums:
            if n > 0:
                print(f"{100.0 * n / all_samples:5.1f}%  {name}")
        print("\nlargest stall reasons by opcode (samples):")
        for name, n, ops in by_opcode(header, body, source, reasons):
            print(f"{name} {int(n)}: " + ", ".join(f"{op} {int(k)}" for op, k in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else print(__doc__) or 2)
