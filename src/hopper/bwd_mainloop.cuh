// fa3 — the backward mainloop: the producer warp's loads and the consumer warpgroups'
// five GEMMs of one step (a query block against the tile's key block).
//
// A step, for the consumers (sdp_swap: S and dP are held transposed):
//   S = Q·Kᵀ and dP = dO·Vᵀ issued back to back; P = exp2(S·scale·log2e − LSE·log2e)
//   while dP runs (S capped first under a softcap); dS = P∘(dP − D), times the cap's
//   slope under a softcap; P and dS to bf16/fp16, dS (and P unless the dK/dV
//   GEMMs take them from registers) to shared memory; dV += Pᵀ·dO; dQ = dS·K once every
//   warpgroup's dS is in; dK += dSᵀ·Q while dQ's sum leaves (through shared memory to
//   the dQ warp's bulk reduce-add).
// The row statistics come with their tiles: LSE with Q, D with dO.
//
// A varlen call's tiles load their rows at the sequence's offset in the packed tensors
// (one batch entry of all the rows). A block's rows past the sequence's end are then the
// next sequence's, or rows no sequence uses, and may hold anything, NaN included, where
// a fixed-length call's are TMA's zero fill: even with P and dS 0 there, 0 times NaN in
// the dK, dV and dQ GEMMs is NaN. The consumers clear them in shared memory (Q's and dO's
// in a sequence's last query block, K's and V's in its last key block), after which a
// step computes what it computes for a fixed-length call.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <type_traits>

#include "hopper/barriers.cuh"
#include "hopper/bwd_params.h"
#include "hopper/bwd_seq.cuh"
#include "hopper/fragment.cuh"
#include "hopper/gemm.cuh"
#include "hopper/mask.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

// Query blocks [begin, end) of key block n_block.
template <class Traits, class Mask>
__device__ __forceinline__ BlockRange query_range(const Mask& mask, int n_block) {
  BlockRange r;
  r.end = mask.template query_blocks<Traits::kBlockM, Traits::kBlockN>(n_block, &r.begin);
  return r;
}

template <class Traits>
struct BwdProducer {
  using SharedStorage = typename Traits::SharedStorage;
  using QPipeline = typename Traits::QPipeline;
  using DoPipeline = typename Traits::DoPipeline;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;

  StageState<Traits::kQStages> q_state = QPipeline::producer_start();
  StageState<Traits::kDoStages> do_state = DoPipeline::producer_start();
  std::uint32_t kv_empty_phase = 1;  // K/V's buffers start empty

