// fa3 — the order of the deterministic backward's dQ sums in a non-causal call with the
// static tile order: each key block of a head starts at a query block of its own.
//
// In deterministic mode every query block's dQ sums are added in a fixed order, each
// waiting for the one before it (BwdKernel::dq_turn). Had all key blocks of a head
// walked the query blocks from 0 up, as they start together, key block n would add to
// every query block n turns after key block 0: the head's last key block starts its
// adds (n_blocks - 1) turns late, and each turn is a reduce-add's round trip through the
// L2, so every round of the grid lost about that much (hdim 128 non-causal 0.74-0.87 of
// the default mode).
//
// Instead the key blocks of a head that run in one round of the grid (tile t runs on
// CTA t % grid in round t / grid, the static order of hopper/tile_scheduler.cuh) start
// evenly spread over the query blocks and walk them cyclically, so each query block is
// reached by one key block after another, a few steps apart, and none waits. The order
// of the sums at a query block is the order of arrival: the head's key blocks of earlier
// rounds first (done by then), then those of the round by the step at which they reach
// the block, equal steps by key block. A tile waits only for tiles of its own or earlier
// rounds, all running or done, and only for one at a smaller step index (or the same
// step and a lower key block), so no wait goes in a circle and every wait ends.
//
// Plain C++ for the host tests; the kernel uses it on the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FA3_DQ_ORDER_FN __host__ __device__ __forceinline__
#else
#define FA3_DQ_ORDER_FN inline
#endif

namespace fa3::hopper {

// 32-bit arithmetic throughout: the host takes this order only where a call's tiles and
// grid * m_blocks stay below 2^31 (static_dq_order_fits).
struct StaticDqOrder {
  int first;     // the head's key blocks in rounds before this tile's
  int index;     // this tile's place among the head's key blocks of its round
  int count;     // the head's key blocks in this tile's round
  int m_blocks;  // query blocks, walked from start() cyclically

  // The head of (batch, head) pair `pair` (batch * nheads + head), key block `n_block`
  // of `n_blocks`, in a grid of `grid` CTAs.
  FA3_DQ_ORDER_FN static StaticDqOrder of(int pair, int n_block, int n_blocks, int grid, int m_blocks) {
    const int head_first = pair * n_blocks;
    const int tile = head_first + n_block;
    const int round_first = tile / grid * grid;
    const int begin = round_first > head_first ? round_first : head_first;
    const int round_end = round_first + grid;
    const int head_end = head_first + n_blocks;
    const int end = round_end < head_end ? round_end : head_end;
    return {begin - head_first, tile - begin, end - begin, m_blocks};
  }

  // The first query block of the round's key block `j`: the round's key blocks spread
  // evenly over the query blocks.
  FA3_DQ_ORDER_FN int start_of(int j) const { return j * m_blocks / count; }
  FA3_DQ_ORDER_FN int start() const { return start_of(index); }

  // The query block of this tile's step `i` (0 <= i < m_blocks).
  FA3_DQ_ORDER_FN int block_at(int i) const {
    const int m = start() + i;
    return m < m_blocks ? m : m - m_blocks;
  }

  // How many of the round's key blocks start at or before query block `v`
  // (start_of(j) <= v <=> j < (v + 1) * count / m_blocks, rounded up).
  FA3_DQ_ORDER_FN int starting_by(int v) const {
    const int n = ((v + 1) * count + m_blocks - 1) / m_blocks;
    return n < count ? n : count;
  }
  // How many start before query block `v`.
  FA3_DQ_ORDER_FN int starting_before(int v) const { return v <= 0 ? 0 : starting_by(v - 1); }

  // How many of the head's sums go into query block `m` before this tile's. Of the
  // round's key blocks, those that started at or before m reach it at step m - start,
  // the later ones at m_blocks + m - start; a larger start means an earlier arrival.
  FA3_DQ_ORDER_FN int turn(int m) const {
    const int s = start();
    const int reached = starting_by(m);  // the round's key blocks j < reached start at or before m
    const int same_start_before = index - starting_before(s);
    if (s <= m) return first + (reached - starting_by(s)) + same_start_before;
    return first + reached + (count - starting_by(s)) + same_start_before;
  }
};

// Whether a call's numbers stay within the order's 32-bit arithmetic: its tiles
// (pairs * n_blocks, and one round past them) and (grid + 1) * (m_blocks + 1), which
// bound every product above.
inline bool static_dq_order_fits(std::int64_t pairs, std::int64_t n_blocks, std::int64_t grid, std::int64_t m_blocks) {
  constexpr std::int64_t kLimit = std::int64_t{1} << 31;
  return pairs * n_blocks + grid < kLimit && (grid + 1) * (m_blocks + 1) < kLimit;
}

}  // namespace fa3::hopper

#undef FA3_DQ_ORDER_FN
