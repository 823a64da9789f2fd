"""Context parallelism: fa3.distributed's ring and all-gather against one GPU and PyTorch's own.

Run under torchrun, one process per GPU (NCCL):

    torchrun --nproc-per-node 8 bench/bench_context_parallel.py
    torchrun --nproc-per-node 2 bench/bench_context_parallel.py --seqlens 32768 131072 --passes fwd
    torchrun --nproc-per-node 2 bench/bench_context_parallel.py --backend gloo --device cpu --tiny
    torchrun --nproc-per-node 2 bench/bench_context_parallel.py --sm-margin 8   # SMs left to NCCL

One attention over a whole sequence of 32k ... 1M tokens (batch 1, GQA 32:8, head dim
128, bf16), sharded along the sequence over the W ranks, causal (zigzag shards,
fa3.distributed.zigzag_shard) and not; passes "fwd" (the forward) and "fwd_bwd" (the
forward and the gradients of q, k and v). Variants, each a record:

  ring       fa3.distributed.ring_flash_attn_func: K/V shards travel around the ring
             while fa3 attends to the shard in hand
  allgather  fa3.distributed.allgather_flash_attn_func: K/V gathered once, one call
  torch_cp   PyTorch's context parallelism (torch.distributed.tensor.experimental.
             context_parallel around scaled_dot_product_attention, its default rotate
             method and load balancing; enable_gqa, or K/V repeated to 32 heads where
             it refuses GQA, said in the record); "unavailable" with the reason where
             this torch has no such API or it cannot run the point
  one_gpu    fa3.flash_attn_func on the whole sequence on rank 0 alone (the others
             wait): the baseline of each record's "speedup"

Every rank builds the same full inputs (one seed) and takes its shard. Before timing,
each variant's output is checked against fa3's single-call output for the first KV
head's group of query heads (4 heads), computed on every rank: the largest relative
error over ranks must stay under 1e-2 (the gradients are fa3.distributed's tests'
business). Timing: a warm-up call, then the same number of calls on every rank (from
the slowest rank's first call, within --budget-ms), each started after the L2 flush and
a barrier; a call's time is the slowest rank's, and a record holds the median.

How much communication the ring hides: ring records also hold "comm_ms", the ring's
transfers alone (its W - 1 K/V hops, and for fwd_bwd the backward's K/V and fp32 dK/dV
hops, in the ring's order), "compute_ms", the ring's kernels and merges alone (the same
blocks on the local K/V shard, no transfer), and "comm_hidden" = (comm_ms + compute_ms
- ms) / comm_ms, clamped to [0, 1]: 1 when the transfers cost nothing beyond the
compute, 0 when they add their whole time.

Lengths whose inputs would not fit (the full q, k, v and dout on each rank, 80 % of the
device's memory) or that do not split in 2W chunks are skipped with a note; a call that
runs out of memory becomes a record with an "error". NCCL_NVLS_ENABLE defaults to 0
(NVLink SHARP multicast off; set it in the environment to override).

Writes <out-dir>/<YYYY-MM-DD>-<gpu>-cp-w<W>.json from rank 0: records {"pass", "variant",
"world_size", "causal", "seqlen" (the whole sequence), "batch", "nheads", "nheads_kv",
"hdim", "dtype", "ms", "tokens_per_s" (whole-sequence tokens per second), "speedup"
(one_gpu's ms / ms), "rel_err", "gpu", "backend", ...}.
"""

import argparse
import datetime
import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

# Before torch initializes NCCL: NVLink SHARP multicast off unless asked for.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fa3  # noqa: E402
from fa3 import distributed as cp  # noqa: E402
from fa3.distributed import _blocks, _ring  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import gpu_slug  # noqa: E402

NHEADS, NHEADS_KV, HDIM, BATCH = 32, 8, 128, 1
DTYPE, DTYPE_NAME = torch.bfloat16, "bf16"
SEQLENS = [2**k for k in range(15, 21)]  # 32k ... 1M
TINY_SEQLENS = [64]
VARIANTS = ("ring", "allgather", "torch_cp")
PASSES = ("fwd", "fwd_bwd")
# The first KV head's group of query heads: what the check compares.
CHECK_HEADS = NHEADS // NHEADS_KV
MAX_REL_ERR = 1e-2
MEMORY_FRACTION = 0.8


