// fa3 — the ring backward's gradients (fa3/distributed.h): each step's block gradients by
// fa3::backward into the workspace's block buffers, added into the fp32 sums (dq's at
// home, the dk/dv sums that travel with their shard), and the sums written into the
// caller's gradients at the end. Apart from the NCCL steps, so that one GPU tests it.
#pragma once

#include <cuda_runtime_api.h>

#include "distributed/ring_backward_plan.h"
#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::distributed::detail {

// The workspace's gradient buffers, as views of the whole shard's shapes, contiguous.
struct GradientSums {
  ShardGradients block;  // one block's dq, dk and dv, in q's dtype
  TensorView dq;         // fp32
  TensorView dk[2];      // fp32, the two buffers of dk/dv sums (BackwardLayout::grads)
  TensorView dv[2];
  void* block_workspace = nullptr;  // the block calls' fa3::backward workspace
  std::size_t block_workspace_bytes = 0;
};
GradientSums gradient_sums(const RingBackwardArgs& args, const BackwardLayout& layout);

// fa3::backward on `block` of the K/V shard `kv`, into the block buffers' rows it covers.
Status block_backward(const RingBackwardArgs& args, const GradientSums& sums, const BlockView& block,
                      const KvShard& kv, cudaStream_t stream);

// The block's dq rows added into the dq sum. first: the sum holds nothing yet, and the
// block, which must cover every row, is copied in (the sum's memory is not read).
Status add_block_dq(const GradientSums& sums, const BlockView& block, bool first, cudaStream_t stream);

// The block's dk and dv rows added into the sums of buffer `buffer`; first as above.
Status add_block_dkv(const GradientSums& sums, const BlockView& block, int buffer, bool first, cudaStream_t stream);

// The dq sum into dq, and the dk/dv sums of buffer `buffer` into dk and dv (their dtype
// and strides).
Status write_dq(const GradientSums& sums, const TensorView& dq, cudaStream_t stream);
Status write_dkv(const GradientSums& sums, int buffer, const TensorView& dk, const TensorView& dv,
                 cudaStream_t stream);

}  // namespace fa3::distributed::detail
