// fa3 — the forward mainloop: the producer warp's TMA loads and the consumer
// warpgroups' GEMMs and online softmax for one (query block, head, batch) tile.
//
// Consumers overlap inside a warpgroup: S_j = Q·K_jᵀ is issued before P_{j-1}·V_{j-1},
// so the tensor cores work on both while the warpgroup waits only for S_j, runs the
// softmax of block j, then waits for the P·V. Across warpgroups ("ping-pong") named
// barriers let one warpgroup issue GEMMs while the other runs its softmax.
//
// Key blocks are visited from last to first, so that the blocks needing a mask
// (causal diagonal, sequence end) come first and the mask test is a uniform branch.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "hopper/barriers.cuh"
#include "hopper/fp8_layout.h"
#include "hopper/fp8_scales.cuh"
#include "hopper/fragment.cuh"
#include "hopper/gemm.cuh"
#include "hopper/mask.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/timeline.cuh"

namespace fa3::hopper {

template <class Traits>
struct FwdProducer {
  using Element = typename Traits::Element;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;
  using DV = typename Traits::DV;
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  using QPipeline = typename Traits::QPipeline;
  using State = StageState<Traits::kStages>;

  State k_state = Pipeline::producer_start();
  State v_state = Pipeline::producer_start();
  StageState<Traits::kQStages> q_state = QPipeline::producer_start();

  // A tile's K/V loads come in two parts: the first (last-in-order) K and V blocks,
  // which only need ring stages, then the rest (load_kv_blocks, in two ranges where the
  // next tile is drawn between them). The caller announces a tile's Q between the two
  // parts, so that the first blocks are in flight while it waits for a Q buffer.
  template <class Params>
  __device__ void load_first_kv(const Params& params, SharedStorage& smem, Pipeline& k_pipe, Pipeline& v_pipe,
                                TileCoord tile, BlockRange keys) {
    if (keys.end <= keys.begin) return;
    const int n_end = keys.end;
    with_kv_tensors(params, smem, tile, [&](auto& tKgK, auto& tKsK, const auto& tma_v, auto& tVgV, auto& tVsV) {
      load_kv(params, smem, k_pipe, v_pipe, tKgK, tKsK, tma_v, tVgV, tVsV, n_end - 1,
              last_block_keys(params, tile, n_end - 1));
    });
  }

  // Loads the K/V blocks of `blocks`, last to first (a tile's blocks after its first
  // load, whole: only the first can end inside the sequence).
  template <class Params>
  __device__ void load_kv_blocks(const Params& params, SharedStorage& smem, Pipeline& k_pipe, Pipeline& v_pipe,
                                 TileCoord tile, BlockRange blocks) {
    if (blocks.end <= blocks.begin) return;
    with_kv_tensors(params, smem, tile, [&](auto& tKgK, auto& tKsK, const auto& tma_v, auto& tVgV, auto& tVsV) {
      // Not unrolled: unrolled, the compiler keeps each copy's key offset live across
      // the loop, and the producer's few registers spill.
#pragma unroll 1
      for (int n = blocks.end - 1; n >= blocks.begin; --n) {
        load_kv(params, smem, k_pipe, v_pipe, tKgK, tKsK, tma_v, tVgV, tVsV, n, Traits::kBlockN);
      }
    });
  }

  // With a cluster, after the last tile: waits until the consumers of every CTA have
  // released every K/V stage this CTA filled (TmaPipeline::producer_drain).
  __device__ void drain(Pipeline& k_pipe, Pipeline& v_pipe) {
    if constexpr (Traits::kCluster > 1) {
      k_pipe.producer_drain(k_state);
      v_pipe.producer_drain(v_state);
    }
  }

  // With V transposed in shared memory, after the last tile: a V stage with no load and
  // the keys slot -1 tells the transposing warps to stop.
  __device__ void stop_transpose(SharedStorage& smem, Pipeline& v_pipe) {
    if constexpr (Traits::kVtSmem) {
      v_pipe.producer_wait(v_state);
      arch::compiler_barrier();
      smem.v_landed_keys[v_state.index] = -1;
      arch::compiler_barrier();
      v_pipe.producer_commit_empty(v_state);
      v_state.advance();
    }
  }

