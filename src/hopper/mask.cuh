// fa3 — mask policies. A policy answers four questions for a (query block, key
// block) tile: which key blocks a range of query rows needs at all (the forward's
// loop), which query blocks see a key block at all (the backward's loop), whether a
// tile needs element-wise masking, and which keys a row sees (all below a bound).
// Columns past the sequence end are always masked: their keys are TMA's zero fill, and
// a zero score is not "no score". Rows past the sequence end need no key block.
// Policies are built from any parameter struct with seqlen_q and seqlen_k (the
// forward's and the backward's).
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>


namespace fa3::hopper {

// Non-causal: every key is visible; only the sequence end is masked.
struct NoMask {
  static constexpr bool kCausal = false;
  int seqlen_q;
  int seqlen_k;

  template <class Params>
  __host__ __device__ explicit NoMask(const Params& p) : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}

  // Key blocks [0, n) that query rows [row_begin, row_end) need.
  template <int kBlockN>
  __host__ __device__ int key_blocks(int row_begin, int /*row_end*/) const {
    return row_begin >= seqlen_q ? 0 : (seqlen_k + kBlockN - 1) / kBlockN;
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ int n_block_end(int m_block) const {
    return key_blocks<kBlockN>(m_block * kBlockM, (m_block + 1) * kBlockM);
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ bool needs_mask(int /*m_block*/, int n_block) const {
    return (n_block + 1) * kBlockN > seqlen_k;
  }
  // Query blocks [0, end) that see key block n_block (the first is returned in *begin).
  template <int kBlockM, int kBlockN>
  __host__ __device__ int query_blocks(int /*n_block*/, int* begin) const {
    *begin = 0;
    return (seqlen_q + kBlockM - 1) / kBlockM;
  }
  // Row `row` sees exactly the keys below this one.
  __host__ __device__ int visible_end(int /*row*/) const { return seqlen_k; }
};

// Causal, aligned to the bottom-right corner: row i sees keys j <= i + seqlen_k - seqlen_q.
struct CausalMask {
  static constexpr bool kCausal = true;
  int seqlen_q;
  int seqlen_k;

  template <class Params>
  __host__ __device__ explicit CausalMask(const Params& p) : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}

  // Key blocks [0, n) that query rows [row_begin, row_end) need.
  template <int kBlockN>
  __host__ __device__ int key_blocks(int row_begin, int row_end) const {
    if (row_begin >= seqlen_q) return 0;
    // One past the last key the range's last row sees; may be <= 0 (no key at all).
    const int last_key_end = row_end + seqlen_k - seqlen_q;
    const int end = last_key_end < seqlen_k ? last_key_end : seqlen_k;
    return end <= 0 ? 0 : (end + kBlockN - 1) / kBlockN;
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ int n_block_end(int m_block) const {
    return key_blocks<kBlockN>(m_block * kBlockM, (m_block + 1) * kBlockM);
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ bool needs_mask(int m_block, int n_block) const {
    // The block's first row sees up to key m_block*BM + sk - sq: any later column needs masking.
    return (n_block + 1) * kBlockN > seqlen_k ||
           (n_block + 1) * kBlockN - 1 > m_block * kBlockM + seqlen_k - seqlen_q;
  }
  // Query blocks [*begin, end) that see key block n_block: from the one holding the
  // first row that sees its first key, n_block * kBlockN + seqlen_q - seqlen_k.
  template <int kBlockM, int kBlockN>
  __host__ __device__ int query_blocks(int n_block, int* begin) const {
    const int first_row = n_block * kBlockN + seqlen_q - seqlen_k;
    *begin = first_row <= 0 ? 0 : first_row / kBlockM;
    return (seqlen_q + kBlockM - 1) / kBlockM;
  }
  __host__ __device__ int visible_end(int row) const {
    const int end = row + seqlen_k - seqlen_q + 1;
    return end < seqlen_k ? end : seqlen_k;
  }
};

// In a wgmma accumulator a thread's columns come in pairs 8 apart: column c of the
// (row, col) view sits at (c % 2) + 8 * (c / 2) past the thread's first. Returns the
// bit mask of those below `end` (counted from the thread's first column), for
// kPairs pairs: a few integer operations instead of a compare per column.
template <class Bits, int kPairs>
__host__ __device__ constexpr Bits visible_columns(int end) {
  static_assert(2 * kPairs <= 8 * sizeof(Bits));
  end = end < 0 ? 0 : (end > 8 * kPairs ? 8 * kPairs : end);
  const int full = (end + 6) / 8;  // pairs with both columns visible
  constexpr Bits kAll = static_cast<Bits>(~Bits{0} >> (8 * sizeof(Bits) - 2 * kPairs));
  Bits keep = full >= kPairs ? kAll : static_cast<Bits>((Bits{1} << (2 * full)) - 1);
  if (full < kPairs && end - 8 * full >= 1) keep |= Bits{1} << (2 * full);  // the next pair's first column
  return keep;
}

// Sets masked scores to -inf. `s` and `coord` are (row, col) views of a thread's
// accumulator fragment and of its (row, col) coordinates within the tile. Each row's
// visible columns are those below a bound; ptxas moves their bit mask into predicates
// (R2P, seven at a time) for the selects, where a compare per element would cost as
// much as the select.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask(const Mask& mask, TensorS& s, const TensorC& coord, int row0, int col0) {
  constexpr int kCols = decltype(cute::size<1>(s))::value;
  static_assert(kCols % 2 == 0 && kCols <= 64);
  using Bits = std::conditional_t<(kCols > 32), std::uint64_t, std::uint32_t>;
  const int first_col = col0 + cute::get<1>(coord(0, 0));
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const int end = mask.visible_end(row0 + cute::get<0>(coord(r, 0))) - first_col;
    const Bits keep = visible_columns<Bits, kCols / 2>(end);
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      if (!((keep >> c) & 1)) s(r, c) = -INFINITY;
    }
  }
}

// apply_mask for a transposed score fragment (the backward's Sᵀ: rows are keys, columns
// query rows), element by element: a column's bound is its own, so the row-wise bit
// mask does not apply. Only the blocks on a causal diagonal or at the sequence end
// take this path.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask_transposed(const Mask& mask, TensorS& s, const TensorC& coord, int key0,
                                                      int row0) {
  CUTE_UNROLL
  for (int c = 0; c < cute::size<1>(s); ++c) {
    const int end = mask.visible_end(row0 + cute::get<1>(coord(0, c))) - key0;
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(s); ++r) {
      if (cute::get<0>(coord(r, c)) >= end) s(r, c) = -INFINITY;
    }
  }
}

}  // namespace fa3::hopper
