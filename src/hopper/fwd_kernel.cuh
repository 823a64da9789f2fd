// fa3 — the forward kernel: warpgroup roles, register budgets, the persistent tile
// loop, and the handshakes between roles.
//
// Warpgroup 0 is the producer (one warp picks tiles and issues every TMA load; it
// keeps few registers; with O's own buffer a second warp issues O's TMA stores, see
// hopper/epilogue.cuh); warpgroups 1.. are consumers, each owning 64 query rows of
// the tile. Handshakes, all mbarrier rings (full: TMA bytes landed; empty: the
// consumers done with the stage):
//   K, V : one stage per key block.
//   Q    : one stage per tile. The producer writes the tile's coordinates into the
//          stage before arming it, so its completion also tells the consumers which
//          tile to run; m_block -1 (armed with no load) tells them to stop. A stage
//          is freed when O is written through Q's buffer once O's store has read it,
//          otherwise once Q is in the consumers' registers (FwdConfig::q_registers),
//          which happens while the previous tile's last P·V runs, or their last Q·Kᵀ
//          of the tile has completed. Every consumer thread reads the coordinates, so
//          every thread arrives on the stage's empty barrier: an arrival releases only
//          its own thread's reads.
//          With two stages the producer announces each tile while the previous one
//          runs, so its Q is there when the consumers get to it.
// A varlen call (FwdParams::cu_seqlens_q) runs on the same kernels: the producer reads
// each tile's sequence bounds (SeqBounds), loads its rows at the sequence's offset in the
// packed tensors and hands the bounds to the consumers with the coordinates; the masks
// take the sequence's lengths, and the epilogue stores each row under its own predicate.
// Kernels of paired tiles (FwdConfig::cluster_m, non-causal only) run clusters of two
// CTAs on neighbouring query blocks of the same head, which see the same key blocks in
// the same order: each CTA loads half of every K/V stage and multicasts it to both
// (pipeline.cuh).
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include <type_traits>

#include "hopper/barriers.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/fp8_scales.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_params.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/fwd_vt_transpose.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/varlen_tiles.cuh"

namespace fa3::hopper {

template <class Traits_, class Mask_>
struct FwdKernel {
  using Traits = Traits_;
  using Mask = Mask_;
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  using QPipeline = typename Traits::QPipeline;
  // General tiles may differ in length as causal ones do (a causal window, or causal
  // with a softcap): they take the dynamic, longest-first order too.
  using Scheduler = TileScheduler<Mask::kCausal || Mask::kGeneral>;
  using Scales = std::conditional_t<Traits::kFp8, Fp8TileScales<Traits::kBlockM, Traits::kBlockN>, NoScales>;
  // Whether varlen calls take the order of real tiles (hopper/varlen_tiles.cuh): in builds
  // with kVarlenDynamicOrder, on 16-bit kernels without CTA pairs, whose two CTAs must run
  // neighbouring blocks (the launch gives these calls a counter, always). The FP8 kernels
  // keep their own order: the new one has not run on them.
  static constexpr bool kVarlenOrder = kVarlenDynamicOrder && Traits::kVarlen && Traits::kCluster == 1 && !Traits::kFp8;
  // FP8: P = exp(s - max) * 2^8 before its rounding to e4m3 (fa3/attention.h).
  static constexpr int kFp8PLog2Shift = 8;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;

  struct Params {
    typename Traits::TmaQ tma_q;
    typename Traits::TmaK tma_k;
    typename Traits::TmaV tma_v;
    typename Traits::TmaO tma_o;
    FwdParams p;
    int num_m_blocks;
    int heads_per_group;  // tile order: (batch, head) pairs whose K/V share L2
    int* tile_counter;    // 0 at launch, left 0 (dynamic scheduler; hopper/tile_counter.h)
    int draw_lead;        // dynamic orders: when the next tile is drawn (fwd_draw_lead)
    // V with its head dim contiguous, for the transpose in shared memory (Traits::kVtSmem);
    // a V whose keys are contiguous loads by tma_v.
    typename Traits::TmaVRows tma_v_rows;
  };

