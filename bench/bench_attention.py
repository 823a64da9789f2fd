"""Attention throughput: fa3 against PyTorch's SDPA backends, in one process.

The sweep is the FlashAttention-3 paper's (docs ANCHORS.md): batch x seqlen = 16384
tokens, hidden size 2048, nheads = 2048 // hdim (21 heads at hdim 96, 10 at 192),
causal and not, seqlen 512 .. 16384; head dims 64/128/256 for the forward and
64/96/128/192/256 for the backward. For every point it first checks fa3's result
against cuDNN's (or an fp32 reference where cuDNN cannot run), then times each
implementation: median of triton.testing.do_bench, or of CUDA-event timings without
triton; L2 is flushed before each timed call. With --rounds N every implementation is
timed N times per point, each round starting one implementation later, and the record
holds the median: under the GPU's power cap a call's clocks depend on what ran before
it, which a single pass in a fixed order turns into a bias of several percent. With
--interleave the implementations of a point are timed in turns, one call of each per
turn (medians per implementation), so that the clocks' drift during a measurement
reaches them alike.

    python bench/bench_attention.py                       # the full forward sweep
    python bench/bench_attention.py --passes bwd          # the backward sweep
    python bench/bench_attention.py --passes bwd --deterministic   # adds fa3's deterministic backward
    python bench/bench_attention.py --quick               # a few points, for a smoke test
    python bench/bench_attention.py --hdims 128 --seqlens 1024 8192 --causal yes
    python bench/bench_attention.py --passes bwd --impls fa3 flashattention3 cudnn --rounds 3
    python bench/bench_attention.py --passes bwd --impls fa3 flashattention3 --rounds 5 --interleave
    python bench/bench_attention.py --dtypes e4m3 --hdims 128   # FP8 forward (FA3_GPU_FP8 build)
    python bench/bench_attention.py --dtypes e4m3 --fp8-scales descales --impls fa3 flashattention3

e4m3 records (forward only): the inputs are drawn in bf16 and quantized by
fa3.fp8.quantize (128-row block scales, Hadamard transform) before the timing, fa3
runs the codes with their scales (its time includes the transpose of V the FP8 path
makes), and the check is against fp32 attention of the dequantized values with the FP8
cap (MAX_REL_ERR_E4M3); the SDPA peers take no e4m3 inputs and are recorded unavailable.
With --fp8-scales descales the inputs are quantized as FlashAttention-3's FP8 path takes
them instead, one scale per (batch, head) given as q/k/v_descale, which FlashAttention-3
(--impls flashattention3, a build with its FP8 kernels) runs too; those records carry
"variant": "descales".
Each e4m3 point also times cuBLAS's FP8 GEMM (torch._scaled_mm, bf16 out) of the same
FLOPs, impl "cublas-fp8": the ceiling the tensor cores give a plain matmul, beside
which the attention kernels' softmax and data movement show.

Backward: the forward runs once, untimed, with the graph retained; what is timed is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) alone, for fa3 and for
the SDPA backends alike (not time(fwd+bwd) - time(fwd)). It includes each backend's
whole backward (preprocessing, dQ conversion, any copies it makes) and returns the
gradients without accumulating them into .grad. fa3's dq, dk and dv are checked
against cuDNN's (or fp32 ones) with the forward's bound on each; the deterministic
variant must also give bitwise-equal gradients twice. Each backward record carries
bwd_extra_bytes: the peak memory the backward call allocated through torch (the
max_memory_allocated delta) less the three gradients it returns, i.e. its
workspace; memory a library allocates outside torch's allocator is not seen.

FLOPs: forward 4 * batch * nheads * seqlen^2 * hdim, halved when causal; backward
2.5x forward. Peers: SDPA with one backend forced (cuDNN = CUDNN_ATTENTION,
fa2 = FLASH_ATTENTION, efficient = EFFICIENT_ATTENTION); one that cannot run a
point is recorded as unavailable with its reason. Writes <out-dir>/<YYYY-MM-DD>-<gpu>
[-quick][-bwd | -fwd-bwd].json (no pass suffix for forward-only runs; a list of
records: impl, pass, dtype, hdim, causal, seqlen, batch, nheads, tflops, gpu) and a
PNG per pass and dtype, <YYYY-MM-DD>-<gpu>[-quick]-<pass>-<dtype>.png, beside it.
Needs a CUDA GPU, torch and fa3; triton, tqdm and matplotlib are used when present.
No network.
"""

