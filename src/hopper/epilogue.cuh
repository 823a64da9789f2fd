// fa3 — forward epilogue. O goes to global memory either through shared memory
// (stmatrix, then one TMA store per warpgroup, which also clips rows past seqlen_q) or
// straight from registers (16-byte stores after a transpose inside each quad), as the
// configuration's OStore says; LSE is written per row.
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cutlass/arch/barrier.h>

#include "hopper/barriers.cuh"
#include "hopper/fragment.cuh"
#include "hopper/fwd_params.h"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::Element;
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using D = typename Traits::D;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;

  // Stores the tile's O; `tOrO` is normalized. Every thread of each consumer warpgroup
  // calls it; a warpgroup stores its own 64 rows without waiting for the others.
  template <class Params, class TensorO>
  __device__ static void store_o(const Params& params, typename Traits::SharedStorage& smem, int tid, TileCoord tile,
                                 const TensorO& tOrO) {
    if constexpr (Traits::kCfg.o_store == OStore::kRegisters) {
      store_o_from_registers(params.p, tid, tile, tOrO);
    } else {
      store_o_through_smem(params, smem, tid, tile, tOrO);
    }
  }

  // Stores the LSE of this thread's rows (those of the S fragment), if the caller asked
  // for it. Every consumer thread calls it.
  template <int kRows>
  __device__ static void store_lse(const FwdParams& p, int tid, TileCoord tile, const float (&lse)[kRows]) {
    using namespace cute;
    if (p.lse != nullptr && tid % 4 == 0) {
      // Quad leaders hold complete row statistics.
      typename Traits::TiledMmaQK mma_qk;
      Tensor tScS = mma_qk.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, BN>{}));
      auto coord = rowcol_view(tScS);
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = tile.m_block * Traits::kBlockM + get<0>(coord(r, 0));
        if (row < p.seqlen_q) {
          p.lse[tile.batch * p.lse_batch_stride + tile.head * p.lse_head_stride + row * p.lse_row_stride] = lse[r];
        }
      }
    }
  }

  // Before the CTA exits (or reuses O's buffer for Q), the warpgroup's last store must
  // have read it.
  __device__ static void drain(int tid) {
    if constexpr (Traits::kCfg.o_store != OStore::kRegisters) {
      if (tid % 128 == 0) cute::tma_store_wait<0>();
    }
  }

 private:
  template <class Params, class TensorO>
  __device__ static void store_o_through_smem(const Params& params, typename Traits::SharedStorage& smem, int tid,
                                              TileCoord tile, const TensorO& tOrO) {
    using namespace cute;
    const FwdParams& p = params.p;
    const int wg = tid / 128;
    const int wg_tid = tid % 128;
    Tensor sO = make_tensor(make_smem_ptr(smem.o_buffer(wg)), typename Traits::SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaPVRows{});
    auto thr_copy = copy_o.get_thread_slice(wg_tid);
    auto rO = convert_fragment<Element>(tOrO);
    Tensor tRrO = thr_copy.retile_S(rO);
    Tensor tRsO = thr_copy.partition_D(sO);

    // When O's buffer is Q's, every other warpgroup must be done reading Q (they
    // arrive once their last Q·Kᵀ has completed).
    if constexpr (Traits::kCfg.o_store == OStore::kQBuffer) barrier_sync(query_read_barrier(wg), kConsumerThreads);
    // The buffer is free once this warpgroup's previous store has read it; only the
    // thread that issued it can tell, and the barrier publishes it.
    if (wg_tid == 0) tma_store_wait<0>();
    barrier_sync(epilogue_barrier(wg), 128);
    copy(copy_o, tRrO, tRsO);
    // Generic-proxy writes must be visible to the TMA (async proxy) before it reads.
    cutlass::arch::fence_view_async_shared();
    barrier_sync(epilogue_barrier(wg), 128);
    if (wg_tid == 0) {
      Tensor mO = params.tma_o.get_tma_tensor(make_shape(p.seqlen_q, p.head_dim, p.nheads_q, p.batch));
      Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<_64, D>{},
                             make_coord(tile.m_block * Traits::kConsumerWGs + wg, _0{}));
      auto thr_tma = params.tma_o.get_slice(_0{});
      copy(params.tma_o, thr_tma.partition_S(sO), thr_tma.partition_D(gO));
      tma_store_arrive();
    }
  }

  // A quad (four lanes) holds each row's eight-column groups as one 32-bit pair per
  // lane. Transposing four groups at a time across the quad (two butterfly steps)
  // gives every lane eight consecutive elements of one group: one 16-byte store, and
  // a quad writes 64 contiguous bytes of the row.
  template <class TensorO>
  __device__ static void store_o_from_registers(const FwdParams& p, int tid, TileCoord tile, const TensorO& tOrO) {
    using namespace cute;
    static_assert(sizeof(Element) == 2 && Traits::kHeadDim % 32 == 0);
    constexpr int kGroups = Traits::kHeadDim / 8;  // eight-column groups per row
    auto rO = convert_fragment<Element>(tOrO);     // ((2, 2, kGroups), 1, 1): pair, row half, group
    const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(raw_pointer_cast(rO.data()));
    typename Traits::TiledMmaPV mma_pv;
    Tensor tOcO = mma_pv.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, D>{}));
    auto coord = rowcol_view(tOcO);
    const int lane = tid % 32;
    const bool odd = lane & 1, upper = lane & 2;
    Element* out = static_cast<Element*>(p.out) + tile.batch * p.o_batch_stride + tile.head * p.o_head_stride;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = tile.m_block * Traits::kBlockM + get<0>(coord(r, 0));
      Element* row_out = out + static_cast<std::int64_t>(row) * p.o_row_stride;
      CUTE_UNROLL
      for (int g0 = 0; g0 < kGroups; g0 += 4) {
        std::uint32_t w[4];
        CUTE_UNROLL
        for (int k = 0; k < 4; ++k) w[k] = words[r + 2 * (g0 + k)];
        // Swap the off-diagonal 2x2 blocks between lanes 0-1 and 2-3 ...
        std::uint32_t got = __shfl_xor_sync(0xffffffffu, upper ? w[0] : w[2], 2);
        (upper ? w[0] : w[2]) = got;
        got = __shfl_xor_sync(0xffffffffu, upper ? w[1] : w[3], 2);
        (upper ? w[1] : w[3]) = got;
        // ... then transpose inside each 2x2 block.
        got = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
        (odd ? w[0] : w[1]) = got;
        got = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
        (odd ? w[2] : w[3]) = got;
        if (row < p.seqlen_q) {
          const int col = 8 * (g0 + lane % 4);
          *reinterpret_cast<uint4*>(row_out + col) = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
};

}  // namespace fa3::hopper
