// fa3 — exact merge of partial attention results.
//
// Attention over keys split into parts (ring attention's blocks, split-KV) gives per
// part an output and a logsumexp. With L = log(sum_i exp(lse_i)), the attention over
// all keys is out = sum_i exp(lse_i - L) * out_i and lse = L, exactly: this is the
// same rescaling the online softmax does between key tiles.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3 {

// Every part and the result share one layout, fa3's: outputs (batch, seqlen, nheads,
// head_dim), each of its own dtype (fp32, fp16 or bf16: an fp32 running result may take
// in a 16-bit part, and a 1-part merge converts), logsumexps (batch, nheads, seqlen)
// fp32. The sums are fp32 whatever the dtypes. Any non-negative strides. out and lse may
// be the storage of a part (same layout): each row is read completely before it is
// written. fa3::cpu::merge_attention_states (fa3/cpu.h) merges host memory;
// merge_attention_states below device memory.
struct MergeArgs {
  std::vector<TensorView> outs;  // at least one part
  std::vector<TensorView> lses;  // one per part, in the same order
  TensorView out;
  TensorView lse;
};

// On the current CUDA device (a Hopper GPU), enqueued on `stream`: the same rules as
// fa3::cpu::merge_attention_states, with every tensor in the device's memory and at most
// 128 parts per call (the kernel's parameters carry each part's addresses; merge more in
// groups: a group's out and lse are a part of the next merge). A row whose lse is -inf
// in every part gives out 0 and lse -inf. Nothing is written when the call is rejected.
// Tensors whose values are contiguous and 16-byte aligned are read in 16-byte vectors,
// others one value at a time.
Status merge_attention_states(const MergeArgs& args, cudaStream_t stream);

}  // namespace fa3
