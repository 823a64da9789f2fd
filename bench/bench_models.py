"""fa3 against its peers on the attention shapes of real models (ANCHORS.md's "Model
shapes": Llama-3, Mistral, Gemma-2, Qwen, ViT-L, SD3, MQA, short prefill), where
the sweep of bench_attention.py (MHA, 16k tokens) does not go: GQA and MQA head ratios,
batches of long sequences, 577-token images.

    python bench/bench_models.py                                   # fa3 vs cuDNN, forward
    python bench/bench_models.py --passes fwd bwd --impls fa3 flashattention3 cudnn --rounds 3 --interleave

Each shape is checked first (fa3 against cuDNN, or fp32 attention where cuDNN cannot run
it), then timed as bench_attention.py times a point (its --rounds and --interleave).
Writes bench/results/<YYYY-MM-DD>-<gpu>-models.json (records with "model", "nheads_kv")
and a bar chart beside it; prints a table with the fa3 / best-peer ratio.
"""

import argparse
import datetime
import functools
import json
import sys
from collections import namedtuple
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402

Shape = namedtuple("Shape", "name batch seqlen nheads nheads_kv hdim causal")

MODELS = [
    Shape("Llama-3-8B", 4, 4096, 32, 8, 128, True),
    Shape("Llama-3-70B", 1, 8192, 64, 8, 128, True),
    Shape("Llama-3-8B long", 1, 32768, 32, 8, 128, True),
    Shape("Mistral", 8, 2048, 32, 8, 128, True),
    Shape("Gemma-2-9B", 2, 8192, 16, 8, 256, True),
    Shape("Qwen", 2, 4096, 28, 4, 128, True),
    Shape("ViT-L", 64, 577, 16, 16, 64, False),
    Shape("SD3", 2, 4096, 24, 24, 64, False),
    Shape("MQA", 2, 8192, 32, 1, 128, True),
    Shape("short prefill", 16, 1024, 32, 8, 128, True),
]
BY_NAME = {m.name: m for m in MODELS}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(BY_NAME), help="shapes to run (default: all)")
    parser.add_argument("--passes", nargs="+", choices=bench_attention.PASSES, default=["fwd"])
    impls = sorted(name for name in bench_attention.IMPLS if name not in ("cublas-fp8", "fa3-deterministic"))
    parser.add_argument("--impls", nargs="+", choices=impls, default=["fa3", "cudnn"])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--interleave", action="store_true", help="as bench_attention.py --interleave")
    parser.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement (ms)")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--no-plot", action="store_true", help="write the JSON file only")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    args.models = [BY_NAME[name] for name in args.models] if args.models else list(MODELS)
    args.passes = [p for p in bench_attention.PASSES if p in args.passes]
    return args


def flops(pass_, shape):
    """The shape's FLOPs: its query heads', as bench_attention.flops counts them."""
    return bench_attention.flops(pass_, shape.batch, shape.nheads, shape.seqlen, shape.hdim, shape.causal)


def run(args, gpu):
    records = []
    for pass_ in args.passes:
        for shape in args.models:
            gen = torch.Generator(device="cuda").manual_seed(0)

            def draw(heads):
                return torch.randn(
                    shape.batch, shape.seqlen, heads, shape.hdim, generator=gen, device="cuda", dtype=torch.bfloat16
                )

            q, k, v, dout = draw(shape.nheads), draw(shape.nheads_kv), draw(shape.nheads_kv), draw(shape.nheads)
            base = {"pass": pass_, "dtype": "bf16", "model": shape.name, "batch": shape.batch, "seqlen": shape.seqlen,
                    "nheads": shape.nheads, "nheads_kv": shape.nheads_kv, "hdim": shape.hdim,
                    "causal": shape.causal, "gpu": gpu}
            get_reference = functools.cache(
                functools.partial(bench_attention.reference, pass_, q, k, v, shape.causal, dout)
            )
            point = bench_attention.measure_point(
                args.impls, base, pass_, q, k, v, shape.causal, dout, get_reference, flops(pass_, shape), args
            )
            records.extend(point.values())
            del q, k, v, dout, get_reference
            torch.cuda.empty_cache()
    return records


def table(records):
    """Markdown lines: one row per (pass, model), TFLOP/s per implementation, fa3 / best peer."""
    impls = list(dict.fromkeys(r["impl"] for r in records))
    lines = ["| pass | model | b x s, heads q:kv, hdim, mask | " + " | ".join(impls) + " | fa3 / best peer |",
             "|---|---|---|" + "---:|" * (len(impls) + 1)]
    rows = {}
    for r in records:
        rows.setdefault((r["pass"], r["model"]), {})[r["impl"]] = r
    for (pass_, model), by_impl in rows.items():
        first = next(iter(by_impl.values()))
        shape = (f"{first['batch']} x {first['seqlen']}, {first['nheads']}:{first['nheads_kv']}, {first['hdim']}, "
                 f"{'causal' if first['causal'] else 'full'}")
        cells = [f"{by_impl[i]['tflops']:.0f}" if i in by_impl and by_impl[i]["tflops"] else "-" for i in impls]
        mine = by_impl.get("fa3", {}).get("tflops")
        peers = [r["tflops"] for i, r in by_impl.items() if i != "fa3" and r["tflops"]]
        ratio = f"{mine / max(peers):.2f}" if mine and peers else "-"
        lines.append(f"| {pass_} | {model} | {shape} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def plot(records, path):
    """A grouped bar chart, one panel per pass: TFLOP/s per model and implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    passes = list(dict.fromkeys(r["pass"] for r in records))
    impls = list(dict.fromkeys(r["impl"] for r in records))
    fig, axes = plt.subplots(1, len(passes), figsize=(7 * len(passes), 5), squeeze=False)
    for ax, pass_ in zip(axes[0], passes):
        models = list(dict.fromkeys(r["model"] for r in records if r["pass"] == pass_))
        width = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            values = [next((r["tflops"] or 0 for r in records
                            if r["pass"] == pass_ and r["model"] == m and r["impl"] == impl), 0) for m in models]
            ax.barh([i + j * width for i in range(len(models))], values, height=width, label=impl)
        ax.set_yticks([i + 0.4 - width / 2 for i in range(len(models))])
        ax.set_yticklabels(models)
        ax.invert_yaxis()
        ax.set_xlabel("TFLOP/s")
        ax.set_title(f"{'forward' if pass_ == 'fwd' else 'backward'}, bf16, {records[0]['gpu']}")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_models.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    records = run(args, gpu)
    print("\n".join(table(records)))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"{datetime.date.today().isoformat()}-{bench_attention.gpu_slug(gpu)}-models"
    stem.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(f"wrote {stem.with_suffix('.json')}")
    if not args.no_plot:
        try:
            plot(records, stem.with_suffix(".png"))
            print(f"wrote {stem.with_suffix('.png')}")
        except ImportError as e:
            print(f"no plot ({e})")


if __name__ == "__main__":
    main()
