// fa3 — the backward kernel: warpgroup roles, register budgets, the persistent tile
// loop, and the handshakes between roles. A tile is one key block of one (head, batch):
// its K and V stay in shared memory and its dK and dV in the consumers' registers,
// while the query blocks that see the keys stream past.
//
// Warpgroup 0 is the producer: warp 0 picks tiles and issues every load; warp 1 (the
// dQ warp) adds each step's dQ partial sums, staged in shared memory, to the global
// accumulator by bulk reduce-add (all but the slice BwdConfig::dq_red_slice names,
// which the consumers add by red). Warpgroups 1.. are consumers (hopper/bwd_mainloop.cuh).
// Handshakes:
//   K, V : one buffer each. The producer writes the tile's coordinates into `tile`,
//          then arms kv_full with K's and V's TMA loads; n_block -1 (armed with no load)
//          means no more tiles. kv_empty counts every consumer thread (and the dQ
//          warp's lanes, which read the coordinates too) once it is done with the tile
//          (the dQ warp, with the varlen paths, once done with the tile's dQ sums).
//   Q, dO: rings, one stage per query block, LSE riding with Q and D with dO; every
//          consumer thread reads the statistics, so every one releases the stage.
//   dQ   : per consumer warpgroup a pair of named barriers with the dQ warp (its part
//          of the staging buffer is full / was read).
// dK and dV leave by TMA store through K's and V's buffers before their release, or,
// with an overlapped tile switch (BwdConfig::overlap_tile_switch), through the dS and
// dQ staging buffers after it, while the next tile's K and V load; with GQA/MQA they
// are added from registers to fp32 accumulators (the postprocess converts them).
//
// A varlen call (BwdParams::cu_seqlens_q) runs on the kernels that carry the varlen
// paths (BwdConfig::varlen): tiles cover max_seqlen_k's key blocks for every (head,
// sequence), and the producer skips those past their sequence's keys (skip_empty). A
// tile sees its own sequence's query blocks only, under the mask of the sequence's own
// lengths (bottom-right aligned per sequence); its dQ parts and statistics are the
// sequence's blocks in the workspace (hopper/bwd_workspace.h). Its dK and dV leave
// through shared memory as a fixed-length call's do, by TMA store from the packed tensor
// offset to the sequence, except a sequence's partial last block: row copies stop at its
// last key (a TMA store writes whole blocks, over the next sequence's rows); with
// GQA/MQA they go to the fp32 accumulators, whence the postprocess writes the sequence's
// rows only.
//
// Deterministic mode fixes the order of every sum across CTAs with counters in the
// workspace: a tile adds its dQ part of query block m only after the key blocks before
// it in a fixed order have, and a query head adds its dK/dV part only after the lower
// heads of its KV group have. The tile scheduler hands tiles out in an order
// consistent with both (tile_block), so the tile every other waits for is always
// running and nothing deadlocks; and a CTA draws its next tile near the end of its
// current one, so that tiles also start in that order and a turn comes about when the
// tile waiting for it needs it (produce). In builds with kBwdSpreadStarts,
// non-causal calls of fixed length, whose tiles all have the same length and go in the
// static order's rounds, instead start each tile of a round at a query block of its own,
// so that the turns at a query block come a few steps apart rather than one after
// another (hopper/bwd_dq_order.h, QueryWalk).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "hopper/barriers.cuh"
#include "hopper/bwd_dq_order.h"
#include "hopper/bwd_mainloop.cuh"
#include "hopper/bwd_params.h"
#include "hopper/bwd_seq.cuh"
#include "hopper/bwd_traits.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

template <class Traits_, class Mask_>
struct BwdKernel {
  using Traits = Traits_;
  using Mask = Mask_;
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  using QPipeline = typename Traits::QPipeline;
  using DoPipeline = typename Traits::DoPipeline;
  // General tiles may differ in length as causal ones do, and a varlen call's tiles
  // with their sequences' query blocks: dynamic order (tile_block).
  using Scheduler = TileScheduler<Mask::kCausal || Mask::kGeneral || Traits::kVarlen>;
  using Consumer = BwdConsumer<Traits, Mask>;
  using BN = typename Traits::BN;
  using D = typename Traits::D;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;
  static constexpr bool kVarlen = Traits::kVarlen;