  // Q with its LSE, then dO with its D, of query block m_block into the next stages.
  // The sequence's bounds are read here, not kept across the loads in the producer's
  // few registers.
  template <class Params>
  __device__ void load_step(const Params& params, SharedStorage& smem, QPipeline& q_pipe, DoPipeline& do_pipe,
                            TileCoord tile, int m_block) {
    using namespace cute;
    constexpr bool kVarlen = Traits::kVarlen;
    const BwdParams& p = params.p;
    const SeqBounds seq = seq_bounds<kVarlen>(p, tile.batch);
    const std::int64_t stats_row =
        q_block_index<Traits::kBlockM, kVarlen>(p, tile.batch, tile.head, seq, m_block) * Traits::kBlockM;
    const char* ws = static_cast<const char*>(p.workspace);
    const auto q_shape = make_shape(q_rows<kVarlen>(p), p.head_dim, p.nheads_q, tensor_batches<kVarlen>(p));
    const auto do_shape = make_shape(q_rows<kVarlen>(p), p.head_dim_v, p.nheads_q, tensor_batches<kVarlen>(p));
    const int batch = tensor_batch<kVarlen>(p, tile.batch);

    // Every tile of the head reads them (kBwdL2EvictLast).
    constexpr auto kReused = kBwdL2EvictLast ? TMA::CacheHintSm90::EVICT_LAST : TMA::CacheHintSm90::EVICT_NORMAL;
    std::uint64_t* q_full = q_pipe.producer_acquire(q_state, Traits::kQBytes + Traits::kStatsBytes);
    Tensor mQ = params.tma_q.get_tma_tensor(q_shape);
    Tensor gQ = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mQ(_, _, tile.head, batch)), Shape<BM, D>{},
                           make_coord(_, _0{}));  // (BM, D, m)
    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});               // (BM, D, stage)
    auto [tQgQ, tQsQ] =
        tma_partition(params.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
    copy(params.tma_q.with(*q_full, 0, kReused), tQgQ(_, m_block), tQsQ(_, q_state.index));
    arch::bulk_load(smem.lse + q_state.index * Traits::kStatsStride,
                    reinterpret_cast<const float*>(ws + p.layout.lse_log2) + stats_row, Traits::kStatsBytes, q_full);
    q_state.advance();

    std::uint64_t* do_full = do_pipe.producer_acquire(do_state, Traits::kQBytes + Traits::kStatsBytes);
    Tensor mDo = params.tma_do.get_tma_tensor(do_shape);
    Tensor gDo = local_tile(domain_offset(make_coord(seq.offset_q, _0{}), mDo(_, _, tile.head, batch)), Shape<BM, D>{},
                            make_coord(_, _0{}));
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout), typename Traits::SmemLayoutDo{});
    auto [tDgD, tDsD] =
        tma_partition(params.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDo), group_modes<0, 2>(gDo));
    copy(params.tma_do.with(*do_full, 0, kReused), tDgD(_, m_block), tDsD(_, do_state.index));
    arch::bulk_load(smem.dpsum + do_state.index * Traits::kStatsStride,
                    reinterpret_cast<const float*>(ws + p.layout.dpsum) + stats_row, Traits::kStatsBytes, do_full);
    do_state.advance();
  }

  // Announces `tile` once the previous tile's K/V buffers are free: its coordinates (and,
  // with the varlen paths, its sequence's bounds), then its K and V loads, whose landing
  // completes kv_full. Past the last tile (m_block -1) kv_full completes with the
  // coordinates alone.
  template <class Params>
  __device__ void announce(const Params& params, SharedStorage& smem, TileCoord tile, int n_block) {
    using namespace cute;
    constexpr bool kVarlen = Traits::kVarlen;
    arch::mbarrier_wait(&smem.kv_empty, kv_empty_phase);
    kv_empty_phase ^= 1u;
    arch::compiler_barrier();
    smem.tile.tile = tile;
    if constexpr (kVarlen) {
      smem.tile.seq = tile.m_block >= 0 ? seq_bounds<kVarlen>(params.p, tile.batch) : SeqBounds{0, 0, 0, 0};
    }
    arch::compiler_barrier();
    if (tile.m_block < 0) {
      cutlass::arch::ClusterTransactionBarrier::arrive(&smem.kv_full);
      return;
    }
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.kv_full, Traits::kKVBytes);
    kv_copies(params, smem, tile, n_block, [&](const auto& tma, const auto& src, auto& dst) {
      copy(tma.with(smem.kv_full), src, dst);
    });
  }

  // Asks the L2 for the K and V blocks of `tile` (key block n_block), a tile ahead of
  // their loads: between tiles the consumers wait for K/V, at short sequences a visible
  // share of a tile of a few steps.
  template <class Params>
  __device__ void prefetch_kv(const Params& params, SharedStorage& smem, TileCoord tile, int n_block) {
    kv_copies(params, smem, tile, n_block,
              [&](const auto& tma, const auto& src, auto&) { cute::prefetch(tma, src); });
  }

  // `issue(tma, global, shared)` for K's and then V's block n_block of `tile`.
  template <class Params, class Issue>
  __device__ void kv_copies(const Params& params, SharedStorage& smem, TileCoord tile, int n_block, Issue&& issue) {
    using namespace cute;
    constexpr bool kVarlen = Traits::kVarlen;
    const BwdParams& p = params.p;
    const int head_kv = tile.head / (p.nheads_q / p.nheads_kv);
    const int offset_k = seq_bounds<kVarlen>(p, tile.batch).offset_k;
    const int batch = tensor_batch<kVarlen>(p, tile.batch);
    Tensor mK = params.tma_k.get_tma_tensor(
        make_shape(k_rows<kVarlen>(p), p.head_dim, p.nheads_kv, tensor_batches<kVarlen>(p)));
    Tensor gK = local_tile(domain_offset(make_coord(offset_k, _0{}), mK(_, _, head_kv, batch)), Shape<BN, D>{},
                           make_coord(n_block, _0{}));
    Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{});
    auto [tKgK, tKsK] = tma_partition(params.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
    issue(params.tma_k, tKgK, tKsK);
    Tensor mV = params.tma_v.get_tma_tensor(
        make_shape(k_rows<kVarlen>(p), p.head_dim_v, p.nheads_kv, tensor_batches<kVarlen>(p)));
    Tensor gV = local_tile(domain_offset(make_coord(offset_k, _0{}), mV(_, _, head_kv, batch)), Shape<BN, D>{},
                           make_coord(n_block, _0{}));
    Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutV{});
    auto [tVgV, tVsV] = tma_partition(params.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));
    issue(params.tma_v, tVgV, tVsV);
  }
};

