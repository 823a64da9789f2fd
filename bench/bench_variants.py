"""What fa3's forward features cost: each variant against the plain call it extends.

One point per variant: batch x seqlen = 16384 tokens at 16k (batch 1), hidden size
2048 (16 heads of 128), bf16, causal and not. Variants, each a record with a
"variant" field beside the baseline (variant "none"):

  window4096   sliding window of 4096 keys per row: (4095, 0) causal, (2048, 2047) not
  softcap50    softcap 50
  chunk8192    attention_chunk 8192 (Llama 4's chunked attention): a query sees its own chunk
  sinks        attention sinks (one logit per head, random), gradient included
  graph        the plain call, forward and backward, captured into a CUDA graph and
               replayed (eager vs replay)
  hdimD        a head dim D without kernels of its own (--odd-hdims, default 80), run
               on the next built head dim K, against that head dim's own call
               (variant "hdimK"); same batch, seqlen and 16 heads, FLOPs of D
  qk192v128    a V head dim of its own, DeepSeek-V3's: q and k of head dim 192, v and
               out of 128, against head dim 192's plain call (variant "hdim192");
               --head-dim-v-pairs QK:V,... picks the pairs (default 192:128), each
               a variant "qkQKvV" against "hdimQK"; same batch, seqlen and 16 heads.
               The backward runs a pair on the kernel of its larger head dim.
               Skipped, with a note, when the build has no kernel for the pair
  varlen       a packed batch of sequences of mixed lengths (--varlen-lengths, default
               100 to 4096, drawn log-uniformly from a fixed seed, 16384 tokens in all)
               through flash_attn_varlen_func, against the fixed-length call of equal
               work and tokens (variant "fixedSxB": B sequences of S tokens, S the
               lengths' mean weighted by length, rounded to a multiple of 128); same
               head dim and heads. Skipped, with a note, when the build runs varlen
               calls on the CPU. --yardstick also times FlashAttention-3's
               flash_attn_varlen_func and flash_attn_func on the same two calls
               (flash_attn_interface built with its varlen paths:
               bench/build_flashattention3.py --varlen), records with impl
               "flashattention3" against its own fixed-length call

FLOPs count the visible (query, key) pairs exactly (2 * pairs * (hdim + hdim_v) per
head for the forward: S = QK^T costs hdim, O = PV hdim_v, 4 * pairs * hdim when they
are equal; 2.5x that for the backward), so a window's TFLOP/s is comparable with full
attention's, and its speedup over full attention is in the table. Timing as in
bench_attention.py (triton's do_bench median, L2 flushed). Every variant's output is
first checked against an fp32 reference on a slice of heads. Writes
<out-dir>/<YYYY-MM-DD>-<gpu>-variants.json (records: impl, pass, variant, dtype, hdim,
hdim_v, causal, seqlen, batch, nheads, ms, tflops, gpu; a varlen record's seqlen is its
longest sequence, its batch 1 and its lengths in "lengths").

    python bench/bench_variants.py
    python bench/bench_variants.py --seqlen 8192 --hdim 64 --passes fwd
    python bench/bench_variants.py --passes fwd --head-dim-v-pairs 192:128,64:256
    python bench/bench_variants.py --varlen-lengths 512:8192
    python bench/bench_variants.py --varlen-only --yardstick
"""

import argparse
import datetime
import functools
import json
import math
import random
import sys
from pathlib import Path

import torch

import fa3

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import gpu_slug, graph_of, median_ms  # noqa: E402

TOKENS = 16384
HIDDEN = 2048
MAX_REL_ERR = 1e-2


