// The whole sequence of a ring backward test, on the current GPU: random inputs,
// fa3::forward's out and lse over all of it, the reference gradients, and the accuracy
// report of gradients put back in sequence order.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <vector>

#include "common/gpu_test_util.h"

namespace fa3::test {

struct RingCase {
  int world;
  std::int64_t batch, seqlen, nheads, nheads_kv, head_dim;
  bool causal;
  bool deterministic = false;
};

// Gradients in sequence order, dense fp32: dq, dk, dv.
using Gradients = std::array<std::vector<float>, kGradients>;

struct Whole {
  std::vector<__nv_bfloat16> q, k, v, dout, out;  // host copies, (batch, seqlen, heads, dim)
  std::vector<float> lse;                         // (batch, nheads, seqlen)
  DeviceBuffer buffers[9];                        // q, k, v, out, dout, lse, dq, dk, dv
  BackwardArgs args;                              // over them
  GradientReference ref;
};

// Fills `w` on the current device; skips the test when this build has no forward
// kernel for the case.
void make_whole(const RingCase& c, Whole* w);

// The rule's report of `grads` against w's reference (they pass through w's dq, dk and
// dv, as bf16: the gradients' own values).
BackwardReport compare_gradients(Whole& w, const Gradients& grads);

// fa3::backward on the whole sequence on the current device, and its report.
BackwardReport one_gpu_backward(Whole& w);

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer buf(host.size() * sizeof(T));
  EXPECT_EQ(cudaMemcpy(buf.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return buf;
}

// A contiguous bf16 view of (batch, len, heads, dim).
TensorView bf16_rows(void* data, std::int64_t batch, std::int64_t len, std::int64_t heads, std::int64_t dim);

}  // namespace fa3::test
