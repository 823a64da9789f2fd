"""Decoding throughput: one query token per sequence over a KV cache, fa3 against cuDNN.

The serving case of attention: each of `batch` sequences has one new query token and
attends to its whole KV cache, so the call is bound by reading the cache from HBM. The
sweep: GQA 32:8 (32 query heads, 8 KV heads), head dim 128, bf16; batch 1, 8, 32, 128
by cache length 1k, 8k, 32k, 128k tokens, the points with batch x length <= 4M tokens
(16 GiB of K and V); the cache contiguous (batch, seqlen, 8, 128) and paged (pages of
64 tokens, each sequence's pages in random order through a shuffled page_table).

fa3 runs flash_attn_with_kvcache; cuDNN runs torch's scaled_dot_product_attention under
sdpa_kernel(SDPBackend.CUDNN_ATTENTION) with enable_gqa=True, in the same process. SDPA
has no page table: at the paged points cuDNN reads the contiguous cache holding the same
keys and values, and its record says so ("cudnn_cache": "contiguous"). fa3's output is
first checked against cuDNN's (or an fp32 reference where cuDNN cannot run). Timing as
in bench_attention.py (triton's do_bench median, L2 flushed before each call).

Metric: KV bytes read per second, TB/s = bytes of the K and V cache entries attended
(batch x seqlen_k x 8 heads x 128 x 2 bytes, for K and for V) / time; the H200's HBM
peak is 4.8 TB/s. fa3 runs its GPU KV-cache path (split-KV kernels over the cache,
the query heads of each KV head together) in a build with FA3_GPU_KVCACHE=ON
(fa3.build_info()["gpu_kvcache"]); in one without it flash_attn_with_kvcache raises
NotImplementedError on CUDA tensors, and the script records cuDNN alone, each of its
records noting why ("fa3_unavailable").

Writes <out-dir>/<YYYY-MM-DD>-<gpu>-decode.json, records {"pass": "decode", "impl":
"fa3" | "cudnn", "paged", "batch", "seqlen_k", "tbs", "ms", "gpu", "dtype", "hdim",
"nheads", "nheads_kv", "page_size" (paged), "num_splits" (when set), ...}, and with
--plot a PNG beside it (TB/s against cache length, one panel per batch; bench/plot.py
re-plots a JSON file).

    python bench/bench_decode.py --plot
    python bench/bench_decode.py --batches 8 32 --seqlens 8192 32768 --layouts paged
    python bench/bench_decode.py --num-splits 0 4 16       # fa3 at several split counts
    python bench/bench_decode.py --graph                   # calls replayed from CUDA graphs
    python bench/bench_decode.py --kv-dtype e4m3           # fa3 on an FP8 cache

With --kv-dtype e4m3 fa3 reads an FP8 cache: q, K and V quantized to e4m3 with one
descale per (sequence, KV head) (FlashAttention-3's layout, absmax / 448 of the group's
values), out bf16; cuDNN keeps the bf16 cache (SDPA has no FP8 path). fa3 is checked
against the fp32 attention of the dequantized values under the FP8 rule's 4e-2, its
records carry "dtype": "e4m3" and count the bytes it reads (one per value), and the file
is <date>-<gpu>-decode-e4m3.json.

With --graph each implementation's call is captured once in a CUDA graph (after a
warm-up on a side stream, as PyTorch asks) and the graph is what is timed: the GPU's
time alone, without the host's work of an eager call, which bounds the small points
(one sequence of 1k-8k keys reads 4-32 MiB, a few microseconds of HBM time) and which
serving engines avoid by replaying their decode steps from graphs. Its records carry
"variant": "graph" and go to <date>-<gpu>-decode-graph.json.
"""

import argparse
import datetime
import json
import math
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

import fa3
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import gpu_slug, graph_of, median_ms  # noqa: E402

