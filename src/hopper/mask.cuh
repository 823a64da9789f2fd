// fa3 — mask policies. A policy answers three questions for a (query block, key
// block) tile: which key blocks a query block needs at all, whether a tile needs
// element-wise masking, and which (row, col) pairs are visible. Columns past the
// sequence end are always masked: their keys are TMA's zero fill, and a zero score
// is not "no score".
#pragma once

#include <cute/tensor.hpp>

#include "hopper/fwd_params.h"

namespace fa3::hopper {

// Non-causal: every key is visible; only the sequence end is masked.
struct NoMask {
  static constexpr bool kCausal = false;
  int seqlen_q;
  int seqlen_k;

  __device__ explicit NoMask(const FwdParams& p) : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}

  template <int kBlockM, int kBlockN>
  __device__ int n_block_end(int /*m_block*/) const {
    return (seqlen_k + kBlockN - 1) / kBlockN;
  }
  template <int kBlockM, int kBlockN>
  __device__ bool needs_mask(int /*m_block*/, int n_block) const {
    return (n_block + 1) * kBlockN > seqlen_k;
  }
  __device__ bool visible(int /*row*/, int col) const { return col < seqlen_k; }
};

// Causal, aligned to the bottom-right corner: row i sees keys j <= i + seqlen_k - seqlen_q.
struct CausalMask {
  static constexpr bool kCausal = true;
  int seqlen_q;
  int seqlen_k;

  __device__ explicit CausalMask(const FwdParams& p) : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}

  template <int kBlockM, int kBlockN>
  __device__ int n_block_end(int m_block) const {
    // One past the last key the block's last row sees; may be <= 0 (no key at all).
    const int last_key_end = (m_block + 1) * kBlockM + seqlen_k - seqlen_q;
    const int end = last_key_end < seqlen_k ? last_key_end : seqlen_k;
    return end <= 0 ? 0 : (end + kBlockN - 1) / kBlockN;
  }
  template <int kBlockM, int kBlockN>
  __device__ bool needs_mask(int m_block, int n_block) const {
    // The block's first row sees up to key m_block*BM + sk - sq: any later column needs masking.
    return (n_block + 1) * kBlockN > seqlen_k ||
           (n_block + 1) * kBlockN - 1 > m_block * kBlockM + seqlen_k - seqlen_q;
  }
  __device__ bool visible(int row, int col) const { return col < seqlen_k && col <= row + seqlen_k - seqlen_q; }
};

// Sets masked scores to -inf. `s` and `coord` are (row, col) views of a thread's
// accumulator fragment and of its (row, col) coordinates within the tile.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask(const Mask& mask, TensorS& s, const TensorC& coord, int row0, int col0) {
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const int row = row0 + cute::get<0>(coord(r, 0));
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(s); ++c) {
      if (!mask.visible(row, col0 + cute::get<1>(coord(r, c)))) s(r, c) = -INFINITY;
    }
  }
}

}  // namespace fa3::hopper