import argparse
import datetime
import functools
import json
import math
import re
import statistics
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
PASSES = ("fwd", "bwd")
# The anchors' head dims for the forward; the backward adds 96 and 192, which fa3's
# backward serves and FlashAttention-3's published figures leave out.
HDIMS = {"fwd": [64, 128, 256], "bwd": [64, 96, 128, 192, 256]}
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_HDIMS = [128]
QUICK_SEQLENS = [1024, 4096]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn}
# Largest relative error (Frobenius) of fa3's output, or of each of its gradients,
# against the reference that still counts as correct: both are rounded to 16 bits
# (about 2e-3 apart for the output, 2e-3 to 4e-3 for dq, dk and dv).
MAX_REL_ERR = 1e-2
# e4m3 (forward only, a build with FA3_GPU_FP8): inputs drawn in bf16 and quantized with
# fa3.fp8.quantize (128-row block scales, Hadamard transform) outside the timing; fa3 runs
# the codes with their block scales, the reference is fp32 attention of the dequantized
# values, and the FP8 accuracy rule's cap applies (tests/cpu/reference/test_fp8.cpp). The
# peers take no e4m3 inputs: their records say so.
MAX_REL_ERR_E4M3 = 4e-2


class Unavailable(Exception):
    """An implementation cannot run a point (unsupported shape, missing kernel)."""


class WrongResult(Exception):
    """An fa3 variant ran but failed its check; it is not timed."""


# ---- implementations: each maps (q, k, v, causal) in (batch, seqlen, nheads, hdim) to out ----


def fa3_impl(deterministic):
    def run(q, k, v, causal, **fp8):
        return fa3.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic, **fp8)

    return run


def sdpa(backend):
    def run(q, k, v, causal, **fp8):
        if q.dtype == torch.float8_e4m3fn:
            raise NotImplementedError("no e4m3 inputs")
        # SDPA takes (batch, nheads, seqlen, hdim): transposed views of the same
        # memory (no copies), the layout FlashAttention-2 and cuDNN read natively.
        # GQA/MQA (fewer K/V heads than query heads): SDPA's enable_gqa, which its
        # backends that take it read without a copy.
        gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, **gqa
            )
        return out.transpose(1, 2)

    return run


def flashattention3(q, k, v, causal, **fp8):
    """FlashAttention-3's own Hopper kernels through its Python interface
    (`flash_attn_interface`, built from its public source, e.g. by
    bench/build_flashattention3.py), where it is installed: the
    figures of ANCHORS.md, timed in the same process as fa3. 16-bit inputs only (its FP8
    path takes per-head descales, not fa3's block-scaled codes)."""
    try:
        import flash_attn_interface
    except ImportError:
        raise NotImplementedError("flash_attn_interface is not installed") from None
    if q.dtype == torch.float8_e4m3fn and "block_scales" in fp8:
        raise NotImplementedError("no block-scaled e4m3 inputs")
    out = flash_attn_interface.flash_attn_func(q, k, v, causal=causal, **fp8)
    # Some releases return (out, lse).
    return out[0] if isinstance(out, tuple) else out


def fp8_gemm_shape(batch, seqlen, nheads, hdim, causal):
    """(M, N, K) of the FP8 GEMM with the FLOPs of a forward call (2 M N K = flops): the
    seqlen x seqlen score block of every head at once, K = 2 hdim heads (halved when
    causal), a shape cuBLAS runs near its peak from 512 tokens on."""
    return seqlen, seqlen, (1 if causal else 2) * hdim * batch * nheads