def window_for(causal, width):
    """The window giving each row `width` keys (fewer at the sequence edges)."""
    return (width - 1, 0) if causal else (width // 2, width - 1 - width // 2)


def visible_pairs(seqlen, causal, window, chunk=0):
    """(query, key) pairs a square problem's rows see."""
    rows = torch.arange(seqlen, dtype=torch.int64)
    left, right = window
    if causal:
        right = 0
    first = (rows - left).clamp(min=0) if left >= 0 else torch.zeros_like(rows)
    last = (rows + right).clamp(max=seqlen - 1) if right >= 0 else torch.full_like(rows, seqlen - 1)
    if chunk > 0:
        first = torch.maximum(first, rows // chunk * chunk)
        last = torch.minimum(last, rows // chunk * chunk + chunk - 1)
    return int((last - first + 1).clamp(min=0).sum())


def reference(q, k, v, causal, window, softcap, sinks, chunk=0, heads=2):
    """fp32 attention of the first `heads` heads: the scale is q's head dim's, the
    output has v's head dim."""
    qf, kf, vf = (t[:, :, :heads].float().transpose(1, 2) for t in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    n = q.shape[1]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    left, right = window
    right = 0 if causal else right
    allowed = torch.ones(n, n, dtype=torch.bool, device=q.device)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    if chunk > 0:
        allowed &= i // chunk == j // chunk
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        probs = scores.softmax(-1)
    else:  # the sink joins each row's softmax as a score without a value
        sink = sinks[:heads].float().view(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
    return (probs @ vf).transpose(1, 2)


def check(out, q, k, v, causal, window, softcap, sinks, chunk=0):
    ref = reference(q, k, v, causal, window, softcap, sinks, chunk)
    got = out[:, :, : ref.shape[2]].float()
    err = ((got - ref).norm() / ref.norm()).item()
    if not err < MAX_REL_ERR:
        raise SystemExit(f"fa3 output off by {err:.3g} (window {window}, softcap {softcap}, causal {causal})")
    return err


def run(args, gpu):
    dtype = torch.bfloat16
    seqlen, hdim = args.seqlen, args.hdim
    batch, nheads = max(TOKENS // seqlen, 1), HIDDEN // hdim
    records = []
    for causal in (False, True):
        shape = (batch, seqlen, nheads, hdim)
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        dout = torch.randn(shape, device="cuda", dtype=dtype)
        full_pairs = visible_pairs(seqlen, causal, (-1, -1))
        sinks = torch.randn(nheads, device="cuda")
        variants = [
            ("none", (-1, -1), 0.0, None, 0),
            (f"window{args.window}", window_for(causal, args.window), 0.0, None, 0),
            (f"softcap{args.softcap:g}", (-1, -1), args.softcap, None, 0),
            ("sinks", (-1, -1), 0.0, sinks, 0),
            (f"chunk{args.chunk}", (-1, -1), 0.0, None, args.chunk),
        ]
        for name, window, softcap, sink, chunk in variants:
            pairs = visible_pairs(seqlen, causal, window, chunk)

            def forward(window=window, softcap=softcap, sink=sink, chunk=chunk, q=q, k=k, v=v):
                return fa3.flash_attn_func(
                    q, k, v, causal=causal, window_size=window, softcap=softcap, sinks=sink, attention_chunk=chunk
                )

            err = check(forward(), q, k, v, causal, window, softcap, sink, chunk)
            timed = [("fwd", name, forward)]
            if name == "none":
                timed.append(("fwd", "graph", graph_of(lambda forward=forward: forward).replay))
            if "bwd" in args.passes:

                def make_backward(window=window, softcap=softcap, sink=sink, chunk=chunk, q=q, k=k, v=v):
                    """The backward of a fresh forward, as a function of no arguments."""
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    sg = None if sink is None else sink.detach().requires_grad_()
                    out = fa3.flash_attn_func(
                        qg, kg, vg, causal=causal, window_size=window, softcap=softcap, sinks=sg, attention_chunk=chunk
                    )
                    inputs = (qg, kg, vg) + (() if sg is None else (sg,))
                    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)

                timed.append(("bwd", name, make_backward()))
                if name == "none":
                    try:
                        timed.append(("bwd", "graph", graph_of(make_backward).replay))
                    except RuntimeError as e:  # an open bug: docs/perf-log.md, 2026-12-03
                        torch.cuda.synchronize()
                        print(f"bench_variants: no graph replay of the backward: {e}", file=sys.stderr)
            for pass_, variant, fn in timed:
                if pass_ not in args.passes:
                    continue
                shape = dict(hdim=hdim, causal=causal, seqlen=seqlen, batch=batch, nheads=nheads, pairs=pairs)
                records.append(
                    timed_record(
                        fn,
                        pass_,
                        variant,
                        "none",
                        shape,
                        args,
                        gpu,
                        window=list(window),
                        softcap=softcap,
                        sinks=sink is not None,
                        attention_chunk=chunk,
                        visible_fraction=pairs / full_pairs,
                        rel_err=err,
                    )
                )
    return records


def timed_record(fn, pass_, variant, baseline, shape, args, gpu, **fields):
    """fn timed, as a JSON record: FLOPs count the shape's visible (query, key) pairs,
    each costing 2 * hdim (S = QK^T) and 2 * hdim_v (O = PV); the shape's hdim_v is its
    hdim unless it says otherwise."""
    ms = median_ms(fn, args.rep_ms)
    shape = {"hdim_v": shape["hdim"], **shape}
    pair_flops = 2.0 * (shape["hdim"] + shape["hdim_v"])
    flops = shape["batch"] * shape["nheads"] * shape["pairs"] * pair_flops * (2.5 if pass_ == "bwd" else 1.0)
    record = {"impl": "fa3", "pass": pass_, "variant": variant, "baseline": baseline, "dtype": "bf16"}
    record.update((key, shape[key]) for key in ("hdim", "hdim_v", "causal", "seqlen", "batch", "nheads"))
    record.update(fields)
    record.update({"ms": ms, "tflops": flops / ms / 1e9, "gpu": gpu})
    return record


def run_head_dims(args, gpu):
    """Each head dim of --odd-hdims on the next built head dim's kernels, and that head
    dim's own call: what running on a wider kernel costs."""
    built = sorted(fa3.build_info()["head_dims"])
    seqlen, nheads = args.seqlen, 16
    batch = max(TOKENS // seqlen, 1)
    records = []
    for d in args.odd_hdims:
        kernel_dim = next((b for b in built if b >= d), None)
        if kernel_dim is None or kernel_dim == d:
            continue
        for causal in (False, True):
            for hdim, variant in ((kernel_dim, f"hdim{kernel_dim}"), (d, f"hdim{d}")):
                shape = (batch, seqlen, nheads, hdim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                err = check(fa3.flash_attn_func(q, k, v, causal=causal), q, k, v, causal, (-1, -1), 0.0, None)
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                out = fa3.flash_attn_func(qg, kg, vg, causal=causal)
                timed = {
                    "fwd": lambda q=q, k=k, v=v: fa3.flash_attn_func(q, k, v, causal=causal),
                    "bwd": lambda out=out, inputs=(qg, kg, vg), dout=dout: torch.autograd.grad(
                        out, inputs, dout, retain_graph=True
                    ),
                }
                pairs = visible_pairs(seqlen, causal, (-1, -1))
                shape = dict(hdim=hdim, causal=causal, seqlen=seqlen, batch=batch, nheads=nheads, pairs=pairs)
                for pass_ in args.passes:
                    records.append(
                        timed_record(
                            timed[pass_],
                            pass_,
                            variant,
                            f"hdim{kernel_dim}",
                            shape,
                            args,
                            gpu,
                            kernel_hdim=kernel_dim,
                            rel_err=err,
                        )
                    )
    return records


def run_head_dim_pairs(args, gpu):
    """Each (QK, V) pair of --head-dim-v-pairs on its own kernels, and QK's plain call:
    what a narrower (or wider) V costs, forward and backward (the backward runs a pair on
    the kernel of its larger head dim). A pair the build has no kernel for is skipped
    with a note on stderr."""
    built = fa3.build_info()["head_dims"]
    seqlen, nheads = args.seqlen, 16
    batch = max(TOKENS // seqlen, 1)
    records = []
    for hdim, hdim_v in args.head_dim_v_pairs:
        variant, baseline = f"qk{hdim}v{hdim_v}", f"hdim{hdim}"
        # The pair's kernels are built with its QK head dim's (FA3_HEAD_DIM_PAIRS).
        if hdim not in built:
            print(f"bench_variants: skipping {variant}: this build has no head dim {hdim} kernels", file=sys.stderr)
            continue
        for causal in (False, True):
            q, k = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            # The pair first: when the build lacks its kernels, the baseline is not timed either.
            values = {
                name: torch.randn(batch, seqlen, nheads, dim_v, device="cuda", dtype=torch.bfloat16)
                for name, dim_v in ((variant, hdim_v), (baseline, hdim))
            }

            def forward(v, q=q, k=k, causal=causal):
                return fa3.flash_attn_func(q, k, v, causal=causal)

            try:
                errs = {name: check(forward(v), q, k, v, causal, (-1, -1), 0.0, None) for name, v in values.items()}
            except NotImplementedError as e:  # the QK head dim is built, the pair is not
                mask = "causal" if causal else "non-causal"
                print(f"bench_variants: skipping {variant} ({mask}): {e}", file=sys.stderr)
                continue
            pairs = visible_pairs(seqlen, causal, (-1, -1))
            for name, v in values.items():
                shape = dict(hdim=hdim, hdim_v=v.shape[-1], causal=causal, seqlen=seqlen, batch=batch, nheads=nheads)
                shape["pairs"] = pairs
                timed = {"fwd": functools.partial(forward, v)}
                if "bwd" in args.passes:
                    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                    out = fa3.flash_attn_func(qg, kg, vg, causal=causal)
                    dout = torch.randn_like(out)
                    grads = lambda out=out, inputs=(qg, kg, vg), dout=dout: torch.autograd.grad(  # noqa: E731
                        out, inputs, dout, retain_graph=True
                    )
                    try:
                        grads()
                        timed["bwd"] = grads
                    except NotImplementedError as e:  # a V head dim past the backward's kernels
                        print(f"bench_variants: no backward of {name}: {e}", file=sys.stderr)
                for pass_ in args.passes:
                    if pass_ in timed:
                        records.append(
                            timed_record(timed[pass_], pass_, name, baseline, shape, args, gpu, rel_err=errs[name])
                        )
    return records


def mixed_lengths(total, low, high, seed=0):
    """Sequence lengths log-uniform in [low, high] from `seed`, summing to `total`. A
    draw that would leave less than `low` takes the rest with it where that stays within
    `high`, and leaves exactly `low` otherwise; so with high >= 2 * low every length is
    within [low, high]."""
    if not 0 < low <= high or total < low:
        raise ValueError(f"cannot cut {total} tokens into sequences of {low} to {high}")
    rng = random.Random(seed)
    lengths = []
    left = total
    while left > 0:
        length = min(round(math.exp(rng.uniform(math.log(low), math.log(high)))), left)
        rest = left - length
        if 0 < rest < low:  # too little left for a sequence of its own: take it now
            length = left if left <= high else left - low
        lengths.append(length)
        left -= length
    return lengths


def equal_work_shape(lengths, causal):
    """(seqlen, batch) of a fixed-length call with the work and tokens of `lengths`:
    seqlen is the lengths' mean weighted by length (the length whose square, times the
    token count over it, gives the same (query, key) pairs), rounded to a multiple of
    128, and batch the token count over it."""
    tokens = sum(lengths)
    pairs = sum(visible_pairs(n, causal, (-1, -1)) for n in lengths)
    mean = (2 * pairs / tokens - 1) if causal else pairs / tokens
    seqlen = max(128, round(mean / 128) * 128)
    return seqlen, max(1, round(tokens / seqlen))


def varlen_error(out, q, k, v, lengths, cu_seqlens, causal):
    """The largest error of a packed call's output against the reference on the shortest,
    a middle and the longest of its sequences."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    err = 0.0
    for i in {order[0], order[len(order) // 2], order[-1]}:
        rows = slice(int(cu_seqlens[i]), int(cu_seqlens[i + 1]))
        err = max(err, check(*[t[rows][None] for t in (out, q, k, v)], causal, (-1, -1), 0.0, None))
    return err


def run_varlen(args, gpu):
    """A packed batch of mixed lengths through flash_attn_varlen_func, against the
    fixed-length call of equal work and tokens, forward and backward."""
    if not fa3.build_info().get("gpu_varlen", False):
        print("bench_variants: skipping varlen: this build runs varlen calls on the CPU", file=sys.stderr)
        return []
    low, high = args.varlen_lengths
    lengths = mixed_lengths(TOKENS, low, high)
    hdim, nheads, dtype = args.hdim, HIDDEN // args.hdim, torch.bfloat16
    longest = max(lengths)
    cu_seqlens = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    records = []
    for causal in (False, True):
        q, k, v, dout = (torch.randn(TOKENS, nheads, hdim, device="cuda", dtype=dtype) for _ in range(4))

        def varlen(q=q, k=k, v=v, causal=causal):
            return fa3.flash_attn_varlen_func(
                q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=causal
            )

        err = varlen_error(varlen(), q, k, v, lengths, cu_seqlens, causal)
        pairs = sum(visible_pairs(n, causal, (-1, -1)) for n in lengths)
        seqlen, batch = equal_work_shape(lengths, causal)
        fq, fk, fv, fdout = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(4))

        def fixed_call(q=fq, k=fk, v=fv, causal=causal):
            return fa3.flash_attn_func(q, k, v, causal=causal)

        fixed_err = check(fixed_call(), fq, fk, fv, causal, (-1, -1), 0.0, None)
        baseline = f"fixed{seqlen}x{batch}"
        varlen_sizes = dict(seqlen=longest, batch=1, pairs=pairs)
        fixed_sizes = dict(seqlen=seqlen, batch=batch, pairs=visible_pairs(seqlen, causal, (-1, -1)))
        calls = [
            (varlen, (q, k, v), dout, err, "varlen", varlen_sizes, lengths, "fa3"),
            (fixed_call, (fq, fk, fv), fdout, fixed_err, baseline, fixed_sizes, None, "fa3"),
        ]
        if args.yardstick:
            peer = yardstick()

            def peer_varlen(q=q, k=k, v=v, causal=causal):
                return first_output(
                    peer.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=causal)
                )

            def peer_fixed(q=fq, k=fk, v=fv, causal=causal):
                return first_output(peer.flash_attn_func(q, k, v, causal=causal))

            peer_err = varlen_error(peer_varlen(), q, k, v, lengths, cu_seqlens, causal)
            peer_fixed_err = check(peer_fixed(), fq, fk, fv, causal, (-1, -1), 0.0, None)
            calls += [
                (peer_varlen, (q, k, v), dout, peer_err, "varlen", varlen_sizes, lengths, "flashattention3"),
                (peer_fixed, (fq, fk, fv), fdout, peer_fixed_err, baseline, fixed_sizes, None, "flashattention3"),
            ]
        for forward, inputs, grad_out, rel_err, name, sizes, seq_lengths, impl in calls:
            fields = {"impl": impl} if seq_lengths is None else {"impl": impl, "lengths": seq_lengths}
            timed = {"fwd": forward}
            if "bwd" in args.passes:
                leaves = tuple(t.detach().requires_grad_() for t in inputs)
                result = forward(*leaves)
                timed["bwd"] = lambda result=result, leaves=leaves, grad_out=grad_out: torch.autograd.grad(
                    result, leaves, grad_out, retain_graph=True
                )
            shape = dict(hdim=hdim, causal=causal, nheads=nheads, **sizes)
            for pass_ in args.passes:
                record = timed_record(timed[pass_], pass_, name, baseline, shape, args, gpu, rel_err=rel_err, **fields)
                records.append(record)
    return records


def print_table(records):
    """Each record's time against its baseline's, the same implementation's."""
    ms = {(r["impl"], r["pass"], r["causal"], r["variant"]): r["ms"] for r in records}
    print("| impl | pass | causal | variant | ms | TFLOP/s | time vs baseline |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        ratio = r["ms"] / ms[(r["impl"], r["pass"], r["causal"], r["baseline"])]
        print(
            f"| {r['impl']} | {r['pass']} | {'yes' if r['causal'] else 'no'} | {r['variant']} | {r['ms']:.3f} | "
            f"{r['tflops']:.0f} | {ratio:.3f} ({r['baseline']}) |"
        )


def yardstick():
    """FlashAttention-3's Python interface, for --yardstick (bench/build_flashattention3.py
    --varlen builds it with the varlen paths)."""
    try:
        import flash_attn_interface
    except ImportError:
        sys.exit("bench_variants: --yardstick needs FlashAttention-3's flash_attn_interface on PYTHONPATH")
    return flash_attn_interface


def first_output(result):
    """The output of a call that returns it alone or as (out, lse), as releases differ."""
    return result[0] if isinstance(result, tuple) else result


def length_range(text):
    """--varlen-lengths: "100:4096" is (100, 4096)."""
    low, sep, high = text.partition(":")
    if not (sep and low.isdigit() and high.isdigit() and 0 < int(low) <= int(high) <= TOKENS):
        raise argparse.ArgumentTypeError(
            f"expected LOW:HIGH sequence lengths, 0 < LOW <= HIGH <= {TOKENS}, got {text!r}"
        )
    return int(low), int(high)


def head_dim_pairs(text):
    """--head-dim-v-pairs: "192:128,64:256" is [(192, 128), (64, 256)], "" is []."""
    pairs = []
    for item in filter(None, text.split(",")):
        hdim, sep, hdim_v = item.partition(":")
        if not (sep and hdim.isdigit() and hdim_v.isdigit() and int(hdim) > 0 and int(hdim_v) > 0):
            raise argparse.ArgumentTypeError(f"expected QK:V head dims such as 192:128, got {item!r}")
        if int(hdim) == int(hdim_v):
            raise argparse.ArgumentTypeError(f"{item}: V's head dim equals QK's; that is the baseline's plain call")
        pairs.append((int(hdim), int(hdim_v)))
    return pairs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--window", type=int, default=4096, help="keys per row of the window variant")
    parser.add_argument("--softcap", type=float, default=50.0)
    parser.add_argument("--chunk", type=int, default=8192, help="attention_chunk of the chunk variant")
    parser.add_argument("--passes", nargs="+", choices=["fwd", "bwd"], default=["fwd", "bwd"])
    parser.add_argument(
        "--odd-hdims", type=int, nargs="*", default=[80], help="head dims without kernels of their own to time"
    )
    parser.add_argument(
        "--head-dim-v-pairs",
        type=head_dim_pairs,
        default="192:128",
        help="QK:V head dim pairs to time against QK's plain call, comma-separated (default 192:128; empty: none)",
    )
    parser.add_argument(
        "--varlen-lengths",
        type=length_range,
        default="100:4096",
        help="the varlen variant's shortest and longest sequence, LOW:HIGH (default 100:4096)",
    )
    varlen = parser.add_mutually_exclusive_group()
    varlen.add_argument("--no-varlen", action="store_true", help="leave out the varlen variant")
    varlen.add_argument("--varlen-only", action="store_true", help="time the varlen variant and its baseline alone")
    parser.add_argument(
        "--yardstick",
        action="store_true",
        help="also time FlashAttention-3 (flash_attn_interface) on the varlen variant and its baseline",
    )
    parser.add_argument("--rep-ms", type=int, default=200)
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    if args.yardstick and args.no_varlen:
        parser.error("--yardstick times the varlen variant: not with --no-varlen")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_variants.py needs a CUDA GPU")
    gpu = torch.cuda.get_device_name()
    records = [] if args.varlen_only else run(args, gpu) + run_head_dims(args, gpu) + run_head_dim_pairs(args, gpu)
    if not args.no_varlen:
        records += run_varlen(args, gpu)
    print_table(records)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}-variants.json"
    path.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