  struct Params {
    typename Traits::TmaQ tma_q;
    typename Traits::TmaDo tma_do;
    typename Traits::TmaK tma_k;
    typename Traits::TmaV tma_v;
    typename Traits::TmaDk tma_dk;
    typename Traits::TmaDv tma_dv;
    BwdParams p;
    int heads_per_group;  // tile order: (batch, head) pairs sharing Q and dO in L2
    bool spread_starts;   // tiles start at query blocks of their own (QueryWalk)
  };

  __device__ static void run(const Params& params, char* smem_raw) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_group = warp / 4;

    if (threadIdx.x == 0) {
      QPipeline::init(smem.q_pipe, kConsumerThreads);
      DoPipeline::init(smem.do_pipe, kConsumerThreads);
      cutlass::arch::ClusterTransactionBarrier::init(&smem.kv_full, 1);
      cutlass::arch::ClusterBarrier::init(&smem.kv_empty, kConsumerThreads + 32);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
    // Launched as a programmatic dependent (kBwdPdl): everything below reads what the
    // kernels before wrote (statistics, zeroed sums and counters), so every thread waits
    // for them here. The dQ conversion is not let in early: its CTAs would wait on the
    // SMs that sm_margin leaves to other work for the whole of this kernel.
    if constexpr (kBwdPdl) arch::wait_grid_dependencies();

    QPipeline q_pipe{&smem.q_pipe};
    DoPipeline do_pipe{&smem.do_pipe};
    const Mask mask(params.p);

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kCfg.producer_regs>();
      if (warp == 0) {
        produce(params, smem, q_pipe, do_pipe, mask);
      } else if (warp == 1) {
        add_dq(params, smem, mask);
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Traits::kCfg.consumer_regs>();
      consume(params, smem, q_pipe, do_pipe, mask, static_cast<int>(threadIdx.x) - 128);
    }
  }

 private:
  // The query blocks a tile walks, in order: from range.begin up, or from a block of the
  // tile's own, cyclically (spread_starts).
  struct QueryWalk {
    BlockRange range;
    int start;
    __device__ int block(int i) const {
      const int m = start + (i - range.begin);
      return m < range.end ? m : m - (range.end - range.begin);
    }
  };

  // Whether tiles start at query blocks of their own: deterministic non-causal calls of
  // fixed length, whose tiles all walk every query block and run in the static order's
  // rounds (hopper/bwd_dq_order.h), where the launch found the order's arithmetic fits;
  // in builds with kBwdSpreadStarts.
  __device__ static bool spread_starts(const Params& params) {
    if constexpr (Mask::kCausal || Mask::kGeneral || kVarlen || !kBwdSpreadStarts) {
      return false;
    } else {
      return params.spread_starts;
    }
  }

  // The static order's place of key block tile.m_block of (tile.batch, tile.head).
  __device__ static StaticDqOrder static_order(const Params& params, const TileCoord& tile, const BlockRange& range) {
    return StaticDqOrder::of(tile.batch * params.p.nheads_q + tile.head, tile.m_block,
                             static_cast<int>(params.p.layout.n_blocks), static_cast<int>(gridDim.x),
                             range.end - range.begin);
  }

  __device__ static QueryWalk query_walk(const Params& params, const TileCoord& tile, const BlockRange& range) {
    const bool spread = spread_starts(params) && range.begin < range.end;
    return {range, spread ? range.begin + static_order(params, tile, range).start() : range.begin};
  }

  // The key block of scheduler tile `tile`. The scheduler hands causal tiles out
  // highest block first; a causal key block is the longer to run the lower it is (more
  // query blocks see it), so the order is reversed to run the longest first. In
  // deterministic mode causal dQ sums go highest key block first, and tiles must come
  // in that order.
  __device__ static int tile_block(const Params& params, int n_blocks, int block) {
    if constexpr (Mask::kCausal) {
      return params.p.deterministic ? block : n_blocks - 1 - block;
    } else if constexpr (Scheduler::kDynamic) {
      // General tiles and a varlen call's tiles without a mask: lowest key block first,
      // undoing the scheduler's reversal. Under a causal-like window the lower blocks are
      // seen by more query blocks (the longest first); without a mask a sequence's key
      // blocks are alike in length; and deterministic dQ sums go lowest key block first
      // (dq_turn).
      return n_blocks - 1 - block;
    } else {
      return block;
    }
  }

