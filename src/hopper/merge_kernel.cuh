// fa3 — the merge kernel: partial attention rows into their exact merge,
//   lse = log(sum_i exp(lse_i)),   out = sum_i exp(lse_i - lse) * out_i,   in fp32.
//
// Bandwidth is the whole cost (a few flops per value read), so: a group of lanes per
// (row, head) reads each part's row once, in 16-byte vectors where the layout allows,
// the lanes of the group interleaved so that each vector load of the group is one
// coalesced stretch of the row; the row's lse values are reduced once per row across the
// group, and each lane computes the weights of a few parts, handed to the others by
// shuffles. Parts come from a policy (hopper/merge_params.h): a list for
// merge_attention_states, the slices of one tensor for the split-KV combine.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "hopper/arch/ptx.cuh"
#include "hopper/convert.cuh"
#include "hopper/merge_params.h"

namespace fa3::hopper {

constexpr int kMergeThreads = 128;
// Vectors each lane accumulates per pass over the parts: a row longer than
// kMergeChunks * lanes * vector takes more passes, recomputing the weights.
constexpr int kMergeChunks = 4;

namespace merge_detail {

// N values moved as one access: 16 bytes of fp32 or 16-bit values, or one value.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

__device__ inline std::int64_t row_offset(const std::int64_t* stride, std::int64_t b, std::int64_t s, std::int64_t h) {
  return b * stride[0] + s * stride[1] + h * stride[2];
}

// A row's (batch, seq, head). A 64-bit division is a software routine of tens of
// instructions, and a row costs only a few per value otherwise: 32-bit ones wherever
// the row count allows.
__device__ inline void split_row(std::int64_t row, const MergeShape& shape, std::int64_t* b, std::int64_t* s,
                                 std::int64_t* h) {
  if (shape.rows <= 0x7fffffff) {
    const unsigned r = static_cast<unsigned>(row);
    const unsigned heads = static_cast<unsigned>(shape.extent[2]);
    const unsigned seqs = static_cast<unsigned>(shape.extent[1]);
    const unsigned q = r / heads;
    *h = r - q * heads;
    *s = q % seqs;
    *b = q / seqs;
  } else {
    *h = row % shape.extent[2];
    *s = row / shape.extent[2] % shape.extent[1];
    *b = row / shape.extent[2] / shape.extent[1];
  }
}

// Adds w times the lane's values of one part's row, held as `In`, to acc: kMergeChunks
// accesses of kVec values, the lanes of the group interleaved.
template <class In, int kVec>
__device__ inline void accumulate_part(const void* row, std::int64_t stride_d, std::int64_t d0, std::int64_t head_dim,
                                       int lane, int lanes, float w, float (&acc)[kMergeChunks][kVec]) {
  const In* in = static_cast<const In*>(row);
#pragma unroll
  for (int k = 0; k < kMergeChunks; ++k) {
    const std::int64_t d = d0 + (static_cast<std::int64_t>(k) * lanes + lane) * kVec;
    if (d >= head_dim) break;
    const Pack<In, kVec> v = *reinterpret_cast<const Pack<In, kVec>*>(in + d * stride_d);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[k][e] = fmaf(w, to_float(v.v[e]), acc[k][e]);
  }
}

// The weighted sum over parts that are all fp32 (the split-KV combine's), kBatch parts
// at a time, kChunks of the lane's vectors of each: their loads are issued together,
// each predicated rather than behind a branch, and added once all have arrived. One
// part at a time, a combine of 16 small parts took a load latency per part; a row that
// one vector per lane covers (decode's, head dim up to 128) of more than four parts
// takes 16 at a time (merge_kernel). A part of weight 0 saw no key of the row: its values, whatever they
// hold (NaN included), count as 0; they are read all the same, every part's row being
// memory of the call.
template <int kVec, int kChunks, int kBatch, class Parts, class WeightOf>
__device__ inline void accumulate_fp32_parts(const Parts& parts, WeightOf weight_of, int count, std::int64_t b,
                                             std::int64_t s, std::int64_t h, std::int64_t d0, std::int64_t head_dim,
                                             unsigned group, int lane, int lanes, float (&acc)[kMergeChunks][kVec]) {
  static_assert(kChunks <= kMergeChunks);
  for (int c = 0; c < count; c += lanes) {
    // Lane j holds part c + j's weight.
    const float mine = c + lane < count ? weight_of(c + lane) : 0.f;
    const int here = min(lanes, count - c);
    for (int j0 = 0; j0 < here; j0 += kBatch) {
      float w[kBatch];
      Pack<float, kVec> v[kBatch][kChunks];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        // Past the last part: the last part again, at weight 0.
        const int j = min(j0 + u, here - 1);
        const float wj = __shfl_sync(group, mine, j, lanes);
        w[u] = j0 + u < here ? wj : 0.f;
        const MergePart part = parts.get(c + j);
        const float* row = static_cast<const float*>(part.out.data) + row_offset(part.out.stride, b, s, h);
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const std::int64_t d = d0 + (static_cast<std::int64_t>(k) * lanes + lane) * kVec;
          v[u][k] = d < head_dim ? *reinterpret_cast<const Pack<float, kVec>*>(row + d * part.out.stride_d)
                                 : Pack<float, kVec>{};
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[k][e] = fmaf(w[u], w[u] == 0.f ? 0.f : v[u][k].v[e], acc[k][e]);
        }
      }
    }
  }
}

}  // namespace merge_detail