  // Announces tile `t` in the next Q stage once the consumers have freed it: its
  // coordinates, then its Q load, whose landing completes the stage. Past the last tile
  // the stage completes with coordinates alone (m_block -1), which tell the consumers to
  // stop. The consumers take the coordinates from here rather than decoding the index
  // themselves: the divisions would sit on their path from one tile to the next.
  template <class Params, class Scheduler>
  __device__ void announce(const Params& params, SharedStorage& smem, QPipeline& q_pipe, const Scheduler& scheduler,
                           int t) {
    const bool valid = scheduler.valid(t);
    announce_tile(params, smem, q_pipe, valid, valid ? scheduler.coord(t) : TileCoord{-1, 0, 0});
  }

  // The same for a tile whose coordinates the caller has (the varlen order of
  // hopper/varlen_tiles.cuh); `valid` false announces the end.
  template <class Params>
  __device__ void announce_tile(const Params& params, SharedStorage& smem, QPipeline& q_pipe, bool valid,
                                TileCoord tile) {
    using namespace cute;
    const FwdParams& p = params.p;
    q_pipe.producer_wait(q_state);
    // The coordinates and the bounds are written after the stage is free and before the
    // arrival publishes them; the bounds are read only here, so that no more of them
    // than the store needs is live in the producer's few registers.
    arch::compiler_barrier();
    smem.tile[q_state.index].tile = tile;
    const SeqBounds seq = valid ? seq_bounds<Traits::kVarlen>(p, tile.batch) : SeqBounds{0, 0, 0, 0};
    smem.tile[q_state.index].seq = seq;
    arch::compiler_barrier();
    if (valid) {
      // A varlen call's rows start at the sequence's offset, not on a block boundary;
      // the block's rows past its end are the next sequence's (or TMA's zero fill),
      // computed and never stored.
      Tensor mQ = params.tma_q.get_tma_tensor(
          make_shape(q_rows<Traits::kVarlen>(p), p.head_dim, p.nheads_q, tensor_batches<Traits::kVarlen>(p)));
      Tensor mQh = mQ(_, _, tile.head, tensor_batch<Traits::kVarlen>(p, tile.batch));
      Tensor gQ = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mQh), Shape<BM, D>{},
                             make_coord(tile.m_block, _0{}));
      Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});  // (BM, D, q stages)
      auto [tQgQ, tQsQ] =
          tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
      constexpr auto kOnce = kFwdL2Hints ? TMA::CacheHintSm90::EVICT_FIRST : TMA::CacheHintSm90::EVICT_NORMAL;
      copy(params.tma_q.with(*q_pipe.producer_expect(q_state, Traits::kQBytes), 0, kOnce), tQgQ,
           tQsQ(_, q_state.index));
    } else {
      q_pipe.producer_commit_empty(q_state);
    }
    q_state.advance();
  }

 private:
  // The keys of block n, the tile's last, that are its sequence's, for the transpose in
  // shared memory to clear the rest: only a varlen call's last block of a sequence has
  // other rows (the next sequence's, which may hold NaN); a fixed-length call's rows past
  // the end are TMA's zero fill.
  template <class Params>
  __device__ __forceinline__ static int last_block_keys(const Params& params, TileCoord tile, int n) {
    if constexpr (Traits::kVtSmem) {
      if (is_varlen<Traits::kVarlen>(params.p)) {
        const int keys = seq_bounds<Traits::kVarlen>(params.p, tile.batch).seqlen_k - n * Traits::kBlockN;
        return keys < Traits::kBlockN ? keys : Traits::kBlockN;
      }
    }
    return Traits::kBlockN;
  }

  // `v_keys`: the keys of the block that are the sequence's (last_block_keys), for the
  // transpose in shared memory, which takes them from the stage's slot.
  template <class Params, class GK, class SK, class TmaV, class GV, class SV>
  __device__ __forceinline__ void load_kv(const Params& params, SharedStorage& smem, Pipeline& k_pipe, Pipeline& v_pipe,
                                          GK& tKgK, SK& tKsK, const TmaV& tma_v, GV& tVgV, SV& tVsV, int n,
                                          int v_keys) {
    using namespace cute;
    // A stage is full when all of it has landed: this CTA's part and the other CTAs'.
    std::uint64_t* k_full = k_pipe.producer_acquire(k_state, Traits::kKBytes);
    copy(with_barrier(params.tma_k, *k_full), tKgK(_, n), tKsK(_, k_state.index));
    k_state.advance();
    std::uint64_t* v_full;
    if constexpr (Traits::kVtSmem) {
      // The slot is written once the stage is free; the arrival publishes it.
      v_pipe.producer_wait(v_state);
      arch::compiler_barrier();
      smem.v_landed_keys[v_state.index] = v_keys;
      arch::compiler_barrier();
      v_full = v_pipe.producer_expect(v_state, Traits::kVBytes);
    } else {
      v_full = v_pipe.producer_acquire(v_state, Traits::kVBytes);
    }
    copy(with_barrier(tma_v, *v_full), tVgV(_, n), tVsV(_, v_state.index));
    v_state.advance();
  }

  // The executable TMA copy of K or V: with a cluster, multicast to all of its CTAs.
  // Every query block of the head reads them again (kFwdL2Hints).
  template <class Tma>
  __device__ __forceinline__ static auto with_barrier(const Tma& tma, std::uint64_t& full) {
    using cute::TMA::CacheHintSm90;
    constexpr auto kReused = kFwdL2Hints ? CacheHintSm90::EVICT_LAST : CacheHintSm90::EVICT_NORMAL;
    if constexpr (Traits::kCluster > 1) {
      return tma.with(full, static_cast<std::uint16_t>((1u << Traits::kCluster) - 1), kReused);
    } else {
      return tma.with(full, 0, kReused);
    }
  }

  // The first key of the tile's sequence in V as the kernel reads it: K's, except in a
  // varlen call's Vᵀ (FP8), whose sequences start apart (hopper/fp8_layout.h).
  __device__ __forceinline__ static int vt_offset(const FwdParams& p, const SeqBounds& seq, int batch) {
    if constexpr (Traits::kFp8 && !Traits::kVtSmem) {
      if (is_varlen<Traits::kVarlen>(p)) return static_cast<int>(fp8_vt_seq_start(seq.offset_k, batch));
    }
    return seq.offset_k;
  }

  // Calls fn with the TMA-partitioned (global, shared) tensors of K and V for `tile`,
  // whose keys start at the sequence's offset (a varlen call's, else 0), and V's TMA copy.
  template <class Params, class Fn>
  __device__ __forceinline__ void with_kv_tensors(const Params& params, SharedStorage& smem, TileCoord tile,
                                                  Fn&& fn) {
    using namespace cute;
    const FwdParams& p = params.p;
    const int head_kv = tile.head / (p.nheads_q / p.nheads_kv);
    const int batch = tensor_batch<Traits::kVarlen>(p, tile.batch);
    const SeqBounds seq = seq_bounds<Traits::kVarlen>(p, tile.batch);

    Tensor mK = params.tma_k.get_tma_tensor(
        make_shape(k_rows<Traits::kVarlen>(p), p.head_dim, p.nheads_kv, tensor_batches<Traits::kVarlen>(p)));
    Tensor gK = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mK(_, _, head_kv, batch)), Shape<BN, D>{},
                           make_coord(_, _0{}));  // (BN, D, n)
    Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{});
    // This CTA's part of each stage (all of it without a cluster).
    const int rank = Traits::kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
    const Layout<typename Traits::Cluster> cluster{};
    auto [tKgK, tKsK] = tma_partition(params.tma_k, rank, cluster, group_modes<0, 2>(sK), group_modes<0, 2>(gK));

    // Vᵀ (keys contiguous: the FP8 kernels' transposed copy, or with the transpose in
    // shared memory a V_colmajor V as it is), or V as the 16-bit kernels read it. With
    // the transpose in shared memory it lands in V's own ring.
    Element* v_smem = Traits::kVtSmem ? smem.v_landed : smem.v;
    const auto vt_tensors = [&] {
      Tensor mVt = params.tma_v.get_tma_tensor(
          make_shape(p.head_dim_v, k_rows<Traits::kVarlen>(p), p.nheads_kv, tensor_batches<Traits::kVarlen>(p)));
      Tensor gVt = local_tile(domain_offset(make_coord(_0{}, vt_offset(p, seq, tile.batch)), mVt(_, _, head_kv, batch)),
                              Shape<DV, BN>{}, make_coord(_0{}, _));  // (DV, BN, n)
      Tensor sVt = make_tensor(make_smem_ptr(v_smem), typename Traits::SmemLayoutVt{});
      return tma_partition(params.tma_v, rank, cluster, group_modes<0, 2>(sVt), group_modes<0, 2>(gVt));
    };
    if constexpr (Traits::kVtSmem) {
      if (p.v_col_stride == 1) {
        // V with its head dim contiguous lands as K does, (BN, DV) a stage.
        Tensor mV = params.tma_v_rows.get_tma_tensor(
            make_shape(k_rows<Traits::kVarlen>(p), p.head_dim_v, p.nheads_kv, tensor_batches<Traits::kVarlen>(p)));
        Tensor gV = local_tile(domain_offset(make_coord(seq.offset_k, _0{}), mV(_, _, head_kv, batch)), Shape<BN, DV>{},
                               make_coord(_, _0{}));  // (BN, DV, n)
        Tensor sV = make_tensor(make_smem_ptr(v_smem), typename Traits::SmemLayoutVRows{});
        auto [tVgV, tVsV] =
            tma_partition(params.tma_v_rows, rank, cluster, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
        fn(tKgK, tKsK, params.tma_v_rows, tVgV, tVsV);
        return;
      }
    }
    auto [tVgV, tVsV] = vt_tensors();
    fn(tKgK, tKsK, params.tma_v, tVgV, tVsV);
  }
};

