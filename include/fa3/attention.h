// fa3 — exact attention: argument structs and entry points.
//
// Layout (FlashAttention's): q is (batch, seqlen_q, nheads_q, head_dim); k and v are
// (batch, seqlen_k, nheads_kv, head_dim); out is like q; lse is (batch, nheads_q,
// seqlen_q) in fp32, natural log. Every tensor's last dimension must be contiguous;
// the other strides are free (16-byte aligned for the GPU path).
//
// Masking follows FlashAttention 2/3: query i may see key j when
//   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
// a negative window side meaning "unbounded"; causal is window_right = 0, i.e. the mask is
// aligned to the bottom-right corner when seqlen_q != seqlen_k. A query row that sees no
// key gets output 0 and lse -inf.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"
#include "fa3/tensor.h"

namespace fa3 {

// Options shared by the forward and backward passes.
struct AttentionOptions {
  float softmax_scale = 0.f;  // 0 selects 1/sqrt(head_dim); otherwise must be finite and > 0
  bool causal = false;
  int window_left = -1;       // keys before the diagonal a query may see; -1: unbounded
  int window_right = -1;      // keys after the diagonal; -1: unbounded; causal means 0
  float softcap = 0.f;        // > 0: scores become softcap * tanh(scores / softcap)
};

struct ForwardArgs {
  TensorView q;
  TensorView k;
  TensorView v;
  TensorView out;  // written; same dtype as q
  TensorView lse;  // optional (data == nullptr to skip); written
  AttentionOptions options;
};

struct BackwardArgs {
  TensorView q;
  TensorView k;
  TensorView v;
  TensorView out;   // the forward's output
  TensorView dout;  // gradient of the loss with respect to out
  TensorView lse;   // the forward's lse
  TensorView dq;    // written; same dtype and shape as q
  TensorView dk;    // written; same dtype and shape as k
  TensorView dv;    // written; same dtype and shape as v
  AttentionOptions options;
  bool deterministic = false;
};

// Forward pass on the current CUDA device (a Hopper GPU), enqueued on `stream`.
// All pointers must be device memory of the current device. On any rejection no
// output is touched and nothing is enqueued.
Status forward(const ForwardArgs& args, cudaStream_t stream);

// Backward pass on the current CUDA device. Not implemented on the GPU yet:
// every call returns kNotSupported after validating its arguments.
Status backward(const BackwardArgs& args, cudaStream_t stream);

}  // namespace fa3
