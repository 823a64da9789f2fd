// fa3 — the CuTe types of one forward kernel configuration: MMAs, shared-memory
// layouts, TMA copies. Derived from (Element, Q/K head dim, V head dim, FwdConfig,
// ElementOut) alone; Q, K and S have the first head dim, V and O the second. Element is
// the inputs' type and ElementOut O's: the same 16-bit type, or e4m3 inputs with a bf16
// or fp16 O (the FP8 kernels, whose differences are marked kFp8).
#pragma once

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "hopper/fp8_layout.h"
#include "hopper/fwd_config.h"
#include "hopper/pipeline.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

namespace detail {

// The widest GMMA swizzle whose atom tiles `kExtent` elements of the contiguous mode,
// or no swizzle (interleaved 16-byte rows) when none does. e4m3 rows of head dim 96
// (96 bytes) take the 32-byte one, under which the eight 16-byte rows of a GMMA core
// matrix still fall in distinct banks.
template <cute::SM90::GMMA::Major kMajor, class Element, int kExtent>
constexpr auto smem_atom() {
  using namespace cute::SM90::GMMA;
  constexpr int kBits = cute::sizeof_bits_v<Element>;
  if constexpr (kExtent * kBits % 1024 == 0) {
    return Layout_SW128_Atom<Element, kMajor>{};
  } else if constexpr (kExtent * kBits % 512 == 0) {
    return Layout_SW64_Atom<Element, kMajor>{};
  } else if constexpr (kExtent * kBits % 256 == 0) {
    return Layout_SW32_Atom<Element, kMajor>{};
  } else {
    static_assert(kExtent * kBits % 128 == 0, "tile extent not a multiple of 16 bytes");
    return Layout_INTER_Atom<Element, kMajor>{};
  }
}

}  // namespace detail

template <class Element_, int kHeadDim_, int kHeadDimV_, FwdConfig kCfg_, class ElementOut_ = Element_>
struct FwdTraits {
  using Element = Element_;
  using ElementOut = ElementOut_;
  static constexpr bool kFp8 = cute::sizeof_bits_v<Element> == 8;
  static_assert(cute::sizeof_bits_v<ElementOut> == 16, "O is bf16 or fp16");
  static constexpr FwdConfig kCfg = kCfg_;
  static constexpr bool kVarlen = kCfg.varlen;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  static constexpr int kBlockM = kCfg.block_m;
  static constexpr int kBlockN = kCfg.block_n;
  static constexpr int kStages = kCfg.stages;
  static constexpr int kQStages = kCfg.q_stages;
  static constexpr int kConsumerWGs = kCfg.consumer_wgs;
  static constexpr int kConsumerThreads = 128 * kConsumerWGs;
  static constexpr int kThreads = kCfg.threads();
  static constexpr int kCluster = kCfg.cluster_m;
  // FP8 kernels that transpose V in shared memory (FwdConfig::vt_smem): the producer
  // warpgroup's last warps (hopper/fwd_vt_transpose.cuh). Warp 0 issues the loads and,
  // where O leaves through its own buffer, warp 1 stores it; where the consumers store O
  // themselves (from registers or through Q's buffer) warp 1 has no role and transposes
  // too, which shortens each stage's transpose from kDV / 64 chunk rows a warp to kDV / 96.
  static constexpr bool kVtSmem = kCfg.vt_smem;
  static constexpr int kTransposeWarps = kCfg.o_store == OStore::kOwnBuffer ? 2 : 3;
  static constexpr int kFirstTransposeWarp = 4 - kTransposeWarps;
  static constexpr int kTransposeThreads = 32 * kTransposeWarps;
  static_assert(!kVtSmem || (kFp8 && kCluster == 1),
                "V is transposed in shared memory by FP8 kernels without a cluster");
  static_assert(kCfg.registers_fit(), "setmaxnreg budgets exceed the registers the CTA launches with");
  static_assert(kBlockM == 64 * kConsumerWGs, "each consumer warpgroup owns 64 query rows");
  static_assert(kBlockN % 16 == 0, "block_n is the K extent of the P·V GEMM");
  static_assert(kQStages == 1 || (kQStages == 2 && kCfg.o_store != OStore::kQBuffer),
                "O written through Q's buffer needs a single Q buffer");

  using BM = cute::Int<kBlockM>;
  using BN = cute::Int<kBlockN>;
  using D = cute::Int<kHeadDim>;
  using DV = cute::Int<kHeadDimV>;
  using AtomLayout = cute::Layout<cute::Shape<cute::Int<kConsumerWGs>, cute::_1, cute::_1>>;