template <class Traits, class Mask>
struct FwdConsumer {
  using Element = typename Traits::Element;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  using State = StageState<Traits::kStages>;
  static constexpr int kConsumerWGs = Traits::kConsumerWGs;
  static constexpr bool kPingpong = Traits::kCfg.pingpong && kConsumerWGs > 1;
  static_assert(kConsumerWGs <= kMaxConsumerWGs, "more consumer warpgroups than named barriers are laid out for");

  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  int tid;  // index among consumer threads
  int wg;   // consumer warpgroup
  int lane;
  State k_state;
  State v_state;
  FwdTimeline<kFwdTimeline> timeline;  // stamps of a diagnosis build (hopper/timeline.h)

  // Kernels that read Q from shared memory (every Q·Kᵀ's A operand: the FP8 kernels and
  // the 16-bit ones of head dims 192 and 256) slice it by a warpgroup index that comes
  // from a broadcast, which tells the compiler that it is warp-uniform: Q's descriptors
  // are then built in uniform registers, where sliced per thread they were built in
  // regular ones and moved over before every GEMM (two R2UR and two more instructions a
  // GEMM). Measured (docs/perf-log.md): FP8 hdim 256 128x64 +2-5 %; 16-bit hdim 192
  // +0.5-3 %, 256 level to +1 % up to 4k keys. Kernels with Q in registers were not
  // measured with it.
  static constexpr bool kUniformQ = !Traits::kCfg.q_registers;

