// fa3 — FP8 (e4m3) quantization of attention inputs, for the FP8 forward
// (fa3/attention.h's Fp8Args).
//
// quantize() turns one (batch, seqlen, nheads, head_dim) tensor into e4m3 codes and one
// fp32 scale per block of block_rows rows of each (batch, head): the block's real values
// are codes * scale. Per row of the input, in this order (fp32 throughout):
//   1. with hadamard, the random-sign Hadamard transform along the head dim
//      (FlashAttention-3's incoherent processing): y = H (s * x) / sqrt(n), s a sign per
//      column drawn from `seed` (hadamard_sign), H the Walsh-Hadamard matrix of size
//      n = hadamard_size(head_dim), the largest power of two dividing head_dim, applied
//      to each of the head_dim / n consecutive groups of n columns (block-diagonal:
//      head dim 96 is three blocks of 32, 192 three of 64). H is orthogonal up to the
//      1/sqrt(n), so transforming q and k with the same seed leaves q . k unchanged
//      while spreading an outlier column over n columns. H's butterfly runs stage by
//      stage, partners i and i + h for h = 1, 2, 4, ..., n / 2, each pair becoming
//      (a + b, a - b); then the product with 1/sqrt(n) (rounded to fp32 once).
//   2. absmax = the largest |y| of the block (NaN ignored); scale = absmax / 448, or 1
//      for a block of zeros.
//   3. code = e4m3(y * (448 / absmax)): round to nearest even, saturating at 448.
// The GPU kernel and the CPU version follow these steps operation for operation, so
// their codes and scales are bitwise equal. Inputs must be finite (an infinity makes its
// block's scale infinite). V is quantized without the transform (it would have to be
// undone on the output); the scales go to Fp8Args' block scales with block_rows equal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::fp8 {

constexpr float kE4m3Max = 448.f;

struct QuantizeArgs {
  TensorView input;   // (batch, seqlen, nheads, head_dim): fp32, fp16 or bf16; head_dim <= 256
  TensorView output;  // written: e4m3, input's shape; both with the last dimension contiguous
  TensorView scale;   // written: fp32 (batch, nheads, ceil(seqlen / block_rows)), any strides >= 0
  int block_rows = 128;
  bool hadamard = false;   // transform first (head_dim a multiple of 32)
  std::uint64_t seed = 0;  // the transform's signs: equal seeds for q and k
  // A varlen batch (fa3/attention.h's packed layout), when cu_seqlens is given: int32
  // (batch + 1), contiguous, in the input's memory. input and output are then (total,
  // nheads, head_dim), sequence b being rows [cu_seqlens[b], cu_seqlens[b + 1]); its
  // blocks count from its first row, and scale is (batch, nheads, ceil(max_seqlen /
  // block_rows)), what a varlen FP8 call takes as its block scales (a sequence's blocks
  // past its rows get scale 1). Rows of no sequence are not written. cpu::quantize checks
  // the offsets (0 first, non-decreasing, within total, no sequence over max_seqlen);
  // fp8::quantize cannot read them without a synchronization, so there they are the
  // caller's contract, as in a varlen attention call.
  TensorView cu_seqlens;
  int max_seqlen = 0;
};

// n, the size of the Hadamard blocks for `head_dim` (its largest power-of-two divisor).
int hadamard_size(int head_dim);
// Whether column `column`'s sign is -1 for `seed` (a hash of both: reproducible anywhere).
bool hadamard_sign(std::uint64_t seed, int column);

// On the current CUDA device (all pointers device memory), enqueued on `stream`; one
// kernel launch. On any rejection nothing is written or enqueued. Its codes and scales
// equal cpu::quantize's bit for bit (tests/gpu/hopper/test_fp8_quantize.cpp, run on an
// H200).
Status quantize(const QuantizeArgs& args, cudaStream_t stream);

}  // namespace fa3::fp8

namespace fa3::cpu {

// fp8::quantize on host memory: the oracle of the GPU kernel.
Status quantize(const fp8::QuantizeArgs& args);

}  // namespace fa3::cpu
