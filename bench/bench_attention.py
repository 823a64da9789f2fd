"""Attention throughput: fa3 against PyTorch's SDPA backends, in one process.

The sweep is the FlashAttention-3 paper's (docs ANCHORS.md): batch x seqlen = 16384
tokens, hidden size 2048, nheads = 2048 / hdim, hdim 64/128/256, causal and not,
seqlen 512 .. 16384. For every point it first checks fa3's output against cuDNN's
(or an fp32 reference where cuDNN cannot run), then times each implementation:
median of triton.testing.do_bench, or of CUDA-event timings without triton.

    python bench/bench_attention.py                       # the full forward sweep
    python bench/bench_attention.py --quick               # a few points, for a smoke test
    python bench/bench_attention.py --hdims 128 --seqlens 1024 8192 --causal yes

FLOPs: forward 4 * batch * nheads * seqlen^2 * hdim, halved when causal; backward
2.5x forward. Peers: SDPA with one backend forced (cuDNN = CUDNN_ATTENTION,
fa2 = FLASH_ATTENTION, efficient = EFFICIENT_ATTENTION); one that cannot run a
point is recorded as unavailable with its reason. Writes
<out-dir>/<YYYY-MM-DD>-<gpu>.json (a list of records: impl, pass, dtype, hdim,
causal, seqlen, batch, nheads, tflops, gpu) and PNG plots beside it. Needs a CUDA
GPU, torch and fa3; triton, tqdm and matplotlib are used when present. No network.
"""

import argparse
import datetime
import functools
import json
import math
import re
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

# After torch: the extension then shares the CUDA runtime torch has already loaded.
import fa3
from torch.nn.attention import SDPBackend, sdpa_kernel

TOKENS = 16384
HIDDEN = 2048
HDIMS = [64, 128, 256]
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_HDIMS = [128]
QUICK_SEQLENS = [1024, 4096]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PASSES = ("fwd", "bwd")
# Largest relative error (Frobenius) of fa3's output against the reference that
# still counts as correct: both are rounded to 16 bits (about 2e-3 apart).
MAX_REL_ERR = 1e-2


class Unavailable(Exception):
    """An implementation cannot run a point (unsupported shape, missing kernel)."""


# ---- implementations: each maps (q, k, v, causal) in (batch, seqlen, nheads, hdim) to out ----


def run_fa3(q, k, v, causal):
    return fa3.flash_attn_func(q, k, v, causal=causal)


def sdpa(backend):
    def run(q, k, v, causal):
        # SDPA takes (batch, nheads, seqlen, hdim): transposed views of the same
        # memory (no copies), the layout FlashAttention-2 and cuDNN read natively.
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
            )
        return out.transpose(1, 2)

    return run


IMPLS = {
    "fa3": run_fa3,
    "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    "fa2": sdpa(SDPBackend.FLASH_ATTENTION),
    "efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
}


