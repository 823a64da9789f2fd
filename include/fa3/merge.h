// fa3 — exact merge of partial attention results.
//
// Attention over keys split into parts (ring attention's blocks, split-KV) gives per
// part an output and a logsumexp. With L = log(sum_i exp(lse_i)), the attention over
// all keys is out = sum_i exp(lse_i - L) * out_i and lse = L, exactly: this is the
// same rescaling the online softmax does between key tiles.
#pragma once

#include <vector>

#include "fa3/tensor.h"

namespace fa3 {

// Every part and the result share one layout, fa3's: outputs (batch, seqlen, nheads,
// head_dim) of one dtype (fp32, fp16 or bf16), logsumexps (batch, nheads, seqlen) fp32.
// Any non-negative strides. out and lse may be the storage of a part (same layout):
// each row is read completely before it is written.
struct MergeArgs {
  std::vector<TensorView> outs;  // at least one part
  std::vector<TensorView> lses;  // one per part, in the same order
  TensorView out;
  TensorView lse;
};

}  // namespace fa3
