// fa3 — the ring's device merges: each block's (out, lse) into the running fp32 result,
// and the running result into the caller's out and lse at the end. The merge is
// fa3/merge.h's exact rule for two parts, as reference/lse_merge.h computes it on the
// host; a private kernel until the library's merge of attention states runs on the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa3/tensor.h"

namespace fa3::distributed::detail {

// The running result and one block's, contiguous, over the whole shard: outputs
// (batch, shard_len, nheads, head_dim_v), lse (batch, nheads, shard_len). The block
// covers query rows [row0, row0 + rows); first: the running result is empty (its
// memory is not read), so the block's is copied into it.
struct RingMergeArgs {
  float* acc_out;
  float* acc_lse;
  const void* block_out;  // `dtype`
  const float* block_lse;
  DType dtype;
  std::int64_t batch, shard_len, nheads, head_dim_v;
  std::int64_t row0, rows;
  bool first;
};
cudaError_t launch_ring_merge(const RingMergeArgs& args, cudaStream_t stream);

// out (the caller's strided view, its dtype) and lse (optional) from the running result.
struct RingFinalizeArgs {
  const float* acc_out;
  const float* acc_lse;
  TensorView out;
  TensorView lse;
};
cudaError_t launch_ring_finalize(const RingFinalizeArgs& args, cudaStream_t stream);

}  // namespace fa3::distributed::detail