  // S = Q·Kᵀ, K-major: Q from shared memory, or from registers loaded once per tile.
  using TiledMmaQK = decltype(cute::make_tiled_mma(
      [] {
        using Shape = cute::Shape<cute::_64, BN, D>;
        if constexpr (kCfg.q_registers) {
          return cute::SM90::GMMA::rs_op_selector<Element, Element, float, Shape>();
        } else {
          return cute::SM90::GMMA::ss_op_selector<Element, Element, float, Shape>();
        }
      }(),
      AtomLayout{}));
  // O += P·V: P from registers, V read as a (head_dim_v x block_n) operand: MN-major
  // (V as it is in memory) for 16-bit types; K-major (Vᵀ, keys contiguous: the only
  // major FP8 wgmma takes) for e4m3, from the transposed copy hopper/fp8_vt.h writes or
  // transposed in shared memory (kVtSmem).
  static constexpr auto kMajorV = kFp8 ? cute::SM90::GMMA::Major::K : cute::SM90::GMMA::Major::MN;
  using MmaPVOp = decltype(cute::SM90::GMMA::rs_op_selector<Element, Element, float, cute::Shape<cute::_64, DV, BN>,
                                                            cute::SM90::GMMA::Major::K, kMajorV>());
  using TiledMmaPV = decltype(cute::make_tiled_mma(MmaPVOp{}, AtomLayout{}));

