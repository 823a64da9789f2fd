#include "usage.h"

namespace fa3::cli {

const char* main_usage() {
  return R"(usage: fa3 <command> [options]

Exact attention (FlashAttention-3) on NVIDIA Hopper GPUs, with a CPU path.

commands:
  info     what this build holds, and which GPU (if any) is present
  run      one forward pass (or, with --backward, a backward pass) on random
           inputs: timed, and checked against the exact reference
  bench    a sweep of shapes, forward or backward, timed; optional JSON and
           CSV output
  tune     times every forward kernel on a sweep of shapes (or one) and keeps
           the fastest of each problem class in the tuning cache, which
           fa3::forward uses when FA3_AUTOTUNE=1; --show lists the cache

`fa3 <command> --help` lists a command's options.
exit status: 0 ok, 1 error from the library or CUDA, 2 bad arguments,
             3 `fa3 run` found a wrong result
)";
}

const char* info_usage() {
  return R"(usage: fa3 info

Prints the library version, the CUDA and CUTLASS versions it was built with, the
head dims and dtypes of its GPU kernels, the current GPU (name, compute capability,
SMs, memory), and whether the kernels can run on it. Works without a GPU.
)";
}

const char* run_usage() {
  return R"(usage: fa3 run [options]

Runs one attention forward pass on random normal inputs, times it, and checks a
sample of query rows against the exact (fp64) reference. With --backward, runs
the forward (with lse) once, then times the backward pass alone on a random dout,
and checks out, lse and dq on the sampled query rows and dk, dv on as many
sampled key rows.

shape:
  --batch N          batch size (default 1)
  --seqlen N         query and key length (default 512)
  --seqlen-q N       query length (overrides --seqlen)
  --seqlen-k N       key/value length (overrides --seqlen)
  --nheads N         query heads (default 8)
  --nheads-kv N      key/value heads, dividing --nheads (default: --nheads)
  --head-dim N       head dimension of q and k (default 128)
  --head-dim-v N     head dimension of v and out, and so of dout and dv (default:
                     --head-dim); one of its own, such as DeepSeek-V3's 192 and
                     128, runs on the CPU only so far
  --dtype T          bf16 | fp16 | fp32 | e4m3 (default bf16); fp32 runs on the
                     CPU only; e4m3 (FP8) inputs give bf16 out, forward only
pass:
  --backward         time the backward pass: fa3::backward on the GPU, its
                     workspace allocated once; on the CPU fa3::cpu::backward,
                     the exact reference
  --deterministic    with --backward: the deterministic backward; one more
                     untimed call first, whose dq, dk, dv the last call must
                     reproduce bit for bit
attention:
  --causal           causal mask, aligned to the bottom-right corner
  --window L,R       sliding window: query i sees keys i-L .. i+R (-1: unbounded)
  --softcap X        scores become X * tanh(scores / X) (default 0: off)
  --chunk N          chunked attention: query i sees only keys of its own chunk of N
                     positions (Llama 4's attention_chunk)
  --scale X          softmax scale (default 0: 1/sqrt(--head-dim))
  --sinks X[,X...]   attention sinks: one logit for every head, or one per head
                     (--nheads values), in each row's softmax denominator; lse
                     includes them. With --backward, dq, dk and dv are checked,
                     the sinks' own gradient is not asked for
execution:
  --device D         auto | gpu | cpu (default auto: the GPU when it is a Hopper
                     GPU with kernels for the dtype, else the CPU)
  --iters N          timed calls; the median is reported (default 20 on the GPU,
                     3 on the CPU, 1 for the CPU's backward)
  --warmup N         untimed calls first (default 5 on the GPU, 1 on the CPU, 0
                     for the CPU's backward)
  --threads N        CPU threads (default 0: one per hardware thread)
  --kernel NAME      GPU forward kernel, by tile (such as 128x176), instead of
                     the library's choice; an unknown name is refused with the
                     list of kernels built for the problem (with --backward:
                     the forward that writes out and lse)
  --flush-l2         GPU: overwrite a 256 MiB buffer before each timed call, so
                     that every call starts with a cold L2 cache, as
                     bench/bench_attention.py times (default: back to back)
  --check-rows N     query rows compared with the reference, spread over batch,
                     heads and rows, the last row included (default 16; 0: none);
                     with --backward also N key rows (of dk, dv), spread over
                     batch, KV heads and keys. Each (batch, KV head) holding a
                     sampled key costs an fp64 forward pass of its query heads
                     on --threads CPU threads: for long sequences use few rows
  --seed N           random seed of the inputs and the sample (default 0)
  -h, --help         this text

The check fails (exit status 3) on a NaN anywhere in out or lse, or an error above
the bound: |out - ref| over 2e-2 (bf16), 4e-3 (fp16), 1e-5 (fp32); lse the same
bound times max(1, |lse|). With --backward it also fails on a NaN anywhere in dq,
dk or dv, on |dq - ref| (dk, dv alike) over that bound times the largest |ref| of
the gradient among the checked rows, plus 1e-5, and (--deterministic) on a last
call whose gradients differ from the first's. The backward's speed counts 2.5x
the forward's FLOPs.
)";
}

const char* bench_usage() {
  return R"(usage: fa3 bench [options]

Times the forward pass (or, with --backward, the backward pass alone) over a
sweep of shapes. Every shape keeps batch x seqlen = --tokens and nheads x head dim
= --hidden, as in the FlashAttention-3 paper; query and key lengths are equal,
nheads_kv = nheads.

default sweep on the GPU (the ANCHORS.md sweep): head dims 64, 128, 256 (those
  compiled into this build) x causal no, yes x seqlen 512, 1024, 2048, 4096, 8192,
  16384; 16384 tokens, hidden 2048; 20 timed calls after 5 warm-up
default sweep on the CPU (under a minute on 2 cores): head dims 64, 128 x causal
  no, yes x seqlen 128, 256, 512; 1024 tokens, hidden 512; 3 timed calls after 1
  (--backward, the exact fp64 reference: seqlen 128, 256; 512 tokens, hidden
  256; 1 timed call)

options:
  --backward         time the backward pass: the forward runs once per shape,
                     untimed, for the out and lse it reads; the GPU workspace is
                     allocated once for the sweep; TFLOP/s count 2.5x the
                     forward's FLOPs
  --deterministic    with --backward: the deterministic backward
  --head-dims LIST   comma-separated head dims (of q and k)
  --head-dim-v N     head dim of v and out in every shape (default: the shape's
                     head dim), such as DeepSeek-V3's --head-dims 192
                     --head-dim-v 128; nheads still count the head dim of q
                     and k
  --seqlens LIST     comma-separated sequence lengths
  --causal           causal shapes only
  --non-causal       non-causal shapes only (neither or both: both)
  --tokens N         batch x seqlen; batch = max(1, N / seqlen)
  --hidden N         nheads x head dim; nheads = max(1, N / head dim)
  --dtype T          bf16 | fp16 | fp32 | e4m3 (default bf16); fp32 runs on the
                     CPU only; e4m3 (FP8) inputs give bf16 out, forward only
  --device D         auto | gpu | cpu (default auto, as in `fa3 run`)
  --iters N          timed calls per shape; the median is reported
  --warmup N         untimed calls per shape first
  --threads N        CPU threads (default 0: one per hardware thread)
  --kernel NAME      GPU forward kernel for every shape, as in `fa3 run`
  --flush-l2         GPU: a cold L2 cache before each timed call, as in `fa3 run`
  --seed N           random seed of the inputs (default 0)
  --json FILE        write the results as a JSON list of records
  --csv FILE         write the results as CSV, one record a line
  -h, --help         this text

A record: {"impl": "fa3", "pass": "fwd" | "bwd", "dtype", "hdim", "causal",
"seqlen", "batch", "nheads", "tflops", "ms", "device": "gpu" | "cpu", "gpu": the
GPU's name or "cpu"}, with "hdim_v" after "hdim" when --head-dim-v is given,
"timing": "l2-flushed" after "gpu" when --flush-l2 timed GPU calls, and for "bwd"
"deterministic" (true | false) last; the CSV has the same columns.
TFLOP/s count the forward's FLOPs as 2 x batch x nheads x seqlen^2 x (hdim +
hdim_v), halved when causal (hdim_v = hdim without --head-dim-v). A shape the
library rejects is reported (in a backward sweep with the call that refused it:
the untimed forward or the backward) and left out of the files, and the exit
status is then 1.
)";
}

const char* tune_usage() {
  return R"(usage: fa3 tune [options]
       fa3 tune --show

Times every compiled forward kernel on random inputs for each problem of a sweep
(or for one problem) and writes the fastest of each problem class into the tuning
cache of this GPU. With FA3_AUTOTUNE=1 in the environment (or fa3::set_autotune /
fa3.set_autotune), fa3::forward runs the cached kernel for a problem's class, and
its built-in choice for classes the cache does not hold. Needs a Hopper GPU.

A problem class is: dtype, head dim, mask (plain or causal), the query length's
and the key length's bucket, and the GQA ratio's bucket (nheads / nheads-kv); a
bucket is the smallest power of two at or above the value (seqlen 1025 to 2048:
bucket 2048). The cache is keyed by GPU name, SM count, CUDA driver version and
fa3 version. It lives in $FA3_TUNE_CACHE when set, else in
$XDG_CACHE_HOME/fa3/ or ~/.cache/fa3/ as tune-<GPU>-<SMs>sm-cuda<driver>-fa3-
<version>.txt. An entry added replaces the one of its class.

sweep (the default: the ANCHORS.md sweep, head dims 64, 128, 256 (those compiled
  into this build) x causal no, yes x seqlen 512, 1024, 2048, 4096, 8192, 16384;
  16384 tokens, hidden 2048, as `fa3 bench`):
  --head-dims LIST   comma-separated head dims
  --seqlens LIST     comma-separated sequence lengths (query and key)
  --causal           causal shapes only
  --non-causal       non-causal shapes only (neither or both: both)
  --gqa LIST         GQA ratios, query heads per key/value head; each must
                     divide nheads (default 1)
  --tokens N         batch x seqlen; batch = max(1, N / seqlen)
  --hidden N         nheads x head dim; nheads = max(1, N / head dim)
one problem (any of these flags selects it; defaults as in `fa3 run`):
  --batch N, --seqlen N, --seqlen-q N, --seqlen-k N, --nheads N,
  --nheads-kv N, --head-dim N, and --causal for the causal mask
both:
  --dtype T          bf16 | fp16 (default bf16)
  --warmup N         untimed calls of each kernel first (default 5)
  --iters N          timed calls of each kernel, taking turns; the median
                     counts (default 20)
  --seed N           random seed of the inputs (default 0)
  --dry-run          time and print, but leave the cache as it is
  --show             list the cache's entries for this GPU instead; no other
                     option goes with it
  -h, --help         this text

The table: each problem's class, the number of kernels timed, the fastest and
its median time, the built-in choice and its median time, and the speedup of
the fastest over the built-in choice. A problem the library rejects is reported
and left out of the cache, and the exit status is then 1; so is a run without a
usable GPU.
)";
}

}  // namespace fa3::cli
