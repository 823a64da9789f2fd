// fa3 — the forward's order of a varlen call's tiles in builds with kVarlenDynamicOrder:
// real tiles only, sequence by sequence in the call's order, each sequence's query blocks
// from the last, its heads fastest, drawn from the tile counter as CTAs finish.
//
// The scheduler's own order (hopper/tile_scheduler.cuh) gives every sequence the longest
// one's query blocks and skips the empty ones as they are drawn: with sequences of mixed
// lengths most slots are empty (16k tokens in 17 sequences of 211 to 2912: 6256 slots,
// 2176 tiles), each skip a draw and a read of the sequence's bounds, and the non-causal
// kernels' static order leaves the CTAs' work uneven. A model puts both orders at
// 1.08-1.23x a fixed-length batch's time and this one at 1.02-1.03x
// (scripts/sim_varlen_order.py). Measured on an H100 this order ran that batch at
// 1.20-1.24x without a mask instead of 1.32-1.34x, and level to 3 % faster causal: the
// model leaves out what the sequences' partial blocks cost (docs/perf-log.md).
//
// A tile index maps to its sequence by the running sum of the sequences' tile counts
// (query blocks x heads). The producer warp keeps the counts of 32 sequences at a time,
// one a lane, summed across the lanes, and moves on to the next 32 when an index lies past
// them: a CTA's draws only grow, so over a call each CTA reads every sequence's bounds at
// most once, 32 at a time, besides the scan of them all for the tile count at its start.
// Every member function is called by the whole producer warp with the same arguments.
#pragma once

#include <cute/tensor.hpp>

#include "hopper/fwd_params.h"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

template <int kBlockM>
struct VarlenTiles {
  static constexpr unsigned kWarp = 0xffffffffu;
  int total;   // the call's tiles
  int base;    // the first of the 32 sequences in hand
  int before;  // tiles of the sequences before them
  int count;   // this lane's sequence's tiles (base + lane)
  int upto;    // tiles of the sequences in hand up to this lane's, its own included

  __device__ explicit VarlenTiles(const FwdParams& p) : total(0), base(0), before(0) {
    for (int first = 0; first < p.batch; first += 32) {
      int sum = tiles_of(p, first + lane());
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kWarp, sum, o);
      total += sum;
    }
    take(p);
  }

  __device__ bool valid(int t) const { return t < total; }

  // The CTA's next tile, drawn from the counter (which the launch always gives these
  // calls) as TileScheduler::next draws it, over this order's tile count.
  __device__ int next(int* counter) const {
    int t = 0;
    if (lane() == 0) t = draw_tile(counter, total);
    return __shfl_sync(kWarp, t, 0);
  }

  // Tile t's coordinates, for valid(t) and t no smaller than any asked before (past the
  // last tile the walk would not end).
  __device__ TileCoord coord(const FwdParams& p, int t) {
    for (int last = __shfl_sync(kWarp, upto, 31); t >= before + last; last = __shfl_sync(kWarp, upto, 31)) {
      before += last;
      base += 32;
      take(p);
    }
    const int lane_of_t = __ffs(__ballot_sync(kWarp, before + upto > t)) - 1;
    const int tiles = __shfl_sync(kWarp, count, lane_of_t);
    const int r = t - (before + __shfl_sync(kWarp, upto, lane_of_t) - tiles);
    const int row = r / p.nheads_q;
    return {tiles / p.nheads_q - 1 - row, r - row * p.nheads_q, base + lane_of_t};
  }

 private:
  __device__ static int lane() { return static_cast<int>(threadIdx.x % 32); }

  __device__ static int tiles_of(const FwdParams& p, int batch) {
    if (batch >= p.batch) return 0;
    return (seq_bounds<true>(p, batch).seqlen_q + kBlockM - 1) / kBlockM * p.nheads_q;
  }

  // The counts of sequences base .. base + 31 and their running sum across the lanes.
  __device__ void take(const FwdParams& p) {
    count = tiles_of(p, base + lane());
    upto = count;
    for (int o = 1; o < 32; o <<= 1) {
      const int below = __shfl_up_sync(kWarp, upto, o);
      if (lane() >= o) upto += below;
    }
  }
};

}  // namespace fa3::hopper