def cublas_fp8_matmul():
    """cuBLAS's FP8 GEMM of the attention's FLOPs (fp8_gemm_shape); its operands are made
    once per shape, outside the timed call."""
    operands = {}

    def run(q, k, v, causal, **fp8):
        if q.dtype != torch.float8_e4m3fn:
            raise NotImplementedError("e4m3 points only")
        batch, seqlen, nheads, hdim = q.shape
        key = (batch, seqlen, nheads, hdim, causal)
        if key not in operands:
            operands.clear()
            m, n, depth = fp8_gemm_shape(batch, seqlen, nheads, hdim, causal)
            gen = torch.Generator(device="cuda").manual_seed(1)
            a = torch.randn(m, depth, generator=gen, device="cuda").to(torch.float8_e4m3fn)
            # _scaled_mm takes its second operand column-major.
            b = torch.randn(n, depth, generator=gen, device="cuda").to(torch.float8_e4m3fn).t()
            operands[key] = (a, b, torch.ones((), device="cuda"))
        a, b, one = operands[key]
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return run


IMPLS = {
    "fa3": fa3_impl(deterministic=False),
    # Backward only (--deterministic): its forward is fa3's.
    "fa3-deterministic": fa3_impl(deterministic=True),
    "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    "fa2": sdpa(SDPBackend.FLASH_ATTENTION),
    "efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
    # Where installed (--impls ... flashattention3); a peer like cuDNN in the tables.
    "flashattention3": flashattention3,
    # e4m3 forward points only, added to every such point (impls_for).
    "cublas-fp8": cublas_fp8_matmul(),
}
DEFAULT_IMPLS = ["fa3", "cudnn", "fa2", "efficient"]


def guarded(fn):
    """Runs fn() once and waits for it; converts 'cannot run this' into Unavailable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SDPA warns at length about why a backend declined
            result = fn()
            torch.cuda.synchronize()
            return result
    except (RuntimeError, NotImplementedError, ValueError) as e:
        raise Unavailable(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def attempt(impl, q, k, v, causal, **fp8):
    """Runs `impl`'s forward once; converts 'cannot run this' into Unavailable. `fp8`:
    flash_attn_func's scale arguments of e4m3 inputs."""
    return guarded(lambda: IMPLS[impl](q, k, v, causal, **fp8))


def backward_fn(impl, q, k, v, causal, dout):
    """Runs `impl`'s forward once with a retained graph; returns a function that runs
    its backward alone and returns (dq, dk, dv)."""
    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = attempt(impl, *inputs, causal)
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


# ---- timing ----


def median_ms(fn, rep_ms):
    """Median time of fn() in milliseconds."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return _median_ms_cuda_events(fn, rep_ms)
    options = {"warmup": max(rep_ms // 4, 10), "rep": rep_ms}
    try:
        return do_bench(fn, return_mode="median", **options)
    except TypeError:  # triton releases before return_mode
        return do_bench(fn, quantiles=[0.5], **options)


def graph_of(make):
    """The function make() returns, captured into a CUDA graph after a warm-up call.
    make() runs on the side stream that then captures: autograd runs a backward on the
    stream its forward ran on, so a captured backward's forward must come from there."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn = make()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph


@functools.lru_cache(maxsize=1)
def _l2_flush_buffer():
    return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")


def _median_ms_cuda_events(fn, rep_ms):
    """What do_bench does, with CUDA events: L2 flushed before each timed call."""
    return interleaved_medians({"call": fn}, rep_ms)["call"]


def flops(pass_, batch, nheads, seqlen, hdim, causal):
    forward = 4 * batch * nheads * seqlen * seqlen * hdim / (2 if causal else 1)
    return forward * (2.5 if pass_ == "bwd" else 1.0)