  __device__ static void run(const Params& params, char* smem_raw) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_group = warp / 4;

    if (threadIdx.x == 0) {
      QPipeline::init(smem.q_pipe, kConsumerThreads);
      Pipeline::init(smem.k_pipe, kConsumerThreads / 32);
      // With V transposed in shared memory, Vᵀ's stages are filled by the transposing
      // threads' arrivals, and V's, as TMA lands them, freed by them.
      Pipeline::init(smem.v_pipe, kConsumerThreads / 32, Traits::kVtSmem ? Traits::kTransposeThreads : 1);
      if constexpr (Traits::kVtSmem) Pipeline::init(smem.v_landed_pipe, Traits::kTransposeThreads);
      FwdEpilogue<Traits>::init(smem);
      cutlass::arch::fence_barrier_init();
    }
    // With a cluster, the other CTAs' loads and arrivals reach this CTA's barriers:
    // none may start before every CTA has initialised its own.
    if constexpr (Traits::kCluster > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    QPipeline q_pipe{&smem.q_pipe};
    Pipeline k_pipe{&smem.k_pipe};
    Pipeline v_pipe{&smem.v_pipe};
    Pipeline v_landed_pipe{&smem.v_landed_pipe};
    const Scheduler scheduler(params.num_m_blocks, params.p.nheads_q, params.p.batch, params.heads_per_group);
    const Mask mask(params.p);

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kCfg.producer_regs>();
      if (warp == 0) {
        // The producer's TMA fills V's ring: Vᵀ's, or with the transpose in shared memory
        // the ring of V as it lands.
        produce(params, smem, q_pipe, k_pipe, Traits::kVtSmem ? v_landed_pipe : v_pipe, scheduler, mask);
      } else if (warp == 1 && FwdEpilogue<Traits>::kStoreWarp) {
        FwdEpilogue<Traits>::run_store_warp(params, smem);
      } else if constexpr (Traits::kVtSmem) {
        if (warp >= Traits::kFirstTransposeWarp) {
          FwdVtTranspose<Traits>::run(params.p, smem, v_landed_pipe, v_pipe,
                                      static_cast<int>(threadIdx.x) - 32 * Traits::kFirstTransposeWarp);
        }
      }
    } else {
      cutlass::arch::warpgroup_reg_alloc<Traits::kCfg.consumer_regs>();
      consume(params, smem, q_pipe, k_pipe, v_pipe, mask, static_cast<int>(threadIdx.x) - 128);
    }
  }

 private:
  // The key blocks a tile runs: those of its cluster's first query block, so that every
  // CTA of the cluster loads and runs the same ones (a query block past the sequence
  // end, which pads a head's blocks to the cluster size, would otherwise see none).
  // Paired tiles are plain (no window), whose blocks all start at 0.
  __device__ static BlockRange tile_key_blocks(const Mask& mask, int m_block) {
    const int first = m_block / Traits::kCluster * Traits::kCluster;
    return {mask.template n_block_begin<Traits::kBlockM, Traits::kBlockN>(first),
            mask.template n_block_end<Traits::kBlockM, Traits::kBlockN>(first)};
  }

  // The mask of sequence `batch` (the producer's: the consumers have the bounds from the
  // tile's slot). Read where it is used, so that the producer, whose registers are few,
  // keeps no bounds live across its loads.
  __device__ static Mask sequence_mask(const FwdParams& p, const Mask& mask, int batch) {
    const SeqBounds seq = seq_bounds<Traits::kVarlen>(p, batch);
    return for_sequence(mask, seq.seqlen_q, seq.seqlen_k);
  }

  // Tile `t` or, in a varlen call, the first from it on (in the CTA's order) whose
  // cluster's first query block starts inside its sequence: the longest sequence sets
  // how many query blocks every (head, batch entry) has, and the others' blocks past
  // their ends (all of an empty sequence's) have nothing to compute or store. The CTAs
  // of a cluster run one cluster's blocks of one head, so they skip alike. Every tile
  // skipped is drawn, so that the counter's protocol (TileScheduler::next) holds.
  __device__ static int skip_empty(const Params& params, const Scheduler& scheduler, int t) {
    if (!is_varlen<Traits::kVarlen>(params.p)) return t;
#pragma unroll 1
    for (; scheduler.valid(t); t = scheduler.next(t, params.tile_counter)) {
      const TileCoord tile = scheduler.coord(t);
      const int first_row = tile.m_block / Traits::kCluster * Traits::kCluster * Traits::kBlockM;
      if (first_row < seq_bounds<Traits::kVarlen>(params.p, tile.batch).seqlen_q) break;
    }
    return t;
  }