class Unavailable(Exception):
    """A variant cannot run a point (no API, refused shape, out of memory, wrong result)."""


# ---- pure arithmetic ----


def splittable(seqlen, world_size, causal):
    """Whether the sequence cuts in equal shards: 2W zigzag chunks when causal, W otherwise."""
    return seqlen % (2 * world_size if causal else world_size) == 0


def full_input_bytes(seqlen, nheads=NHEADS, nheads_kv=NHEADS_KV, hdim=HDIM, batch=BATCH, itemsize=2):
    """Bytes of the full q, k, v and dout that every rank holds."""
    return batch * seqlen * (2 * nheads + 2 * nheads_kv) * hdim * itemsize


def iterations(first_ms, budget_ms, min_iters, max_iters):
    """Timed calls after a first call of first_ms: as many as fit in budget_ms, within bounds."""
    return max(min_iters, min(max_iters, int(budget_ms / max(first_ms, 1e-3))))


def median_of_slowest(times):
    """times[i][r]: call i's time on rank r. The median over calls of the slowest rank's time."""
    slowest = sorted(max(per_rank) for per_rank in times)
    return slowest[len(slowest) // 2]


def comm_hidden(ms, comm_ms, compute_ms):
    """The fraction of the transfers' time the overlap hides, in [0, 1]."""
    if comm_ms <= 0:
        return 1.0
    return min(1.0, max(0.0, (comm_ms + compute_ms - ms) / comm_ms))


def record(pass_, variant, world_size, causal, seqlen, ms, baseline_ms, **fields):
    """One JSON record; ms None (with an "error" field) when the variant could not run."""
    rec = {
        "pass": pass_,
        "variant": variant,
        "world_size": world_size,
        "causal": causal,
        "seqlen": seqlen,
        "batch": BATCH,
        "nheads": NHEADS,
        "nheads_kv": NHEADS_KV,
        "hdim": HDIM,
        "dtype": DTYPE_NAME,
        "ms": ms,
        "tokens_per_s": None if ms is None else BATCH * seqlen / (ms * 1e-3),
        "speedup": None if ms is None or baseline_ms is None else baseline_ms / ms,
    }
    rec.update(fields)
    return rec


# ---- the world and its clock ----


class World:
    """This process's rank in the default group, its device, and agreement across ranks."""

    def __init__(self, device):
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = device
        self.backend = dist.get_backend()
        self.mesh = None  # torch_cp's device mesh, made on its first use

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def per_rank(self, values):
        """values (floats, one per call) -> [[value on each rank] per call]."""
        gathered = [None] * self.size
        dist.all_gather_object(gathered, list(values))
        return [list(per_call) for per_call in zip(*gathered)]

    def agree(self, fn):
        """fn()'s result on every rank, or Unavailable on every rank (the first failing
        rank's reason) if it raised on any: so that no rank goes on to a collective alone."""
        result, reason = None, None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA explains at length why a backend declined
                result = fn()
                self.sync()
        except (RuntimeError, NotImplementedError, ValueError, Unavailable) as e:
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        reasons = [None] * self.size
        dist.all_gather_object(reasons, reason)
        failed = [(r, why) for r, why in enumerate(reasons) if why]
        if failed:
            raise Unavailable(f"rank {failed[0][0]}: {failed[0][1]}")
        return result


@functools.lru_cache(maxsize=1)
def _l2_flush_buffer():
    return torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")


def timed_ms(fn, world, args, together=True):
    """Median ms of fn() as described in the module docstring. together=False: this rank
    alone (the one-GPU baseline), no collectives."""

    def one_call():
        if world.device.type == "cuda":
            _l2_flush_buffer().zero_()
        world.sync()
        if together:
            dist.barrier()
        start = time.perf_counter()
        fn()
        world.sync()
        return (time.perf_counter() - start) * 1e3

    fn()  # warm-up
    first = one_call()
    if together:
        first = max(world.per_rank([first])[0])
    times = [one_call() for _ in range(iterations(first, args.budget_ms, args.min_iters, args.max_iters))]
    return median_of_slowest(world.per_rank(times) if together else [[t] for t in times])


# ---- inputs and checks ----


def full_inputs(seqlen, device):
    """q, k, v, dout of the whole sequence, the same on every rank."""
    gen = torch.Generator(device=device).manual_seed(seqlen)

    def randn(heads):
        return torch.randn(BATCH, seqlen, heads, HDIM, generator=gen, device=device, dtype=DTYPE)

    return randn(NHEADS), randn(NHEADS_KV), randn(NHEADS_KV), randn(NHEADS)


def shard(x, world, causal):
    """This rank's shard of the whole sequence x (dim 1): zigzag when causal."""
    if causal:
        return cp.zigzag_shard(x, world.rank, world.size).contiguous()
    return x.chunk(world.size, dim=1)[world.rank].contiguous()


def relative_error(out, ref):
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref.float()).norm() / ref.float().norm()).item()


