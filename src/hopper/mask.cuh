// fa3 — mask policies. A policy answers four questions for a (query block, key
// block) tile: which key blocks a range of query rows needs at all (the forward's
// loop), which query blocks see a key block at all (the backward's loop), whether a
// tile needs element-wise masking, and which keys a row sees (a range of them).
// Columns past the sequence end are always masked: their keys are TMA's zero fill, and
// a zero score is not "no score". Rows past the sequence end need no key block.
// Policies are built from any parameter struct with seqlen_q and seqlen_k (the
// forward's and the backward's); the general one also reads the window and softcap.
//
// Plain and causal calls have policies of their own, whose first visible key is
// always 0 at compile time, so their kernels carry none of the general one's work.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>

#include "hopper/softcap.cuh"
#include <type_traits>


namespace fa3::hopper {

// Blocks [begin, end) of one kind, which a tile of the other visits: a forward tile's
// key blocks (visited from end - 1 down), a backward tile's query blocks.
struct BlockRange {
  int begin;
  int end;
};

// Non-causal: every key is visible; only the sequence end is masked.
struct NoMask {
  static constexpr bool kCausal = false;
  static constexpr bool kGeneral = false;
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
  // The first key block query block m_block needs.
  template <int kBlockM, int kBlockN>
  __host__ __device__ int n_block_begin(int /*m_block*/) const {
    return 0;
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
  static constexpr bool kGeneral = false;
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
  __host__ __device__ int n_block_begin(int /*m_block*/) const {
    return 0;
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

// Any window and softcap: row i sees keys [i + sk - sq - left, i + sk - sq + right]
// within the sequence (a negative side is unbounded; causal is right = 0), and scores
// pass through the softcap first when it is on. The bounds are clamped where they stop
// mattering (left to sk, right to sq), so that no sum below overflows an int.
struct GeneralMask {
  static constexpr bool kCausal = false;
  static constexpr bool kGeneral = true;
  int seqlen_q;
  int seqlen_k;
  int left;   // -1: unbounded
  int right;  // -1: unbounded
  Softcap softcap;

  template <class Params>
  __host__ __device__ explicit GeneralMask(const Params& p)
      : seqlen_q(p.seqlen_q),
        seqlen_k(p.seqlen_k),
        left(p.window_left < 0 ? -1 : (p.window_left < p.seqlen_k ? p.window_left : p.seqlen_k)),
        right(p.window_right < 0 ? -1 : (p.window_right < p.seqlen_q ? p.window_right : p.seqlen_q)),
        softcap(p.softcap, p.softmax_scale) {}

  __host__ __device__ int diag() const { return seqlen_k - seqlen_q; }

  // Key blocks [.., n) that query rows [row_begin, row_end) need: up to the last row's
  // last key.
  template <int kBlockN>
  __host__ __device__ int key_blocks(int row_begin, int row_end) const {
    if (row_begin >= seqlen_q) return 0;
    const int last_key_end = right < 0 ? seqlen_k : row_end + diag() + right;
    const int end = last_key_end < seqlen_k ? last_key_end : seqlen_k;
    return end <= 0 ? 0 : (end + kBlockN - 1) / kBlockN;
  }
  // The first key block that rows from row_begin need: the first row's first key's.
  template <int kBlockN>
  __host__ __device__ int first_key_block(int row_begin) const {
    if (left < 0) return 0;
    const int first = row_begin + diag() - left;
    return first <= 0 ? 0 : first / kBlockN;
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ int n_block_end(int m_block) const {
    return key_blocks<kBlockN>(m_block * kBlockM, (m_block + 1) * kBlockM);
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ int n_block_begin(int m_block) const {
    return first_key_block<kBlockN>(m_block * kBlockM);
  }
  template <int kBlockM, int kBlockN>
  __host__ __device__ bool needs_mask(int m_block, int n_block) const {
    const int row0 = m_block * kBlockM;
    // Past the sequence end; past the first row's last key; before the last row's first.
    return (n_block + 1) * kBlockN > seqlen_k || (right >= 0 && (n_block + 1) * kBlockN - 1 > row0 + diag() + right) ||
           (left >= 0 && n_block * kBlockN < row0 + kBlockM - 1 + diag() - left);
  }
  // Query blocks [*begin, end) that see key block n_block: from the first row whose
  // last key reaches the block's first, to the last row whose first key is at or
  // before the block's last.
  template <int kBlockM, int kBlockN>
  __host__ __device__ int query_blocks(int n_block, int* begin) const {
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    if (right < 0) {
      *begin = 0;
    } else {
      const int first_row = n_block * kBlockN - diag() - right;
      *begin = first_row <= 0 ? 0 : first_row / kBlockM;
    }
    if (left < 0) return m_blocks;
    const int last_row = (n_block + 1) * kBlockN - 1 - diag() + left;
    if (last_row < 0) return *begin;  // no row sees it: an empty range
    const int end = last_row / kBlockM + 1;
    return end < m_blocks ? end : m_blocks;
  }
  __host__ __device__ int visible_begin(int row) const { return left < 0 ? 0 : row + diag() - left; }
  __host__ __device__ int visible_end(int row) const {
    if (right < 0) return seqlen_k;
    const int end = row + diag() + right + 1;
    return end < seqlen_k ? end : seqlen_k;
  }
};

// The scale the softmax applies to the scores a kernel hands it, natural and times
// log2 e: the softmax scale, or for capped scores (tanh values, Softcap::apply) the cap.
template <class Mask, class Params>
__device__ __forceinline__ float softmax_scale_of(const Mask& mask, const Params& p) {
  if constexpr (Mask::kGeneral) {
    if (mask.softcap.on) return mask.softcap.cap;
  }
  return p.softmax_scale;
}
template <class Mask, class Params>
__device__ __forceinline__ float softmax_scale_log2_of(const Mask& mask, const Params& p) {
  if constexpr (Mask::kGeneral) {
    if (mask.softcap.on) return mask.softcap.cap * 1.4426950408889634f;
  }
  return p.softmax_scale_log2;
}

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
// visible columns are those in a range (below a bound, for plain and causal masks);
// ptxas moves their bit mask into predicates (R2P, seven at a time) for the selects,
// where a compare per element would cost as much as the select.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask(const Mask& mask, TensorS& s, const TensorC& coord, int row0, int col0) {
  constexpr int kCols = decltype(cute::size<1>(s))::value;
  static_assert(kCols % 2 == 0 && kCols <= 64);
  using Bits = std::conditional_t<(kCols > 32), std::uint64_t, std::uint32_t>;
  const int first_col = col0 + cute::get<1>(coord(0, 0));
  CUTE_UNROLL
  for (int r = 0; r < cute::size<0>(s); ++r) {
    const int row = row0 + cute::get<0>(coord(r, 0));
    Bits keep = visible_columns<Bits, kCols / 2>(mask.visible_end(row) - first_col);
    if constexpr (Mask::kGeneral) keep &= ~visible_columns<Bits, kCols / 2>(mask.visible_begin(row) - first_col);
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) {
      if (!((keep >> c) & 1)) s(r, c) = -INFINITY;
    }
  }
}

// apply_mask for a transposed score fragment (the backward's Sᵀ: rows are keys, columns
// query rows), element by element: a column's bound is its own, so the row-wise bit
// mask does not apply. Only the blocks on a window's edge (a causal diagonal) or at
// the sequence end take this path.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask_transposed(const Mask& mask, TensorS& s, const TensorC& coord, int key0,
                                                      int row0) {
  CUTE_UNROLL
  for (int c = 0; c < cute::size<1>(s); ++c) {
    const int row = row0 + cute::get<1>(coord(0, c));
    const int end = mask.visible_end(row) - key0;
    int begin = 0;
    if constexpr (Mask::kGeneral) begin = mask.visible_begin(row) - key0;
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(s); ++r) {
      const int key = cute::get<0>(coord(r, c));
      if (key >= end || key < begin) s(r, c) = -INFINITY;
    }
  }
}

}  // namespace fa3::hopper
