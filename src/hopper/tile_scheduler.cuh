// fa3 — the persistent tile scheduler: a grid of about one CTA per SM walks the
// (query block, head, batch) tiles. The producer warp of each CTA picks the CTA's
// next tile and announces it to the consumers with the tile's Q load (see
// fwd_kernel.cuh), so only the producer needs to know the order.
//
// Order: (batch, head) pairs are taken in groups, and inside a group the head varies
// fastest, then the query block. A group of one head is "query blocks of one head in
// a row": the CTAs running at one time share a few heads and their K/V stay in L2.
//
// A varlen call's tiles cover the longest sequence's query blocks (max_seqlen_q) for every
// (head, batch entry); the producer skips those past their own sequence's end before
// announcing anything (FwdKernel::skip_empty), drawing them as it draws every tile.
//
// Non-causal tiles are all alike: CTA c takes tiles c, c + grid, c + 2 grid, ...
// With CTA pairs (FwdConfig::cluster_m) the grid and each head's query blocks are even
// in number, so the two CTAs of a cluster (c even, c + 1) always run neighbouring
// blocks of one head.
// Causal tiles differ in length (query block m sees about m + 1 key blocks): groups
// are sized for L2 and for balance (causal_heads_per_group), tiles inside a group go
// longest first, and each CTA takes the next tile from a global counter when it
// finishes one, so that lengths even out across CTAs and the running tiles stay within
// one or two groups.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hopper/fwd_config.h"
#include "hopper/fwd_params.h"

namespace fa3::hopper {

struct TileCoord {
  int m_block;
  int head;
  int batch;
};

// A TileCoord handed between roles through shared memory. Slots are 16 bytes apart so
// that the compiler's 16-byte load of one never reads part of its neighbour, which
// another role may be writing at that moment.
struct alignas(16) TileSlot {
  TileCoord tile;
};

// Whether a call is varlen (FwdParams::cu_seqlens_q), as a kernel that carries the
// varlen paths (kCarries: FwdConfig::varlen) sees it; in one that does not, every
// varlen branch folds away. The helpers below take the same switch.
template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ bool is_varlen(const Params& p) {
  return kCarries && p.cu_seqlens_q != nullptr;
}

// A tile's sequence: the first of its batch entry's rows in the tensors as the kernels
// see them, and how many of them take part. For a fixed-length call that is offset 0 and
// the call's lengths; for a varlen call (FwdParams::cu_seqlens_q) the sequence's own.
struct SeqBounds {
  int offset_q;
  int offset_k;
  int seqlen_q;
  int seqlen_k;
};

template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ SeqBounds seq_bounds(const Params& p, int batch) {
  if (!is_varlen<kCarries>(p)) return {0, 0, p.seqlen_q, p.seqlen_k};
  const int offset_q = p.cu_seqlens_q[batch];
  const int offset_k = p.cu_seqlens_k[batch];
  const int seqlen_q = p.seqused_q != nullptr ? p.seqused_q[batch] : p.cu_seqlens_q[batch + 1] - offset_q;
  const int seqlen_k = p.seqused_k != nullptr ? p.seqused_k[batch] : p.cu_seqlens_k[batch + 1] - offset_k;
  return {offset_q, offset_k, seqlen_q, seqlen_k};
}

// The batch index of a tile's rows in the tensors as the kernels see them: a varlen
// call's packed tensors are one batch entry of all the rows.
template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ int tensor_batch(const Params& p, int batch) {
  return is_varlen<kCarries>(p) ? 0 : batch;
}

// The shape of the tensors as the kernels see them (rows, batch entries): a varlen call's
// are one entry of all the packed rows.
template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ int q_rows(const Params& p) {
  return is_varlen<kCarries>(p) ? p.total_q : p.seqlen_q;
}
template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ int k_rows(const Params& p) {
  return is_varlen<kCarries>(p) ? p.total_k : p.seqlen_k;
}
template <bool kCarries = kVarlenKernels, class Params>
__host__ __device__ int tensor_batches(const Params& p) {
  return is_varlen<kCarries>(p) ? 1 : p.batch;
}

// The forward's tile handed from the producer to the consumers: the coordinates and the
// sequence's bounds, which the producer reads (from global memory, for a varlen call)
// so that the consumers' way from one tile to the next holds no such load. 32 bytes,
// for the reason TileSlot is 16.
struct alignas(16) FwdTileSlot {
  TileCoord tile;
  SeqBounds seq;
};

// A draw from the tile counter (TileScheduler::next): the grid's tile after its first
// ones. The grid draws one value per tile, 0 to num_tiles - 1, and whoever draws the last
// one sets the counter back to 0 for the next launch (hopper/tile_counter.h).
__device__ inline int draw_tile(int* counter, int num_tiles) {
  const int drawn = atomicAdd(counter, 1);
  if (drawn == num_tiles - 1) atomicExch(counter, 0);
  return static_cast<int>(gridDim.x) + drawn;
}

template <bool kCausal>
struct TileScheduler {
  static constexpr bool kDynamic = kCausal;
  int num_m_blocks;
  int num_heads;
  int num_tiles;
  // The (batch, head) pairs go into as many groups as `heads_per_group` pairs a group
  // make, as even as whole pairs allow: the first pairs % groups of them hold one pair
  // more than the rest. A last group of a few pairs (32 in groups of 5: six of 5, one
  // of 2) would start its longest tiles when the other CTAs are about to run out of
  // work (hdim 96 causal 16k backward: +3 %, docs/perf-log.md).
  int group_heads;  // pairs of a later group; the first ones hold one more
  int big_pairs;    // pairs in the first groups
  int big_tiles;    // their tiles