NHEADS, NHEADS_KV, HDIM = 32, 8, 128
DTYPE, DTYPE_NAME = torch.bfloat16, "bf16"
BATCHES = [1, 8, 32, 128]
SEQLENS = [1024, 8192, 32768, 131072]
MAX_TOKENS = 4 * 2**20
PAGE_SIZE = 64
LAYOUTS = ("contiguous", "paged")
# fa3's output against cuDNN's (both bf16, fp32 accumulation): about 3e-3 apart.
MAX_REL_ERR = 1e-2
# An e4m3 cache against the exact attention of its values: TESTING.md's FP8 cap.
MAX_REL_ERR_FP8 = 4e-2
E4M3 = torch.float8_e4m3fn
# What cuDNN's records at paged points read: SDPA has no page table, so the contiguous
# cache with the same keys and values (its time is the contiguous point's).
CUDNN_PAGED_NOTE = "contiguous"


def points(batches, seqlens, max_tokens):
    """(batch, seqlen_k) of the sweep: every pair whose cache holds at most max_tokens tokens."""
    return [(b, s) for b in batches for s in seqlens if b * s <= max_tokens]


def kv_bytes(batch, seqlen_k, nheads_kv=NHEADS_KV, hdim=HDIM, itemsize=2):
    """Bytes of the K and V cache entries one decoding call attends to."""
    return 2 * batch * seqlen_k * nheads_kv * hdim * itemsize


def record(impl, paged, batch, seqlen_k, ms, gpu, num_splits=0, dtype=DTYPE_NAME, **fields):
    """One JSON record; TB/s counts kv_bytes (of the cache's dtype) over ms (None, with
    an "error" field, when the implementation could not run the point)."""
    itemsize = 1 if dtype == "e4m3" else 2
    rec = {
        "pass": "decode",
        "impl": impl,
        "paged": paged,
        "batch": batch,
        "seqlen_k": seqlen_k,
        "tbs": None if ms is None else kv_bytes(batch, seqlen_k, itemsize=itemsize) / (ms * 1e-3) / 1e12,
        "ms": ms,
        "gpu": gpu,
        "dtype": dtype,
        "hdim": HDIM,
        "nheads": NHEADS,
        "nheads_kv": NHEADS_KV,
    }
    if paged:
        rec["page_size"] = PAGE_SIZE
    if num_splits:
        rec["num_splits"] = num_splits
    rec.update(fields)
    return rec


def quantize_kv(t, nheads_kv=NHEADS_KV):
    """(e4m3 codes of t (b, s, h, d), float32 descale (b, nheads_kv)): one scale per
    (batch, KV head), shared by its group of heads (FlashAttention-3's descale layout),
    the group's largest magnitude mapped to e4m3's largest value."""
    b, s, h, d = t.shape
    grouped = t.float().view(b, s, nheads_kv, h // nheads_kv, d)
    scale = grouped.abs().amax(dim=(1, 3, 4)).clamp_min(1e-12) / torch.finfo(E4M3).max
    codes = (grouped / scale[:, None, :, None, None]).view(b, s, h, d).to(E4M3)
    return codes, scale.contiguous()


def dequantize_kv(codes, scale):
    """codes (b, s, h, d) times their (batch, KV head) descale, in float32."""
    b, s, h, d = codes.shape
    g = scale.shape[1]
    return (codes.float().view(b, s, g, h // g, d) * scale[:, None, :, None, None]).view(b, s, h, d)


def paged_cache(k_cache, v_cache, page_size, generator=None):
    """The contiguous caches (batch, seqlen, heads, hdim) as shuffled pages: (k_pages,
    v_pages, page_table), the pages (batch * seqlen / page_size, page_size, heads, hdim) in
    one random order for K and V, and page_table int32 (batch, seqlen / page_size) naming
    each sequence's pages in order."""
    batch, seqlen = k_cache.shape[:2]
    if seqlen % page_size:
        raise ValueError(f"seqlen_k {seqlen} is not a multiple of the page size {page_size}")
    npages = batch * (seqlen // page_size)
    # Page j of sequence b (in_order[b * seqlen / page_size + j]) is stored at where[...].
    where = torch.randperm(npages, generator=generator).to(k_cache.device)
    shuffled = []
    for cache in (k_cache, v_cache):
        # e4m3 pages move as their bytes (index_put has no float8 kernel).
        raw = cache.view(torch.uint8) if cache.dtype == E4M3 else cache
        pages = raw.new_empty((npages, page_size) + tuple(cache.shape[2:]))
        pages[where] = raw.reshape(pages.shape)
        shuffled.append(pages.view(cache.dtype))
    return shuffled[0], shuffled[1], where.view(batch, -1).to(torch.int32)


def cudnn_decode(q, k_cache, v_cache):
    """SDPA on (batch, heads, seqlen, hdim) views of the same memory, cuDNN forced."""
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), enable_gqa=True
        )
    return out.transpose(1, 2)


def fp32_reference(q, k_cache, v_cache, rows=2):
    """fp32 attention of the first `rows` sequences (one query token each)."""
    group = q.shape[2] // k_cache.shape[2]
    qf = q[:rows].float()
    kf, vf = (t[:rows].float().repeat_interleave(group, dim=2) for t in (k_cache, v_cache))
    scores = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * q.shape[-1] ** -0.5
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vf)


def relative_error(out, ref):
    out = out[: ref.shape[0]].float()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm()).item()