// Parts hold fp32, fp16 or bf16 values, each its own (their count, type and location
// from `Parts`), the result `Out`; each lane moves kVec values per access: 16 bytes of
// the widest type of the call, or 1 value where the layout is not 16-byte aligned.
template <class Parts, class Out, int kVec>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const __grid_constant__ MergeParams<Parts> p) {
  using namespace merge_detail;
  // Launched as a programmatic dependent (merge.cu): the parts may still be being written.
  arch::wait_grid_dependencies();
  // lanes is a power of two: shifts and masks, not divisions.
  const int lanes = p.shape.lanes_per_row;
  const int shift = __ffs(lanes) - 1;
  const int lane = threadIdx.x & (lanes - 1);
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (kMergeThreads >> shift) + static_cast<int>(threadIdx.x >> shift);
  // A whole group shares its row, so it leaves together and its shuffles stay complete.
  if (row >= p.shape.rows) return;
  const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << ((threadIdx.x % 32) & ~(lanes - 1));
  std::int64_t b, s, h;
  split_row(row, p.shape, &b, &s, &h);
  const int parts = p.parts.count;
  auto lse_of = [&](int i) {
    const RowScalars lse = p.parts.get(i).lse;
    return lse.data[row_offset(lse.stride, b, s, h)];
  };

  // The largest partial lse keeps every exp() in range.
  float max = -INFINITY;
  for (int i = lane; i < parts; i += lanes) max = fmaxf(max, lse_of(i));
  for (int o = lanes / 2; o > 0; o >>= 1) max = fmaxf(max, __shfl_xor_sync(group, max, o, lanes));

  Out* out = static_cast<Out*>(const_cast<void*>(p.out.data)) + row_offset(p.out.stride, b, s, h);
  const std::int64_t head_dim = p.shape.head_dim;
  const std::int64_t pass = static_cast<std::int64_t>(lanes) * kVec * kMergeChunks;
  float lse = -INFINITY;
  if (max == -INFINITY) {
    // No part saw a key of this row: 0, not the NaN of exp(-inf - -inf).
    Pack<Out, kVec> zero;
    for (int e = 0; e < kVec; ++e) zero.v[e] = from_float<Out>(0.f);
    for (std::int64_t d = static_cast<std::int64_t>(lane) * kVec; d < head_dim;
         d += static_cast<std::int64_t>(lanes) * kVec) {
      *reinterpret_cast<Pack<Out, kVec>*>(out + d * p.out.stride_d) = zero;
    }
  } else {
    float sum = 0.f;
    for (int i = lane; i < parts; i += lanes) sum += expf(lse_of(i) - max);
    for (int o = lanes / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(group, sum, o, lanes);
    lse = max + logf(sum);

    for (std::int64_t d0 = 0; d0 < head_dim; d0 += pass) {
      float acc[kMergeChunks][kVec] = {};
      if constexpr (Parts::kFloat32Only) {
        if constexpr (kVec * sizeof(float) <= 16) {  // the launch picks kVec 8 only for calls without fp32
          const auto weight_of = [&](int i) { return expf(lse_of(i) - lse); };
          if (head_dim <= static_cast<std::int64_t>(lanes) * kVec && parts > 4) {
            accumulate_fp32_parts<kVec, 1, 16>(p.parts, weight_of, parts, b, s, h, d0, head_dim, group, lane, lanes,
                                               acc);
          } else {
            accumulate_fp32_parts<kVec, kMergeChunks, 4>(p.parts, weight_of, parts, b, s, h, d0, head_dim, group,
                                                         lane, lanes, acc);
          }
        }
      } else {
        for (int c = 0; c < parts; c += lanes) {
          // Lane j holds part c + j's weight; a part that saw no key of the row (weight 0)
          // is not read, so whatever it holds (NaN included) stays out.
          const float mine = c + lane < parts ? expf(lse_of(c + lane) - lse) : 0.f;
          const int here = min(lanes, parts - c);
          for (int j = 0; j < here; ++j) {
            const float w = __shfl_sync(group, mine, j, lanes);
            if (w == 0.f) continue;
            const MergePart part = p.parts.get(c + j);
            const std::int64_t at = row_offset(part.out.stride, b, s, h);
            // The type is the same for the whole group: the branch does not diverge.
            if (part.type == PartType::kFloat16) {
              accumulate_part<__half, kVec>(static_cast<const __half*>(part.out.data) + at, part.out.stride_d, d0,
                                            head_dim, lane, lanes, w, acc);
            } else if (part.type == PartType::kBFloat16) {
              accumulate_part<__nv_bfloat16, kVec>(static_cast<const __nv_bfloat16*>(part.out.data) + at,
                                                   part.out.stride_d, d0, head_dim, lane, lanes, w, acc);
            } else if constexpr (kVec * sizeof(float) <= 16) {
              // fp32: compiled out at kVec 8, which the launch picks only for calls without fp32.
              accumulate_part<float, kVec>(static_cast<const float*>(part.out.data) + at, part.out.stride_d, d0,
                                           head_dim, lane, lanes, w, acc);
            }
          }
        }
      }
      // Each lane writes only the values it read itself, after reading them from every
      // part: out may be a part's storage.
#pragma unroll
      for (int k = 0; k < kMergeChunks; ++k) {
        const std::int64_t d = d0 + (static_cast<std::int64_t>(k) * lanes + lane) * kVec;
        if (d >= head_dim) break;
        Pack<Out, kVec> o;
#pragma unroll
        for (int e = 0; e < kVec; ++e) o.v[e] = from_float<Out>(acc[k][e]);
        *reinterpret_cast<Pack<Out, kVec>*>(out + d * p.out.stride_d) = o;
      }
    }
  }
  // lse may be a part's storage too: every lane of the group has read it by now.
  __syncwarp(group);
  if (lane == 0 && p.lse.data != nullptr) {
    const_cast<float*>(p.lse.data)[row_offset(p.lse.stride, b, s, h)] = lse;
  }
}

}  // namespace fa3::hopper
