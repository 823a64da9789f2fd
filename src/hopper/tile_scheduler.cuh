// fa3 — the persistent tile scheduler: a grid of about one CTA per SM walks the
// (query block, head, batch) tiles in a fixed order, every role of a CTA computing
// the same sequence independently (no communication needed).
//
// Order: query blocks vary fastest, so the CTAs running at one time share a few
// heads and their K/V stay in L2. For causal masks the query blocks of a head are
// visited last-first: the longest tiles start first and the short ones fill the tail.
#pragma once

namespace fa3::hopper {

struct TileCoord {
  int m_block;
  int head;
  int batch;
};

template <bool kLongestFirst>
struct StaticTileScheduler {
  int num_m_blocks;
  int num_heads;
  int num_tiles;

  __host__ __device__ StaticTileScheduler(int m_blocks, int heads, int batch)
      : num_m_blocks(m_blocks), num_heads(heads), num_tiles(m_blocks * heads * batch) {}

  __device__ int first() const { return static_cast<int>(blockIdx.x); }
  __device__ int next(int tile) const { return tile + static_cast<int>(gridDim.x); }
  __device__ bool valid(int tile) const { return tile < num_tiles; }

  __device__ TileCoord coord(int tile) const {
    int m = tile % num_m_blocks;
    const int rest = tile / num_m_blocks;
    if constexpr (kLongestFirst) m = num_m_blocks - 1 - m;
    return {m, rest % num_heads, rest / num_heads};
  }
};

}  // namespace fa3::hopper
