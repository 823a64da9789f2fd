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

--dtype e4m3 profiles the FP8 forward (--pass fwd), its inputs quantized with one
descale per (batch, head), as the sweep's --fp8-scales descales gives both libraries.

--varlen-lengths LOW:HIGH profiles a varlen call instead (fa3's or FlashAttention-3's
flash_attn_varlen_func): the sweep's 16k tokens packed in sequences of LOW to HIGH
tokens, the mix bench_variants.py --varlen-only times (--seqlen is then unused).
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_attention  # noqa: E402
import bench_variants  # noqa: E402

VARLEN_IMPLS = ("fa3", "flashattention3")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Attention implementations: the FP8 GEMM yardstick takes no attention inputs.
    impls = sorted(name for name in bench_attention.IMPLS if name != "cublas-fp8")
    parser.add_argument("--impl", choices=impls, default="fa3")
    parser.add_argument("--pass", dest="pass_", choices=bench_attention.PASSES, default="bwd")
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument(
        "--dtype",
        choices=["bf16", "fp16", "e4m3"],
        default="bf16",
        help="e4m3: the FP8 forward, one descale per (batch, head) as the sweep's --fp8-scales descales",
    )
    parser.add_argument("--warmup", type=int, default=3, help="calls before the profiled one")
    parser.add_argument(
        "--varlen-lengths",
        type=bench_variants.length_range,
        help="LOW:HIGH: a varlen call on sequences of LOW to HIGH tokens (fa3 and flashattention3)",
    )
    args = parser.parse_args(argv)
    if args.dtype == "e4m3" and (args.pass_ != "fwd" or args.varlen_lengths is not None):
        parser.error("--dtype e4m3: fixed-length forward calls only (--pass fwd)")
    if args.varlen_lengths is not None and args.impl not in VARLEN_IMPLS:
        parser.error(f"--varlen-lengths: {args.impl} has no varlen call here (one of {', '.join(VARLEN_IMPLS)})")
    if not 1 <= args.hdim <= bench_attention.HIDDEN:
        parser.error(f"--hdim: {args.hdim} is not in 1..{bench_attention.HIDDEN}")
    if args.seqlen < 1:
        parser.error("--seqlen: must be positive")
    return args


def shape(seqlen, hdim):
    """(batch, seqlen, nheads, hdim) of the sweep's point: 16k tokens, hidden size 2048."""
    return max(1, bench_attention.TOKENS // seqlen), seqlen, bench_attention.HIDDEN // hdim, hdim


def varlen_layout(low, high):
    """(lengths, cu_seqlens) of the varlen mix: bench_variants.py's sequences of `low` to
    `high` tokens, 16k in all."""
    lengths = bench_variants.mixed_lengths(bench_attention.TOKENS, low, high)
    cu_seqlens = [0]
    for n in lengths:
        cu_seqlens.append(cu_seqlens[-1] + n)
    return lengths, cu_seqlens


def varlen_forward(impl, lengths, cu_seqlens):
    """forward(q, k, v, causal) -> out of `impl`'s varlen call on the packed batch."""
    if impl == "fa3":
        import fa3

        call = fa3.flash_attn_varlen_func
    else:
        call = bench_variants.yardstick().flash_attn_varlen_func
    cu = torch.tensor(cu_seqlens, device="cuda", dtype=torch.int32)
    longest = max(lengths)

    def forward(q, k, v, causal):
        return bench_variants.first_output(call(q, k, v, cu, cu, longest, longest, causal=causal))

    return forward


def sweep_call(args, dtype):
    """The profiled call on the sweep's point: the backward alone, or the forward (e4m3:
    inputs drawn in bf16, quantized with one descale per (batch, head))."""
    drawn = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    q, k, v = (torch.randn(shape(args.seqlen, args.hdim), device="cuda", dtype=drawn) for _ in range(3))
    if args.pass_ == "bwd":
        return bench_attention.backward_fn(args.impl, q, k, v, args.causal, torch.randn_like(q))
    fp8 = {}
    if dtype == torch.float8_e4m3fn:
        (q, qs), (k, ks), (v, vs) = (bench_attention.quantize_per_head(t) for t in (q, k, v))
        fp8 = {"q_descale": qs, "k_descale": ks, "v_descale": vs}
    bench_attention.attempt(args.impl, q, k, v, args.causal, **fp8)
    return lambda: bench_attention.IMPLS[args.impl](q, k, v, args.causal, **fp8)


def varlen_call(args, dtype):
    """The profiled call on the varlen mix (--varlen-lengths): the backward alone, its
    forward run once outside the profiled range, or the forward."""
    lengths, cu_seqlens = varlen_layout(*args.varlen_lengths)
    packed = (cu_seqlens[-1], bench_attention.HIDDEN // args.hdim, args.hdim)
    q, k, v = (torch.randn(packed, device="cuda", dtype=dtype) for _ in range(3))
    forward = varlen_forward(args.impl, lengths, cu_seqlens)
    if args.pass_ == "bwd":
        inputs = tuple(t.requires_grad_() for t in (q, k, v))
        out = forward(*inputs, args.causal)
        dout = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)
    return lambda: forward(q, k, v, args.causal)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_call.py needs a CUDA GPU")
    dtype = bench_attention.DTYPES[args.dtype]
    fn = varlen_call(args, dtype) if args.varlen_lengths is not None else sweep_call(args, dtype)
    for _ in range(args.warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
