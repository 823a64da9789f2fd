// fa3 — the CuTe types of one backward kernel configuration: the five GEMMs' MMAs,
// shared-memory layouts (each operand and its transposed view), TMA copies. Derived
// from (Element, head dim, BwdConfig) alone.
#pragma once

#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "hopper/bwd_config.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/pipeline.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

template <class Element_, int kHeadDim_, BwdConfig kCfg_>
struct BwdTraits {
  using Element = Element_;
  static constexpr BwdConfig kCfg = kCfg_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kWGs = kCfg.consumer_wgs;
  static constexpr int kConsumerThreads = kCfg.consumer_threads();
  static constexpr int kThreads = kCfg.threads();
  static constexpr bool kSdpSwap = kCfg.sdp_swap;
  static constexpr bool kDkvSwap = kCfg.dkv_swap;
  static constexpr bool kDqSwap = kCfg.dq_swap;
  static constexpr bool kDkvRS = kCfg.dkv_from_registers();
  static constexpr int kQStages = kCfg.q_stages;
  static constexpr int kDoStages = kCfg.do_stages;
  static constexpr int kDsStages = kCfg.ds_stages;
  static constexpr int kDqSlices = kCfg.dq_slices;
  static constexpr bool kPInDqStaging = kCfg.p_in_dq_staging();
  static constexpr bool kVarlen = kCfg.varlen;
  static constexpr bool kOverlapTileSwitch = kCfg.overlap_tile_switch;
  static constexpr bool kUniformSlices = kCfg.uniform_slices;
  static constexpr int kDqRedSlice = kCfg.dq_red_slice;
  static constexpr bool kDrawNextLate = kCfg.draw_next_late;
  static_assert(kDqRedSlice < 0 || (kDqRedSlice < kCfg.dq_slices && kCfg.dq_slices > 1),
                "dq_red_slice names one of several dQ slices (the others keep the dQ warp's protocol)");
  static_assert(!kOverlapTileSwitch || kDkvRS, "an overlapped tile switch stores dK/dV from whole key rows");
  static_assert(!kPInDqStaging || (!kDkvRS && kDsStages == 1), "P in dQ's staging buffer: one P buffer");
  static_assert(kCfg.registers_fit(), "setmaxnreg budgets exceed the registers the CTA launches with");
  static_assert(kWGs <= kMaxBwdConsumerWGs, "more consumer warpgroups than named barriers are laid out for");
  static_assert(kDoStages == kQStages || kDoStages == 1, "dO's ring is Q's depth or one stage");
  static_assert(kDsStages == kQStages || kDsStages == 1, "P/dS buffers follow Q's stages or are single");
  static_assert(kWGs % kCfg.sdp_wg_m == 0 && kWGs % kCfg.dkv_wg_n == 0 && kWGs % kCfg.dq_wg_m == 0);

  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using D = cute::Int<kHeadDim>;

  // ---- GEMMs. Each is split over the warpgroups by an atom layout (warpgroups along the
  // GEMM's M, along its N); a warpgroup's atom is 64 rows by the N it covers. ----
  static constexpr int kSdpWgM = kCfg.sdp_wg_m;          // along queries
  static constexpr int kSdpWgN = kWGs / kCfg.sdp_wg_m;   // along keys
  using SdpAtomShape = std::conditional_t<!kSdpSwap, cute::Shape<BM, cute::Int<kBlockN / kSdpWgN>, D>,
                                          cute::Shape<BN, cute::Int<kBlockM / kSdpWgM>, D>>;
  using SdpAtomLayout =
      std::conditional_t<!kSdpSwap, cute::Layout<cute::Shape<cute::Int<kSdpWgM>, cute::Int<kSdpWgN>, cute::_1>>,
                         cute::Layout<cute::Shape<cute::Int<kSdpWgN>, cute::Int<kSdpWgM>, cute::_1>>>;
  // S = Q·Kᵀ and dP = dO·Vᵀ (or Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ), both operands K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::SM90::GMMA::ss_op_selector<Element, Element, float, SdpAtomShape>(), SdpAtomLayout{}));