  __host__ __device__ TileScheduler(int m_blocks, int heads, int batch, int heads_per_group)
      : num_m_blocks(m_blocks), num_heads(heads), num_tiles(m_blocks * heads * batch) {
    const int pairs = heads * batch;
    const int per_group = heads_per_group > 0 ? heads_per_group : 1;
    const int groups = pairs > 0 ? (pairs + per_group - 1) / per_group : 1;
    group_heads = pairs / groups;
    big_pairs = pairs % groups * (group_heads + 1);
    big_tiles = big_pairs * m_blocks;
  }

  __device__ int first() const { return static_cast<int>(blockIdx.x); }
  __host__ __device__ bool valid(int tile) const { return tile < num_tiles; }

  // The CTA's tile after `tile`, asked for once per tile the CTA runs. Dynamic:
  // `counter` is an int shared by the grid, 0 at launch; every CTA's first tile is its
  // index, the rest come in finishing order (draw_tile). Without a counter the order is
  // static.
  __device__ int next(int tile, int* counter) const {
    if (kDynamic && counter != nullptr) return draw_tile(counter, num_tiles);
    return tile + static_cast<int>(gridDim.x);
  }

  __host__ __device__ TileCoord coord(int tile) const {
    const bool big = tile < big_tiles;
    const int heads_here = big ? group_heads + 1 : group_heads;
    const int local = big ? tile : tile - big_tiles;
    const int tiles_per_group = heads_here * num_m_blocks;
    const int group = local / tiles_per_group;
    const int r = local - group * tiles_per_group;
    const int first_bh = (big ? 0 : big_pairs) + group * heads_here;
    const int bh = first_bh + r % heads_here;
    const int m = r / heads_here;
    return {kCausal ? num_m_blocks - 1 - m : m, bh % num_heads, bh / num_heads};
  }
};

// Causal tile order: how many consecutive (batch, head) pairs to interleave. Inside a
// group tiles go longest first, which evens out the CTAs' work only if the group holds
// enough tiles: with one to two grids' worth, CTAs that drew a group's last long tiles
// still run while the rest have finished (hdim 256 causal 4k-8k: 13 % idle in a
// simulation of the schedule; +9-10 % measured with four grids' worth). So a group spans
// four grids' worth of tiles, as far as DRAM allows, and at least as many heads as fit
// in 16 MB of L2 (their K/V, read by every query block of the head, are then fetched
// once; Q and O stream through the rest of the 50 MB). Query heads of one GQA group
// share K/V and count once. A group too large for L2 fetches each head's K/V about
// once per round of the grid: 4·seqlen_k·d bytes for each of its heads against
// 2·block_m·seqlen_k·d FLOPs for each of the round's tiles, so up to block_m / 4 heads
// keep that near 2.3 TB/s at 600 TFLOP/s (hdim 256 causal 1k: 32 heads 513 TFLOP/s,
// 64 heads 486). Then the pairs are split into groups of equal size, since a small last
// group would start its longest tiles when the other CTAs are about to run out of work.
//
// The general form: `shared_bytes` is what every tile of a head reads (the forward's
// K/V, the backward's Q and dO), `heads_sharing` how many consecutive heads read the
// same (a GQA group in the forward), `block` the rows of a tile and `num_blocks` the
// tiles of a head.
inline int causal_heads_per_group(double shared_bytes, int heads_sharing, std::int64_t pairs, int num_sms, int block,
                                  int num_blocks) {
  constexpr double kL2Budget = 16.0 * 1024 * 1024;
  constexpr int kGridsPerGroup = 4;
  const int fit = std::max(1, static_cast<int>(kL2Budget / shared_bytes)) * heads_sharing;
  const int sms = std::max(num_sms, 1);
  const int one_grid = (sms + num_blocks - 1) / num_blocks;
  const int balanced =
      std::min((kGridsPerGroup * sms + num_blocks - 1) / num_blocks, std::max(block / 4, 1) * heads_sharing);
  const std::int64_t group = std::min<std::int64_t>(std::max({fit, one_grid, balanced}), pairs);
  const std::int64_t groups = (pairs + group - 1) / group;
  return static_cast<int>((pairs + groups - 1) / groups);
}

// Groups sized for the L2 alone: as many heads as keep what each reads and writes
// again at every tile (`head_bytes`) within `l2_budget`, and at least one grid's worth of
// tiles; then split evenly. For orders whose draw evens out the CTAs' work by itself, or
// that must keep their misses short:
// - the backward's causal order in deterministic mode (kDeterministicL2Budget): a query
//   block's dQ sums are added in a fixed order, and each add waits for the one before it
//   to complete in global memory before passing the turn, so a dQ line that misses the
//   L2 sits in the chain of every later key block. Its groups hold as many heads as keep
//   their Q, dO and fp32 dQ sums within 32 MB (hdim 128 16k: 16 MB a head, 2 heads
//   against the default order's 4; deterministic causal +9 % at 16k, +23 % at 2k; H100,
//   hdim 256 16k: +25 % with the even split). The default causal order keeps its larger
//   groups: without the turns their misses overlap, and smaller groups measured slower.
// - the backward's varlen calls without a mask (kStreamingL2Budget): a sequence's tiles
//   are equally long, so balance asks nothing of the groups, and heads whose Q, dO and
//   dQ sums stay within 16 MB (beside the K/V and the sums in flight) measured fastest
//   (docs/perf-log.md, 2026-12-07).
inline constexpr double kDeterministicL2Budget = 32.0 * 1024 * 1024;
inline constexpr double kStreamingL2Budget = 16.0 * 1024 * 1024;

inline int fitting_heads_per_group(double head_bytes, double l2_budget, std::int64_t pairs, int num_sms,
                                   int num_blocks) {
  const int fit = std::max(1, static_cast<int>(l2_budget / head_bytes));
  const int one_grid = (std::max(num_sms, 1) + num_blocks - 1) / num_blocks;
  const std::int64_t group = std::min<std::int64_t>(std::max(fit, one_grid), pairs);
  const std::int64_t groups = (pairs + group - 1) / group;
  return static_cast<int>((pairs + groups - 1) / groups);
}

inline int causal_heads_per_group(const FwdParams& p, std::size_t element_bytes, int block_m, int num_m_blocks) {
  const double kv_bytes = static_cast<double>(p.seqlen_k) * (p.head_dim + p.head_dim_v) * static_cast<double>(element_bytes);
  return causal_heads_per_group(kv_bytes, p.nheads_q / p.nheads_kv, static_cast<std::int64_t>(p.nheads_q) * p.batch,
                                p.num_sms, block_m, num_m_blocks);
}

}  // namespace fa3::hopper
