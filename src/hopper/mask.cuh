// fa3 — mask policies. A policy answers four questions for a (query block, key
// block) tile: which key blocks a range of query rows needs at all (the forward's
// loop), which query blocks see a key block at all (the backward's loop), whether a
// tile needs element-wise masking, and which keys a row sees (a range of them).
// Columns past the sequence end are always masked: their keys are TMA's zero fill, and
// a zero score is not "no score". Rows past the sequence end need no key block.
// Policies are built from any parameter struct with seqlen_q and seqlen_k (the
// forward's and the backward's); the general one also reads the window, the chunk and
// the softcap.
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

// Any window, chunk and softcap: row i sees keys [i + sk - sq - left, i + sk - sq + right]
// within the sequence (causal is right = 0), with a chunk only those of its own chunk,
// [c, c + chunk) for the multiple c of chunk at or below i + sk - sq, and scores pass
// through the softcap first when it is on. Both bounds of a row never decrease with the
// row, so a range of rows needs the keys from its first row's first to its last row's
// last. set_mask_params (hopper/mask_kind.h) gives an unbounded side as the sequence
// length, which bounds no row of the sequence, so that no bound needs a test of its own;
// and it clamps both sides and the chunk where they stop mattering (left and chunk to
// sk, right to sq), so that no sum below overflows an int.
struct GeneralMask {
  static constexpr bool kCausal = false;
  static constexpr bool kGeneral = true;
  int seqlen_q;
  int seqlen_k;
  int left;
  int right;
  int chunk;  // 0: none
  std::uint32_t chunk_mul;
  int chunk_shift;
  Softcap softcap;

  template <class Params>
  __host__ __device__ explicit GeneralMask(const Params& p)
      : seqlen_q(p.seqlen_q),
        seqlen_k(p.seqlen_k),
        left(p.window_left),
        right(p.window_right),
        chunk(p.chunk),
        chunk_mul(p.chunk_mul),
        chunk_shift(p.chunk_shift),
        softcap(p.softcap, p.softmax_scale) {}

  __host__ __device__ int diag() const { return seqlen_k - seqlen_q; }

  // The first key of the chunk holding key `key` (from 0), by the multiplier and shift
  // of FwdParams::chunk_mul.
  __host__ __device__ int key_chunk_start(int key) const {
    const std::uint64_t product = std::uint64_t{static_cast<std::uint32_t>(key)} * chunk_mul;
    return static_cast<int>(static_cast<std::uint32_t>(product >> 32) >> chunk_shift) * chunk;
  }
  // The same for a row's position `pos` (query i sits at i + diag()), which may lie
  // before key 0: such a row sees no key whatever its chunk, and is given the chunk
  // [-chunk, 0), which holds none (pos >> 31 is -1 there, 0 from 0), so that only
  // positions from 0 are divided, and without a branch.
  __host__ __device__ int chunk_start(int pos) const {
    const std::uint64_t product = std::uint64_t{static_cast<std::uint32_t>(pos > 0 ? pos : 0)} * chunk_mul;
    return (static_cast<int>(static_cast<std::uint32_t>(product >> 32) >> chunk_shift) + (pos >> 31)) * chunk;
  }
  // Row `row` sees keys [visible_begin(row), visible_end(row)); the first may be
  // negative, and the range empty.
  __host__ __device__ int visible_begin(int row) const {
    int begin = row + diag() - left;
    if (chunk > 0) {
      const int first = chunk_start(row + diag());
      begin = first > begin ? first : begin;
    }
    return begin;
  }
  __host__ __device__ int visible_end(int row) const {
    int end = row + diag() + right + 1;
    if (chunk > 0) {
      const int last = chunk_start(row + diag()) + chunk;
      end = last < end ? last : end;
    }
    return end < seqlen_k ? end : seqlen_k;
  }
  // The same pairs key by key: rows [seen_begin(key), seen_end(key)) see key `key` (from
  // 0; none past the sequence end, where visible_end stops). The rows are not cut at
  // the sequence's ends, as the keys are not cut at its first above, so that both name
  // the same pairs for the rows past the end that a last query block holds too.
  __host__ __device__ int seen_begin(int key) const {
    int begin = key - diag() - right;
    if (chunk > 0) {
      const int first = key_chunk_start(key) - diag();
      begin = first > begin ? first : begin;
    }
    return begin;
  }
  __host__ __device__ int seen_end(int key) const {
    if (key >= seqlen_k) return 0;
    int end = key - diag() + left + 1;
    if (chunk > 0) {
      const int last = key_chunk_start(key) + chunk - diag();
      end = last < end ? last : end;
    }
    return end;
  }

