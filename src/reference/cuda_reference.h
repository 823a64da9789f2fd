// fa3 — the simple CUDA reference: every feature, fp32 accumulation, no attempt at
// speed. GPU tests use it as the oracle for shapes too large for the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include "api/problem.h"
#include "fa3/status.h"
#include "fa3/tensor.h"
#include "reference/naive.h"

namespace fa3::reference {

// q/k/v: device views laid out as in fa3::ForwardArgs (fp16/bf16/fp32).
// out: device fp32 (batch, seqlen_q, nheads_q, head_dim), contiguous.
// lse: device fp32 (batch, nheads_q, seqlen_q), contiguous; may be null.
// kLikeInputs rounds scores, probabilities and out to the input dtype.
Status cuda_forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, float* out,
                    float* lse, Precision precision, cudaStream_t stream);

}  // namespace fa3::reference
