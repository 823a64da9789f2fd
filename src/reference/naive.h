// fa3 — the naive reference: attention computed directly from its definition, on
// the CPU, in fp64 (or rounded like a low-precision implementation, for the
// accuracy rule's "low" result). The oracle for every test.
#pragma once

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

// Dense results in canonical layouts: out (batch, seqlen_q, nheads_q, head_dim),
// lse (batch, nheads_q, seqlen_q); fully masked rows: out 0, lse -inf.
struct ForwardResult {
  std::vector<double> out;
  std::vector<double> lse;
};

// q/k/v are host views (any strides, dtype fp32/fp16/bf16) laid out as in fa3::ForwardArgs.
ForwardResult forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      Precision precision = Precision::kExact);

// dq (like q), dk and dv (like k/v) in canonical layouts.
struct BackwardResult {
  std::vector<double> dq;
  std::vector<double> dk;
  std::vector<double> dv;
};

// Gradients of sum(out * dout); recomputes the forward internally.
BackwardResult backward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& dout, Precision precision = Precision::kExact);

}  // namespace fa3::reference
