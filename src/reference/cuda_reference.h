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
// sinks: device fp32 (nheads_q), contiguous; may be null (no sinks). fa3/attention.h
// defines them; their values are read exactly in either precision.
// out: device fp32 (batch, seqlen_q, nheads_q, head_dim_v), contiguous.
// lse: device fp32 (batch, nheads_q, seqlen_q), contiguous; may be null.
// kLikeInputs rounds scores, probabilities and out to the input dtype.
Status cuda_forward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v, const float* sinks,
                    float* out, float* lse, Precision precision, cudaStream_t stream);

// Gradients of sum(out * dout), as reference::backward defines them: the forward is
// recomputed here (cuda_forward), so out, lse and D = rowsum(dout * out) are the
// reference's own, not a kernel's.
// q/k/v/dout: device views laid out as in fa3::BackwardArgs (fp16/bf16/fp32); sinks
// as in cuda_forward.
// dq: device fp32 (batch, seqlen_q, nheads_q, head_dim); dk: device fp32 (batch,
// seqlen_k, nheads_kv, head_dim); dv: device fp32 (batch, seqlen_k, nheads_kv,
// head_dim_v); all contiguous. A KV head's dk and dv are
// summed over the query heads of its group; rows that see no key get zero gradients.
// dsinks: device fp32 (nheads_q); may be null (not computed), and is only computed
// with sinks: each head's sum over the rows of every batch, in fp32 in either precision.
// kLikeInputs rounds scores, P, out, dP, dS and the gradients to the input dtype, where
// reference::backward rounds them. Scratch memory is allocated and freed in `stream`'s
// order (cudaMallocAsync).
Status cuda_backward(const Problem& p, const TensorView& q, const TensorView& k, const TensorView& v,
                     const float* sinks, const TensorView& dout, float* dq, float* dk, float* dv, float* dsinks,
                     Precision precision, cudaStream_t stream);

}  // namespace fa3::reference
