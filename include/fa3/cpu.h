// fa3 — the CPU path: the same arguments as the GPU entry points, on host memory.
//
// forward() runs a tiled, multi-threaded online-softmax implementation (fp32
// accumulation), the path the `fa3` program uses when no GPU is present.
// backward() runs the exact reference (fp64 accumulation); it is slow and meant for
// checking results, not for training. Both take attention sinks, a V head dim that
// differs from q's and k's, and variable-length batches (ForwardArgs::varlen), whose
// index tensors they read on the host (fa3/attention.h). forward_with_kvcache and combine
// run the calls of fa3/kvcache.h; forward_with_kvcache reads its index tensors on the host
// too, ignores num_splits (its result never depends on it) and appends to the cache
// before it attends. merge_attention_states() combines partial results (fa3/merge.h) in
// fp32.
#pragma once

#include "fa3/attention.h"
#include "fa3/kvcache.h"
#include "fa3/merge.h"

namespace fa3::cpu {

struct Options {
  int num_threads = 0;  // 0: one per hardware thread
};

// Supported dtypes: fp32, fp16, bf16 (all tensors of q/k/v/out share one; lse is fp32);
// forward() also e4m3 q, k, v with their Fp8Args scales and a bf16 or fp16 out, with the
// FP8 kernel's numerics (fa3/attention.h; not in varlen calls).
Status forward(const ForwardArgs& args, const Options& options = {});
Status backward(const BackwardArgs& args, const Options& options = {});
Status forward_with_kvcache(const KvCacheArgs& args, const Options& options = {});
Status combine(const CombineArgs& args);

// Writes args.out and args.lse from the parts. A row whose lse is -inf in every part
// (it saw no key anywhere) gives out 0 and lse -inf.
Status merge_attention_states(const MergeArgs& args);

}  // namespace fa3::cpu