def attempt(fn):
    """(fn()'s result, None), or (None, reason) when it cannot run."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA explains at length why a backend declined
            result = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            return result, None
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def timed_ms(fn, args):
    """Median ms of fn(), or of its replay from a CUDA graph with --graph."""
    return median_ms(graph_of(lambda: fn).replay if args.graph else fn, args.rep_ms)


def time_fa3(q, cache, seqlen, reference, reference_name, args, max_err=MAX_REL_ERR):
    """[(num_splits, ms, rel_err)] of fa3 on one cache (and its descales, with an e4m3
    one) at each --num-splits, or ([], reason) at the first that cannot run or gives a
    wrong result."""
    timings = []
    for splits in args.num_splits:

        def decode(splits=splits):
            return fa3.flash_attn_with_kvcache(q, cache_seqlens=seqlen, num_splits=splits, **cache)

        out, error = attempt(decode)
        if error:
            return [], error
        err = relative_error(out, reference)
        if not err <= max_err:
            return [], f"wrong result: relative error {err:.2e} against {reference_name}"
        ms, error = attempt(lambda: timed_ms(decode, args))
        if error:
            return [], error
        timings.append((splits, ms, err))
    return timings, None


def run_point(batch, seqlen, args, gpu, device="cuda"):
    """Records of one (batch, seqlen_k) point: fa3 and cuDNN for each layout. (device
    "cpu" runs fa3's CPU path, where cuDNN is unavailable: the tests' way through.)"""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, 1, NHEADS, HDIM, generator=gen, device=device, dtype=DTYPE)
    k_cache, v_cache = (
        torch.randn(batch, seqlen, NHEADS_KV, HDIM, generator=gen, device=device, dtype=DTYPE) for _ in range(2)
    )
    cudnn_out, cudnn_error = attempt(lambda: cudnn_decode(q, k_cache, v_cache))
    # One cuDNN timing serves both layouts: SDPA has no page table.
    cudnn_ms = None
    if not cudnn_error:
        cudnn_ms, cudnn_error = attempt(lambda: timed_ms(lambda: cudnn_decode(q, k_cache, v_cache), args))
    fp8 = args.kv_dtype == "e4m3"
    if fp8:
        # fa3 reads the codes; its result is held to the exact attention of their values.
        (q_in, q_scale), (k_in, k_scale), (v_in, v_scale) = (quantize_kv(t) for t in (q, k_cache, v_cache))
        descales = {"q_descale": q_scale, "k_descale": k_scale, "v_descale": v_scale}
        values = (dequantize_kv(q_in[:2], q_scale[:2]), dequantize_kv(k_in[:2], k_scale[:2]),
                  dequantize_kv(v_in[:2], v_scale[:2]))
        reference, reference_name = fp32_reference(*values), "fp32"
    else:
        q_in, k_in, v_in, descales = q, k_cache, v_cache, {}
        if cudnn_error:
            reference, reference_name = fp32_reference(q, k_cache, v_cache), "fp32"
        else:
            reference, reference_name = cudnn_out.float(), "cudnn"
    variant = {"variant": "graph"} if args.graph else {}
    fa3_fields = {"dtype": args.kv_dtype, **variant}
    records = []
    for layout in args.layouts:
        paged = layout == "paged"
        cache = {"k_cache": k_in, "v_cache": v_in, **descales}
        if paged:
            k_pages, v_pages, table = paged_cache(k_in, v_in, PAGE_SIZE, torch.Generator().manual_seed(0))
            cache = {"k_cache": k_pages, "v_cache": v_pages, "page_table": table, **descales}
        max_err = MAX_REL_ERR_FP8 if fp8 else MAX_REL_ERR
        timings, fa3_error = time_fa3(q_in, cache, seqlen, reference, reference_name, args, max_err)
        for splits, ms, err in timings:
            records.append(
                record("fa3", paged, batch, seqlen, ms, gpu, splits, rel_err=err, reference=reference_name,
                       **fa3_fields)
            )
        notes = dict(variant)
        if paged:
            notes["cudnn_cache"] = CUDNN_PAGED_NOTE
        if fa3_error:
            print(f"bench_decode: fa3 at batch {batch} seqlen_k {seqlen} {layout}: {fa3_error}", file=sys.stderr)
            notes["fa3_unavailable"] = fa3_error
        if cudnn_error:
            notes["error"] = cudnn_error
        records.append(record("cudnn", paged, batch, seqlen, cudnn_ms, gpu, **notes))
        del cache
    return records


def print_table(records):
    """TB/s per point: cuDNN, and fa3 at each num_splits."""
    print("| layout | batch | seqlen_k | KV MiB | impl | ms | TB/s |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in records:
        impl = r["impl"] + (f" splits={r['num_splits']}" if "num_splits" in r else "")
        ms = f"{r['ms']:.4f}" if r["ms"] is not None else "n/a"
        tbs = f"{r['tbs']:.2f}" if r["tbs"] is not None else "n/a"
        mib = kv_bytes(r["batch"], r["seqlen_k"], itemsize=1 if r["dtype"] == "e4m3" else 2) / 2**20
        if r["dtype"] == "e4m3":
            impl += " e4m3"
        layout = "paged" if r["paged"] else "contiguous"
        print(f"| {layout} | {r['batch']} | {r['seqlen_k']} | {mib:.0f} | {impl} | {ms} | {tbs} |")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    parser.add_argument("--seqlens", type=int, nargs="+", default=SEQLENS, help="cache lengths (seqlen_k)")
    parser.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS, help="largest batch x seqlen_k (default 4M tokens)"
    )
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument(
        "--num-splits", type=int, nargs="+", default=[0], help="fa3's num_splits, each timed (0: its heuristic)"
    )
    parser.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement (ms)")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--plot", action="store_true", help="also write the TB/s plot (needs matplotlib)")
    parser.add_argument("--graph", action="store_true", help="time calls replayed from CUDA graphs (no host time)")
    parser.add_argument(
        "--kv-dtype", choices=("bf16", "e4m3"), default="bf16", help="fa3's cache: bf16, or e4m3 with descales"
    )
    args = parser.parse_args(argv)
    for s in args.seqlens:
        if s < 1 or ("paged" in args.layouts and s % PAGE_SIZE):
            parser.error(f"--seqlens: {s} must be positive and, for the paged layout, a multiple of {PAGE_SIZE}")
    if any(b < 1 for b in args.batches):
        parser.error("--batches: every batch must be positive")
    if any(n < 0 for n in args.num_splits):
        parser.error("--num-splits: 0 (the heuristic) or a positive count")
    if not points(args.batches, args.seqlens, args.max_tokens):
        parser.error("no (batch, seqlen) point has batch x seqlen <= --max-tokens")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}; torch {torch.__version__}; fa3 {fa3.__version__}", file=sys.stderr)
    records = []
    for batch, seqlen in points(args.batches, args.seqlens, args.max_tokens):
        records += run_point(batch, seqlen, args, gpu)
        torch.cuda.empty_cache()
    print_table(records)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = ("-e4m3" if args.kv_dtype == "e4m3" else "") + ("-graph" if args.graph else "")
    stem = args.out_dir / f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}-decode{suffix}"
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {path}")
    if args.plot:
        from plot import plot_decode

        print(f"wrote {plot_decode(records, stem.with_suffix('.png'))}")


if __name__ == "__main__":
    main()
