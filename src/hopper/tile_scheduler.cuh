// fa3 — the persistent tile scheduler: a grid of about one CTA per SM walks the
// (query block, head, batch) tiles in a fixed order, every role of a CTA computing
// the same sequence independently (no communication needed).
//
// Order, non-causal: query blocks vary fastest, so the CTAs running at one time share
// a few heads and their K/V stay in L2.
// Causal tiles differ in length (query block m sees m+1 key blocks): heads are taken
// in groups whose K/V fit in L2 together, and within a group tiles go longest first
// (query block descending, head fastest), so that round-robin assignment hands every
// CTA a similar amount of work while the CTAs stay on the same few heads.
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
  int group_heads;  // (batch, head) pairs per L2 group; used when kLongestFirst

  __host__ __device__ StaticTileScheduler(int m_blocks, int heads, int batch, int heads_per_group)
      : num_m_blocks(m_blocks),
        num_heads(heads),
        num_tiles(m_blocks * heads * batch),
        group_heads(heads_per_group) {}

  __device__ int first() const { return static_cast<int>(blockIdx.x); }
  __device__ int next(int tile) const { return tile + static_cast<int>(gridDim.x); }
  __device__ bool valid(int tile) const { return tile < num_tiles; }

  __device__ TileCoord coord(int tile) const {
    if constexpr (kLongestFirst) {
      const int tiles_per_group = num_m_blocks * group_heads;
      const int group = tile / tiles_per_group;
      const int r = tile % tiles_per_group;
      const int first = group * group_heads;
      const int total = num_tiles / num_m_blocks;
      const int heads_here = total - first < group_heads ? total - first : group_heads;
      const int bh = first + r % heads_here;
      return {num_m_blocks - 1 - r / heads_here, bh % num_heads, bh / num_heads};
    } else {
      const int rest = tile / num_m_blocks;
      return {tile % num_m_blocks, rest % num_heads, rest / num_heads};
    }
  }
};

}  // namespace fa3::hopper