def attempt(impl, q, k, v, causal):
    """Runs `impl` once; converts 'cannot run this' into Unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns at length about why a backend declined
            out = IMPLS[impl](q, k, v, causal)
            torch.cuda.synchronize()
            return out
    except (RuntimeError, NotImplementedError, ValueError) as e:
        raise Unavailable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


# ---- timing ----


def median_ms(fn, rep_ms, grad_to_none=()):
    """Median time of fn() in milliseconds; the tensors in grad_to_none lose their
    .grad before each call, so that a backward pass allocates instead of accumulating."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _median_ms_cuda_events(fn, rep_ms, grad_to_none)
    options = {"warmup": max(rep_ms // 4, 10), "rep": rep_ms, "grad_to_none": list(grad_to_none) or None}
    try:
        return do_bench(fn, return_mode="median", **options)
    except TypeError:  # triton releases before return_mode
        return do_bench(fn, quantiles=[0.5], **options)


@functools.lru_cache(maxsize=1)
def _l2_flush_buffer():
    return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")


def _median_ms_cuda_events(fn, rep_ms, grad_to_none):
    """What do_bench does, with CUDA events: L2 flushed before each timed call."""
    flush = _l2_flush_buffer()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    iters = max(10, min(1000, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-3))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for begin, finish in events:
        for t in grad_to_none:
            t.grad = None
        flush.zero_()
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    times = sorted(b.elapsed_time(f) for b, f in events)
    return times[len(times) // 2]


def flops(pass_, batch, nheads, seqlen, hdim, causal):
    forward = 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
    return forward * (2.5 if pass_ == "bwd" else 1.0)


def time_point(impl, pass_, q, k, v, causal, rep_ms):
    """Milliseconds for one pass of `impl`; the backward is timed alone, on a retained graph."""
    if pass_ == "fwd":
        return median_ms(lambda: IMPLS[impl](q, k, v, causal), rep_ms)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attempt(impl, q, k, v, causal)
    dout = torch.randn_like(out)
    try:
        out.backward(dout, retain_graph=True)
    except (RuntimeError, NotImplementedError) as e:
        raise Unavailable(f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
    return median_ms(lambda: out.backward(dout, retain_graph=True), rep_ms, grad_to_none=(q, k, v))


# ---- correctness check ----


def fp32_reference(q, k, v, causal):
    """fp32 attention, computed a few heads at a time to bound the score matrix's memory."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    seqlen = q.shape[1]
    heads_per_step = max(1, (2**30) // (seqlen * seqlen))
    for b in range(q.shape[0]):
        for h0 in range(0, q.shape[2], heads_per_step):
            h1 = min(h0 + heads_per_step, q.shape[2])
            qs, ks, vs = (t[b, :, h0:h1].float().transpose(0, 1) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                out[b, :, h0:h1] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1)
    return out


def check_fa3(q, k, v, causal):
    """(relative error, reference name) of fa3's output; raises Unavailable if fa3 cannot run."""
    out = attempt("fa3", q, k, v, causal).float()
    try:
        ref, ref_name = attempt("cudnn", q, k, v, causal).float(), "cudnn"
    except Unavailable:
        ref, ref_name = fp32_reference(q, k, v, causal), "fp32"
    if not torch.isfinite(out).all():
        return math.inf, ref_name
    return ((out - ref).norm() / ref.norm()).item(), ref_name


# ---- the sweep ----


def gpu_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def progress(items):
    try:
        from tqdm import tqdm
    except ImportError:
        total = len(items)
        for i, item in enumerate(items, 1):
            print(f"[{i}/{total}] {item}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, unit="point")


def run_sweep(args, gpu):
    points = [
        (pass_, dtype, hdim, causal, seqlen)
        for pass_ in args.passes
        for dtype in args.dtypes
        for hdim in args.hdims
        for causal in args.causal
        for seqlen in args.seqlens
    ]
    records = []
    for pass_, dtype, hdim, causal, seqlen in progress(points):
        batch, nheads = max(1, TOKENS // seqlen), HIDDEN // hdim
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(batch, seqlen, nheads, hdim, generator=gen, device="cuda", dtype=DTYPES[dtype])
            for _ in range(3)
        )
        base = {
            "pass": pass_,
            "dtype": dtype,
            "hdim": hdim,
            "causal": causal,
            "seqlen": seqlen,
            "batch": batch,
            "nheads": nheads,
            "gpu": gpu,
        }
        fa3_error = None
        if "fa3" in args.impls:
            try:
                rel_err, ref_name = check_fa3(q, k, v, causal)
                if not rel_err <= MAX_REL_ERR:
                    fa3_error = f"wrong result: relative error {rel_err:.2e} against {ref_name}"
            except Unavailable as e:
                fa3_error = str(e)
        for impl in args.impls:
            record = dict(base, impl=impl, tflops=None)
            if impl == "fa3" and fa3_error:
                record["error"] = fa3_error
            else:
                try:
                    attempt(impl, q, k, v, causal)
                    ms = time_point(impl, pass_, q, k, v, causal, args.rep_ms)
                    record["tflops"] = flops(pass_, batch, nheads, seqlen, hdim, causal) / (ms * 1e-3) / 1e12
                    if impl == "fa3":
                        record["rel_err"], record["reference"] = rel_err, ref_name
                except Unavailable as e:
                    record["error"] = str(e)
            records.append(record)
        del q, k, v
        torch.cuda.empty_cache()
    return records


def print_table(records, impls):
    peers = [i for i in impls if i != "fa3"]
    header = ["pass", "dtype", "hdim", "causal", "seqlen", "batch x heads"] + impls
    if "fa3" in impls and peers:
        header.append("fa3 / best peer")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    keys = sorted(
        {(r["pass"], r["dtype"], r["hdim"], r["causal"], r["seqlen"]) for r in records},
        key=lambda key: (PASSES.index(key[0]), *key[1:]),
    )
    for key in keys:
        row = {r["impl"]: r for r in records if (r["pass"], r["dtype"], r["hdim"], r["causal"], r["seqlen"]) == key}
        any_record = next(iter(row.values()))
        cells = [
            key[0],
            key[1],
            str(key[2]),
            "yes" if key[3] else "no",
            str(key[4]),
            f"{any_record['batch']}x{any_record['nheads']}",
        ]
        for impl in impls:
            tflops = row.get(impl, {}).get("tflops")
            cells.append(f"{tflops:.0f}" if tflops is not None else "n/a")
        if "fa3" in impls and peers:
            best = max((row[p]["tflops"] for p in peers if row.get(p, {}).get("tflops") is not None), default=None)
            mine = row.get("fa3", {}).get("tflops")
            cells.append(f"{mine / best:.2f}" if mine is not None and best else "n/a")
        print("| " + " | ".join(cells) + " |")
    for r in records:
        if r.get("error"):
            print(
                f"  {r['impl']} unavailable at {r['pass']} {r['dtype']} hdim {r['hdim']} "
                f"{'causal' if r['causal'] else 'non-causal'} seqlen {r['seqlen']}: {r['error']}"
            )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hdims", type=int, nargs="+", help=f"head dims (default {HDIMS})")
    parser.add_argument("--seqlens", type=int, nargs="+", help=f"sequence lengths (default {SEQLENS})")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=["fwd"],
        help="fwd (default) and/or bwd (timed alone on a retained graph)",
    )
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    parser.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement (ms)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"hdims {QUICK_HDIMS}, seqlens {QUICK_SEQLENS}, shorter timings; file name ends -quick",
    )
    parser.add_argument("--no-plot", action="store_true", help="write the JSON file only")
    args = parser.parse_args(argv)
    args.hdims = args.hdims or (QUICK_HDIMS if args.quick else HDIMS)
    args.seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else SEQLENS)
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    if args.quick:
        args.rep_ms = min(args.rep_ms, 50)
    for hdim in args.hdims:
        if HIDDEN % hdim:
            parser.error(f"--hdims: {hdim} does not divide the hidden size {HIDDEN}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    print(
        f"{gpu}; torch {torch.__version__}; fa3 {fa3.__version__} "
        f"(kernels: head dims {fa3.build_info()['head_dims']}, {fa3.build_info()['dtypes']})",
        file=sys.stderr,
    )
    records = run_sweep(args, gpu)
    print_table(records, args.impls)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}" + ("-quick" if args.quick else "")
    json_path = args.out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {json_path}")
    if not args.no_plot:
        try:
            from plot import plot_records
        except ImportError as e:
            print(f"no plots ({e}); re-plot later with bench/plot.py {json_path}")
        else:
            for path in plot_records(records, args.out_dir / stem):
                print(f"wrote {path}")


if __name__ == "__main__":
    main()
