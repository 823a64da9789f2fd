// fa3 — the exact merge of partial attention results on the GPU, for
// fa3::merge_attention_states (fa3/merge.h) and the split-KV combine (fa3/kvcache.h):
// one kernel (hopper/merge_kernel.cuh), its parts given as a list or as the slices of
// one tensor. Plain C++: the API layer includes this, not the kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "api/validate_kvcache.h"
#include "fa3/merge.h"
#include "fa3/status.h"

namespace fa3::hopper {

// The most parts one merge_attention_states call takes on the GPU: each part's addresses
// and strides travel in the kernel's parameters, whose size CUDA caps.
constexpr std::size_t kMaxMergeParts = 128;

// Enqueue the merge on `stream`; the arguments must have passed validate_merge() for
// the device (every pointer device memory of the current device).
Status launch_merge(const MergeArgs& args, cudaStream_t stream);

// Enqueue the combine on `stream`; `problem` comes from validate_combine().
Status launch_combine(const CombineProblem& problem, const CombineArgs& args, cudaStream_t stream);

// Enqueue the merge of the KV-cache kernel's splits: out_partial (num_splits, batch,
// seqlen, nheads, head_dim) and lse_partial (num_splits, batch, seqlen, nheads), fp32
// and contiguous, into out (batch, seqlen, nheads, head_dim) and the optional lse
// (batch, nheads, seqlen), as forward_with_kvcache has them.
Status launch_split_merge(const float* out_partial, const float* lse_partial, int num_splits, const TensorView& out,
                          const TensorView& lse, cudaStream_t stream);

}  // namespace fa3::hopper