  static constexpr int kDkvWgN = kCfg.dkv_wg_n;          // along keys
  static constexpr int kDkvWgD = kWGs / kCfg.dkv_wg_n;   // along the head dim
  using DkvAtomShape = std::conditional_t<!kDkvSwap, cute::Shape<BN, cute::Int<kHeadDim / kDkvWgD>, BM>,
                                          cute::Shape<D, cute::Int<kBlockN / kDkvWgN>, BM>>;
  using DkvAtomLayout =
      std::conditional_t<!kDkvSwap, cute::Layout<cute::Shape<cute::Int<kDkvWgN>, cute::Int<kDkvWgD>, cute::_1>>,
                         cute::Layout<cute::Shape<cute::Int<kDkvWgD>, cute::Int<kDkvWgN>, cute::_1>>>;
  // dV += Pᵀ·dO and dK += dSᵀ·Q: Pᵀ/dSᵀ from registers, or from shared memory where they
  // are stored (query, key) with keys contiguous, i.e. M-major as Pᵀ; dO and Q are read
  // with the head dim contiguous (N-major). Swapped: dVᵀ = dOᵀ·P, both M/N-major.
  using TiledMmaDkv = decltype(cute::make_tiled_mma(
      [] {
        using namespace cute::SM90::GMMA;
        if constexpr (kDkvRS) {
          return rs_op_selector<Element, Element, float, DkvAtomShape, Major::K, Major::MN>();
        } else {
          return ss_op_selector<Element, Element, float, DkvAtomShape, Major::MN, Major::MN>();
        }
      }(),
      DkvAtomLayout{}));

  static constexpr int kDqWgM = kCfg.dq_wg_m;           // along queries
  static constexpr int kDqWgD = kWGs / kCfg.dq_wg_m;    // along the head dim
  using DqAtomShape = std::conditional_t<!kDqSwap, cute::Shape<BM, cute::Int<kHeadDim / kDqWgD>, BN>,
                                         cute::Shape<D, cute::Int<kBlockM / kDqWgM>, BN>>;
  using DqAtomLayout =
      std::conditional_t<!kDqSwap, cute::Layout<cute::Shape<cute::Int<kDqWgM>, cute::Int<kDqWgD>, cute::_1>>,
                         cute::Layout<cute::Shape<cute::Int<kDqWgD>, cute::Int<kDqWgM>, cute::_1>>>;
  // dQ = dS·K: dS K-major (keys contiguous), K read N-major. Swapped: dQᵀ = Kᵀ·dSᵀ.
  using TiledMmaDq = decltype(cute::make_tiled_mma(
      [] {
        using namespace cute::SM90::GMMA;
        if constexpr (!kDqSwap) {
          return ss_op_selector<Element, Element, float, DqAtomShape, Major::K, Major::MN>();
        } else {
          return ss_op_selector<Element, Element, float, DqAtomShape, Major::MN, Major::K>();
        }
      }(),
      DqAtomLayout{}));

