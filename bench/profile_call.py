"""Runs one call of an implementation that bench_attention.py times, on the sweep's
shape for a head dim and length, between cudaProfilerStart and cudaProfilerStop after
three warm-up calls: for Nsight Compute with --profile-from-start off, so that fa3's
kernels and another implementation's (FlashAttention-3's, cuDNN's) are profiled under
the same settings, in the same way.

    ncu --profile-from-start off --clock-control none --section WarpStateStats \\
        --section SourceCounters --kernel-name-base demangled \\
        --kernel-name regex:'bwd_kernel<|FlashAttnBwdSm90' -o OUT \\
        python bench/profile_call.py --impl flashattention3 --pass bwd --hdim 64 --causal --seqlen 16384
    ncu -i OUT.ncu-rep --page source --print-source sass --csv > src.csv
    python scripts/ncu_hotspots.py src.csv

(FlashAttention-3's kernels are all named cutlass::device_kernel, hence the demangled
names.) The backward is profiled alone: the forward runs before the profiled range.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Attention implementations: the FP8 GEMM yardstick takes no attention inputs.
    impls = sorted(name for name in bench_attention.IMPLS if name != "cublas-fp8")
    parser.add_argument("--impl", choices=impls, default="fa3")
    parser.add_argument("--pass", dest="pass_", choices=bench_attention.PASSES, default="bwd")
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--warmup", type=int, default=3, help="calls before the profiled one")
    args = parser.parse_args(argv)
    if not 1 <= args.hdim <= bench_attention.HIDDEN:
        parser.error(f"--hdim: {args.hdim} is not in 1..{bench_attention.HIDDEN}")
    if args.seqlen < 1:
        parser.error("--seqlen: must be positive")
    return args


def shape(seqlen, hdim):
    """(batch, seqlen, nheads, hdim) of the sweep's point: 16k tokens, hidden size 2048."""
    return max(1, bench_attention.TOKENS // seqlen), seqlen, bench_attention.HIDDEN // hdim, hdim


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_call.py needs a CUDA GPU")
    dtype = bench_attention.DTYPES[args.dtype]
    q, k, v = (torch.randn(shape(args.seqlen, args.hdim), device="cuda", dtype=dtype) for _ in range(3))
    if args.pass_ == "bwd":
        fn = bench_attention.backward_fn(args.impl, q, k, v, args.causal, torch.randn_like(q))
    else:
        bench_attention.attempt(args.impl, q, k, v, args.causal)
        fn = lambda: bench_attention.IMPLS[args.impl](q, k, v, args.causal)  # noqa: E731
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