  // In deterministic mode, how many key blocks add their dQ part of query block m_block
  // before key block n_block does: lower blocks first (from the first one the query
  // block sees, under a window), except with a causal mask, whose diagonal blocks reach
  // a query block first (each tile walks its query blocks upwards from its diagonal).
  // Tiles that start at query blocks of their own take StaticDqOrder::turn instead.
  __device__ static int dq_turn(const Mask& mask, int n_block, int m_block) {
    if constexpr (Mask::kCausal) {
      return mask.template n_block_end<Traits::kBlockM, Traits::kBlockN>(m_block) - 1 - n_block;
    } else {
      return n_block - mask.template n_block_begin<Traits::kBlockM, Traits::kBlockN>(m_block);
    }
  }

  // The tile's sequence as the consumers and the dQ warp have it: from the tile's slot
  // (the producer read it), or the call's lengths in a kernel without the varlen paths.
  __device__ static SeqBounds slot_seq(const Params& params, const SharedStorage& smem) {
    if constexpr (kVarlen) {
      return smem.tile.seq;
    } else {
      return seq_bounds<false>(params.p, 0);
    }
  }

  // Tile `t` or, in a varlen call, the first from it on (in the CTA's order) whose key
  // block starts inside its sequence's keys: the longest sequence sets how many key
  // blocks every (head, sequence) has, and the others' blocks past their ends have no
  // keys to compute or store. A block of keys that no query sees still runs (its dK and
  // dV are 0). Every tile skipped is drawn, so that the counter's protocol holds
  // (TileScheduler::next).
  __device__ static int skip_empty(const Params& params, const Scheduler& scheduler, int n_blocks, int t,
                                   int* counter) {
    if (!is_varlen<kVarlen>(params.p)) return t;
#pragma unroll 1
    for (; scheduler.valid(t); t = scheduler.next(t, counter)) {
      const TileCoord tile = scheduler.coord(t);
      const int first_key = tile_block(params, n_blocks, tile.m_block) * Traits::kBlockN;
      if (first_key < seq_bounds<kVarlen>(params.p, tile.batch).seqlen_k) break;
    }
    return t;
  }

  // Where warpgroup `wg`'s part of slice `slice` of query block `block`'s dQ sums lies in
  // the accumulator (hopper/bwd_workspace.h), as the staging buffer holds them.
  __device__ static float* dq_slice(const BwdParams& p, std::int64_t block, int wg, int slice) {
    return workspace_floats(p, p.layout.dq_accum) +
           block * static_cast<std::int64_t>(Traits::kBlockM * Traits::kHeadDim) + wg * Traits::kDqPerWG +
           slice * Traits::kDqStagedPerWG;
  }

  __device__ static int* workspace_ints(const BwdParams& p, std::size_t offset) {
    return reinterpret_cast<int*>(static_cast<char*>(p.workspace) + offset);
  }
  __device__ static float* workspace_floats(const BwdParams& p, std::size_t offset) {
    return reinterpret_cast<float*>(static_cast<char*>(p.workspace) + offset);
  }

  // The producer's mask of sequence `batch`, read where it is used, so that the
  // producer's few registers keep no bounds across its loads.
  __device__ static Mask producer_mask(const BwdParams& p, const Mask& mask, int batch) {
    if constexpr (kVarlen) {
      const SeqBounds seq = seq_bounds<kVarlen>(p, batch);
      return for_sequence(mask, seq.seqlen_q, seq.seqlen_k);
    } else {
      return mask;
    }
  }