  using SmemLayoutQ = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim>(),
      cute::Shape<BM, D, cute::Int<kQStages>>{}));
  using SmemLayoutK = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDim>(),
      cute::Shape<BN, D, cute::Int<kStages>>{}));
  // V lands in shared memory already transposed: TMA reads it as (head_dim, seqlen).
  // The swizzle atoms (64 of head_dim x 8 keys) are laid out keys first, so that each
  // 64-wide slice of head_dim holds all block_n keys contiguously and TMA fills it with
  // one box; head_dim first would make every 8 keys a box of their own (1 KB each, 16
  // TMA instructions per slice at block_n 128).
  // Vᵀ of the FP8 kernels is in memory as shared memory wants it, keys contiguous (or
  // is written so by the transpose in shared memory).
  using SmemLayoutVt =
      std::conditional_t<kFp8,
                         decltype(cute::tile_to_shape(detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kBlockN>(),
                                                      cute::Shape<DV, BN, cute::Int<kStages>>{})),
                         decltype(cute::tile_to_shape(
                             detail::smem_atom<cute::SM90::GMMA::Major::MN, Element, kHeadDimV>(),
                             cute::Shape<DV, BN, cute::Int<kStages>>{}, cute::Step<cute::_2, cute::_1, cute::_3>{}))>;
  // With V transposed in shared memory, V as it lands, a stage at a time: (block_n, head_dim_v)
  // with the head dim contiguous, as K's; a V whose keys are contiguous (V_colmajor)
  // lands in SmemLayoutVt's layout instead, keys in their own order. Either way the
  // ring's stages take the same bytes.
  using SmemLayoutVRows = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, Element, kHeadDimV>(), cute::Shape<BN, DV, cute::Int<kStages>>{}));
  static_assert(cute::cosize_v<SmemLayoutVRows> == cute::cosize_v<SmemLayoutVt>, "both layouts of V's stage are dense");
  // Each consumer warpgroup writes its own 64 rows of O and stores them with its own
  // TMA copy, so that no warpgroup waits for another at the end of a tile.
  using TiledMmaPVRows = decltype(cute::make_tiled_mma(MmaPVOp{}));
  using SmemLayoutO = decltype(cute::tile_to_shape(
      detail::smem_atom<cute::SM90::GMMA::Major::K, ElementOut, kHeadDimV>(), cute::Shape<cute::_64, DV>{}));
  static constexpr int kOElemsPerWG = cute::cosize_v<SmemLayoutO>;

  // Global tensors as TMA sees them: (rows, head_dim, head, batch), head_dim contiguous;
  // V as (head_dim, rows, head, batch), and the FP8 kernels' Vᵀ likewise, with its keys
  // contiguous instead.
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemStrideVt = cute::Stride<cute::_1, int64_t, int64_t, int64_t>;

  using GmemStrideV = std::conditional_t<kFp8, GmemStride, GmemStrideVt>;

  template <class Stride, class T = Element>
  using GmemTensor =
      decltype(cute::make_tensor(cute::make_gmem_ptr(static_cast<T const*>(nullptr)), GmemShape{}, Stride{}));

  using TmaQ = decltype(cute::make_tma_copy(cute::SM90_TMA_LOAD{}, GmemTensor<GmemStride>{},
                                            cute::take<0, 2>(SmemLayoutQ{}), cute::Shape<BM, D>{}, cute::_1{}));
  // K and V: with a cluster, each CTA loads 1/kCluster of a stage (a contiguous part of
  // its shared memory) and multicasts it to every CTA of the cluster.
  using Cluster = cute::Int<kCluster>;
  using TmaKVOp = std::conditional_t<(kCluster > 1), cute::SM90_TMA_LOAD_MULTICAST, cute::SM90_TMA_LOAD>;
  using TmaK = decltype(cute::make_tma_copy(TmaKVOp{}, GmemTensor<GmemStride>{}, cute::take<0, 2>(SmemLayoutK{}),
                                            cute::Shape<BN, D>{}, Cluster{}));
  using TmaV = decltype(cute::make_tma_copy(TmaKVOp{}, GmemTensor<GmemStrideV>{}, cute::take<0, 2>(SmemLayoutVt{}),
                                            cute::Shape<DV, BN>{}, Cluster{}));
  // V as it is in memory, head dim contiguous, for the transpose in shared memory (a
  // V_colmajor V loads by TmaV, as Vᵀ does without the transpose in shared memory).
  struct NoTma {};
  using TmaVRows = std::conditional_t<kVtSmem,
                                      decltype(cute::make_tma_copy(TmaKVOp{}, GmemTensor<GmemStride>{},
                                                                   cute::take<0, 2>(SmemLayoutVRows{}),
                                                                   cute::Shape<BN, DV>{}, Cluster{})),
                                      NoTma>;
  using TmaO = decltype(cute::make_tma_copy(cute::SM90_TMA_STORE{}, GmemTensor<GmemStride, ElementOut>{}, SmemLayoutO{},
                                            cute::Shape<cute::_64, DV>{}, cute::_1{}));

  static constexpr std::uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr std::uint32_t kVBytes = kBlockN * kHeadDimV * sizeof(Element);

  using Pipeline = TmaPipeline<kStages, kCluster>;
  // Q's buffers: a stage is full when its tile's Q has landed (or, with no load, when
  // its tile index says there are no more tiles) and empty once every consumer warp's
  // last read of it is complete.
  using QPipeline = TmaPipeline<kQStages>;

  // 128-byte swizzles repeat every 1024 bytes: each operand starts on such a boundary.
  struct SharedStorage {
    alignas(1024) Element q[cute::cosize_v<SmemLayoutQ>];
    alignas(1024) Element k[cute::cosize_v<SmemLayoutK>];
    alignas(1024) Element v[cute::cosize_v<SmemLayoutVt>];
    alignas(1024) ElementOut o[kCfg.o_store == OStore::kOwnBuffer ? kConsumerWGs * kOElemsPerWG : 1];
    FwdTileSlot tile[kQStages];  // the tile whose Q a stage of q_pipe holds; m_block < 0: no more tiles
    // O's own buffer (hopper/epilogue.cuh): the tile's LSE and each consumer
    // warpgroup's tile for the store warp, and the barriers that hand a warpgroup's rows
    // to the store warp and back.
    float o_lse[kCfg.o_store == OStore::kOwnBuffer ? kBlockM : 1];
    FwdTileSlot o_tile[kConsumerWGs];  // with the sequence's bounds, for a varlen call's rows
    std::uint64_t o_full[kConsumerWGs];
    std::uint64_t o_free[kConsumerWGs];
    typename QPipeline::Storage q_pipe;
    typename Pipeline::Storage k_pipe;
    typename Pipeline::Storage v_pipe;
    // With V transposed in shared memory: v_pipe's stages are Vᵀ's, written by the
    // transposing warps, and this ring's are V's as TMA lands it. The producer writes
    // into each stage's slot how many of the block's keys are the sequence's (keys past
    // them are cleared in the transpose: a varlen call's next rows may hold NaN), or
    // -1 after the last block, which tells the transposing warps to stop. Last, and a
    // few bytes without the transpose, so that the other kernels' layout is as it was.
    typename Pipeline::Storage v_landed_pipe;
    int v_landed_keys[kVtSmem ? kStages : 1];
    alignas(kVtSmem ? 1024 : alignof(Element)) Element v_landed[kVtSmem ? cute::cosize_v<SmemLayoutVRows> : 1];

    // Consumer warpgroup wg's 64 rows of O.
    __device__ ElementOut* o_buffer(int wg) {
      if constexpr (kCfg.o_store == OStore::kQBuffer) {
        return reinterpret_cast<ElementOut*>(q) + wg * kOElemsPerWG;
      } else {
        return o + wg * kOElemsPerWG;
      }
    }
  };
  static_assert(kCfg.o_store != OStore::kQBuffer ||
                    kConsumerWGs * kOElemsPerWG * sizeof(ElementOut) <= cute::cosize_v<SmemLayoutQ> * sizeof(Element),
                "O's rows fit in Q's buffer");
  static_assert(!kFp8 || !kCfg.q_registers, "e4m3 Q·Kᵀ reads Q from shared memory");
  static_assert(!kFp8 || kBlockN <= kFp8VtTail, "a varlen sequence's last key block reads only Vᵀ's zeros past it");
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the Hopper limit");
};

}  // namespace fa3::hopper