def extra_memory_bytes(backward):
    """Peak bytes one call of `backward` allocates through torch beyond the gradients it
    returns. Measured on a call after the first, so that one-time setup is left out."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak - before - sum(g.numel() * g.element_size() for g in grads)


def timed_call(impl, pass_, q, k, v, causal, dout, **fp8):
    """(the call that times one pass of `impl`, extra fields for its record), after one
    untimed run (Unavailable where the implementation cannot run the point)."""
    if pass_ == "fwd":
        attempt(impl, q, k, v, causal, **fp8)
        return (lambda: IMPLS[impl](q, k, v, causal, **fp8)), {}
    backward = backward_fn(impl, q, k, v, causal, dout)
    guarded(backward)  # a backend may accept the forward and refuse the backward
    return backward, {"bwd_extra_bytes": extra_memory_bytes(backward)}


def round_order(impls, round_index):
    """The order in which round `round_index` times the implementations: each round
    starts one later, so that none is always the first timed after the point's setup,
    nor always timed right after the same neighbour (the GPU's clocks under its power
    cap depend on what ran just before)."""
    shift = round_index % len(impls) if impls else 0
    return impls[shift:] + impls[:shift]


def interleaved_medians(calls, rep_ms, idle_cycles=0):
    """{impl: median ms} for the calls {impl: call}, timed in turns: each turn times one
    call of every implementation, in the dict's order, L2 flushed before each, for about
    rep_ms of calls per implementation. The GPU's clocks drift under its power cap while
    a point is measured (an H100's backward moved by up to 7 % from one call to the
    next, docs/perf-log.md); timed in turns, the drift reaches every implementation
    alike instead of whichever is timed last. idle_cycles > 0 queues a sleep kernel of
    that many cycles before each flush (bench/timing_methods.py: the GPU idle a moment
    before every call)."""
    flush = _l2_flush_buffer()
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        for fn in calls.values():
            fn()
    end.record()
    torch.cuda.synchronize()
    turn_ms = max(start.elapsed_time(end) / 5, 1e-3)
    turns = max(10, min(1000, int(rep_ms * len(calls) / turn_ms)))
    events = {impl: [] for impl in calls}
    for _ in range(turns):
        for impl, fn in calls.items():
            begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if idle_cycles:
                torch.cuda._sleep(idle_cycles)
            flush.zero_()
            begin.record()
            fn()
            finish.record()
            events[impl].append((begin, finish))
    torch.cuda.synchronize()
    return {impl: statistics.median(b.elapsed_time(f) for b, f in pairs) for impl, pairs in events.items()}


def time_in_rounds(calls, rounds, rep_ms, timer=None, interleaved=None):
    """{impl: [ms of each round]} for the calls {impl: call}, `rounds` rounds in
    round_order, each measurement a median_ms (or `timer`); with `interleaved` (a
    function like interleaved_medians) each round times the calls together, in turns,
    in the round's order."""
    timer = timer or median_ms
    impls = list(calls)
    times = {impl: [] for impl in impls}
    for r in range(rounds):
        order = round_order(impls, r)
        if interleaved is not None:
            medians = interleaved({impl: calls[impl] for impl in order}, rep_ms)
            for impl in order:
                times[impl].append(medians[impl])
        else:
            for impl in order:
                times[impl].append(timer(calls[impl], rep_ms))
    return times


# ---- correctness check ----


