"""Bar charts of benchmark results, in the style of the FlashAttention-3 paper's figures.

One PNG per (pass, dtype) with a panel per (head dim, causal), grouped bars per
sequence length and one colour per implementation, TFLOP/s written on the bars.

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
    "cudnn": ("cuDNN (SDPA)", "#2e86c1"),
    "fa2": ("FlashAttention-2 (SDPA)", "#27ae60"),
    "efficient": ("memory-efficient (SDPA)", "#8e7cc3"),
}
PASS_TITLE = {"fwd": "forward", "bwd": "backward"}


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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json_file", type=Path, help="a results file written by bench_attention.py")
    parser.add_argument("--out-dir", type=Path, help="where to write the PNGs (default: beside the JSON file)")
    args = parser.parse_args()
    records = json.loads(args.json_file.read_text())
    out_dir = args.out_dir or args.json_file.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    # The JSON name's pass suffix (-bwd, -fwd-bwd) is dropped: each PNG names its pass.
    stem = re.sub(r"(-(fwd|bwd))+$", "", args.json_file.stem)
    for path in plot_records(records, out_dir / stem):
        print(path)


if __name__ == "__main__":
    main()
