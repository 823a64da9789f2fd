// fa3 — the backward's postprocess kernel: an fp32 accumulator block (dQ; with
// GQA/MQA also dK and dV) scaled, converted to the output dtype and written in place.
//
// The main kernel sums each block's partials in the order its consumer threads hold
// them (hopper/bwd_workspace.h), so this kernel runs one thread per consumer thread:
// thread t reads its own values with 16-byte loads, finds their (row, column) through
// the same tiled MMA, and drops them into a shared-memory tile, from which the block
// leaves in 16-byte row stores.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include <cute/tensor.hpp>

namespace fa3::hopper {

// Where a postprocess writes: a (rows, head_dim) slice of one head's output.
struct AccumTarget {
  const float* accum;      // the block's partial sums, kRows * kHeadDim floats
  void* out;               // the output at the block's first row
  std::int64_t row_stride;
  int rows;                // rows of the block inside the sequence
  int cols;                // the call's head dim (a multiple of 8, at most kHeadDim): columns to write
  float scale;
};

// kTransposed: the MMA's accumulator holds the block transposed (head dim as rows).
template <class Element, class TiledMma, int kRows, int kHeadDim, bool kTransposed>
__device__ void convert_accum_block(const AccumTarget& t) {
  using namespace cute;
  constexpr int kThreads = decltype(size(TiledMma{}))::value;
  constexpr int kPerWG = kRows * kHeadDim / (kThreads / 128);
  // Rows padded by 8 elements (16 bytes), so that the row stores below and the scattered
  // writes into the tile spread over the banks.
  constexpr int kPitch = kHeadDim + 8;
  __shared__ alignas(16) Element tile[kRows * kPitch];

  const int tid = threadIdx.x;
  TiledMma mma;
  auto thr = mma.get_thread_slice(tid);
  using TileShape = std::conditional_t<kTransposed, Shape<Int<kHeadDim>, Int<kRows>>, Shape<Int<kRows>, Int<kHeadDim>>>;
  Tensor coord = thr.partition_C(make_identity_tensor(TileShape{}));
  Tensor acc = partition_fragment_C(mma, TileShape{});
  static_assert(decltype(size(acc))::value % 4 == 0);
  const float4* src = reinterpret_cast<const float4*>(t.accum + (tid / 128) * kPerWG) + tid % 128;
  CUTE_UNROLL
  for (int i = 0; i < size(acc) / 4; ++i) {
    const float4 v = src[i * 128];
    acc(4 * i) = v.x;
    acc(4 * i + 1) = v.y;
    acc(4 * i + 2) = v.z;
    acc(4 * i + 3) = v.w;
  }
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) {
    const int row = kTransposed ? get<1>(coord(i)) : get<0>(coord(i));
    const int col = kTransposed ? get<0>(coord(i)) : get<1>(coord(i));
    tile[row * kPitch + col] = static_cast<Element>(acc(i) * t.scale);
  }
  __syncthreads();
  constexpr int kVecs = kHeadDim / 8;  // 16-byte vectors per row
  for (int i = tid; i < kRows * kVecs; i += kThreads) {
    const int row = i / kVecs, col = i % kVecs * 8;
    Element* out = static_cast<Element*>(t.out) + row * t.row_stride + col;
    if (row < t.rows && col < t.cols) {
      *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(&tile[row * kPitch + col]);
    }
  }
}

}  // namespace fa3::hopper
