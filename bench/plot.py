"""Bar charts of benchmark results, in the style of the FlashAttention-3 paper's figures.

One PNG per (pass, dtype) with a panel per (head dim, causal), grouped bars per
sequence length and one colour per implementation, TFLOP/s written on the bars.
Decoding records (bench_decode.py, pass "decode") get line plots instead: KV bytes
read per second against cache length, a panel per batch, fa3 (contiguous and paged
cache) against cuDNN, with the HBM peak drawn across.

    python bench/plot.py bench/results/2026-12-01-nvidia-h200.json [--out-dir DIR]

writes the PNGs beside the JSON file (or into DIR), named as bench_attention.py
names them: <date>-<gpu>[-quick]-<pass>-<dtype>.png, whatever passes the JSON
file's name lists. bench_attention.py calls plot_records() after each run.
"""

import argparse
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402

# Fixed colours and order so that every figure reads the same.
IMPL_STYLE = {
    "fa3": ("fa3", "#c0392b"),
    "fa3-deterministic": ("fa3 deterministic", "#e59866"),
    "flashattention3": ("FlashAttention-3", "#d4ac0d"),
    "cudnn": ("cuDNN (SDPA)", "#2e86c1"),
    "fa2": ("FlashAttention-2 (SDPA)", "#27ae60"),
    "efficient": ("memory-efficient (SDPA)", "#8e7cc3"),
    "cublas-fp8": ("cuBLAS FP8 GEMM, same FLOPs", "#7f8c8d"),
}
PASS_TITLE = {"fwd": "forward", "bwd": "backward"}
# The H200's HBM bandwidth: the ceiling of a decoding call, which reads its KV cache once.
HBM_TBS = 4.8


def _panel(ax, records, impls, seqlens):
    width = 0.8 / len(impls)
    for i, impl in enumerate(impls):
        label, colour = IMPL_STYLE.get(impl, (impl, None))
        values = []
        for seqlen in seqlens:
            hits = [r["tflops"] for r in records if r["impl"] == impl and r["seqlen"] == seqlen]
            values.append(hits[0] if hits else None)
        xs = [x + (i - (len(impls) - 1) / 2) * width for x in range(len(seqlens))]
        bars = ax.bar(xs, [value or 0.0 for value in values], width, label=label, color=colour)
        for bar, value in zip(bars, values):
            # An implementation that could not run the point is marked, not left as a silent gap.
            text = "n/a" if value is None else f"{value:.0f}"
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, value or 0.0),
                ha="center",
                va="bottom",
                fontsize=6,
                xytext=(0, 1),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(seqlens)))
    ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("TFLOP/s")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def plot_records(records, stem):
    """Writes <stem>-<pass>-<dtype>.png for each (pass, dtype) in `records`; returns the paths."""
    stem = Path(stem)
    paths = []
    for pass_, dtype in sorted({(r["pass"], r["dtype"]) for r in records}):
        group = [r for r in records if r["pass"] == pass_ and r["dtype"] == dtype]
        hdims = sorted({r["hdim"] for r in group})
        causals = sorted({r["causal"] for r in group})
        impls = [i for i in IMPL_STYLE if any(r["impl"] == i for r in group)]
        impls += sorted({r["impl"] for r in group} - set(impls))
        fig, axes = plt.subplots(
            len(hdims), len(causals), figsize=(6.5 * len(causals), 3.6 * len(hdims)), squeeze=False
        )
        for row, hdim in enumerate(hdims):
            for col, causal in enumerate(causals):
                panel = [r for r in group if r["hdim"] == hdim and r["causal"] == causal]
                seqlens = sorted({r["seqlen"] for r in panel})
                ax = axes[row][col]
                _panel(ax, panel, impls, seqlens)
                ax.set_title(f"head dim {hdim}, {'causal' if causal else 'non-causal'}")
        gpus = sorted({r["gpu"] for r in group})
        fig.suptitle(f"Attention {PASS_TITLE.get(pass_, pass_)} pass, {dtype}, {', '.join(gpus)}")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
        fig.tight_layout(rect=(0, 0.04, 1, 0.97))
        path = stem.with_name(f"{stem.name}-{pass_}-{dtype}.png")
        fig.savefig(path, dpi=130)
        plt.close(fig)
        paths.append(path)
    return paths


def _decode_lines(records):
    """{(label, colour, dashed): records} of one batch's panel: fa3 per (layout, num_splits),
    cuDNN once (its paged points read the contiguous cache, so they repeat its time)."""
    lines = {}
    for r in records:
        if r["tbs"] is None or (r["impl"] != "fa3" and r["paged"]):
            continue
        label, colour = IMPL_STYLE.get(r["impl"], (r["impl"], None))
        if r["impl"] == "fa3":
            label += ", paged" if r["paged"] else ", contiguous"
            if "num_splits" in r:
                label += f", {r['num_splits']} splits"
        lines.setdefault((label, colour, r["paged"]), []).append(r)
    return lines


def plot_decode(records, path):
    """TB/s of decoding against cache length, one panel per batch; writes `path`, returns it."""
    batches = sorted({r["batch"] for r in records})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.8), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for (label, colour, dashed), line in _decode_lines([r for r in records if r["batch"] == batch]).items():
            line.sort(key=lambda r: r["seqlen_k"])
            ax.plot(
                [r["seqlen_k"] for r in line],
                [r["tbs"] for r in line],
                "--" if dashed else "-",
                marker="s" if dashed else "o",
                color=colour,
                label=label,
            )
        ax.axhline(HBM_TBS, color="grey", linestyle=":", label=f"HBM peak {HBM_TBS} TB/s")
        seqlens = sorted({r["seqlen_k"] for r in records if r["batch"] == batch})
        ax.set_xscale("log", base=2)
        ax.set_xticks(seqlens)
        ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in seqlens])
        ax.set_ylim(0, 1.1 * max([HBM_TBS] + [r["tbs"] for r in records if r["tbs"] is not None]))
        ax.set_xlabel("cache length (tokens)")
        ax.set_ylabel("KV read, TB/s")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3)
    first = records[0]
    gpus = ", ".join(sorted({r["gpu"] for r in records}))
    fig.suptitle(
        f"Decoding, one query token: {first['nheads']}:{first['nheads_kv']} heads, head dim {first['hdim']}, "
        f"{first['dtype']}, {gpus}"
    )
    handles = {}
    for ax in axes[0]:  # each label once, whichever panel drew it
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    labels = list(handles)
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return Path(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "json_file", type=Path, help="a results file written by bench_attention.py or bench_decode.py"
    )
    parser.add_argument("--out-dir", type=Path, help="where to write the PNGs (default: beside the JSON file)")
    args = parser.parse_args()
    records = json.loads(args.json_file.read_text())
    out_dir = args.out_dir or args.json_file.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    decode = [r for r in records if r["pass"] == "decode"]
    records = [r for r in records if r["pass"] != "decode"]
    if decode:
        print(plot_decode(decode, out_dir / f"{args.json_file.stem}.png"))
    # The JSON name's pass suffix (-bwd, -fwd-bwd) is dropped: each PNG names its pass.
    stem = re.sub(r"(-(fwd|bwd))+$", "", args.json_file.stem)
    for path in plot_records(records, out_dir / stem):
        print(path)


if __name__ == "__main__":
    main()
