// fa3 — what the merge kernel (hopper/merge_kernel.cuh) reads: the parts' and the
// result's addresses and strides, passed by value in the launch's parameter space.
//
// Both callers index their rows by (batch, seqlen, head): merge_attention_states' outputs
// are (batch, seqlen, nheads, head_dim) and its lses (batch, nheads, seqlen); the split-KV
// combine's (rows, nheads, head_dim) are batch 1 of `rows` positions. Every stride is in
// elements and 64-bit.
#pragma once

#include <cstdint>

namespace fa3::hopper {

// One tensor of rows: row (b, s, h) starts at data + b*stride[0] + s*stride[1] + h*stride[2],
// its d-th value is d*stride_d further on.
struct RowTensor {
  const void* data = nullptr;
  std::int64_t stride[3] = {0, 0, 0};
  std::int64_t stride_d = 1;
};

// One fp32 value per row, at data + b*stride[0] + s*stride[1] + h*stride[2].
struct RowScalars {
  const float* data = nullptr;
  std::int64_t stride[3] = {0, 0, 0};
};

// What a part's output values are; each part has its own (the ring merges a 16-bit
// block into an fp32 running result).
enum class PartType : std::uint8_t { kFloat32, kFloat16, kBFloat16 };

struct MergePart {
  RowTensor out;
  RowScalars lse;
  PartType type = PartType::kFloat32;
};

// merge_attention_states' parts: a list of independent tensors. Their descriptors live in
// the kernel's parameters, which CUDA caps (32 KiB), so one call takes at most kCapacity;
// a small capacity keeps the common two-part call's launch cheap.
template <int kCapacity>
struct ListedParts {
  static constexpr int kMax = kCapacity;
  static constexpr bool kFloat32Only = false;
  int count = 0;
  MergePart part[kCapacity];
  __host__ __device__ MergePart get(int i) const { return part[i]; }
};

// The combine's parts: the slices of one fp32 tensor along its first dimension, any
// number of them (`first.type` stays fp32).
struct SlicedParts {
  // Every part is fp32: the kernel reads them in batches, with no branch on the type.
  static constexpr bool kFloat32Only = true;
  int count = 0;
  MergePart first;
  std::int64_t out_step = 0;  // elements from one split's out_partial to the next
  std::int64_t lse_step = 0;  // the same for lse_partial
  __host__ __device__ MergePart get(int i) const {
    MergePart p = first;
    p.out.data = static_cast<const float*>(first.out.data) + i * out_step;
    p.lse.data = first.lse.data + i * lse_step;
    return p;
  }
};

// Rows, the result, and how the rows are spread over threads.
struct MergeShape {
  std::int64_t extent[3] = {0, 0, 0};  // batch, seqlen, heads
  std::int64_t rows = 0;               // their product
  std::int64_t head_dim = 0;
  // Lanes that merge one row together: a power of two up to 32, so that a lane's share
  // of a row is whole 16-byte vectors where it can be.
  int lanes_per_row = 32;
};

template <class Parts>
struct MergeParams {
  Parts parts;
  MergeShape shape;
  RowTensor out;   // written (const only in the type every tensor shares)
  RowScalars lse;  // written when data is not null
};

}  // namespace fa3::hopper
