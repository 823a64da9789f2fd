#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "distributed/ring_merge.h"

namespace fa3::distributed::detail {
namespace {

constexpr int kWarps = 8;  // one warp per (batch, row, head) of head_dim_v values

__device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ T from_float(float x);
template <>
__device__ __nv_bfloat16 from_float(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __half from_float(float x) {
  return __float2half(x);
}

// Row r of the grid: (b, s, h) with s counted within the block's rows.
struct RowIndex {
  std::int64_t b, s, h;
};
__device__ RowIndex row_index(std::int64_t r, std::int64_t rows, std::int64_t nheads) {
  const std::int64_t h = r % nheads;
  const std::int64_t s = (r / nheads) % rows;
  return {r / (nheads * rows), s, h};
}

template <class T>
__global__ void ring_merge_kernel(RingMergeArgs a) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= a.batch * a.rows * a.nheads) return;
  const RowIndex i = row_index(row, a.rows, a.nheads);
  const std::int64_t s = a.row0 + i.s;
  const std::int64_t lse_at = (i.b * a.nheads + i.h) * a.shard_len + s;
  const std::int64_t out_at = ((i.b * a.shard_len + s) * a.nheads + i.h) * a.head_dim_v;
  const T* block = static_cast<const T*>(a.block_out) + out_at;
  float* acc = a.acc_out + out_at;
  const float lse_block = a.block_lse[lse_at];
  const float lse_acc = a.first ? -INFINITY : a.acc_lse[lse_at];
  // reference::merge_row for two parts: the larger lse keeps exp() in range; a row no
  // part saw a key of stays 0 / -inf; a part of weight 0 is not read.
  const float max = fmaxf(lse_acc, lse_block);
  if (max == -INFINITY) {
    for (std::int64_t d = lane; d < a.head_dim_v; d += 32) acc[d] = 0.f;
    if (lane == 0) a.acc_lse[lse_at] = -INFINITY;
    return;
  }
  const float lse = max + logf(expf(lse_acc - max) + expf(lse_block - max));
  const float w_acc = expf(lse_acc - lse);
  const float w_block = expf(lse_block - lse);
  for (std::int64_t d = lane; d < a.head_dim_v; d += 32) {
    float value = 0.f;
    if (w_acc != 0.f) value += w_acc * acc[d];
    if (w_block != 0.f) value += w_block * to_float(block[d]);
    acc[d] = value;
  }
  if (lane == 0) a.acc_lse[lse_at] = lse;
}

template <class T>
__global__ void ring_finalize_kernel(RingFinalizeArgs a) {
  const std::int64_t batch = a.out.shape[0], shard_len = a.out.shape[1], nheads = a.out.shape[2];
  const std::int64_t head_dim_v = a.out.shape[3];
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= batch * shard_len * nheads) return;
  const RowIndex i = row_index(row, shard_len, nheads);
  const float* acc = a.acc_out + ((i.b * shard_len + i.s) * nheads + i.h) * head_dim_v;
  T* out = static_cast<T*>(a.out.data) + i.b * a.out.stride[0] + i.s * a.out.stride[1] + i.h * a.out.stride[2];
  for (std::int64_t d = lane; d < head_dim_v; d += 32) out[d] = from_float<T>(acc[d]);
  if (lane == 0 && a.lse.data != nullptr) {
    float* lse = static_cast<float*>(a.lse.data) + i.b * a.lse.stride[0] + i.h * a.lse.stride[1] + i.s * a.lse.stride[2];
    *lse = a.acc_lse[(i.b * nheads + i.h) * shard_len + i.s];
  }
}

unsigned blocks_for(std::int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

}  // namespace

cudaError_t launch_ring_merge(const RingMergeArgs& args, cudaStream_t stream) {
  const std::int64_t rows = args.batch * args.rows * args.nheads;
  if (rows == 0) return cudaSuccess;
  if (args.dtype == DType::kBFloat16) {
    ring_merge_kernel<__nv_bfloat16><<<blocks_for(rows), kWarps * 32, 0, stream>>>(args);
  } else {
    ring_merge_kernel<__half><<<blocks_for(rows), kWarps * 32, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

cudaError_t launch_ring_finalize(const RingFinalizeArgs& args, cudaStream_t stream) {
  const std::int64_t rows = args.out.shape[0] * args.out.shape[1] * args.out.shape[2];
  if (rows == 0) return cudaSuccess;
  if (args.out.dtype == DType::kBFloat16) {
    ring_finalize_kernel<__nv_bfloat16><<<blocks_for(rows), kWarps * 32, 0, stream>>>(args);
  } else {
    ring_finalize_kernel<__half><<<blocks_for(rows), kWarps * 32, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace fa3::distributed::detail