// A thread's share of a per-query statistic (LSE or D) for the S/dP fragment. With S
// transposed a thread's queries are its fragment's columns, which the eight lanes of
// equal lane % 4 share; when there are many (block_m 128: 32 per thread) each of the
// eight keeps an eighth and the others fetch them by shuffle, which saves registers the
// dK/dV accumulators need.
template <int kCount, bool kShared>
struct QueryStats {
  static constexpr int kHeld = kShared ? kCount / 8 : kCount;
  static_assert(!kShared || kCount % 8 == 0);
  float held[kHeld];

  // query_of(i): the tile row of the thread's i-th statistic.
  template <class QueryOf>
  __device__ __forceinline__ void load(const float* stats, int lane, QueryOf&& query_of) {
    CUTE_UNROLL
    for (int j = 0; j < kHeld; ++j) held[j] = stats[query_of(kShared ? lane / 4 + 8 * j : j)];
  }
  __device__ __forceinline__ float operator()(int i, int lane) const {
    if constexpr (kShared) {
      return __shfl_sync(0xffffffffu, held[i / 8], (i % 8) * 4 + lane % 4);
    } else {
      return held[i];
    }
  }
};

// The mask of the tile whose K/V are loaded: with the varlen paths, of its sequence's
// lengths from the tile's slot, read where it is used rather than kept in registers
// across the tile (the slot holds until every consumer has released the tile).
template <class Traits, class Mask>
__device__ __forceinline__ Mask tile_mask(const Mask& mask, const typename Traits::SharedStorage& smem) {
  if constexpr (Traits::kVarlen) {
    return for_sequence(mask, smem.tile.seq.seqlen_q, smem.tile.seq.seqlen_k);
  } else {
    return mask;
  }
}

// The softcap's slope at a score of probability p (Softcap::slope); 1 without a cap.
template <class Mask>
__device__ __forceinline__ float softcap_slope(const Mask& mask, float p, float lse_log2) {
  if constexpr (Mask::kGeneral) {
    return mask.softcap.slope(p, lse_log2);
  } else {
    return 1.f;
  }
}