  __device__ explicit FwdConsumer(int consumer_thread)
      : tid(consumer_thread),
        wg(kUniformQ ? __shfl_sync(0xffffffffu, consumer_thread / 128, 0) : consumer_thread / 128),
        lane(consumer_thread % 32) {}

  // Ping-pong: wait for this warpgroup's turn to issue GEMMs / hand the turn on.
  __device__ __forceinline__ void turn_wait() {
    if constexpr (kPingpong) barrier_sync(warp_scheduler_barrier(wg), 256);
  }
  __device__ __forceinline__ void turn_pass() {
    if constexpr (kPingpong) barrier_arrive(warp_scheduler_barrier((wg + 1) % kConsumerWGs), 256);
  }
  // The first turn belongs to warpgroup 0: the last warpgroup hands it over at start.
  __device__ __forceinline__ void turn_start() {
    if constexpr (kPingpong) {
      if (wg == kConsumerWGs - 1) barrier_arrive(warp_scheduler_barrier(0), 256);
    }
  }

  // Once S = Q·K_nᵀ has landed: frees K's stage, applies the block's k scale (FP8
  // kernels, hopper/fp8_scales.cuh), masks the block if it needs it, and folds S into
  // the online softmax (S becomes P). Returns whether O must be rescaled by `rescale`
  // (warp-uniform). With the lean FP8 softmax (fp8_lean_softmax, which gives an FP8
  // kernel lazy references: FwdConfig::lazy_rescale) the softmax takes k's scale
  // itself, and moves its references at every block of a call with block scales.
  template <bool kFirst, class Scales, class TensorS, class TensorC, class Softmax, int kRows>
  __device__ __forceinline__ bool scores_to_probs(Pipeline& k_pipe, const Mask& mask, TensorS& s, const TensorC& coord,
                                                  int m_block, int n, const Scales& scales, float k_scale,
                                                  Softmax& softmax, float (&rescale)[kRows]) {
    constexpr bool kScaledSoftmax = Scales::kOn && Traits::kCfg.lazy_rescale;
    k_pipe.consumer_release(k_state, lane);
    k_state.advance();
    if constexpr (Scales::kOn && !kScaledSoftmax) {
      // Before the mask: a scale times -inf would be NaN for a scale of 0.
      CUTE_UNROLL
      for (int i = 0; i < cute::size(s); ++i) s(i) *= k_scale;
    }
    if constexpr (Mask::kGeneral) {
      if (mask.softcap.on) mask.softcap.apply(s);
    }
    if (mask.template needs_mask<Traits::kBlockM, Traits::kBlockN>(m_block, n)) {
      apply_mask(mask, s, coord, m_block * Traits::kBlockM, n * Traits::kBlockN);
    }
    if constexpr (kScaledSoftmax) {
      return softmax.template update<kFirst, true>(s, rescale, k_scale, scales.per_block());
    } else {
      return softmax.template update<kFirst>(s, rescale);
    }
  }