  __device__ static void produce(const Params& params, SharedStorage& smem, QPipeline& q_pipe, DoPipeline& do_pipe,
                                 const Mask& mask) {
    const BwdParams& p = params.p;
    const int n_blocks = static_cast<int>(p.layout.n_blocks);
    const Scheduler scheduler(n_blocks, p.nheads_q, p.batch, params.heads_per_group);
    int* counter = workspace_ints(p, p.layout.tile_counter);
    const bool leader = cute::elect_one_sync();
    if (leader) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    }
    BwdProducer<Traits> producer;
    int t = scheduler.first();
    // Only the leader draws tiles (skip_empty may draw several); the others learn the
    // leader's from the broadcast.
    if constexpr (kVarlen) {
      t = __shfl_sync(0xffffffffu, leader ? skip_empty(params, scheduler, n_blocks, t, counter) : 0, 0);
    }
    for (;;) {
      const bool valid = scheduler.valid(t);
      int next = 0;
      if (leader) {
        if (valid) {
          // The next tile is drawn as this one starts or, with BwdConfig::draw_next_late
          // and in deterministic mode, once this one's last loads are out. Deterministic
          // sums wait for the tiles drawn before, so tiles must start in the order they
          // are drawn: one drawn early starts when the CTA's current tile ends, and causal
          // tiles differ in length, so a tile drawn first could start many steps after
          // those drawn next, which would wait for it at every query block they share.
          // A static order takes no draw, so only the dynamic one asks.
          const bool late = Traits::kDrawNextLate || (Scheduler::kDynamic && p.deterministic);
          const auto draw_next = [&] {
            return skip_empty(params, scheduler, n_blocks, scheduler.next(t, counter), counter);
          };
          if (!late) next = draw_next();
          TileCoord tile = scheduler.coord(t);
          tile.m_block = tile_block(params, n_blocks, tile.m_block);
          const BlockRange range = query_range<Traits>(producer_mask(p, mask, tile.batch), tile.m_block);
          const QueryWalk walk = query_walk(params, tile, range);
          // The first step's Q and dO go out before the wait for K/V's buffers, which
          // lasts until the previous tile's epilogue is done with them.
          if (range.begin < range.end) producer.load_step(params, smem, q_pipe, do_pipe, tile, walk.start);
          producer.announce(params, smem, tile, tile.m_block);
#pragma unroll 1
          for (int i = range.begin + 1; i < range.end; ++i) {
            producer.load_step(params, smem, q_pipe, do_pipe, tile, walk.block(i));
          }
          if (late) next = draw_next();
          // The next tile's K and V are asked of the L2 about two steps before this tile ends.
          if (Traits::kOverlapTileSwitch && scheduler.valid(next)) {
            TileCoord coming = scheduler.coord(next);
            coming.m_block = tile_block(params, n_blocks, coming.m_block);
            producer.prefetch_kv(params, smem, coming, coming.m_block);
          }
        } else {
          producer.announce(params, smem, TileCoord{-1, 0, 0}, 0);
        }
      }
      if (!valid) break;
      t = __shfl_sync(0xffffffffu, next, 0);
    }
  }

  // The dQ warp: adds each step's dQ partial sums, one part per consumer warpgroup,
  // from shared memory to the accumulator, a slice at a time (BwdConfig::dq_slices).
  // With the varlen paths it holds the tile's slot until it is done with the tile, and
  // reads the sequence's bounds from it where they are used: its few registers keep none
  // across the tile (the consumers release the slot later anyway).
  __device__ static void add_dq(const Params& params, SharedStorage& smem, const Mask& mask) {
    const BwdParams& p = params.p;
    const int lane = threadIdx.x % 32;
    std::uint32_t phase = 0;
    for (;;) {
      arch::mbarrier_wait(&smem.kv_full, phase);
      phase ^= 1u;
      const TileCoord tile = smem.tile.tile;
      if (!kVarlen || tile.m_block < 0) arch::mbarrier_arrive(&smem.kv_empty);
      if (tile.m_block < 0) break;
      const int n_block = tile.m_block;
      const BlockRange range = query_range<Traits>(tile_mask<Traits>(mask, smem), n_block);
      const QueryWalk walk = query_walk(params, tile, range);
      const StaticDqOrder order = spread_starts(params) ? static_order(params, tile, range) : StaticDqOrder{};
      const std::int64_t first =
          q_block_index<Traits::kBlockM, kVarlen>(p, tile.batch, tile.head, slot_seq(params, smem), 0);
#pragma unroll 1
      for (int i = range.begin; i < range.end; ++i) {
        const int m = walk.block(i);
        const std::int64_t block = first + m;
        int* turn = p.deterministic ? workspace_ints(p, p.layout.dq_semaphore) + block : nullptr;
        const int my_turn =
            spread_starts(params) ? order.turn(m - range.begin) : dq_turn(tile_mask<Traits>(mask, smem), n_block, m);
        if (turn != nullptr && lane == 0) {
          arch::wait_counter(turn, my_turn);
          asm volatile("fence.proxy.async.global;" ::: "memory");
        }
        CUTE_UNROLL
        for (int slice = 0; slice < Traits::kDqSlices; ++slice) {
          if (by_red(p, slice)) continue;
          CUTE_UNROLL
          for (int w = 0; w < Traits::kWGs; ++w) {
            barrier_sync(dq_full_barrier(w), kDqBarrierThreads);
            if (lane == 0) {
              float* dst = dq_slice(p, block, w, slice);
              const float* src = smem.dq + w * Traits::kDqStagedPerWG;
              constexpr std::uint32_t kBytes = Traits::kDqStagedPerWG * sizeof(float);
              if constexpr (kBwdL2EvictLast) {
                arch::bulk_reduce_add_f32(dst, src, kBytes,
                                          static_cast<std::uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST));
              } else {
                arch::bulk_reduce_add_f32(dst, src, kBytes);
              }
              cute::tma_store_arrive();
            }
          }
          if (lane == 0) cute::tma_store_wait<0>();
          __syncwarp();
          CUTE_UNROLL
          for (int w = 0; w < Traits::kWGs; ++w) barrier_arrive(dq_empty_barrier(w), kDqBarrierThreads);
        }
        if (turn != nullptr && lane == 0) {
          arch::bulk_wait_complete();
          arch::publish_counter(turn, my_turn + 1);
        }
      }
      if constexpr (kVarlen) arch::mbarrier_arrive(&smem.kv_empty);
    }
  }

  __device__ static void consume(const Params& params, SharedStorage& smem, QPipeline& q_pipe, DoPipeline& do_pipe,
                                 const Mask& mask, int tid) {
    Consumer consumer(tid);
    // The dQ staging buffer starts free: one warp of each warpgroup stands in for the
    // dQ warp's first "read" arrival.
    if (tid % 128 < 32) barrier_arrive(dq_empty_barrier(consumer.wg), kDqBarrierThreads);
    // With an overlapped tile switch: the previous tile's dK and dV are leaving from the
    // dS and dQ staging buffers (store_dkv_staged), and this warpgroup holds its
    // staging part's turn until the tile's first dQ part takes it.
    bool staged = false;
    std::uint32_t phase = 0;
    for (;;) {
      arch::mbarrier_wait(&smem.kv_full, phase);
      phase ^= 1u;
      const TileCoord tile = smem.tile.tile;
      if (staged) {
        // Their TMA stores have read the buffers before the tile writes dS or dQ.
        if (tid == 0) cute::tma_store_wait<0>();
        if (tile.m_block >= 0) barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
      }
      if (tile.m_block < 0) break;
      const int n_block = tile.m_block;
      if constexpr (kVarlen) {
        const int k_valid = rows_in_block<Traits::kBlockN>(smem.tile.seq.seqlen_k, n_block * Traits::kBlockN);
        if (is_varlen<kVarlen>(params.p) && k_valid < Traits::kBlockN) consumer.clear_kv_rows(smem, k_valid);
      }
      auto tdKrdK = consumer.dkv_accumulator();
      auto tdVrdV = consumer.dkv_accumulator();
      cute::clear(tdKrdK);
      cute::clear(tdVrdV);
      const BlockRange range = query_range<Traits>(tile_mask<Traits>(mask, smem), n_block);
      // The dQ accumulator's block of the tile's query block 0, for the slice added by red.
      const std::int64_t first_q_block =
          Traits::kDqRedSlice >= 0
              ? q_block_index<Traits::kBlockM, kVarlen>(params.p, tile.batch, tile.head, slot_seq(params, smem), 0)
              : 0;
      const int first_staged = by_red(params.p, 0) ? 1 : 0;
      const QueryWalk walk = query_walk(params, tile, range);
#pragma unroll 1
      for (int i = range.begin; i < range.end; ++i) {
        const int m = walk.block(i);
        consumer.step(params, smem, q_pipe, do_pipe, mask, n_block, m, tdKrdK, tdVrdV, [&](auto& dq, int slice) {
          if (by_red(params.p, slice)) {
            add_dq_red(params.p, first_q_block + m, tid, dq, slice);
          } else {
            store_dq(smem, tid, dq, slice, staged, first_staged);
            staged = false;
          }
        });
      }
      if constexpr (Traits::kOverlapTileSwitch) {
        if (!params.p.layout.dkv_sums) {
          store_dkv_staged(params, smem, tid, tile, tdKrdK, tdVrdV, staged);
          staged = true;
          continue;
        }
      }
      store_dkv(params, smem, tid, tile, tdKrdK, tdVrdV);
    }
  }

  // Whether slice `slice` of a step's dQ leaves by red from registers
  // (BwdConfig::dq_red_slice): not in deterministic mode, whose ordered sums the dQ
  // warp makes.
  __device__ static bool by_red(const BwdParams& p, int slice) {
    return slice == Traits::kDqRedSlice && !p.deterministic;
  }

  // Hands a step's dQ partial sums on (slice `slice` of Traits::kDqSlices) to the dQ
  // warp, through this warpgroup's part of the staging buffer. Four consecutive values
  // per thread, threads interleaved: the order of the accumulator too
  // (hopper/bwd_workspace.h).
  // `held`: this warpgroup holds the part's turn already (the tile's first slice after
  // a staged epilogue, store_dkv_staged). `first`: the step's first staged slice.
  template <class FragDq>
  __device__ static void store_dq(SharedStorage& smem, int tid, const FragDq& dq, int slice, bool held, int first) {
    const int wg = tid / 128;
    constexpr int kVecs = decltype(cute::size(dq))::value / 4;
    if constexpr (Traits::kPInDqStaging) {
      // P lies in warpgroup 0's part: every warpgroup's dV GEMM must be done with it.
      // That part's wait for the dQ warp came before P was written (bwd_mainloop.cuh).
      if (slice == first) barrier_sync(BwdBarrier::kPdS, kConsumerThreads);
      if (wg != 0 || slice != first) barrier_sync(dq_empty_barrier(wg), kDqBarrierThreads);
    } else if (!held) {
      barrier_sync(dq_empty_barrier(wg), kDqBarrierThreads);
    }
    float4* dst = reinterpret_cast<float4*>(smem.dq + wg * Traits::kDqStagedPerWG) + tid % 128;
    CUTE_UNROLL
    for (int i = 0; i < kVecs; ++i) dst[i * 128] = make_float4(dq(4 * i), dq(4 * i + 1), dq(4 * i + 2), dq(4 * i + 3));
    cutlass::arch::fence_view_async_shared();
    barrier_arrive(dq_full_barrier(wg), kDqBarrierThreads);
  }

  // Adds slice `slice` of a step's dQ partial sums to the accumulator's block `block`
  // by red from registers (BwdConfig::dq_red_slice), where the dQ warp's bulk
  // reduce-add of the staged slice would put them.
  template <class FragDq>
  __device__ static void add_dq_red(const BwdParams& p, std::int64_t block, int tid, const FragDq& dq, int slice) {
    float4* dst = reinterpret_cast<float4*>(dq_slice(p, block, tid / 128, slice)) + tid % 128;
    constexpr int kVecs = decltype(cute::size(dq))::value / 4;
    CUTE_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      arch::red_add_v4(dst + i * 128, make_float4(dq(4 * i), dq(4 * i + 1), dq(4 * i + 2), dq(4 * i + 3)));
    }
  }

  // Deterministic mode (`turn` set): every consumer thread waits until the sums whose
  // turn comes before `my_turn` are in, adds its part, and then passes the turn on.
  __device__ static void take_turn(int* turn, int my_turn, int tid) {
    if (turn == nullptr) return;
    if (tid == 0) arch::wait_counter(turn, my_turn);
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
  }
  __device__ static void pass_turn(int* turn, int my_turn, int tid) {
    if (turn == nullptr) return;
    __threadfence();
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
    if (tid == 0) arch::publish_counter(turn, my_turn + 1);
  }

  // The tile's dK (scaled by the softmax scale) and dV with an overlapped tile switch
  // (BwdConfig::overlap_tile_switch), MHA: K's and V's buffers are released first, and
  // the rows leave by TMA store from the dS buffers (dK) and the dQ staging buffer (dV),
  // both free at the end of a tile. The next tile's K/V loads then overlap this
  // epilogue, which at short sequences (a tile of a few steps) was a visible share of
  // the tile. `held`: the warpgroup holds its staging part's turn already (a tile
  // without steps). The next tile waits for the stores to have read the buffers
  // (consume()).
  template <class FragDkv>
  __device__ static void store_dkv_staged(const Params& params, SharedStorage& smem, int tid, TileCoord tile,
                                          FragDkv& tdKrdK, const FragDkv& tdVrdV, bool held) {
    using namespace cute;
    const BwdParams& p = params.p;
    // The slot is the next tile's once K's and V's buffers are released.
    const SeqBounds seq = slot_seq(params, smem);
    // This thread's GEMMs are done with K and V (the step waited for all of them).
    arch::mbarrier_arrive(&smem.kv_empty);
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= p.softmax_scale;
    auto rdK = convert_fragment<Element>(tdKrdK);
    auto rdV = convert_fragment<Element>(tdVrdV);
    // The dQ warp has read this warpgroup's part of the staging buffer, and (barrier)
    // every warpgroup's part, and every dQ GEMM is done with dS.
    if (!held) barrier_sync(dq_empty_barrier(tid / 128), kDqBarrierThreads);
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
    Tensor sdK = make_tensor(make_smem_ptr(smem.ds), typename Traits::SmemLayoutK{});
    Tensor sdV = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem.dq)), typename Traits::SmemLayoutV{});
    store_dkv_out(params, tid, tile, seq, rdK, rdV, sdK, sdV, sdK, sdV);
  }

  // dK and dV (converted, `rdK`, `rdV`) into shared memory (`dst_k`, `dst_v`: views of the
  // MMA's layout, transposed when it holds dKᵀ/dVᵀ) and out of the tiles `src_k`, `src_v`:
  // by TMA store, issued by consumer thread 0, whose bulk group they are, or for a varlen
  // sequence's last block when it is partial by every consumer thread's row copies
  // (store_rows), which write no row past the sequence. `seq`: the tile's sequence.
  template <class Frag, class DstK, class DstV, class SrcK, class SrcV>
  __device__ static void store_dkv_out(const Params& params, int tid, TileCoord tile, const SeqBounds& seq,
                                       const Frag& rdK, const Frag& rdV, DstK dst_k, DstV dst_v, SrcK src_k,
                                       SrcV src_v) {
    using namespace cute;
    const BwdParams& p = params.p;
    typename Traits::TiledMmaDkv mma_dkv;
    auto copy_dkv = make_tiled_copy_C(typename Traits::CopyAtomDkv{}, mma_dkv);
    auto thr_copy = copy_dkv.get_thread_slice(tid);
    copy(copy_dkv, thr_copy.retile_S(rdK), thr_copy.partition_D(as_position_independent_swizzle_tensor(dst_k)));
    copy(copy_dkv, thr_copy.retile_S(rdV), thr_copy.partition_D(as_position_independent_swizzle_tensor(dst_v)));
    cutlass::arch::fence_view_async_shared();
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
    if (is_varlen<kVarlen>(p)) {
      // MHA: the KV head is the query head.
      const int first = tile.m_block * Traits::kBlockN;
      const int rows = rows_in_block<Traits::kBlockN>(seq.seqlen_k, first);
      // A block whole inside its sequence leaves by TMA as a fixed-length one does
      // (below): 0-1 % faster calls than row copies of every block (docs/perf-log.md).
      if (rows < Traits::kBlockN) {
        const std::int64_t row = static_cast<std::int64_t>(seq.offset_k) + first;
        store_rows(src_k, static_cast<Element*>(p.dk) + tile.head * p.dk_head_stride + row * p.dk_row_stride,
                   p.dk_row_stride, rows, p.head_dim, tid);
        store_rows(src_v, static_cast<Element*>(p.dv) + tile.head * p.dv_head_stride + row * p.dv_row_stride,
                   p.dv_row_stride, rows, p.head_dim_v, tid);
        return;
      }
    }
    if (tid == 0) {
      // MHA: the KV head is the query head. A varlen call's tensors are packed: the
      // sequence's rows start at its offset (0 in a fixed-length call).
      const int n_block = tile.m_block;
      const int batch = tensor_batch<kVarlen>(p, tile.batch);
      Tensor mdK = params.tma_dk.get_tma_tensor(
          make_shape(k_rows<kVarlen>(p), p.head_dim, p.nheads_kv, tensor_batches<kVarlen>(p)));
      Tensor gdK = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mdK(_, _, tile.head, batch)),
                              Shape<BN, D>{}, make_coord(n_block, _0{}));
      auto [tdKgK, tdKsK] =
          tma_partition(params.tma_dk, _0{}, Layout<_1>{}, group_modes<0, 2>(src_k), group_modes<0, 2>(gdK));
      copy(params.tma_dk, tdKsK, tdKgK);
      Tensor mdV = params.tma_dv.get_tma_tensor(
          make_shape(k_rows<kVarlen>(p), p.head_dim_v, p.nheads_kv, tensor_batches<kVarlen>(p)));
      Tensor gdV = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mdV(_, _, tile.head, batch)),
                              Shape<BN, D>{}, make_coord(n_block, _0{}));
      auto [tdVgV, tdVsV] =
          tma_partition(params.tma_dv, _0{}, Layout<_1>{}, group_modes<0, 2>(src_v), group_modes<0, 2>(gdV));
      copy(params.tma_dv, tdVsV, tdVgV);
      tma_store_arrive();
    }
  }

  // The first `rows` rows and `cols` columns of the block `src` (kBlockN x kHeadDim in
  // shared memory) to `out`, rows `row_stride` apart: 16 bytes a thread at a time (a
  // row's 16-byte groups stay whole in the swizzled layouts), each row under its own
  // predicate. The copies' reads are done when a thread moves on, so the buffer is free
  // once every consumer thread has passed a barrier after this.
  template <class Src>
  __device__ static void store_rows(const Src& src, Element* out, std::int64_t row_stride, int rows, int cols,
                                    int tid) {
    constexpr int kGroups = Traits::kHeadDim / 8;  // 16-byte groups per row
#pragma unroll 4
    for (int i = tid; i < Traits::kBlockN * kGroups; i += kConsumerThreads) {
      const int r = i / kGroups;
      const int col = 8 * (i % kGroups);
      if (r < rows && col < cols) {
        *reinterpret_cast<uint4*>(out + r * row_stride + col) = *reinterpret_cast<const uint4*>(&src(r, col));
      }
    }
  }

  // The tile's dK (scaled by the softmax scale) and dV otherwise: through K's and V's
  // buffers (store_dkv_out), after which the buffers are free, or (GQA/MQA: dkv_sums)
  // added to the fp32 accumulators, the buffers released before the sums with an
  // overlapped tile switch and after them without.
  template <class FragDkv>
  __device__ static void store_dkv(const Params& params, SharedStorage& smem, int tid, TileCoord tile,
                                   FragDkv& tdKrdK, const FragDkv& tdVrdV) {
    using namespace cute;
    const BwdParams& p = params.p;
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= p.softmax_scale;
    const int n_block = tile.m_block;
    if (!p.layout.dkv_sums) {
      // Every warpgroup's GEMMs are done with K and V before any overwrites them.
      barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
      Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{});
      Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKt{});
      Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutV{});
      Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutVt{});
      store_dkv_out(params, tid, tile, slot_seq(params, smem), convert_fragment<Element>(tdKrdK),
                    convert_fragment<Element>(tdVrdV), conditional_return<Traits::kDkvSwap>(sKt, sK),
                    conditional_return<Traits::kDkvSwap>(sVt, sV), sK, sV);
      if (tid == 0) tma_store_wait<0>();
      arch::mbarrier_arrive(&smem.kv_empty);
    } else {
      const int group = p.nheads_q / p.nheads_kv;
      const std::int64_t block =
          k_block_index<Traits::kBlockN, kVarlen>(p, tile.batch, tile.head / group, slot_seq(params, smem), n_block);
      // The sums leave from registers: with an overlapped tile switch K's and V's
      // buffers (and the slot, read above) are free for the next tile's loads while
      // they do.
      if constexpr (Traits::kOverlapTileSwitch) arch::mbarrier_arrive(&smem.kv_empty);
      const std::int64_t offset = block * (Traits::kBlockN * Traits::kHeadDim) + (tid / 128) * Traits::kDkvPerWG;
      float4* dk = reinterpret_cast<float4*>(workspace_floats(p, p.layout.dk_accum) + offset) + tid % 128;
      float4* dv = reinterpret_cast<float4*>(workspace_floats(p, p.layout.dv_accum) + offset) + tid % 128;
      int* turn = p.deterministic ? workspace_ints(p, p.layout.dkv_semaphore) + block : nullptr;
      take_turn(turn, tile.head % group, tid);
      CUTE_UNROLL
      for (int i = 0; i < size(tdKrdK) / 4; ++i) {
        atomicAdd(dk + i * 128, make_float4(tdKrdK(4 * i), tdKrdK(4 * i + 1), tdKrdK(4 * i + 2), tdKrdK(4 * i + 3)));
        atomicAdd(dv + i * 128, make_float4(tdVrdV(4 * i), tdVrdV(4 * i + 1), tdVrdV(4 * i + 2), tdVrdV(4 * i + 3)));
      }
      pass_turn(turn, tile.head % group, tid);
      if constexpr (!Traits::kOverlapTileSwitch) arch::mbarrier_arrive(&smem.kv_empty);
    }
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) bwd_kernel(const __grid_constant__ typename Kernel::Params params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel::run(params, smem);
}

}  // namespace fa3::hopper
