"""Times the same calls of several implementations four ways, in one process, to tell a
slower kernel from a GPU left in another state by what ran before it:

- sweep: bench_attention.py's --interleave method (interleaved_medians): L2 flushed
  before each call, events around it, the implementations in turns;
- idle-before: the same with a sleep kernel queued before each flush (about 2 ms at the
  H100's clock), so that the GPU is idle a moment before every call and the host is
  always ahead of it;
- back-to-back: the profiler's kernel times over five calls in a row, no flush;
- host: microseconds of host time per call, enqueued behind a long sleep kernel.

    python bench/timing_methods.py --impls fa3 flashattention3 fwd:128:causal:4096 bwd:64:causal:16384

A point is PASS:HDIM:MASK:SEQLEN (MASK causal or none), on the sweep's shapes (16k
tokens, hidden size 2048). --dtype e4m3 times FP8 forward calls with one descale per
(batch, head), as the sweep's --fp8-scales descales and FlashAttention-3 take them.
docs/perf-log.md (2026-12-06) has a run.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402

SLEEP_CYCLES = 4_000_000  # about 2 ms at 1.98 GHz
HOST_SLEEP_CYCLES = 200_000_000  # about 100 ms: longer than the host's enqueues below
REP_MS = 200  # per implementation and repeat, as the sweep's default
REPEATS = 3


def parse_point(text):
    try:
        pass_, hdim, mask, seqlen = text.split(":")
        if pass_ not in bench_attention.PASSES or mask not in ("causal", "none"):
            raise ValueError
        return pass_, int(hdim), mask == "causal", int(seqlen)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PASS:HDIM:causal|none:SEQLEN, got '{text}'") from None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    impls = sorted(name for name in bench_attention.IMPLS if name != "cublas-fp8")
    parser.add_argument("--impls", nargs="+", choices=impls, default=["fa3", "flashattention3"])
    parser.add_argument("--dtype", choices=["bf16", "fp16", "e4m3"], default="bf16")
    parser.add_argument("points", nargs="+", type=parse_point)
    args = parser.parse_args(argv)
    if args.dtype == "e4m3" and any(point[0] == "bwd" for point in args.points):
        parser.error("--dtype e4m3: forward points only")
    return args


def kernel_ms(fn, calls=5):
    """Per call: {kernel name: ms} and the sum, from the profiler, `calls` calls in a row."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(event, "device_time", None)
            us = event.cuda_time if us is None else us
            kernels[event.name[:70]] = kernels.get(event.name[:70], 0.0) + us / 1e3 / calls
    return kernels, sum(kernels.values())


def host_us(fn, calls=20):
    torch.cuda.synchronize()
    torch.cuda._sleep(HOST_SLEEP_CYCLES)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("timing_methods.py needs a CUDA GPU")
    for pass_, hdim, causal, seqlen in args.points:
        batch, nheads = max(1, bench_attention.TOKENS // seqlen), bench_attention.HIDDEN // hdim
        gen = torch.Generator(device="cuda").manual_seed(0)
        drawn = torch.bfloat16 if args.dtype == "e4m3" else bench_attention.DTYPES[args.dtype]
        q, k, v, dout = (
            torch.randn(batch, seqlen, nheads, hdim, generator=gen, device="cuda", dtype=drawn) for _ in range(4)
        )
        fp8 = {}
        if args.dtype == "e4m3":
            (q, q_descale), (k, k_descale), (v, v_descale) = (bench_attention.quantize_per_head(t) for t in (q, k, v))
            fp8 = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        calls = {
            impl: bench_attention.timed_call(impl, pass_, q, k, v, causal, dout, **fp8)[0] for impl in args.impls
        }
        for fn in calls.values():
            fn()
        torch.cuda.synchronize()
        sweep = [bench_attention.interleaved_medians(calls, REP_MS) for _ in range(REPEATS)]
        idle = [bench_attention.interleaved_medians(calls, REP_MS, SLEEP_CYCLES) for _ in range(REPEATS)]
        flop = bench_attention.flops(pass_, batch, nheads, seqlen, hdim, causal)
        mask = "causal" if causal else "none"
        print(f"== {pass_} {args.dtype} hdim {hdim} {mask} {seqlen} (batch {batch} x {nheads} heads)")
        for impl, fn in calls.items():
            ms_sweep = statistics.median(r[impl] for r in sweep)
            ms_idle = statistics.median(r[impl] for r in idle)
            kernels, ms_kernels = kernel_ms(fn)
            cells = [f"{name} {ms:.4f} ms ({flop / ms / 1e9:.0f} TF)" for name, ms in
                     (("sweep", ms_sweep), ("idle-before", ms_idle), ("back-to-back", ms_kernels))]
            print(f"  {impl}: " + " | ".join(cells) + f" | host {host_us(fn):.0f} us/call")
            for name, ms in sorted(kernels.items(), key=lambda item: -item[1]):
                print(f"      {ms:8.4f} ms {name}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
