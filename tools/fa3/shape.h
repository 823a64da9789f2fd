// fa3 program — one attention problem as the command line describes it, and the views
// of it over buffers (fa3's layout, contiguous).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fa3/attention.h"

namespace fa3::cli {

// out's dtype for inputs of `dtype`: the same, or bf16 for e4m3 (FP8) inputs.
inline DType output_dtype(DType dtype) { return dtype == DType::kFloat8E4M3 ? DType::kBFloat16 : dtype; }

struct AttentionShape {
  std::int64_t batch = 1;
  std::int64_t seqlen_q = 512;
  std::int64_t seqlen_k = 512;
  std::int64_t nheads_q = 8;
  std::int64_t nheads_kv = 8;
  std::int64_t head_dim = 128;
  std::int64_t head_dim_v = 0;  // of v and out (and dout, dv); 0: head_dim
  DType dtype = DType::kBFloat16;
  AttentionOptions options;
  std::vector<float> sinks;  // attention sinks, one per query head; empty: none

  std::int64_t value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }

  // Element counts (q and k; v; out); throw RunError when one does not fit in 64 bits
  // (sizes up to int32 each can multiply past it).
  std::int64_t q_elements() const;
  std::int64_t kv_elements() const;
  std::int64_t v_elements() const;
  std::int64_t out_elements() const;
  std::int64_t lse_elements() const;

  // "batch 1, seqlen_q 512, seqlen_k 512, nheads 8 (kv 8), head dim 128, bf16, causal",
  // with "head dim 192 (v 128)" when v's differs, then ", sinks 0.5" (every head's) or
  // ", sinks (0.5, -1, ...)" when there are sinks.
  std::string describe() const;
};

// Base pointers of the five tensors; q, k, v, out in the shape's dtype, lse fp32; and of
// the sinks (fp32), null without them.
struct TensorPointers {
  void* q = nullptr;
  void* k = nullptr;
  void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  float* sinks = nullptr;
};

// q (batch, seqlen_q, nheads_q, head_dim); k (batch, seqlen_k, nheads_kv, head_dim); v
// (batch, seqlen_k, nheads_kv, head_dim_v); out (batch, seqlen_q, nheads_q, head_dim_v);
// lse (batch, nheads_q, seqlen_q); sinks (nheads_q) when given; all contiguous.
ForwardArgs forward_args(const AttentionShape& shape, const TensorPointers& ptrs);

// Base pointers of the backward's own tensors, in the shape's dtype: dout like out, dq
// like q, dk like k and dv like v.
struct GradientPointers {
  void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// The forward's views of `ptrs` (its out, lse and sinks being the backward's inputs) with
// the gradients of `grads`, all contiguous; no workspace, and no dsinks: `fa3 run` checks
// dq, dk and dv.
BackwardArgs backward_args(const AttentionShape& shape, const TensorPointers& ptrs, const GradientPointers& grads,
                           bool deterministic);

// Element counts large enough for every shape it has grown to: one allocation serves a
// whole sweep.
struct TensorCapacity {
  std::int64_t q_elements = 0;
  std::int64_t kv_elements = 0;
  std::int64_t v_elements = 0;
  std::int64_t out_elements = 0;
  std::int64_t lse_elements = 0;

  void grow_to(const AttentionShape& shape);
};

}  // namespace fa3::cli