  __device__ static void produce(const Params& params, SharedStorage& smem, QPipeline& q_pipe, Pipeline& k_pipe,
                                 Pipeline& v_pipe, const Scheduler& scheduler, const Mask& mask) {
    if constexpr (kVarlenOrder) {
      if (is_varlen<Traits::kVarlen>(params.p)) {
        produce_varlen(params, smem, q_pipe, k_pipe, v_pipe, mask);
        return;
      }
    }
    constexpr bool kQAhead = Traits::kQStages > 1;
    // A static order's next tile is known without a draw: it is always taken first.
    const int draw_lead = Scheduler::kDynamic ? params.draw_lead : -1;
    const bool leader = cute::elect_one_sync();
    if (leader) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    }
    FwdProducer<Traits> producer;
    // Only the leader draws tiles (skip_empty may draw several); the others learn the
    // leader's from the broadcast below.
    int t = leader ? skip_empty(params, scheduler, scheduler.first()) : 0;
    t = __shfl_sync(0xffffffffu, t, 0);
    if (kQAhead && leader) producer.announce(params, smem, q_pipe, scheduler, t);
    for (;;) {
      const bool valid = scheduler.valid(t);
      int next = 0;
      if (leader) {
        if (valid) {
          // The next tile is drawn as this one starts (draw_lead < 0), its answer needed
          // only after this tile's first K/V loads, or once all but the last draw_lead
          // of this tile's K/V blocks are loading (hopper/fwd_config.h's fwd_draw_lead);
          // with two Q stages the next tile's Q follows the draw.
          const auto draw_next = [&] { return skip_empty(params, scheduler, scheduler.next(t, params.tile_counter)); };
          if (draw_lead < 0) next = draw_next();
          const TileCoord tile = scheduler.coord(t);
          const BlockRange keys = tile_key_blocks(sequence_mask(params.p, mask, tile.batch), tile.m_block);
          producer.load_first_kv(params, smem, k_pipe, v_pipe, tile, keys);
          if (draw_lead < 0 || !kQAhead) producer.announce(params, smem, q_pipe, scheduler, kQAhead ? next : t);
          // The blocks after the first, keys.end - 2 down to keys.begin; the last
          // draw_lead of them are loaded after the draw.
          const int rest = keys.end - 1 - keys.begin;
          const int split = keys.begin + (draw_lead < 0 || rest <= 0 ? 0 : (draw_lead < rest ? draw_lead : rest));
          producer.load_kv_blocks(params, smem, k_pipe, v_pipe, tile, BlockRange{split, keys.end - 1});
          if (draw_lead >= 0) {
            next = draw_next();
            if (kQAhead) producer.announce(params, smem, q_pipe, scheduler, next);
          }
          producer.load_kv_blocks(params, smem, k_pipe, v_pipe, tile, BlockRange{keys.begin, split});
        } else if (!kQAhead) {
          producer.announce(params, smem, q_pipe, scheduler, t);  // no more tiles
        }
      }
      if (!valid) break;
      t = __shfl_sync(0xffffffffu, next, 0);
    }
    if (leader) {
      producer.drain(k_pipe, v_pipe);
      producer.stop_transpose(smem, v_pipe);
    }
  }

  // produce() for a varlen call in that order. The whole warp draws and maps each tile
  // (VarlenTiles keeps 32 sequences' counts, one a lane); the leader issues the loads.
  // The next tile is drawn once this one's first K/V loads are issued: the draw's atomic
  // and, now and then, the next 32 sequences' bounds are read while they land.
  __device__ static void produce_varlen(const Params& params, SharedStorage& smem, QPipeline& q_pipe,
                                        Pipeline& k_pipe, Pipeline& v_pipe, const Mask& mask) {
    constexpr bool kQAhead = Traits::kQStages > 1;
    const bool leader = cute::elect_one_sync();
    FwdProducer<Traits> producer;
    VarlenTiles<Traits::kBlockM> tiles(params.p);
    int t = static_cast<int>(blockIdx.x);
    bool valid = tiles.valid(t);
    TileCoord tile = valid ? tiles.coord(params.p, t) : TileCoord{-1, 0, 0};
    if (kQAhead && leader) producer.announce_tile(params, smem, q_pipe, valid, tile);
    while (valid) {
      BlockRange keys{};
      if (leader) {
        keys = tile_key_blocks(sequence_mask(params.p, mask, tile.batch), tile.m_block);
        producer.load_first_kv(params, smem, k_pipe, v_pipe, tile, keys);
      }
      __syncwarp();
      t = tiles.next(params.tile_counter);
      const bool next_valid = tiles.valid(t);
      const TileCoord next = next_valid ? tiles.coord(params.p, t) : TileCoord{-1, 0, 0};
      if (leader) {
        if (kQAhead) {
          producer.announce_tile(params, smem, q_pipe, next_valid, next);
        } else {
          producer.announce_tile(params, smem, q_pipe, true, tile);
        }
        producer.load_kv_blocks(params, smem, k_pipe, v_pipe, tile, BlockRange{keys.begin, keys.end - 1});
      }
      __syncwarp();
      valid = next_valid;
      tile = next;
    }
    if (leader) {
      if (!kQAhead) producer.announce_tile(params, smem, q_pipe, false, TileCoord{-1, 0, 0});
      producer.drain(k_pipe, v_pipe);
      producer.stop_transpose(smem, v_pipe);
    }
  }

  // In a varlen call, the V rows of the tile's last key block (the first visited) that
  // lie past its sequence's keys, when that block ends inside the sequence's: those rows
  // are the next sequence's, or rows no sequence uses, and may hold anything, NaN
  // included, where a fixed-length call's are TMA's zero fill. Their probabilities are
  // 0, but 0 times NaN is NaN; the consumers clear them (FwdConsumer::mma_tile). Returns
  // how many of the block's keys are the sequence's (kBlockN: nothing to clear). An FP8
  // kernel's Vᵀ has zeros there already (hopper/fp8_layout.h's kFp8VtTail, or the
  // transpose in shared memory clears them: FwdProducer::v_keys).
  __device__ static int v_rows_to_clear(const FwdParams& p, const SeqBounds& seq, BlockRange keys) {
    if (Traits::kFp8 || !is_varlen<Traits::kVarlen>(p) || keys.end <= keys.begin) return Traits::kBlockN;
    const int valid = seq.seqlen_k - (keys.end - 1) * Traits::kBlockN;
    return valid < Traits::kBlockN ? valid : Traits::kBlockN;
  }

  __device__ static void consume(const Params& params, SharedStorage& smem, QPipeline& q_pipe, Pipeline& k_pipe,
                                 Pipeline& v_pipe, const Mask& mask, int tid) {
    using namespace cute;
    using Epilogue = FwdEpilogue<Traits>;
    using QState = StageState<Traits::kQStages>;
    constexpr bool kOInQ = Traits::kCfg.o_store == OStore::kQBuffer;
    // With Q in registers (and its buffer not needed for O), a tile's Q is loaded while
    // the previous tile's last P·V runs, so that neither the wait for it nor the loads
    // lie between that tile's end and this tile's first Q·Kᵀ.
    constexpr bool kQEarly = Traits::kCfg.q_registers && !kOInQ;
    FwdConsumer<Traits, Mask> consumer(tid);
    consumer.timeline.open(params.p, consumer.wg, tid, Traits::kConsumerWGs);
    typename Epilogue::State epilogue_state;
    Tensor tOrO = partition_fragment_C(consumer.mma_pv, Shape<typename Traits::BM, typename Traits::DV>{});
    auto q_frag = consumer.q_fragment(smem);
    // Waits for stage `st` of Q and returns its tile and sequence; with Q in registers
    // also loads them, after which the stage is free (or, with O in Q's buffer, the
    // other warpgroups may write O there).
    const auto next_tile = [&](const QState& st) {
      q_pipe.consumer_wait_for_data(st);
      const FwdTileSlot slot = smem.tile[st.index];
      if constexpr (Traits::kCfg.q_registers) {
        if (slot.tile.m_block >= 0) {
          consumer.load_q(smem, st.index, q_frag);
          if constexpr (kOInQ) {
            consumer.signal_query_read();
          } else {
            q_pipe.consumer_release_each(st);
          }
        }
      }
      return slot;
    };

    consumer.turn_start();
    QState q_state;
    FwdTileSlot slot = next_tile(q_state);
    while (slot.tile.m_block >= 0) {
      const TileCoord tile = slot.tile;
      const SeqBounds seq = slot.seq;
      const Mask tile_mask = for_sequence(mask, seq.seqlen_q, seq.seqlen_k);
      const BlockRange keys = tile_key_blocks(tile_mask, tile.m_block);
      // The FP8 kernels' scales of q and k fold into the softmax scale, and P is shifted
      // by 2^8 before its rounding to e4m3 (hopper/fp8_scales.cuh, hopper/softmax.cuh).
      const Scales scales(params.p, tile);
      OnlineSoftmax<2, Traits::kCfg.lazy_rescale, Traits::kFp8 ? kFp8PLog2Shift : 0> softmax(
          softmax_scale_log2_of(mask, params.p) * scales.qk());
      // Once this warpgroup's last Q·Kᵀ from shared memory has completed: with O
      // elsewhere, Q's stage may take the next tile's Q; with O in Q's buffer, the other
      // warpgroups may write O.
      // (With Q in registers, next_tile has done this.)
      const auto q_read = [&] {
        if constexpr (!Traits::kCfg.q_registers) {
          if constexpr (kOInQ) {
            consumer.signal_query_read();
          } else {
            q_pipe.consumer_release_each(q_state);
          }
        }
      };
      QState next_state = q_state;
      next_state.advance();
      FwdTileSlot next{};
      float inv_sum[2];
      float lse[2];
      // While the last P·V runs: the row statistics, LSE's store, and the next tile's Q.
      const auto last_pv_issued = [&] {
        softmax.finish(softmax_scale_of(mask, params.p) * scales.qk(), inv_sum, lse);
        add_sink(params.p, tile.head, inv_sum, lse);
        Epilogue::store_lse(params.p, tid, tile, seq, lse);
        if constexpr (kQEarly) next = next_tile(next_state);
      };
      float v_last;
      consumer.timeline.begin_tile(tile.m_block, tile.batch * params.p.nheads_q + tile.head);
      consumer.timeline.stamp(FwdEvent::kTileStart, keys.end);
      consumer.mma_tile(smem, q_state.index, q_frag, k_pipe, v_pipe, tile_mask, tile.m_block, keys,
                        v_rows_to_clear(params.p, seq, keys), tOrO, softmax, scales, v_last, q_read, last_pv_issued);
      if constexpr (Scales::kOn) {
        const float v_out = scales.v_out(v_last);
        for (float& f : inv_sum) f *= v_out;
      }
      auto o = rowcol_view(tOrO);
      rescale_rows(o, inv_sum);
      Epilogue::store_o(params, smem, epilogue_state, tid, tile, seq, tOrO, lse);
      consumer.timeline.stamp(FwdEvent::kTileEnd, keys.begin);
      if constexpr (kOInQ) {
        // Q's buffer is free once this warpgroup's store has read its rows of O; the
        // thread that drains the store arrives after the drain.
        Epilogue::drain(tid);
        q_pipe.consumer_release_each(q_state);
      }
      if constexpr (!kQEarly) next = next_tile(next_state);
      q_state = next_state;
      slot = next;
    }
    Epilogue::finish(smem, epilogue_state, tid);
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) fwd_kernel(const __grid_constant__ typename Kernel::Params params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel::run(params, smem);
}

}  // namespace fa3::hopper
