#include "hopper/bwd_sinks.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) sinks_grad_kernel(const __grid_constant__ BwdParams p) {
  const int head = blockIdx.x;
  const float sink = p.sinks[head * p.sinks_stride];
  const float* dpsum = reinterpret_cast<const float*>(static_cast<const char*>(p.workspace) + p.layout.dpsum);
  // Each thread a fixed set of rows, then a fixed reduction tree: the same sum every run.
  float sum = 0.f;
  if (sink != -INFINITY && is_varlen(p)) {
    // Sequence by sequence: its rows at its first packed row, its statistics at its first
    // block (hopper/bwd_workspace.h).
    const int block_m = p.layout.block_m;
    for (int b = 0; b < p.batch; ++b) {
      const SeqBounds seq = seq_bounds(p, b);
      const std::int64_t stats = (head * p.layout.q_blocks + first_block(seq.offset_q, b, block_m)) * block_m;
      for (int row = threadIdx.x; row < seq.seqlen_q; row += kThreads) {
        const float lse = p.lse[head * p.lse_head_stride + (seq.offset_q + row) * p.lse_row_stride];
        sum += expf(sink - lse) * dpsum[stats + row];
      }
    }
  } else if (sink != -INFINITY) {
    const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.seqlen_q;
    for (std::int64_t i = threadIdx.x; i < rows; i += kThreads) {
      const std::int64_t b = i / p.seqlen_q, row = i % p.seqlen_q;
      const float lse = p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + row * p.lse_row_stride];
      const float d = dpsum[(b * p.nheads_q + head) * p.layout.q_rows + row];
      sum += expf(sink - lse) * d;
    }
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    p.dsinks[head * p.dsinks_stride] = -total;
  }
}

}  // namespace

Status launch_sinks_grad(const BwdParams& p, cudaStream_t stream) {
  if (p.dsinks == nullptr) return Status::ok();
  sinks_grad_kernel<<<p.nheads_q, kThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string("backward sinks' gradient launch: ") + cudaGetErrorString(err)};
}

}  // namespace fa3::hopper
