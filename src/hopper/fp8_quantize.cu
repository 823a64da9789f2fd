// fp8::quantize on the GPU: one kernel, one CTA per block of rows of one (batch, head).
// Each warp takes one row at a time, lane l holding columns l, l + 32, l + 64, ... in
// registers, so that the Hadamard butterfly's partners closer than 32 columns are in
// other lanes (a shuffle) and farther ones in the same lane (a register). The CTA makes
// two passes over its rows: the first transforms them and finds the block's absmax, the
// second transforms them again and stores the codes. Transforming twice costs head_dim
// * log2(n) adds per row, less than keeping a 128 x 256 fp32 block in shared memory
// would cost in occupancy; the second read mostly hits L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "common/hadamard.h"
#include "hopper/fp8_quantize.h"

namespace fa3::hopper {
namespace {

constexpr int kWarps = 4;
constexpr int kPerLane = 8;  // columns per lane: head_dim <= 256
constexpr unsigned kFullMask = 0xffffffffu;

struct QuantizeParams {
  const void* in;
  DType dtype;
  std::int64_t in_stride[3];  // batch, row, head (head_dim is contiguous); a varlen call's batch 0
  std::uint8_t* out;
  std::int64_t out_stride[3];
  float* scale;
  std::int64_t scale_stride[3];
  const int* cu_seqlens;  // a varlen call's: sequence b is rows [cu_seqlens[b], cu_seqlens[b + 1])
  std::int64_t seqlen;    // a fixed-length call's
  int head_dim;
  int block_rows;
  bool hadamard;
  std::uint64_t seed;
  float norm;  // 1/sqrt(n), rounded to fp32 once on the host, as the CPU version does
};

__device__ float load(const void* base, std::int64_t i, DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kFloat16: return __half2float(static_cast<const __half*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

// The input row at element `base` through step 1 of fa3/fp8.h: y[k] holds column
// k * 32 + lane (0 past head_dim). Every add, subtract and multiply is an explicit round-to-nearest intrinsic,
// so that no contraction makes the result differ from the CPU version's.
__device__ void load_row(const QuantizeParams& p, std::int64_t base, float (&y)[kPerLane]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = k * 32 + lane;
    y[k] = c < p.head_dim ? load(p.in, base + c, p.dtype) : 0.f;
  }
  if (!p.hadamard) return;
  const int n = hadamard::block_size(p.head_dim);
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int c = k * 32 + lane;
    if (c < p.head_dim && hadamard::negative(p.seed, c)) y[k] = -y[k];
  }
  // Stages h = 1 .. 16: the partner is lane ^ h. The lower one keeps a + b, the upper
  // one a - b, a being the lower partner's value.
#pragma unroll
  for (int hh = 1; hh < 32; hh *= 2) {
    if (hh >= n) break;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const float other = __shfl_xor_sync(kFullMask, y[k], hh);
      y[k] = (lane & hh) ? __fsub_rn(other, y[k]) : __fadd_rn(y[k], other);
    }
  }
  // Stages h = 32, 64, 128: the partner is register k ^ (h / 32) of the same lane.
#pragma unroll
  for (int kh = 1; kh < kPerLane; kh *= 2) {
    if (32 * kh >= n) break;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if ((k & kh) != 0 || k + kh >= kPerLane) continue;
      const float a = y[k], bb = y[k + kh];
      y[k] = __fadd_rn(a, bb);
      y[k + kh] = __fsub_rn(a, bb);
    }
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) y[k] = __fmul_rn(y[k], p.norm);
}

__global__ void __launch_bounds__(kWarps * 32) fp8_quantize_kernel(const QuantizeParams p) {
  const std::int64_t blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  // The (batch, head)'s row 0: a varlen sequence's first row, whose blocks past its rows
  // hold none (scale 1).
  const std::int64_t first = p.cu_seqlens != nullptr ? p.cu_seqlens[b] : 0;
  const std::int64_t seqlen = p.cu_seqlens != nullptr ? p.cu_seqlens[b + 1] - first : p.seqlen;
  const std::int64_t in_base = b * p.in_stride[0] + first * p.in_stride[1] + h * p.in_stride[2];
  const std::int64_t out_base = b * p.out_stride[0] + first * p.out_stride[1] + h * p.out_stride[2];
  const std::int64_t r0 = blk * p.block_rows;
  const std::int64_t r1 = r0 + p.block_rows < seqlen ? r0 + p.block_rows : seqlen;
  float y[kPerLane];

  float absmax = 0.f;
  for (std::int64_t r = r0 + warp; r < r1; r += kWarps) {
    load_row(p, in_base + r * p.in_stride[1], y);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      if (k * 32 + lane < p.head_dim) absmax = fmaxf(absmax, fabsf(y[k]));
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) absmax = fmaxf(absmax, __shfl_xor_sync(kFullMask, absmax, off));
  __shared__ float warp_max[kWarps];
  if (lane == 0) warp_max[warp] = absmax;
  __syncthreads();
  absmax = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) absmax = fmaxf(absmax, warp_max[w]);

  const float inv = absmax > 0.f ? __fdiv_rn(fp8::kE4m3Max, absmax) : 1.f;
  if (threadIdx.x == 0) {
    p.scale[b * p.scale_stride[0] + h * p.scale_stride[1] + blk * p.scale_stride[2]] =
        absmax > 0.f ? __fdiv_rn(absmax, fp8::kE4m3Max) : 1.f;
  }
  for (std::int64_t r = r0 + warp; r < r1; r += kWarps) {
    load_row(p, in_base + r * p.in_stride[1], y);
    std::uint8_t* row = p.out + out_base + r * p.out_stride[1];
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int c = k * 32 + lane;
      if (c < p.head_dim) row[c] = __nv_cvt_float_to_fp8(__fmul_rn(y[k], inv), __NV_SATFINITE, __NV_E4M3);
    }
  }
}

}  // namespace

cudaError_t launch_fp8_quantize(const fp8::QuantizeArgs& a, cudaStream_t stream) {
  QuantizeParams p;
  p.in = a.input.data;
  p.dtype = a.input.dtype;
  p.out = static_cast<std::uint8_t*>(a.output.data);
  p.scale = static_cast<float*>(a.scale.data);
  // A varlen call's packed (total, nheads, head_dim) tensors: no batch stride.
  const bool packed = a.cu_seqlens.defined();
  for (int d = 0; d < 3; ++d) {
    p.in_stride[d] = packed ? (d == 0 ? 0 : a.input.stride[d - 1]) : a.input.stride[d];
    p.out_stride[d] = packed ? (d == 0 ? 0 : a.output.stride[d - 1]) : a.output.stride[d];
    p.scale_stride[d] = a.scale.stride[d];
  }
  p.cu_seqlens = static_cast<const int*>(a.cu_seqlens.data);
  p.seqlen = packed ? a.max_seqlen : a.input.shape[1];
  p.head_dim = static_cast<int>(a.input.shape[a.input.rank - 1]);
  p.block_rows = a.block_rows;
  p.hadamard = a.hadamard;
  p.seed = a.seed;
  p.norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hadamard::block_size(p.head_dim))));
  // Blocks of the longest sequence (a varlen call's max_seqlen) for each (head, batch).
  const dim3 grid(static_cast<unsigned>((p.seqlen + a.block_rows - 1) / a.block_rows),
                  static_cast<unsigned>(a.scale.shape[1]), static_cast<unsigned>(a.scale.shape[0]));
  if (grid.x == 0) return cudaSuccess;  // sequences of no rows: no block, nothing to write
  fp8_quantize_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace fa3::hopper
