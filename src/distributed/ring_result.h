// fa3 — the ring's running result (fa3/distributed.h): fp32 (out, lse) over the whole
// query shard, in the workspace; each block is merged into the rows it covers and the
// result is written into the caller's out and lse at the end, all by
// fa3::merge_attention_states (fa3/merge.h). Apart from the NCCL steps, so that one GPU
// tests it.
#pragma once

#include <cuda_runtime_api.h>

#include "distributed/ring_plan.h"
#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3::distributed::detail {

// fp32 out (batch, shard_len, nheads_q, head_dim_v) and lse (batch, nheads_q, shard_len),
// contiguous.
struct RunningResult {
  TensorView out, lse;
};
RunningResult running_result(const RingArgs& args, const WorkspaceLayout& layout);

// Merges a block's out and lse, views of rows q_half of the shard (any dtype merge.h
// takes, any strides), into the same rows of the running result, in place. first: the
// running result holds nothing yet, so the block, which must cover every row, is copied
// in (its memory is not read).
Status merge_block(const RunningResult& running, const TensorView& block_out, const TensorView& block_lse, Half q_half,
                   bool first, cudaStream_t stream);

// The running result into out (its dtype and strides) and lse (optional).
Status write_result(const RunningResult& running, const TensorView& out, const TensorView& lse, cudaStream_t stream);

}  // namespace fa3::distributed::detail
