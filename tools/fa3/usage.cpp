#include "usage.h"

namespace fa3::cli {

const char* main_usage() {
  return R"(usage: fa3 <command> [options]

Exact attention (FlashAttention-3) on NVIDIA Hopper GPUs, with a CPU path.

commands:
  info     what this build holds, and which GPU (if any) is present
  run      one forward pass on random inputs: timed, and checked against the
           exact reference
  bench    a sweep of shapes, timed; optional JSON and CSV output

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
sample of query rows against the exact (fp64) reference.

shape:
  --batch N          batch size (default 1)
  --seqlen N         query and key length (default 512)
  --seqlen-q N       query length (overrides --seqlen)
  --seqlen-k N       key/value length (overrides --seqlen)
  --nheads N         query heads (default 8)
  --nheads-kv N      key/value heads, dividing --nheads (default: --nheads)
  --head-dim N       head dimension (default 128)
  --dtype T          bf16 | fp16 | fp32; fp32 runs on the CPU only (default bf16)
attention:
  --causal           causal mask, aligned to the bottom-right corner
  --window L,R       sliding window: query i sees keys i-L .. i+R (-1: unbounded)
  --softcap X        scores become X * tanh(scores / X) (default 0: off)
  --scale X          softmax scale (default 0: 1/sqrt(head dim))
execution:
  --device D         auto | gpu | cpu (default auto: the GPU when it is a Hopper
                     GPU with kernels for the dtype, else the CPU)
  --iters N          timed calls; the median is reported (default 20 on the GPU,
                     3 on the CPU)
  --warmup N         untimed calls first (default 5 on the GPU, 1 on the CPU)
  --threads N        CPU threads (default 0: one per hardware thread)
  --kernel NAME      GPU forward kernel, by tile (such as 128x176), instead of
                     the library's choice; an unknown name is refused with the
                     list of kernels built for the problem
  --check-rows N     query rows compared with the reference, spread over batch,
                     heads and rows, the last row included (default 16; 0: none)
  --seed N           random seed of the inputs and the sample (default 0)
  -h, --help         this text

The check fails (exit status 3) on a NaN anywhere in out or lse, or an error above
the bound: |out - ref| over 2e-2 (bf16), 4e-3 (fp16), 1e-5 (fp32); lse the same
bound times max(1, |lse|).
)";
}

const char* bench_usage() {
  return R"(usage: fa3 bench [options]

Times the forward pass over a sweep of shapes. Every shape keeps batch x seqlen =
--tokens and nheads x head dim = --hidden, as in the FlashAttention-3 paper; query
and key lengths are equal, nheads_kv = nheads.

default sweep on the GPU (the ANCHORS.md sweep): head dims 64, 128, 256 (those
  compiled into this build) x causal no, yes x seqlen 512, 1024, 2048, 4096, 8192,
  16384; 16384 tokens, hidden 2048; 20 timed calls after 5 warm-up
default sweep on the CPU (under a minute on 2 cores): head dims 64, 128 x causal
  no, yes x seqlen 128, 256, 512; 1024 tokens, hidden 512; 3 timed calls after 1

options:
  --head-dims LIST   comma-separated head dims
  --seqlens LIST     comma-separated sequence lengths
  --causal           causal shapes only
  --non-causal       non-causal shapes only (neither or both: both)
  --tokens N         batch x seqlen; batch = max(1, N / seqlen)
  --hidden N         nheads x head dim; nheads = max(1, N / head dim)
  --dtype T          bf16 | fp16 | fp32; fp32 runs on the CPU only (default bf16)
  --device D         auto | gpu | cpu (default auto, as in `fa3 run`)
  --iters N          timed calls per shape; the median is reported
  --warmup N         untimed calls per shape first
  --threads N        CPU threads (default 0: one per hardware thread)
  --kernel NAME      GPU forward kernel for every shape, as in `fa3 run`
  --seed N           random seed of the inputs (default 0)
  --json FILE        write the results as a JSON list of records
  --csv FILE         write the results as CSV, one record a line
  -h, --help         this text

A record: {"impl": "fa3", "pass": "fwd", "dtype", "hdim", "causal", "seqlen",
"batch", "nheads", "tflops", "ms", "device": "gpu" | "cpu", "gpu": the GPU's name
or "cpu"}. A shape the library rejects is reported and left out of the files, and
the exit status is then 1.
)";
}

}  // namespace fa3::cli