def _head_chunks(q, elements_per_step):
    """(batch index, first head, end head) covering q's heads, a few at a time so that
    the fp32 score matrices of one step hold about elements_per_step elements."""
    seqlen, nheads = q.shape[1], q.shape[2]
    heads_per_step = max(1, elements_per_step // (seqlen * seqlen))
    for b in range(q.shape[0]):
        for h0 in range(0, nheads, heads_per_step):
            yield b, h0, min(h0 + heads_per_step, nheads)


def _kv_for_each_query_head(t, nheads):
    """k or v (b, s, nheads_k, d) with each head repeated for its group of query heads
    (GQA/MQA: query head h reads K/V head h // (nheads / nheads_k))."""
    group = nheads // t.shape[2]
    return t if group == 1 else t.repeat_interleave(group, dim=2)


def fp32_reference(q, k, v, causal):
    """fp32 attention, computed a few heads at a time to bound the score matrix's memory."""
    k, v = (_kv_for_each_query_head(t, q.shape[2]) for t in (k, v))
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, h0, h1 in _head_chunks(q, 2**30):
        qs, ks, vs = (t[b, :, h0:h1].float().transpose(0, 1) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            out[b, :, h0:h1] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1)
    return out


def fp32_reference_grads(q, k, v, causal, dout):
    """(dq, dk, dv) of fp32 attention, a few heads at a time; the math backend keeps
    several score-sized tensors for its backward, hence the smaller steps. With GQA/MQA
    a K/V head's gradients sum over its query heads."""
    nheads_k = k.shape[2]
    k, v = (_kv_for_each_query_head(t, q.shape[2]) for t in (k, v))
    grads = tuple(torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in (q, k, v))
    for b, h0, h1 in _head_chunks(q, 2**28):
        # Leaves in (seqlen, heads, hdim), so that the gradients come back in that layout.
        leaves = tuple(t[b, :, h0:h1].float().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in leaves), is_causal=causal)
        chunk_grads = torch.autograd.grad(out.transpose(0, 1), leaves, dout[b, :, h0:h1].float())
        for whole, part in zip(grads, chunk_grads):
            whole[b, :, h0:h1] = part
    dq, dk, dv = grads
    b, s, h, d = dk.shape
    return (dq,) + tuple(g.view(b, s, nheads_k, h // nheads_k, d).sum(dim=3) for g in (dk, dv))


def results(impl, pass_, q, k, v, causal, dout, **fp8):
    """What the check compares: (out,) for the forward, (dq, dk, dv) for the backward."""
    if pass_ == "fwd":
        return (attempt(impl, q, k, v, causal, **fp8),)
    return guarded(backward_fn(impl, q, k, v, causal, dout))


def reference(pass_, q, k, v, causal, dout):
    """(cuDNN's results in fp32, "cudnn"), or fp32 attention's where cuDNN cannot run."""
    try:
        return tuple(t.float() for t in results("cudnn", pass_, q, k, v, causal, dout)), "cudnn"
    except Unavailable:
        if pass_ == "fwd":
            return (fp32_reference(q, k, v, causal),), "fp32"
        return fp32_reference_grads(q, k, v, causal, dout), "fp32"


def dequantize(codes, scale, block):
    """e4m3 codes (b, s, h, d) times their block's scale (b, h, blocks), in float32."""
    per_row = scale.repeat_interleave(block, dim=2)[:, :, : codes.shape[1]]  # (b, h, s)
    return codes.float() * per_row.transpose(1, 2)[..., None]


def quantize_per_head(t):
    """(e4m3 codes of t (b, s, h, d), float32 descale (b, h)): one scale per (batch, head),
    its largest magnitude mapped to e4m3's largest value, as FlashAttention-3's FP8 path
    takes its inputs."""
    amax = t.float().abs().amax(dim=(1, 3)).clamp_min(1e-12)  # (b, h)
    scale = amax / torch.finfo(torch.float8_e4m3fn).max
    codes = (t.float() / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return codes, scale.contiguous()


def relative_error(x, ref):
    x = x.float()
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm() / ref.norm()).item()


def check(impl, pass_, q, k, v, causal, dout, get_reference, **fp8):
    """Fields for an fa3 variant's records: rel_err (the largest of its outputs'),
    reference, and for the backward rel_errs per gradient. Raises Unavailable if it
    cannot run, WrongResult if a result is out of bounds."""
    mine = results(impl, pass_, q, k, v, causal, dout, **fp8)
    ref, ref_name = get_reference()
    names = ("out",) if pass_ == "fwd" else ("dq", "dk", "dv")
    errors = {name: relative_error(x, r) for name, x, r in zip(names, mine, ref)}
    fields = {"rel_err": max(errors.values()), "reference": ref_name}
    if pass_ == "bwd":
        fields["rel_errs"] = errors
    if not fields["rel_err"] <= (MAX_REL_ERR_E4M3 if q.dtype == torch.float8_e4m3fn else MAX_REL_ERR):
        detail = ", ".join(f"{name} {e:.2e}" for name, e in errors.items()) if pass_ == "bwd" else ""
        raise WrongResult(f"wrong result: relative error {fields['rel_err']:.2e} against {ref_name} {detail}".rstrip())
    if impl == "fa3-deterministic":
        again = results(impl, pass_, q, k, v, causal, dout)
        if not all(torch.equal(a, b) for a, b in zip(mine, again)):
            raise WrongResult("not deterministic: two backward passes gave different gradients")
    return fields


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


def impls_for(pass_, dtype, args):
    extra = ["fa3-deterministic"] if pass_ == "bwd" and args.deterministic else []
    extra += ["cublas-fp8"] if pass_ == "fwd" and dtype == "e4m3" else []
    return args.impls + extra


def measure_point(impls, base, pass_, q, k, v, causal, dout, get_reference, point_flops, args, **fp8):
    """{impl: record} of one point: `base`'s fields, each fa3 variant's check against
    get_reference(), and TFLOP/s (point_flops over the median time) of every
    implementation that can run it, timed in args.rounds rounds (args.interleave: in
    turns); an implementation that cannot run it, or an fa3 variant that fails its
    check, gets "error" instead. `fp8`: the e4m3 inputs' scale arguments."""
    records, calls = {}, {}
    for impl in impls:
        record = records[impl] = dict(base, impl=impl, tflops=None)
        try:
            if fp8 and pass_ == "bwd":
                raise Unavailable("e4m3: forward only")
            checked = {}
            if impl.startswith("fa3"):
                checked = check(impl, pass_, q, k, v, causal, dout, get_reference, **fp8)
            calls[impl], extra = timed_call(impl, pass_, q, k, v, causal, dout, **fp8)
            record.update(checked, **extra)
        except (Unavailable, WrongResult) as e:
            record["error"] = str(e)
    interleaved = interleaved_medians if args.interleave else None
    for impl, ms in time_in_rounds(calls, args.rounds, args.rep_ms, interleaved=interleaved).items():
        tflops = [point_flops / (m * 1e-3) / 1e12 for m in ms]
        records[impl]["tflops"] = statistics.median(tflops)
        if args.rounds > 1:
            records[impl]["tflops_rounds"] = tflops
        if args.interleave:
            records[impl]["timing"] = "interleaved"
    return records


def run_sweep(args, gpu):
    points = [
        (pass_, dtype, hdim, causal, seqlen)
        for pass_ in args.passes
        for dtype in args.dtypes
        for hdim in args.hdims[pass_]
        for causal in args.causal
        for seqlen in args.seqlens
    ]
    records = []
    for pass_, dtype, hdim, causal, seqlen in progress(points):
        batch, nheads = max(1, TOKENS // seqlen), HIDDEN // hdim
        gen = torch.Generator(device="cuda").manual_seed(0)
        drawn = torch.bfloat16 if dtype == "e4m3" else DTYPES[dtype]
        q, k, v, dout = (
            torch.randn(batch, seqlen, nheads, hdim, generator=gen, device="cuda", dtype=drawn) for _ in range(4)
        )
        fp8, dequantized = {}, None
        if dtype == "e4m3" and args.fp8_scales == "descales":
            (q, qs), (k, ks), (v, vs) = (quantize_per_head(t) for t in (q, k, v))
            fp8 = {"q_descale": qs, "k_descale": ks, "v_descale": vs}
            dequantized = [dequantize(t, s[:, :, None], t.shape[1]) for t, s in ((q, qs), (k, ks), (v, vs))]
        elif dtype == "e4m3":
            quantized = fa3.fp8.quantize(q, k, v)
            q, k, v = quantized.q, quantized.k, quantized.v
            fp8 = {"block_scales": quantized.block_scales, "block_rows": quantized.block}
            dequantized = [dequantize(t, s, quantized.block) for t, s in zip((q, k, v), quantized.block_scales)]
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
        if "q_descale" in fp8:
            base["variant"] = "descales"
        # Computed on the first check that needs it, then shared by the fa3 variants.
        if fp8:
            get_reference = functools.cache(lambda: ((fp32_reference(*dequantized, causal),), "fp32"))
        else:
            get_reference = functools.cache(functools.partial(reference, pass_, q, k, v, causal, dout))
        point_flops = flops(pass_, batch, nheads, seqlen, hdim, causal)
        point_records = measure_point(
            impls_for(pass_, dtype, args), base, pass_, q, k, v, causal, dout, get_reference, point_flops, args, **fp8
        )
        records.extend(point_records.values())
        del q, k, v, dout, get_reference
        torch.cuda.empty_cache()
    return records


def _rows(records):
    """{(pass, dtype, hdim, causal, seqlen): {impl: record}}, in sweep order."""
    rows = {}
    for r in sorted(records, key=lambda r: (PASSES.index(r["pass"]), r["dtype"], r["hdim"], r["causal"], r["seqlen"])):
        rows.setdefault((r["pass"], r["dtype"], r["hdim"], r["causal"], r["seqlen"]), {})[r["impl"]] = r
    return rows


def _point_cells(key, row):
    any_record = next(iter(row.values()))
    return [
        key[1],
        str(key[2]),
        "yes" if key[3] else "no",
        str(key[4]),
        f"{any_record['batch']}x{any_record['nheads']}",
    ]


def _print_markdown(header, lines):
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" for _ in header) + "|")
    for cells in lines:
        print("| " + " | ".join(cells) + " |")


def print_table(records):
    """A TFLOP/s table per pass, with each fa3 variant's ratio to the best peer; for the
    backward also its extra memory in MiB."""
    rows = _rows(records)
    for pass_ in PASSES:
        keys = [key for key in rows if key[0] == pass_]
        impls = [i for i in list(IMPLS) if any(i in rows[key] for key in keys)]
        if not keys:
            continue
        mine = [i for i in impls if i.startswith("fa3")]
        # The FP8 GEMM is a ceiling to read fa3 against, not a peer attention.
        peers = [i for i in impls if not i.startswith("fa3") and i != "cublas-fp8"]
        ratios = mine if peers else []
        lines = []
        for key in keys:
            row = rows[key]
            tflops = {impl: row[impl].get("tflops") if impl in row else None for impl in impls}
            best = max((tflops[p] for p in peers if tflops[p] is not None), default=None)
            cells = _point_cells(key, row) + [f"{tflops[i]:.0f}" if tflops[i] is not None else "n/a" for i in impls]
            cells += [f"{tflops[i] / best:.2f}" if tflops[i] is not None and best else "n/a" for i in ratios]
            lines.append(cells)
        print(f"\n{pass_} TFLOP/s")
        header = ["dtype", "hdim", "causal", "seqlen", "batch x heads"] + impls + [f"{i} / best peer" for i in ratios]
        _print_markdown(header, lines)
        if pass_ == "bwd":
            print("\nbwd extra memory (MiB) beyond q, k, v, out, dout and the gradients")
            lines = []
            for key in keys:
                row = rows[key]
                extra = [row.get(impl, {}).get("bwd_extra_bytes") for impl in impls]
                r = next(iter(row.values()))
                qkv = 3 * r["batch"] * r["seqlen"] * r["nheads"] * r["hdim"] * DTYPES[r["dtype"]].itemsize
                lines.append(
                    _point_cells(key, row)
                    + [f"{qkv / 2**20:.0f}"]
                    + [f"{e / 2**20:.0f}" if e is not None else "n/a" for e in extra]
                )
            _print_markdown(["dtype", "hdim", "causal", "seqlen", "batch x heads", "q+k+v"] + impls, lines)
    for r in records:
        if r.get("error"):
            print(
                f"  {r['impl']} unavailable at {r['pass']} {r['dtype']} hdim {r['hdim']} "
                f"{'causal' if r['causal'] else 'non-causal'} seqlen {r['seqlen']}: {r['error']}"
            )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--hdims", type=int, nargs="+", help=f"head dims (default {HDIMS['fwd']} forward, {HDIMS['bwd']} backward)"
    )
    parser.add_argument("--seqlens", type=int, nargs="+", help=f"sequence lengths (default {SEQLENS})")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument(
        "--passes",
        nargs="+",
        choices=PASSES,
        default=["fwd"],
        help="fwd (default) and/or bwd (the backward alone, on a retained graph)",
    )
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["bf16"])
    parser.add_argument("--impls", nargs="+", choices=DEFAULT_IMPLS + ["flashattention3"], default=DEFAULT_IMPLS)
    parser.add_argument(
        "--fp8-scales",
        choices=["blocks", "descales"],
        default="blocks",
        help="e4m3 inputs: fa3.fp8.quantize's 128-row block scales (default), or one descale per "
        "(batch, head) as FlashAttention-3 takes them (records get variant descales)",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="also time fa3's deterministic backward (records with impl fa3-deterministic)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--rep-ms", type=int, default=200, help="timing budget per measurement (ms)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every implementation this many times per point, each round in another order; "
        "records carry the median (and tflops_rounds)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="time a point's implementations in turns, one call of each per turn, so that a drift of "
        "the GPU's clocks reaches all of them alike (records get timing: interleaved)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"hdims {QUICK_HDIMS}, seqlens {QUICK_SEQLENS}, shorter timings; file names get -quick",
    )
    parser.add_argument("--no-plot", action="store_true", help="write the JSON file only")
    args = parser.parse_args(argv)
    for hdim in args.hdims or []:
        if not 1 <= hdim <= HIDDEN:
            parser.error(f"--hdims: {hdim} is not in 1..{HIDDEN} (the hidden size)")
    args.hdims = {p: args.hdims or (QUICK_HDIMS if args.quick else HDIMS[p]) for p in PASSES}
    args.seqlens = args.seqlens or (QUICK_SEQLENS if args.quick else SEQLENS)
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    args.passes = [p for p in PASSES if p in args.passes]
    if args.deterministic and "bwd" not in args.passes:
        parser.error("--deterministic: applies to the backward; add --passes bwd")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.quick:
        args.rep_ms = min(args.rep_ms, 50)
    return args


def output_stems(args, gpu):
    """(JSON file stem, PNG stem): the JSON's names the passes unless forward only; the
    PNGs' names carry their pass already (plot.plot_records)."""
    plots = f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}" + ("-quick" if args.quick else "")
    if args.fp8_scales == "descales" and "e4m3" in args.dtypes:
        plots += "-descales"
    return plots + ("" if args.passes == ["fwd"] else "-" + "-".join(args.passes)), plots


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
    print_table(records)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_stem, plot_stem = output_stems(args, gpu)
    json_path = args.out_dir / f"{json_stem}.json"
    json_path.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {json_path}")
    if not args.no_plot:
        try:
            from plot import plot_records
        except ImportError as e:
            print(f"no plots ({e}); re-plot later with bench/plot.py {json_path}")
        else:
            for path in plot_records(records, args.out_dir / plot_stem):
                print(f"wrote {path}")


if __name__ == "__main__":
    main()