  // A key block this warpgroup does not need: its GEMM turn passes straight on, and
  // its stages are freed once they have landed (an arrival on a stage the producer has
  // not refilled yet would count towards the previous lap).
  __device__ __forceinline__ void skip_block(Pipeline& k_pipe, Pipeline& v_pipe) {
    k_pipe.consumer_wait(k_state);
    turn_wait();
    turn_pass();
    k_pipe.consumer_release(k_state, lane);
    k_state.advance();
    v_pipe.consumer_wait(v_state);
    v_pipe.consumer_release(v_state, lane);
    v_state.advance();
  }

  // Sets V's rows for keys [valid, kBlockN) of the current V stage to zero (see
  // FwdKernel::v_rows_to_clear), once the stage has landed, and makes the zeros visible
  // to this warpgroup's GEMMs. Every warpgroup that runs the block clears it before its
  // first P·V of it; another may be clearing the same rows while this one's GEMM reads
  // them, which is harmless: after the first clear every write stores the zero already
  // there. The stage is not refilled before every warpgroup has released it. 16 bytes a
  // store: a key's head dim is contiguous in the 16-bit kernels' Vᵀ (the FP8 kernels,
  // keys contiguous, clear none: v_rows_to_clear).
  __device__ void clear_v_rows(SharedStorage& smem, Pipeline& v_pipe, int valid) {
    using namespace cute;
    v_pipe.consumer_wait(v_state);
    if constexpr (!Traits::kFp8) {
      Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutVt{});  // (DV, BN, stages)
      constexpr int kGroups = Traits::kHeadDimV / 8;
      const int first = (valid > 0 ? valid : 0) * kGroups;
#pragma unroll 1
      for (int i = first + tid % 128; i < kGroups * Traits::kBlockN; i += 128) {
        *reinterpret_cast<uint4*>(&sVt(8 * (i % kGroups), i / kGroups, v_state.index)) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
    cutlass::arch::fence_view_async_shared();
    barrier_sync(epilogue_barrier(wg), 128);
  }

  // When O is written through Q's buffer: tells the other warpgroups that this one's
  // reads of Q are complete (QueryRead), so that they may write their rows of O.
  __device__ __forceinline__ void signal_query_read() const {
    CUTE_UNROLL
    for (int w = 0; w < kConsumerWGs; ++w) {
      if (w != wg) barrier_arrive(query_read_barrier(w), Traits::kConsumerThreads);
    }
  }

  // Q·Kᵀ's A operand in registers, loaded once per tile by load_q (FwdConfig::q_registers);
  // otherwise a placeholder, and mma_tile reads Q from shared memory.
  __device__ auto q_fragment(SharedStorage& smem) {
    using namespace cute;
    if constexpr (Traits::kCfg.q_registers) {
      Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
      return mma_qk.get_thread_slice(tid).partition_fragment_A(sQ(_, _, 0));
    } else {
      return 0;
    }
  }

  template <class QFragment>
  __device__ void load_q(SharedStorage& smem, int q_stage, QFragment& q_frag) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
    auto copy_q = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma_qk);
    auto thr_copy_q = copy_q.get_thread_slice(tid);
    copy(copy_q, thr_copy_q.partition_S(sQ(_, _, q_stage)), thr_copy_q.retile_D(q_frag));
  }

  // Runs the tile's mainloop over key blocks `keys`, once the tile's Q has landed in Q
  // stage `q_stage` (and, with Q in registers, is in q_frag). On return tOrO holds the
  // unnormalized output and `softmax` the row statistics (empty rows: O = 0, sum 0);
  // with Q read from shared memory, `q_read()` has been called as soon as the
  // warpgroup's last Q·Kᵀ had completed. `last_pv_issued()` is called once the
  // statistics are final and the last P·V is in flight (for a warpgroup that saw no
  // key, at the end), so that work that does not need O overlaps that GEMM.
  // `v_valid` < kBlockN: V's rows past the first v_valid of the last key block are
  // cleared before they are read (FwdKernel::v_rows_to_clear). `scales` are the tile's
  // (hopper/fp8_scales.cuh); O is returned in units of *v_last, the v block scale of the
  // last key block run (1 for NoScales).
  template <class QFragment, class TensorO, class Softmax, class Scales, class QueryRead, class LastPvIssued>
  __device__ void mma_tile(SharedStorage& smem, int q_stage, QFragment& q_frag, Pipeline& k_pipe, Pipeline& v_pipe,
                           const Mask& mask, int m_block, BlockRange keys, int v_valid, TensorO& tOrO, Softmax& softmax,
                           const Scales& scales, float& v_last, QueryRead&& q_read, LastPvIssued&& last_pv_issued) {
    using namespace cute;
    Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutVt{});
    auto thr_qk = mma_qk.get_thread_slice(tid);
    auto thr_pv = mma_pv.get_thread_slice(tid);
    constexpr bool kQRegisters = Traits::kCfg.q_registers;
    // Q·Kᵀ's A operand, (MMA, MMA_M, MMA_K): q_frag, or one shared-memory descriptor per
    // K step, the same for every key block of the tile. Computed once, ptxas would hold
    // the descriptors in registers through the mainloop (2 * d/16 of them); from an
    // opaque pointer they are recomputed where each GEMM is issued.
    const auto tSrQ = [&] {
      if constexpr (kQRegisters) {
        return make_tensor(q_frag.data(), q_frag.layout());
      } else {
        // A warpgroup's Q is the same for its 128 threads: it is sliced by the warpgroup's
        // first thread, a uniform index (kUniformQ).
        Tensor sQ_opaque = make_tensor(make_smem_ptr(arch::opaque(smem.q)), typename Traits::SmemLayoutQ{});
        auto thr_q = mma_qk.get_thread_slice(wg * 128);
        return thr_q.partition_fragment_A(sQ_opaque)(_, _, _, q_stage);
      }
    };
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stages)
    Tensor tScS = thr_qk.partition_C(make_identity_tensor(Shape<BM, BN>{}));
    auto coord = rowcol_view(tScS);

    clear(tOrO);
    const int n_end = keys.end;
    const int n_begin = keys.begin;
    // The tile's first key blocks (in visiting order) may lie past what this
    // warpgroup's rows see: beyond a causal diagonal that ends inside the tile, or all
    // of them when its rows are past the sequence end. It only takes their GEMM turns
    // and frees their stages.
    int n_own = n_end;
    if constexpr (Traits::kCfg.skip_blocks) {
      // A broadcast makes the warpgroup index warp-uniform to the compiler, so that the
      // stage indices after the skipped blocks stay in uniform registers (without it
      // the mainloop's descriptor arithmetic moves to vector registers).
      const int row0 = m_block * Traits::kBlockM + __shfl_sync(0xffffffffu, wg, 0) * 64;
      n_own = mask.template key_blocks<Traits::kBlockN>(row0, row0 + 64);
      n_own = n_own > n_begin ? n_own : n_begin;
      for (int n = n_end - 1; n >= n_own; --n) skip_block(k_pipe, v_pipe);
    }
    if (n_own <= n_begin) {
      // Each warpgroup takes a tile's (n_end - n_begin) + 1 GEMM turns (one per key
      // block, then the last P·V's): one that skipped every block still owes the last.
      if (n_end > n_begin) {
        turn_wait();
        turn_pass();
      }
      v_last = 1.f;
      q_read();
      last_pv_issued();
      return;
    }

    Tensor tSrS = partition_fragment_C(mma_qk, Shape<BM, BN>{});
    auto s = rowcol_view(tSrS);
    auto o = rowcol_view(tOrO);
    float rescale[Softmax::kRowsPerThread];

    int n = n_own - 1;
    // The block scales are read before the waits, which hide their latency.
    float k_scale = scales.k_block(n);
    float v_scale = scales.v_block(n);
    k_pipe.consumer_wait(k_state);
    turn_wait();
    timeline.stamp(FwdEvent::kTurn, n);
    gemm_async<true>(mma_qk, tSrQ(), tSrK(_, _, _, k_state.index), tSrS);
    turn_pass();
    // The block whose V may need clearing is the tile's last; this warpgroup runs it
    // unless it skipped it above. Cleared while its first Q·Kᵀ runs: the wait for V's
    // landing and the stores hide under it.
    if (v_valid < Traits::kBlockN && n_own == n_end) clear_v_rows(smem, v_pipe, v_valid);
    warpgroup_wait<0>();
    warpgroup_fence_operand(tSrS);
    timeline.stamp(FwdEvent::kScores, n);
    scores_to_probs<true, Scales>(k_pipe, mask, s, coord, m_block, n, scales, k_scale, softmax, rescale);
    timeline.stamp(FwdEvent::kProbs, n);
    auto tOrP = make_p_operand<Element>(tSrS.layout());
    convert_p(tOrP, tSrS);

    for (--n; n >= n_begin; --n) {
      k_scale = scales.k_block(n);
      const float v_next = scales.v_block(n);
      k_pipe.consumer_wait(k_state);
      turn_wait();
      timeline.stamp(FwdEvent::kTurn, n);
      gemm_async<true>(mma_qk, tSrQ(), tSrK(_, _, _, k_state.index), tSrS);
      v_pipe.consumer_wait(v_state);
      gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, v_state.index), tOrO);
      turn_pass();
      warpgroup_wait<1>();
      warpgroup_fence_operand(tSrS);
      timeline.stamp(FwdEvent::kScores, n);
      const bool grown =
          scores_to_probs<false, Scales>(k_pipe, mask, s, coord, m_block, n, scales, k_scale, softmax, rescale);
      timeline.stamp(FwdEvent::kProbs, n);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      timeline.stamp(FwdEvent::kPvDone, n);
      v_pipe.consumer_release(v_state, lane);
      v_state.advance();
      if (grown) {
        if constexpr (Scales::kOn) {
          // O moves from the previous block's v scale to this one's (hopper/fp8_scales.cuh);
          // with block scales every block rescales (scores_to_probs), without them the
          // ratio is 1.
          const float to_next = v_scale / v_next;
          CUTE_UNROLL
          for (int r = 0; r < Softmax::kRowsPerThread; ++r) rescale[r] *= to_next;
        }
        rescale_rows(o, rescale);
      }
      v_scale = v_next;
      convert_p(tOrP, tSrS);
    }
    v_last = v_scale;
    if constexpr (!kQRegisters) q_read();  // every Q·Kᵀ of the tile has completed

    v_pipe.consumer_wait(v_state);
    turn_wait();
    timeline.stamp(FwdEvent::kTurn, n_begin - 1);
    gemm_async<false>(mma_pv, tOrP, tOrV(_, _, _, v_state.index), tOrO);
    turn_pass();
    last_pv_issued();
    warpgroup_wait<0>();
    warpgroup_fence_operand(tOrO);
    timeline.stamp(FwdEvent::kPvDone, n_begin - 1);
    v_pipe.consumer_release(v_state, lane);
    v_state.advance();
  }
};

}  // namespace fa3::hopper
