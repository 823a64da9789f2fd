// fa3 — the backward's preprocess kernel: for every query row, D = rowsum(dO∘O) and
// LSE·log2(e) in the layout the main kernel loads by query block (hopper/bwd_workspace.h);
// it also zeroes the dQ accumulator and the rest of the workspace that sums start from.
//
// One CTA per (query block, head, batch), a warp per row at a time: a lane reads 16
// bytes of dO and of O (head dims up to 256 fill at most one such load per lane). The
// row is V's head dim long (a multiple of 8), which may be less than kHeadDim.
// In a varlen call (kVarlen: a kernel family that carries the varlen paths) the grid
// covers max_seqlen_q's query blocks of every sequence; a CTA past its sequence's rows
// writes no statistics and clears no dQ block (the main kernel reads neither).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "hopper/bwd_params.h"
#include "hopper/bwd_seq.cuh"

namespace fa3::hopper {

inline constexpr int kBwdPreThreads = 256;

// What starts at 0 besides the dQ blocks (dK/dV sums, counters), spread over the grid.
__device__ __forceinline__ void zero_workspace_part(const BwdParams& p) {
  char* ws = static_cast<char*>(p.workspace);
  const std::int64_t zero_words = static_cast<std::int64_t>(p.layout.bytes - p.layout.zero_begin) / 16;
  uint4* zero = reinterpret_cast<uint4*>(ws + p.layout.zero_begin);
  const std::int64_t block = (static_cast<std::int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * gridDim.y * gridDim.z * kBwdPreThreads;
  for (std::int64_t i = block * kBwdPreThreads + threadIdx.x; i < zero_words; i += stride) zero[i] = make_uint4(0, 0, 0, 0);
}

template <class Element, int kBlockM, int kHeadDim, bool kVarlen>
__global__ void __launch_bounds__(kBwdPreThreads) bwd_preprocess(const __grid_constant__ BwdParams p) {
  static_assert(kHeadDim % 8 == 0 && kHeadDim / 8 <= 32, "one 16-byte load per lane and row");
  constexpr float kLog2e = 1.4426950408889634f;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  char* ws = static_cast<char*>(p.workspace);
  zero_workspace_part(p);
  const SeqBounds seq = seq_bounds<kVarlen>(p, batch);
  if (m_block * kBlockM >= seq.seqlen_q && is_varlen<kVarlen>(p)) return;
  const std::int64_t block = q_block_index<kBlockM, kVarlen>(p, batch, head, seq, m_block);
  float* lse_log2 = reinterpret_cast<float*>(ws + p.layout.lse_log2) + block * kBlockM;
  float* dpsum = reinterpret_cast<float*>(ws + p.layout.dpsum) + block * kBlockM;

  // A varlen call's rows are the sequence's from its first packed row (batch strides 0).
  const std::int64_t row0 = seq.offset_q;
  const auto* out = static_cast<const Element*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  const auto* dout = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  const float* lse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + row0 * p.lse_row_stride;
  for (int r = warp; r < kBlockM; r += kBwdPreThreads / 32) {
    const int row = m_block * kBlockM + r;
    float d = 0.f;
    const int col = lane * 8;
    if (row < seq.seqlen_q && col < p.head_dim_v) {
      const auto o = *reinterpret_cast<const uint4*>(out + (row0 + row) * p.o_row_stride + col);
      const auto g = *reinterpret_cast<const uint4*>(dout + (row0 + row) * p.do_row_stride + col);
      const Element* oe = reinterpret_cast<const Element*>(&o);
      const Element* ge = reinterpret_cast<const Element*>(&g);
      CUTE_UNROLL
      for (int i = 0; i < 8; ++i) d += static_cast<float>(oe[i]) * static_cast<float>(ge[i]);
    }
    CUTE_UNROLL
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) {
      // A row past the sequence end, or one that saw no key (LSE -inf), gets +inf: its
      // probabilities exp2(s - inf) are then 0 and its gradients too.
      float l = INFINITY;
      if (row < seq.seqlen_q) {
        const float row_lse = lse[row * p.lse_row_stride];
        if (row_lse != -INFINITY) l = row_lse * kLog2e;
      }
      lse_log2[r] = l;
      dpsum[r] = row < seq.seqlen_q ? d : 0.f;
    }
  }

  // This block's dQ partial sums start at 0.
  float4* dq = reinterpret_cast<float4*>(ws + p.layout.dq_accum) + block * kBlockM * kHeadDim / 4;
  for (int i = threadIdx.x; i < kBlockM * kHeadDim / 4; i += kBwdPreThreads) dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace fa3::hopper