template <class Traits, class Mask>
struct BwdConsumer {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  using QPipeline = typename Traits::QPipeline;
  using DoPipeline = typename Traits::DoPipeline;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;
  static constexpr bool kSdpSwap = Traits::kSdpSwap;
  static constexpr bool kDkvSwap = Traits::kDkvSwap;
  static constexpr bool kDqSwap = Traits::kDqSwap;
  static constexpr bool kDkvRS = Traits::kDkvRS;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaDkv mma_dkv;
  typename Traits::TiledMmaDq mma_dq;
  int tid;  // index among consumer threads
  int wg;
  int lane;
  StageState<Traits::kQStages> q_state;
  StageState<Traits::kDoStages> do_state;

  // With BwdConfig::uniform_slices the warpgroup index comes from a broadcast, which
  // tells the compiler that it is warp-uniform.
  __device__ explicit BwdConsumer(int consumer_thread)
      : tid(consumer_thread),
        wg(Traits::kUniformSlices ? __shfl_sync(0xffffffffu, consumer_thread / 128, 0) : consumer_thread / 128),
        lane(consumer_thread % 32) {}

  // A fresh dK or dV accumulator: (keys, head dim), or transposed.
  __device__ auto dkv_accumulator() const {
    using namespace cute;
    if constexpr (kDkvSwap) {
      return partition_fragment_C(mma_dkv, Shape<D, BN>{});
    } else {
      return partition_fragment_C(mma_dkv, Shape<BN, D>{});
    }
  }

  // Zeroes rows [valid, kRows) of a (kRows, kHeadDim) shared-memory tile (a stage of it),
  // this thread's share of them among the consumers, 16 bytes a store (a row's 16-byte
  // groups stay whole in the swizzled layouts, the head dim contiguous).
  template <int kRows, class Tile>
  __device__ void clear_rows(Tile&& tile, int valid) const {
    constexpr int kGroups = Traits::kHeadDim / 8;
#pragma unroll 1
    for (int i = (valid > 0 ? valid : 0) * kGroups + tid; i < kRows * kGroups; i += kConsumerThreads) {
      *reinterpret_cast<uint4*>(&tile(i / kGroups, 8 * (i % kGroups))) = make_uint4(0u, 0u, 0u, 0u);
    }
  }