def checked(world, out, ref):
    """The largest relative error over ranks of out against ref; Unavailable past MAX_REL_ERR."""
    err = max(world.per_rank([relative_error(out, ref)])[0])
    if not err <= MAX_REL_ERR:
        raise Unavailable(f"wrong result: relative error {err:.2e} against fa3's single call")
    return err


# ---- the variants: each returns (ms, fields) or raises Unavailable ----


def fa3_variant(fn_name, world, inputs, ref_shard, causal, pass_, args):
    attention = functools.partial(getattr(cp, fn_name), sm_margin=args.sm_margin)
    q, k, v, dout = (shard(t, world, causal) for t in inputs)
    out = world.agree(lambda: attention(q, k, v, causal=causal))
    fields = {"rel_err": checked(world, out[:, :, :CHECK_HEADS], ref_shard)}
    if pass_ == "fwd":
        run = functools.partial(attention, q, k, v, causal=causal)
    else:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

        def run():
            return torch.autograd.grad(attention(*leaves, causal=causal), leaves, dout)

    ms = world.agree(lambda: timed_ms(run, world, args))
    if fn_name == "ring_flash_attn_func":
        fields.update(ring_breakdown(world, q, k, v, dout, causal, pass_, args))
        fields["comm_hidden"] = comm_hidden(ms, fields["comm_ms"], fields["compute_ms"])
    return ms, fields


class _NoTransfer:
    """A ring that hands back what it is given: the ring's compute with no communication
    (every shard has the same shape, so each step's blocks are those of the real ring)."""

    def __init__(self, world):
        self.size, self.rank = world.size, world.rank

    def start(self, tensors):
        return (lambda: None), list(tensors)


def ring_breakdown(world, q, k, v, dout, causal, pass_, args):
    """{"comm_ms", "compute_ms"}: the ring's transfers alone and its compute alone."""
    scale = HDIM**-0.5
    ring = _ring._Ring(dist.group.WORLD)

    def hops(tensors, count):
        for _ in range(count):
            wait, tensors = ring.start(tensors)
            wait()
        return tensors

    def comm():
        hops([k, v], world.size - 1)
        if pass_ == "fwd_bwd":  # as _ring_backward: K/V hops, and the fp32 accumulators' hops beside them
            kv, grads = [k, v], [torch.zeros(k.shape, dtype=torch.float32, device=k.device) for _ in range(2)]
            for step in range(world.size):
                if step + 1 < world.size:
                    wait_kv, next_kv = ring.start(kv)
                wait_grads, grads = ring.start(grads)
                if step + 1 < world.size:
                    wait_kv()
                    kv = next_kv
                wait_grads()

    local = _NoTransfer(world)
    shards = _blocks.Dense(args.sm_margin)
    if pass_ == "fwd":

        def compute():
            return _ring._ring_forward(q, k, v, scale, causal, local, shards)

    else:
        leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

        def compute():
            out, _ = _ring._RingAttention.apply(*leaves, scale, causal, False, local, shards)
            return torch.autograd.grad(out, leaves, dout)

    return {
        "comm_ms": world.agree(lambda: timed_ms(comm, world, args)),
        "compute_ms": world.agree(lambda: timed_ms(compute, world, args)),
    }