  // ---- Shared memory. Q and dO are read K-major by S/dP and M/N-major (transposed
  // views) by dK/dV; K K-major by S and N/M-major by dQ. A swizzle atom read M/N-major
  // must not be wider than the slice of the dimension one warpgroup covers. ----
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim / kDkvWgD>(),
      cute::Shape<BM, D, cute::Int<kQStages>>{}));
  using SmemLayoutDo = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim / kDkvWgD>(),
      cute::Shape<BM, D, cute::Int<kDoStages>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim / kDqWgD>(), cute::Shape<BN, D>{}));
  using SmemLayoutV = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim>(), cute::Shape<BN, D>{}));
  // P and dS as (query, key), keys contiguous.
  using SmemLayoutPdS = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kBlockN / kSdpWgN>(),
      cute::Shape<BM, BN, cute::Int<kDsStages>>{}));

  // Transposed views of the same memory (the view is transposed, not the data).
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_layout(cute::Shape<D, BM, cute::Int<kQStages>>{},
                                       cute::make_stride(BM{}, cute::_1{}, cute::Int<kBlockM * kHeadDim>{}))));
  using SmemLayoutDot = decltype(cute::composition(
      SmemLayoutDo{}, cute::make_layout(cute::Shape<D, BM, cute::Int<kDoStages>>{},
                                        cute::make_stride(BM{}, cute::_1{}, cute::Int<kBlockM * kHeadDim>{}))));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutK{}, cute::make_layout(cute::Shape<D, BN>{}, cute::make_stride(BN{}, cute::_1{}))));
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutV{}, cute::make_layout(cute::Shape<D, BN>{}, cute::make_stride(BN{}, cute::_1{}))));
  using SmemLayoutPdSt = decltype(cute::composition(
      SmemLayoutPdS{}, cute::make_layout(cute::Shape<BN, BM, cute::Int<kDsStages>>{},
                                         cute::make_stride(BM{}, cute::_1{}, cute::Int<kBlockM * kBlockN>{}))));

  // Row statistics of a Q stage (LSE·log2 e) and of a dO stage (D): block_m floats per
  // stage, stages 128 bytes apart (bulk copies land on 16-byte boundaries).
  static constexpr int kStatsStride = (kBlockM + 31) / 32 * 32;

  // P/dS from the S/dP accumulators to shared memory with stmatrix: a transposing store
  // when the accumulators hold Sᵀ.
  static constexpr int kPdSPerThread = kBlockM * kBlockN / kConsumerThreads;
  using CopyAtomPdS = cute::Copy_Atom<
      std::conditional_t<!kSdpSwap,
                         std::conditional_t<kPdSPerThread % 8 == 0, cute::SM90_U32x4_STSM_N, cute::SM90_U32x2_STSM_N>,
                         std::conditional_t<kPdSPerThread % 8 == 0, cute::SM90_U16x8_STSM_T, cute::SM90_U16x4_STSM_T>>,
      Element>;
  // dK/dV (bf16/fp16) into K's and V's buffers for their TMA stores, transposing when
  // the accumulators hold dKᵀ/dVᵀ.
  using CopyAtomDkv = cute::Copy_Atom<std::conditional_t<!kDkvSwap, cute::SM90_U32x4_STSM_N, cute::SM90_U16x8_STSM_T>,
                                      Element>;

  // dQ's fp32 partial sums of one step, per warpgroup, in the order its threads hold
  // them (four consecutive values per thread, threads interleaved): the block's
  // layout in the dQ accumulator too (hopper/bwd_workspace.h).
  static constexpr int kDqPerWG = kBlockM * kHeadDim / kWGs;
  // A warpgroup's part of the staging buffer: one slice of its dQ part.
  static constexpr int kDqStagedPerWG = kDqPerWG / kDqSlices;
  static_assert(!kPInDqStaging || kBlockM * kBlockN * sizeof(Element) <= kDqStagedPerWG * sizeof(float),
                "P must lie within warpgroup 0's part of dQ's staging buffer");
  static constexpr int kDkvPerWG = kBlockN * kHeadDim / kWGs;

  // ---- Global tensors as TMA sees them: (rows, head_dim, head, batch). ----
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemTensor =
      decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemShape{}, GmemStride{}));
  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutQ{}),
                                            cute::Shape<BM, D>{}, cute::_1{}));
  using TmaDo = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, cute::take<0, 2>(SmemLayoutDo{}),
                                             cute::Shape<BM, D>{}, cute::_1{}));
  using TmaK = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutK{}, cute::Shape<BN, D>{},
                                            cute::_1{}));
  using TmaV = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutV{}, cute::Shape<BN, D>{},
                                            cute::_1{}));
  using TmaDk = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutK{},
                                             cute::Shape<BN, D>{}, cute::_1{}));
  using TmaDv = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutV{},
                                             cute::Shape<BN, D>{}, cute::_1{}));

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kStatsBytes = kBlockM * sizeof(float);
  static constexpr std::uint32_t kKVBytes = 2 * kBlockN * kHeadDim * sizeof(Element);
  static_assert(kStatsBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

  using QPipeline = TmaPipeline<kQStages>;
  using DoPipeline = TmaPipeline<kDoStages>;

  struct SharedStorage {
    alignas(1024) Element k[cute::cosize_v<SmemLayoutK>];
    alignas(1024) Element v[cute::cosize_v<SmemLayoutV>];
    alignas(1024) Element q[cute::cosize_v<SmemLayoutQ>];
    alignas(1024) Element dout[cute::cosize_v<SmemLayoutDo>];
    alignas(1024) Element p[kDkvRS || kPInDqStaging ? 1 : cute::cosize_v<SmemLayoutPdS>];
    alignas(1024) Element ds[cute::cosize_v<SmemLayoutPdS>];
    // 1024-byte aligned where it holds P or dV (swizzled layouts).
    alignas(kPInDqStaging || kOverlapTileSwitch ? 1024 : 128) float dq[kBlockM * kHeadDim / kDqSlices];
    alignas(128) float lse[kStatsStride * kQStages];
    alignas(128) float dpsum[kStatsStride * kDoStages];
    // The tile whose K/V are loaded; n_block (m_block field) < 0: no more tiles. A kernel
    // with the varlen paths hands the sequence's bounds over with it, as the forward does.
    std::conditional_t<kVarlen, FwdTileSlot, TileSlot> tile;
    std::uint64_t kv_full;
    std::uint64_t kv_empty;
    typename QPipeline::Storage q_pipe;
    typename DoPipeline::Storage do_pipe;

    __device__ Element* p_buffer() {
      if constexpr (kPInDqStaging) {
        return reinterpret_cast<Element*>(dq);
      } else {
        return p;
      }
    }
  };
  // The overlapped tile switch stores dK from the dS buffers and dV from the dQ
  // staging buffer.
  static_assert(!kOverlapTileSwitch ||
                    (cute::cosize_v<SmemLayoutK> <= cute::cosize_v<SmemLayoutPdS> &&
                     cute::cosize_v<SmemLayoutV> * sizeof(Element) <= kBlockM * kHeadDim / kDqSlices * sizeof(float)),
                "dK and dV must fit the buffers they leave from");
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the Hopper limit");
};

}  // namespace fa3::hopper