  // A varlen tile's K and V rows past its sequence's keys (`valid` of the block's are the
  // sequence's; see the top of this file), cleared before the tile's first step and
  // made visible to every consumer warpgroup's GEMMs.
  __device__ void clear_kv_rows(SharedStorage& smem, int valid) const {
    using namespace cute;
    clear_rows<Traits::kBlockN>(make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{}), valid);
    clear_rows<Traits::kBlockN>(make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutV{}), valid);
    cutlass::arch::fence_view_async_shared();
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
  }

  // The same for a sequence's last query block: Q's and dO's rows past its end, in the
  // step's stages, once both have landed.
  __device__ void clear_query_rows(SharedStorage& smem, DoPipeline& do_pipe, int valid) const {
    using namespace cute;
    do_pipe.consumer_wait(do_state);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout), typename Traits::SmemLayoutDo{});
    clear_rows<Traits::kBlockM>(sQ(_, _, q_state.index), valid);
    clear_rows<Traits::kBlockM>(sDo(_, _, do_state.index), valid);
    cutlass::arch::fence_view_async_shared();
    barrier_sync(BwdBarrier::kConsumers, kConsumerThreads);
  }

  // One step: query block m_block against the tile's key block n_block, adding to dK and
  // dV. `dq_out(dq, slice)` takes the step's dQ partial sums, slice by slice, once they
  // are complete. Every consumer thread reads LSE and D from the Q and dO stages, so
  // every thread releases them. `call_mask` is the call's mask; the step's is the tile's
  // (tile_mask).
  template <class Params, class FragDkv, class DqOut>
  __device__ void step(const Params& params, SharedStorage& smem, QPipeline& q_pipe, DoPipeline& do_pipe,
                       const Mask& call_mask, int n_block, int m_block, FragDkv& tdKrdK, FragDkv& tdVrdV,
                       DqOut&& dq_out) {
    using namespace cute;
    Tensor sQ = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q), typename Traits::SmemLayoutQt{});
    Tensor sDo = make_tensor(make_smem_ptr(smem.dout), typename Traits::SmemLayoutDo{});
    Tensor sDot = make_tensor(make_smem_ptr(smem.dout), typename Traits::SmemLayoutDot{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v), typename Traits::SmemLayoutV{});
    Tensor sP = make_tensor(make_smem_ptr(smem.p_buffer()), typename Traits::SmemLayoutPdS{});
    Tensor sPt = make_tensor(make_smem_ptr(smem.p_buffer()), typename Traits::SmemLayoutPdSt{});
    Tensor sdS = make_tensor(make_smem_ptr(smem.ds), typename Traits::SmemLayoutPdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds), typename Traits::SmemLayoutPdSt{});

    // A warpgroup's operands in shared memory are the same for its 128 threads: they
    // may be sliced by its first thread (BwdConfig::uniform_slices). Fragments of C
    // are sliced per thread.
    const int operand_thread = Traits::kUniformSlices ? wg * 128 : tid;
    auto thr_sdp = mma_sdp.get_thread_slice(tid);
    auto op_sdp = mma_sdp.get_thread_slice(operand_thread);
    auto op_dkv = mma_dkv.get_thread_slice(operand_thread);
    auto op_dq = mma_dq.get_thread_slice(operand_thread);
    Tensor tSrQ = mma_operand<!kSdpSwap>(op_sdp, sQ);    // (MMA, MMA_*, MMA_K, Q stages)
    Tensor tSrK = mma_operand<kSdpSwap>(op_sdp, sK);
    Tensor tdPrDo = mma_operand<!kSdpSwap>(op_sdp, sDo);  // (MMA, MMA_*, MMA_K, dO stages)
    Tensor tdPrV = mma_operand<kSdpSwap>(op_sdp, sV);
    Tensor tdVrDot = mma_operand<kDkvSwap>(op_dkv, sDot);
    Tensor tdKrQt = mma_operand<kDkvSwap>(op_dkv, sQt);
    Tensor tdQrdS = mma_operand<!kDqSwap>(op_dq, sdS);   // (MMA, MMA_*, MMA_K, dS stages)
    Tensor tdQrKt = mma_operand<kDqSwap>(op_dq, sKt);

    using SdpShape = std::conditional_t<kSdpSwap, Shape<BN, BM>, Shape<BM, BN>>;
    Tensor tSrS = partition_fragment_C(mma_sdp, SdpShape{});
    Tensor tdPrdP = partition_fragment_C(mma_sdp, SdpShape{});
    Tensor coord = rowcol_view(thr_sdp.partition_C(make_identity_tensor(SdpShape{})));
    auto s = rowcol_view(tSrS);
    auto dp = rowcol_view(tdPrdP);
    const int q_stage = q_state.index;
    const int do_stage = do_state.index;
    const int ds_stage = Traits::kDsStages == 1 ? 0 : q_stage;

    // Each thread's query rows: the columns of Sᵀ, or the rows of S.
    constexpr int kStats = decltype(size<kSdpSwap ? 1 : 0>(s))::value;
    using Stats = QueryStats<kStats, (kSdpSwap && kStats > 16)>;
    const auto query_of = [&](int i) { return kSdpSwap ? get<1>(coord(0, i)) : get<0>(coord(i, 0)); };
    q_pipe.consumer_wait(q_state);
    if constexpr (Traits::kVarlen) {
      // A varlen sequence's last block: its rows past the end are cleared.
      const int q_valid = rows_in_block<Traits::kBlockM>(smem.tile.seq.seqlen_q, m_block * Traits::kBlockM);
      if (is_varlen<Traits::kVarlen>(params.p) && q_valid < Traits::kBlockM) clear_query_rows(smem, do_pipe, q_valid);
    }
    // LSE is read before the GEMMs are issued: behind their operand reads, the loads
    // from shared memory came back after S did.
    Stats lse;
    lse.load(smem.lse + q_stage * Traits::kStatsStride, lane, query_of);
    gemm_ab<kSdpSwap, true>(mma_sdp, tSrQ(_, _, _, q_stage), tSrK, tSrS);
    do_pipe.consumer_wait(do_state);
    gemm_ab<kSdpSwap, true>(mma_sdp, tdPrDo(_, _, _, do_stage), tdPrV, tdPrdP);

    warpgroup_wait<1>();
    warpgroup_fence_operand(tSrS);
    const Mask mask = tile_mask<Traits>(call_mask, smem);
    if constexpr (Mask::kGeneral) {
      if (mask.softcap.on) mask.softcap.apply(tSrS);
    }
    if (mask.template needs_mask<Traits::kBlockM, Traits::kBlockN>(m_block, n_block)) {
      if constexpr (kSdpSwap) {
        apply_mask_transposed(mask, s, coord, n_block * Traits::kBlockN, m_block * Traits::kBlockM);
      } else {
        apply_mask(mask, s, coord, m_block * Traits::kBlockM, n_block * Traits::kBlockN);
      }
    }
    // The elements of a query: a column of Sᵀ or a row of S.
    constexpr int kPerQuery = decltype(size<kSdpSwap ? 0 : 1>(s))::value;
    const auto at = [](auto& t, int query, int j) -> float& { return kSdpSwap ? t(j, query) : t(query, j); };
    const float scale_log2 = softmax_scale_log2_of(mask, params.p);
    CUTE_UNROLL
    for (int i = 0; i < kStats; ++i) {
      const float l = lse(i, lane);
      CUTE_UNROLL
      for (int j = 0; j < kPerQuery; ++j) at(s, i, j) = arch::exp2_approx(fmaf(at(s, i, j), scale_log2, -l));
    }
    Stats dpsum;
    dpsum.load(smem.dpsum + do_stage * Traits::kStatsStride, lane, query_of);

    warpgroup_wait<0>();
    warpgroup_fence_operand(tdPrdP);
    // dS; under a softcap, with respect to the uncapped score (times the cap's slope).
    const auto dscores = [&](auto capped) {
      CUTE_UNROLL
      for (int i = 0; i < kStats; ++i) {
        const float d = dpsum(i, lane);
        CUTE_UNROLL
        for (int j = 0; j < kPerQuery; ++j) {
          float ds = at(s, i, j) * (at(dp, i, j) - d);
          if constexpr (decltype(capped)::value) ds *= softcap_slope(mask, at(s, i, j), lse(i, lane));
          at(dp, i, j) = ds;
        }
      }
    };
    if constexpr (Mask::kGeneral) {
      if (mask.softcap.on) {
        dscores(std::true_type{});
      } else {
        dscores(std::false_type{});
      }
    } else {
      dscores(std::false_type{});
    }
    auto rP = convert_fragment<Element>(tSrS);
    auto rdS = convert_fragment<Element>(tdPrdP);

    auto copy_pds = make_tiled_copy_C(typename Traits::CopyAtomPdS{}, mma_sdp);
    auto thr_copy_pds = copy_pds.get_thread_slice(tid);
    Tensor tPsP = thr_copy_pds.partition_D(as_position_independent_swizzle_tensor(conditional_return<kSdpSwap>(sPt, sP)));
    Tensor tdSsdS =
        thr_copy_pds.partition_D(as_position_independent_swizzle_tensor(conditional_return<kSdpSwap>(sdSt, sdS)));
    if constexpr (!kDkvRS) {
      // P in warpgroup 0's part of dQ's staging buffer: the dQ warp has read the part's
      // last slice (the wait store_dq's first slice then skips); the barrier below
      // tells the other warpgroups.
      if constexpr (Traits::kPInDqStaging) {
        if (wg == 0) barrier_sync(dq_empty_barrier(0), kDqBarrierThreads);
      }
      // With one buffer, every warpgroup's dV GEMM of the previous step must be done with P.
      if constexpr (Traits::kDsStages == 1) barrier_sync(BwdBarrier::kPdS, kConsumerThreads);
      copy(copy_pds, thr_copy_pds.retile_S(rP), tPsP(_, _, _, ds_stage));
    }
    if constexpr (!kDkvRS || Traits::kDsStages == 1) {
      // P is in (and, with one buffer, every dQ GEMM of the previous step is done with dS).
      cutlass::arch::fence_view_async_shared();
      barrier_sync(BwdBarrier::kPdS, kConsumerThreads);
    }
    copy(copy_pds, thr_copy_pds.retile_S(rdS), tdSsdS(_, _, _, ds_stage));

    if constexpr (kDkvRS) {
      Tensor tdVrPt = make_tensor(rP.data(), acc_as_a_layout(tSrS.layout()));
      gemm_async<false>(mma_dkv, tdVrPt, tdVrDot(_, _, _, do_stage), tdVrdV);
    } else {
      Tensor tdVrPt = mma_operand<!kDkvSwap>(op_dkv, sPt);
      gemm_ab<kDkvSwap, false>(mma_dkv, tdVrPt(_, _, _, ds_stage), tdVrDot(_, _, _, do_stage), tdVrdV);
    }
    // Every warpgroup's dS is in shared memory before any reads it for dQ.
    cutlass::arch::fence_view_async_shared();
    barrier_sync(BwdBarrier::kPdS, kConsumerThreads);
    // dQ in kDqSlices row blocks of its GEMM (BwdConfig::dq_slices), each handed on
    // before the next is computed into the same accumulators.
    constexpr int kSlices = Traits::kDqSlices;
    using DqShape = std::conditional_t<kDqSwap, Shape<Int<Traits::kHeadDim / kSlices>, BM>,
                                       Shape<Int<Traits::kBlockM / kSlices>, D>>;
    Tensor tdQrdQ = partition_fragment_C(mma_dq, DqShape{});
    const auto issue_dq = [&](int slice) {
      if constexpr (kDqSwap) {
        gemm_async_slice<kSlices, true>(mma_dq, tdQrKt, tdQrdS(_, _, _, ds_stage), tdQrdQ, slice);
      } else {
        gemm_async_slice<kSlices, true>(mma_dq, tdQrdS(_, _, _, ds_stage), tdQrKt, tdQrdQ, slice);
      }
    };
    issue_dq(0);
    warpgroup_wait<1>();  // dV's GEMM is done with dO
    do_pipe.consumer_release_each(do_state);
    do_state.advance();

    // dK's GEMM, running while dQ's first slice is handed on.
    if constexpr (kDkvRS) {
      Tensor tdKrdSt = make_tensor(rdS.data(), acc_as_a_layout(tdPrdP.layout()));
      gemm_async<false>(mma_dkv, tdKrdSt, tdKrQt(_, _, _, q_stage), tdKrdK);
    } else {
      Tensor tdKrdSt = mma_operand<!kDkvSwap>(op_dkv, sdSt);
      gemm_ab<kDkvSwap, false>(mma_dkv, tdKrdSt(_, _, _, ds_stage), tdKrQt(_, _, _, q_stage), tdKrdK);
    }
    warpgroup_wait<1>();  // dQ's first slice is complete
    warpgroup_fence_operand(tdQrdQ);
    dq_out(tdQrdQ, 0);
    CUTE_UNROLL
    for (int slice = 1; slice < kSlices; ++slice) {
      issue_dq(slice);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tdQrdQ);
      dq_out(tdQrdQ, slice);
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(tdKrdK);
    q_pipe.consumer_release_each(q_state);
    q_state.advance();
  }
};

}  // namespace fa3::hopper