def torch_cp_api():
    """(init_device_mesh, context_parallel, context_parallel_unshard) of this torch, or Unavailable."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    except ImportError as e:
        raise Unavailable(f"torch {torch.__version__} has no context parallelism API: {e}") from None
    return init_device_mesh, context_parallel, context_parallel_unshard


def torch_cp_variant(world, inputs, ref, causal, pass_, args):
    """PyTorch's context parallelism on SDPA: the full buffers, in SDPA's (batch, heads,
    seqlen, hdim) layout, are sharded in place by context_parallel (its own load
    balancing for causal); the check unshards the output."""
    init_device_mesh, context_parallel, context_parallel_unshard = torch_cp_api()
    if world.mesh is None:
        world.mesh = world.agree(lambda: init_device_mesh(world.device.type, (world.size,)))
    mesh = world.mesh
    fields = {}
    for gqa in (True, False):
        q, k, v, dout = (t.transpose(1, 2).contiguous() for t in inputs)
        if not gqa:  # this torch's context parallelism refused enable_gqa: K/V repeated to every query head
            k, v = (t.repeat_interleave(NHEADS // NHEADS_KV, dim=1) for t in (k, v))
        buffers = [q, k, v, dout]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)):

            def attention(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

            try:
                out = world.agree(lambda: attention(q, k, v))
            except Unavailable as e:
                if not gqa:
                    raise
                fields["kv_heads_repeated"] = f"enable_gqa refused: {e}"
                continue
            (full_out,) = context_parallel_unshard(mesh, [out], [2])
            fields["rel_err"] = checked(world, full_out.transpose(1, 2)[:, :, :CHECK_HEADS], ref)
            if pass_ == "fwd":
                run = functools.partial(attention, q, k, v)
            else:
                leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

                def run():
                    return torch.autograd.grad(attention(*leaves), leaves, dout)

            return world.agree(lambda: timed_ms(run, world, args)), fields


def one_gpu(world, inputs, causal, pass_, args):
    """rank 0's ms for fa3.flash_attn_func on the whole sequence, or its reason for failing;
    the other ranks wait. Returned on every rank as (ms, error)."""
    result = [None, None]
    if world.rank == 0:
        q, k, v, dout = inputs
        if pass_ == "fwd":
            run = functools.partial(fa3.flash_attn_func, q, k, v, causal=causal)
        else:
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))

            def run():
                return torch.autograd.grad(fa3.flash_attn_func(*leaves, causal=causal), leaves, dout)

        try:
            result[0] = timed_ms(run, world, args, together=False)
        except (RuntimeError, NotImplementedError, ValueError) as e:
            result[1] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if world.device.type == "cuda":
            torch.cuda.empty_cache()
    dist.broadcast_object_list(result, src=0)
    return tuple(result)


# ---- the sweep ----


def run_point(world, seqlen, causal, args, gpu):
    """Records of one (seqlen, causal): one_gpu and each variant, for each pass."""
    inputs = full_inputs(seqlen, world.device)
    q, k, v, _ = inputs
    ref = fa3.flash_attn_func(q[:, :, :CHECK_HEADS], k[:, :, :1], v[:, :, :1], causal=causal)
    ref_shard = shard(ref, world, causal)
    base = {"gpu": gpu, "backend": world.backend}
    if args.sm_margin:
        base["sm_margin"] = args.sm_margin
    records = []
    for pass_ in args.passes:
        baseline_ms, baseline_error = one_gpu(world, inputs, causal, pass_, args)
        one = record(pass_, "one_gpu", 1, causal, seqlen, baseline_ms, baseline_ms, **base)
        records.append(one if baseline_error is None else {**one, "error": baseline_error})
        for variant in args.variants:
            try:
                if variant == "torch_cp":
                    ms, fields = torch_cp_variant(world, inputs, ref, causal, pass_, args)
                else:
                    fn_name = "ring_flash_attn_func" if variant == "ring" else "allgather_flash_attn_func"
                    ms, fields = fa3_variant(fn_name, world, inputs, ref_shard, causal, pass_, args)
            except Unavailable as e:
                ms, fields = None, {"error": str(e)}
                if variant == "torch_cp":
                    fields["status"] = "unavailable"
            except (TypeError, AttributeError) as e:
                if variant != "torch_cp":
                    raise
                # An experimental API whose signature moved between torch versions: the
                # same on every rank, so no rank is left in a collective.
                ms, fields = None, {"error": f"torch {torch.__version__}: {type(e).__name__}: {e}"}
                fields["status"] = "unavailable"
            records.append(record(pass_, variant, world.size, causal, seqlen, ms, baseline_ms, **base, **fields))
            if world.device.type == "cuda":
                torch.cuda.empty_cache()
    return records


def print_table(records):
    print("| pass | causal | seqlen | variant | W | ms | tokens/s | speedup | comm ms | compute ms | hidden |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")

    def cell(r, key, fmt):
        return fmt.format(r[key]) if r.get(key) is not None else "n/a"

    for r in records:
        print(
            f"| {r['pass']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | {r['variant']} | {r['world_size']} "
            f"| {cell(r, 'ms', '{:.3f}')} | {cell(r, 'tokens_per_s', '{:.3g}')} | {cell(r, 'speedup', '{:.2f}')} "
            f"| {cell(r, 'comm_ms', '{:.3f}')} | {cell(r, 'compute_ms', '{:.3f}')} "
            f"| {cell(r, 'comm_hidden', '{:.2f}')} |"
        )
    for r in records:
        if r.get("error"):
            print(f"  {r['variant']} {r['pass']} seqlen {r['seqlen']} causal {r['causal']}: {r['error']}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqlens", type=int, nargs="+", help=f"whole-sequence lengths (default {SEQLENS})")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=list(PASSES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--tiny", action="store_true", help=f"a smoke run: seqlens {TINY_SEQLENS}, one timed call per measurement"
    )
    parser.add_argument(
        "--sm-margin", type=int, default=0, help="SMs fa3's kernels leave to the transfers (sm_margin; default 0)"
    )
    parser.add_argument("--budget-ms", type=float, default=1000, help="timing budget per measurement (ms)")
    parser.add_argument("--min-iters", type=int, default=3)
    parser.add_argument("--max-iters", type=int, default=50)
    parser.add_argument("--timeout-min", type=float, default=30, help="the process group's collective timeout")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    args.seqlens = args.seqlens or (TINY_SEQLENS if args.tiny else SEQLENS)
    if args.tiny:
        args.min_iters, args.max_iters = 1, 1
    if any(s < 1 for s in args.seqlens):
        parser.error("--seqlens: lengths must be positive")
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl: takes --device cuda (gloo runs the CPU path)")
    if not 1 <= args.min_iters <= args.max_iters:
        parser.error("--min-iters / --max-iters: need 1 <= min <= max")
    if args.sm_margin < 0:
        parser.error("--sm-margin: SMs left free, >= 0")
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    args.passes = [p for p in PASSES if p in args.passes]
    return args


def init_world(args):
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("bench_context_parallel.py: --device cuda needs CUDA GPUs (or --backend gloo --device cpu)")
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(minutes=args.timeout_min)
    if args.backend == "nccl":
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return World(device)


def main(argv=None):
    args = parse_args(argv)
    world = init_world(args)
    gpu = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else "cpu"
    memory = torch.cuda.get_device_properties(world.device).total_memory if world.device.type == "cuda" else None
    records = []
    try:
        for seqlen in args.seqlens:
            for causal in args.causal:
                why = None
                if not splittable(seqlen, world.size, causal):
                    why = f"does not cut in {2 * world.size if causal else world.size} equal chunks"
                elif memory is not None and full_input_bytes(seqlen) > MEMORY_FRACTION * memory:
                    why = f"its full inputs ({full_input_bytes(seqlen) / 2**30:.0f} GiB) do not fit"
                if why:
                    if world.rank == 0:
                        print(f"skipping seqlen {seqlen} ({'causal' if causal else 'non-causal'}): {why}")
                    continue
                records += run_point(world, seqlen, causal, args, gpu)
        if world.rank == 0:
            print_table(records)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            path = args.out_dir / f"{datetime.date.today().isoformat()}-{gpu_slug(gpu)}-cp-w{world.size}.json"
            path.write_text(json.dumps(records, indent=1) + "\n")
            print(f"wrote {path}")
    except BaseException:
        dist.destroy_process_group()
        raise
    leave()


def leave():
    """Ends a rank once every rank is done: a rank that closes its process group while a
    peer still completes work with it, or the interpreter's own teardown of the
    communication library's threads, can abort a rank after its work is done (gloo's
    SIGABRT at exit). Past the barrier nothing is left to do, so the process leaves at
    once with status 0."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