  // Key blocks [.., n) that query rows [row_begin, row_end) need: up to the last row's
  // last key.
  template <int kBlockN>
  __host__ __device__ int key_blocks(int row_begin, int row_end) const {
    if (row_begin >= seqlen_q) return 0;
    const int end = visible_end(row_end - 1);
    return end <= 0 ? 0 : (end + kBlockN - 1) / kBlockN;
  }
  // The first key block that rows from row_begin need: the first row's first key's.
  template <int kBlockN>
  __host__ __device__ int first_key_block(int row_begin) const {
    const int first = visible_begin(row_begin);
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
  // Whether some key of the tile is hidden from some row: one past the first row's last
  // key (or the sequence end), or before the last row's first. Only tiles on a window's
  // edge or across a chunk's take element-wise masking.
  template <int kBlockM, int kBlockN>
  __host__ __device__ bool needs_mask(int m_block, int n_block) const {
    const int row0 = m_block * kBlockM;
    return (n_block + 1) * kBlockN > visible_end(row0) || n_block * kBlockN < visible_begin(row0 + kBlockM - 1);
  }
  // Query blocks [*begin, end) that see key block n_block, keys [lo, hi]: from the first
  // row whose last key reaches lo (at or after lo - right; with a chunk, in lo's chunk or
  // a later one), to the last row whose first key is at or before hi (at or before
  // hi + left; in hi's chunk or an earlier one). hi is not cut at the sequence end: rows
  // that only keys past it would bring in do not exist, and so the forward's key ranges
  // and these name the same tiles.
  template <int kBlockM, int kBlockN>
  __host__ __device__ int query_blocks(int n_block, int* begin) const {
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    const int lo = n_block * kBlockN;
    const int hi = lo + kBlockN - 1;
    int first_row = lo - diag() - right;
    int last_row = hi - diag() + left;
    if (chunk > 0) {
      const int chunk_first = key_chunk_start(lo) - diag();
      const int chunk_last = key_chunk_start(hi) + chunk - 1 - diag();
      first_row = chunk_first > first_row ? chunk_first : first_row;
      last_row = chunk_last < last_row ? chunk_last : last_row;
    }
    *begin = first_row <= 0 ? 0 : first_row / kBlockM;
    if (last_row < 0) return *begin;  // no row sees it: an empty range
    const int end = last_row / kBlockM + 1;
    return end < m_blocks ? end : m_blocks;
  }
};

// The policy for one sequence of a varlen batch (hopper/tile_scheduler.cuh's SeqBounds):
// the sequence's own lengths, the call's window, chunk and softcap. Every rule above
// then holds per sequence, the causal diagonal at each one's bottom-right corner. The
// call's resolved window sides and chunk (set_mask_params, from max_seqlen_q and
// max_seqlen_k) bound no more of a shorter sequence than its own would.
template <class Mask>
__host__ __device__ Mask for_sequence(Mask mask, int seqlen_q, int seqlen_k) {
  mask.seqlen_q = seqlen_q;
  mask.seqlen_k = seqlen_k;
  return mask;
}

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
// query rows). Only the blocks on a window's or chunk's edge (a causal diagonal) or at
// the sequence end take this path. The general mask goes key by key: the rows that see
// a key are a range of them too (GeneralMask::seen_begin), so each of the thread's few
// keys gets apply_mask's column bits, where bounds for each of its many query rows would
// cost a chunk's division apiece. The others go element by element, each column
// (query row) with its own bound.
template <class Mask, class TensorS, class TensorC>
__device__ __forceinline__ void apply_mask_transposed(const Mask& mask, TensorS& s, const TensorC& coord, int key0,
                                                      int row0) {
  if constexpr (Mask::kGeneral) {
    constexpr int kCols = decltype(cute::size<1>(s))::value;
    static_assert(kCols % 2 == 0 && kCols <= 64);
    using Bits = std::conditional_t<(kCols > 32), std::uint64_t, std::uint32_t>;
    const int first_row = row0 + cute::get<1>(coord(0, 0));
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(s); ++r) {
      const int key = key0 + cute::get<0>(coord(r, 0));
      const Bits keep = visible_columns<Bits, kCols / 2>(mask.seen_end(key) - first_row) &
                        ~visible_columns<Bits, kCols / 2>(mask.seen_begin(key) - first_row);
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        if (!((keep >> c) & 1)) s(r, c) = -INFINITY;
      }
    }
  } else {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(s); ++c) {
      const int row = row0 + cute::get<1>(coord(0, c));
      const int end = mask.visible_end(row) - key0;
      const int begin = 0;  // a plain or causal row's first key
      CUTE_UNROLL
      for (int r = 0; r < cute::size<0>(s); ++r) {
        const int key = cute::get<0>(coord(r, c));
        if (key >= end || key < begin) s(r, c) = -INFINITY;
      }
    }
  }
}

}  // namespace fa3::hopper
