// fa3 — the backward's preprocess kernel: for every query row, D = rowsum(dO∘O) and
// LSE·log2(e) in the layout the main kernel loads by query block (hopper/bwd_workspace.h);
// it also zeroes the dQ accumulator and the rest of the workspace that sums start from.
//
// One CTA per (query block, head, batch). A row belongs to a group of lanes, each
// reading 16 bytes of dO and of O (the group is the power of two of lanes that covers
// kHeadDim: 8 at head dim 64, 16 at 128, 32 at 256), and each thread issues the loads of
// its rows (four at a time) before it sums any: the kernel is bound by the bytes in
// flight. One row per warp at a time took 80-120 us at 16k tokens, this 66-73 us
// (docs/perf-log.md).
// The row is V's head dim long (a multiple of 8), which may be less than kHeadDim.
// In a varlen call (kVarlen: a kernel family that carries the varlen paths) the grid
// covers max_seqlen_q's query blocks of every sequence; a CTA past its sequence's rows
// writes no statistics and clears no dQ block (the main kernel reads neither).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include <cute/tensor.hpp>

#include "hopper/arch/ptx.cuh"
#include "hopper/bwd_config.h"
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

// Threads per row (a power of two, so that a row's lanes are one shuffle group) and
// rows per pass of the CTA's threads.
template <int kHeadDim>
inline constexpr int kBwdPreLanesPerRow = kHeadDim <= 64 ? 8 : kHeadDim <= 128 ? 16 : 32;

template <class Element, int kBlockM, int kHeadDim, bool kVarlen>
__global__ void __launch_bounds__(kBwdPreThreads) bwd_preprocess(const __grid_constant__ BwdParams p) {
  static_assert(kHeadDim % 8 == 0 && kHeadDim / 8 <= 32, "one 16-byte load per lane and row");
  constexpr int kLanes = kBwdPreLanesPerRow<kHeadDim>;
  constexpr int kRowsPerPass = kBwdPreThreads / kLanes;
  static_assert(kBlockM % kRowsPerPass == 0, "whole passes");
  constexpr int kPasses = kBlockM / kRowsPerPass;
  constexpr float kLog2e = 1.4426950408889634f;
  // The main kernel may launch once every CTA of this grid has started (kBwdPdl).
  if constexpr (kBwdPdl) arch::launch_dependent_grids();
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int group_row = threadIdx.x / kLanes, col = threadIdx.x % kLanes * 8;
  const bool leader = threadIdx.x % kLanes == 0;
  char* ws = static_cast<char*>(p.workspace);
  zero_workspace_part(p);
  const SeqBounds seq = seq_bounds<kVarlen>(p, batch);
  if (m_block * kBlockM >= seq.seqlen_q && is_varlen<kVarlen>(p)) return;
  const std::int64_t block = q_block_index<kBlockM, kVarlen>(p, batch, head, seq, m_block);

  // A varlen call's rows are the sequence's from its first packed row (batch strides 0).
  const int first_row = m_block * kBlockM + group_row;
  const std::int64_t row0 = seq.offset_q + first_row;
  const auto* out = static_cast<const Element*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride +
                    row0 * p.o_row_stride + col;
  const auto* dout = static_cast<const Element*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride +
                     row0 * p.do_row_stride + col;
  const float* lse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + row0 * p.lse_row_stride;
  const bool col_valid = col < p.head_dim_v;
  float4* dq = reinterpret_cast<float4*>(ws + p.layout.dq_accum) + block * kBlockM * kHeadDim / 4;
  float* lse_log2 = reinterpret_cast<float*>(ws + p.layout.lse_log2) + block * kBlockM;
  float* dpsum = reinterpret_cast<float*>(ws + p.layout.dpsum) + block * kBlockM;
  // Rows in rounds of at most four per thread: eight (head dims above 128) took 160
  // registers a thread, one CTA an SM.
  constexpr int kRound = kPasses < 4 ? kPasses : 4;
  static_assert(kPasses % kRound == 0, "whole rounds: a partial one would reach the next block's rows");
  CUTE_UNROLL
  for (int first = 0; first < kPasses; first += kRound) {
    uint4 o[kRound], g[kRound];
    float row_lse[kRound];
    CUTE_UNROLL
    for (int i = 0; i < kRound; ++i) {
      const int pass = first + i;
      const bool row_valid = first_row + pass * kRowsPerPass < seq.seqlen_q;
      o[i] = g[i] = make_uint4(0, 0, 0, 0);
      if (row_valid && col_valid) {
        o[i] = *reinterpret_cast<const uint4*>(out + pass * kRowsPerPass * p.o_row_stride);
        g[i] = *reinterpret_cast<const uint4*>(dout + pass * kRowsPerPass * p.do_row_stride);
      }
      row_lse[i] = row_valid && leader ? lse[pass * kRowsPerPass * p.lse_row_stride] : -INFINITY;
    }
    if (first == 0) {
      // This block's dQ partial sums start at 0 (stores, issued while the loads are out).
      for (int i = threadIdx.x; i < kBlockM * kHeadDim / 4; i += kBwdPreThreads) dq[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    CUTE_UNROLL
    for (int i = 0; i < kRound; ++i) {
      const Element* oe = reinterpret_cast<const Element*>(&o[i]);
      const Element* ge = reinterpret_cast<const Element*>(&g[i]);
      float d = 0.f;
      CUTE_UNROLL
      for (int e = 0; e < 8; ++e) d += static_cast<float>(oe[e]) * static_cast<float>(ge[e]);
      CUTE_UNROLL
      for (int lanes = kLanes / 2; lanes > 0; lanes >>= 1) d += __shfl_xor_sync(0xffffffffu, d, lanes);
      if (leader) {
        // A row past the sequence end, or one that saw no key (LSE -inf), gets +inf: its
        // probabilities exp2(s - inf) are then 0 and its gradients too.
        const int r = group_row + (first + i) * kRowsPerPass;
        lse_log2[r] = row_lse[i] != -INFINITY ? row_lse[i] * kLog2e : INFINITY;
        dpsum[r] = first_row + (first + i) * kRowsPerPass < seq.seqlen_q ? d : 0.f;
      }
    }
  }
}

}  // namespace fa3::hopper
