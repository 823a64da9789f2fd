// fa3 — the naive reference: attention computed directly from its definition, on
// the CPU, in fp64 (or rounded like a low-precision implementation, for the
// accuracy rule's "low" result). The oracle for every test.
#pragma once

#include <cstdint>
#include <vector>

#include "api/problem.h"
#include "fa3/tensor.h"

namespace fa3::reference {

// How the reference rounds intermediates.
enum class Precision {
  kExact,       // fp64 throughout; inputs read exactly
  kLikeInputs,  // scores, probabilities and outputs rounded to the input dtype at the
                // points a naive low-precision implementation would round them
};

// Dense results in canonical layouts: out (batch, seqlen_q, nheads_q, head_dim_v),
// lse (batch, nheads_q, seqlen_q); fully masked rows: out 0, lse -inf (the row's sink
// with sinks).
struct ForwardResult {
  std::vector<double> out;
  std::vector<double> lse;
};

// q/k/v are host views (any strides, dtype fp32/fp16/bf16) laid out as in fa3::ForwardArgs.
// `sinks`, when defined, is a host view as in fa3::ForwardArgs::sinks; its values are
// fp32 inputs, read exactly in either precision.
ForwardResult forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      Precision precision = Precision::kExact, const TensorView& sinks = {});

// One query row of one head: the unit `fa3 run` samples to check large problems.
struct RowRef {
  std::int64_t batch = 0;
  std::int64_t head = 0;  // query head
  std::int64_t row = 0;   // query index
};

// The exact reference for selected rows only: out[i * head_dim_v + d] and lse[i] for
// rows[i]. Costs O(rows * seqlen_k * (head_dim + head_dim_v)), so it checks problems of
// any size.
ForwardResult forward_rows(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                           const std::vector<RowRef>& rows, const TensorView& sinks = {});

// dq (like q), dk (like k) and dv (like v, of head_dim_v) in canonical layouts; dsinks
// (one per query head) with sinks, empty without.
struct BackwardResult {
  std::vector<double> dq;
  std::vector<double> dk;
  std::vector<double> dv;
  std::vector<double> dsinks;
};

// Gradients of sum(out * dout); recomputes the forward internally.
BackwardResult backward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& dout, Precision precision = Precision::kExact,
                        const TensorView& sinks = {});

}  // namespace fa3::reference
