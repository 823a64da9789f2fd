// fa3 — forward epilogue. O goes to global memory either through shared memory
// (stmatrix, then one TMA store per warpgroup, which also clips rows past seqlen_q) or
// straight from registers (16-byte stores after a transpose inside each quad), as the
// configuration's OStore says; LSE is written per row.
//
// A varlen call's O is never stored by TMA: a TMA store writes whole 64-row boxes, and a
// box that starts inside a sequence ends in the next one, whose rows another tile
// writes. With O's own buffer the store warp copies the rows from shared memory itself,
// each under its own predicate (so the consumers hold nothing more than for a
// fixed-length call: the register path's transposes and addresses made the kernels at
// their register limit spill); otherwise the register path stores each row.
//
// With O's own buffer a warp of the producer warpgroup does the global stores: each
// consumer warpgroup writes its rows of O and LSE and the tile's coordinates to shared
// memory, hands them over through its o_full mbarrier and goes on to the next tile;
// the store warp waits there, issues O's TMA store, stores LSE, waits until the TMA
// has read O and arrives on the warpgroup's o_free mbarrier, which the warpgroup waits
// on before it writes its rows again. Address arithmetic, the stores and the wait for
// them then stay off the consumers' way from one tile to the next. Coordinates with
// m_block -1 tell the store warp to stop.
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
  using Element = typename Traits::ElementOut;  // O's
  using BM = typename Traits::BM;
  using BN = typename Traits::BN;
  using DV = typename Traits::DV;  // O's head dim (V's)
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;
  static constexpr bool kStoreWarp = Traits::kCfg.o_store == OStore::kOwnBuffer;
  using SharedStorage = typename Traits::SharedStorage;

  // A consumer warpgroup's view of its o_free barrier: the parity of the store it
  // waits for (the first wait passes at once).
  struct State {
    std::uint32_t free_phase = 1;
  };

  // One thread, before the CTA's (or cluster's) first barrier in fwd_kernel.cuh.
  // o_full counts the arrivals of the warpgroup's 128 threads, o_free those of the
  // store warp's 32 lanes.
  __device__ static void init(SharedStorage& smem) {
    if constexpr (kStoreWarp) {
      for (int w = 0; w < Traits::kConsumerWGs; ++w) {
        cutlass::arch::ClusterBarrier::init(&smem.o_full[w], 128);
        cutlass::arch::ClusterBarrier::init(&smem.o_free[w], 32);
      }
    }
  }

  // Stores the tile's O; `tOrO` is normalized. Every thread of each consumer warpgroup
  // calls it; a warpgroup stores its own 64 rows without waiting for the others. `lse`
  // is this thread's rows' LSE, stored here with the store warp (else by store_lse).
  template <class Params, class TensorO, int kRows>
  __device__ static void store_o(const Params& params, SharedStorage& smem, State& state, int tid, TileCoord tile,
                                 const SeqBounds& seq, const TensorO& tOrO, const float (&lse)[kRows]) {
    if constexpr (Traits::kCfg.o_store == OStore::kRegisters) {
      store_o_from_registers(params.p, tid, tile, seq, tOrO);
    } else {
      if (is_varlen<Traits::kVarlen>(params.p) && !kStoreWarp) {
        // O in Q's buffer: the other warpgroups' QueryRead arrivals are taken as the
        // store through shared memory would take them, so that the barrier's count
        // stays in step.
        if constexpr (Traits::kCfg.o_store == OStore::kQBuffer) {
          barrier_sync(query_read_barrier(tid / 128), kConsumerThreads);
        }
        store_o_from_registers(params.p, tid, tile, seq, tOrO);
      } else {
        store_o_through_smem(params, smem, state, tid, tile, seq, tOrO, lse);
      }
    }
  }

  // Every consumer thread, after its last tile: tells the store warp to stop.
  __device__ static void finish(SharedStorage& smem, State& state, int tid) {
    if constexpr (kStoreWarp) {
      const int wg = tid / 128;
      arch::mbarrier_wait(&smem.o_free[wg], state.free_phase);
      if (tid % 128 == 0) smem.o_tile[wg] = FwdTileSlot{TileCoord{-1, 0, 0}, SeqBounds{0, 0, 0, 0}};
      publish(smem, wg);
    } else if constexpr (Traits::kCfg.o_store == OStore::kQBuffer) {
      drain(tid);
    }
  }

  // The store warp's loop (one warp of the producer warpgroup), with O's own buffer.
  // Every lane waits on o_full and arrives on o_free itself, so that each lane's reads
  // of the shared buffers are ordered before the warpgroup writes them again.
  template <class Params>
  __device__ static void run_store_warp(const Params& params, SharedStorage& smem) {
    using namespace cute;
    const FwdParams& p = params.p;
    const int lane = threadIdx.x % 32;
    std::uint32_t full_phase = 0;
    for (bool done = false; !done; full_phase ^= 1u) {
      // Every consumer warpgroup runs the same tiles, so they stop together.
      for (int w = 0; w < Traits::kConsumerWGs; ++w) {
        arch::mbarrier_wait(&smem.o_full[w], full_phase);
        const FwdTileSlot slot = smem.o_tile[w];
        const TileCoord tile = slot.tile;
        if (tile.m_block < 0) {
          done = true;
          continue;
        }
        const bool varlen = is_varlen<Traits::kVarlen>(p);
        if (varlen) {
          store_rows(p, smem, slot, w, lane);
        } else if (lane == 0) {
          issue_store(params, smem, tile, w);
        }
        if (p.lse != nullptr) {
          float* lse = p.lse + tile.batch * p.lse_batch_stride + tile.head * p.lse_head_stride;
          CUTE_UNROLL
          for (int i = lane; i < 64; i += 32) {
            const int row = tile.m_block * Traits::kBlockM + w * 64 + i;
            if (row < slot.seq.seqlen_q) {
              lse[static_cast<std::int64_t>(slot.seq.offset_q + row) * p.lse_row_stride] = smem.o_lse[w * 64 + i];
            }
          }
        }
        // The phase completes with lane 0's arrival, after the TMA has read O (the
        // varlen copies above have read it by the time they are issued).
        if (lane == 0 && !varlen) tma_store_wait<0>();
        arch::mbarrier_arrive(&smem.o_free[w]);
      }
    }
  }

  // Stores the LSE of this thread's rows (those of the S fragment), if the caller asked
  // for it. Every consumer thread calls it. With the store warp the LSE goes to shared
  // memory with O instead (store_o).
  template <int kRows>
  __device__ static void store_lse(const FwdParams& p, int tid, TileCoord tile, const SeqBounds& seq,
                                   const float (&lse)[kRows]) {
    using namespace cute;
    if constexpr (!kStoreWarp) {
      if (p.lse != nullptr && tid % 4 == 0) {
        float* lse_out = p.lse + tile.batch * p.lse_batch_stride + tile.head * p.lse_head_stride;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const int row = tile.m_block * Traits::kBlockM + lse_row(tid, r);
          if (row < seq.seqlen_q) lse_out[static_cast<std::int64_t>(seq.offset_q + row) * p.lse_row_stride] = lse[r];
        }
      }
    }
  }

  // O in Q's buffer: before the CTA exits or the buffer takes Q, the warpgroup's last
  // store must have read it.
  __device__ static void drain(int tid) {
    if constexpr (Traits::kCfg.o_store == OStore::kQBuffer) {
      if (tid % 128 == 0) cute::tma_store_wait<0>();
    }
  }

 private:
  // Hands the warpgroup's rows of O and LSE and o_tile to the store warp. Every thread
  // arrives after its own writes, so that each write is ordered before the store warp's
  // reads by the writer's own release (not through a barrier and another thread's).
  __device__ static void publish(SharedStorage& smem, int wg) { arch::mbarrier_arrive(&smem.o_full[wg]); }

  // A varlen call's rows of consumer warpgroup w's O, copied from its buffer by the store
  // warp's lanes 16 bytes at a time (a row's 16-byte groups stay whole in the swizzled
  // layout), each row under its own predicate, and only the call's head_dim_v columns.
  __device__ static void store_rows(const FwdParams& p, SharedStorage& smem, const FwdTileSlot& slot, int w,
                                    int lane) {
    using namespace cute;
    Tensor sO = make_tensor(make_smem_ptr(smem.o_buffer(w)), typename Traits::SmemLayoutO{});
    constexpr int kGroups = Traits::kHeadDimV / 8;  // 16-byte groups per row
    Element* out =
        static_cast<Element*>(p.out) + slot.tile.batch * p.o_batch_stride + slot.tile.head * p.o_head_stride;
    const int row0 = slot.tile.m_block * Traits::kBlockM + w * 64;
#pragma unroll 4
    for (int i = lane; i < 64 * kGroups; i += 32) {
      const int r = i / kGroups;
      const int col = 8 * (i % kGroups);
      if (row0 + r < slot.seq.seqlen_q && col < p.head_dim_v) {
        const uint4 v = *reinterpret_cast<const uint4*>(&sO(r, col));
        *reinterpret_cast<uint4*>(out + static_cast<std::int64_t>(slot.seq.offset_q + row0 + r) * p.o_row_stride +
                                  col) = v;
      }
    }
  }

  // Issues the TMA store of consumer warpgroup w's rows of O (one thread).
  template <class Params>
  __device__ static void issue_store(const Params& params, SharedStorage& smem, TileCoord tile, int w) {
    using namespace cute;
    const FwdParams& p = params.p;
    Tensor sO = make_tensor(make_smem_ptr(smem.o_buffer(w)), typename Traits::SmemLayoutO{});
    Tensor mO = params.tma_o.get_tma_tensor(make_shape(p.seqlen_q, p.head_dim_v, p.nheads_q, p.batch));
    Tensor gO = local_tile(mO(_, _, tile.head, tile.batch), Shape<_64, DV>{},
                           make_coord(tile.m_block * Traits::kConsumerWGs + w, _0{}));
    auto thr_tma = params.tma_o.get_slice(_0{});
    copy(params.tma_o, thr_tma.partition_S(sO), thr_tma.partition_D(gO));
    tma_store_arrive();
  }

  // The row of the tile (0 .. kBlockM-1) of this thread's r-th row of the S fragment.
  __device__ static int lse_row(int tid, int r) {
    using namespace cute;
    typename Traits::TiledMmaQK mma_qk;
    Tensor tScS = mma_qk.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, BN>{}));
    return get<0>(rowcol_view(tScS)(r, 0));
  }

  template <class Params, class TensorO, int kRows>
  __device__ static void store_o_through_smem(const Params& params, SharedStorage& smem, State& state, int tid,
                                              TileCoord tile, const SeqBounds& seq, const TensorO& tOrO,
                                              const float (&lse)[kRows]) {
    using namespace cute;
    const int wg = tid / 128;
    const int wg_tid = tid % 128;
    Tensor sO = make_tensor(make_smem_ptr(smem.o_buffer(wg)), typename Traits::SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaPVRows{});
    auto thr_copy = copy_o.get_thread_slice(wg_tid);
    auto rO = convert_fragment<Element>(tOrO);
    Tensor tRrO = thr_copy.retile_S(rO);
    Tensor tRsO = thr_copy.partition_D(sO);

    if constexpr (kStoreWarp) {
      arch::mbarrier_wait(&smem.o_free[wg], state.free_phase);
      state.free_phase ^= 1u;
      copy(copy_o, tRrO, tRsO);
      if (params.p.lse != nullptr && tid % 4 == 0) {
        // Quad leaders hold complete row statistics.
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) smem.o_lse[lse_row(tid, r)] = lse[r];
      }
      if (wg_tid == 0) smem.o_tile[wg] = FwdTileSlot{tile, seq};
      // Generic-proxy writes must be visible to the TMA (async proxy) before it reads.
      cutlass::arch::fence_view_async_shared();
      publish(smem, wg);
    } else {
      // O in Q's buffer: every other warpgroup must be done reading Q (they arrive once
      // their last Q·Kᵀ has completed), and this warpgroup's previous store must have
      // read it; only the thread that issued that store can tell, and the barrier
      // publishes it.
      barrier_sync(query_read_barrier(wg), kConsumerThreads);
      if (wg_tid == 0) tma_store_wait<0>();
      barrier_sync(epilogue_barrier(wg), 128);
      copy(copy_o, tRrO, tRsO);
      cutlass::arch::fence_view_async_shared();
      barrier_sync(epilogue_barrier(wg), 128);
      if (wg_tid == 0) issue_store(params, smem, tile, wg);
    }
  }

  // A quad (four lanes) holds each row's eight-column groups as one 32-bit pair per
  // lane. Transposing four groups at a time across the quad (two butterfly steps)
  // gives every lane eight consecutive elements of one group: one 16-byte store, and
  // a quad writes 64 contiguous bytes of the row.
  template <class TensorO>
  __device__ static void store_o_from_registers(const FwdParams& p, int tid, TileCoord tile, const SeqBounds& seq,
                                                const TensorO& tOrO) {
    using namespace cute;
    static_assert(sizeof(Element) == 2 && Traits::kHeadDimV % 32 == 0);
    constexpr int kGroups = Traits::kHeadDimV / 8;  // eight-column groups per row
    auto rO = convert_fragment<Element>(tOrO);     // ((2, 2, kGroups), 1, 1): pair, row half, group
    const std::uint32_t* words = reinterpret_cast<const std::uint32_t*>(raw_pointer_cast(rO.data()));
    typename Traits::TiledMmaPV mma_pv;
    Tensor tOcO = mma_pv.get_thread_slice(tid).partition_C(make_identity_tensor(Shape<BM, DV>{}));
    auto coord = rowcol_view(tOcO);
    const int lane = tid % 32;
    const bool odd = lane & 1, upper = lane & 2;
    Element* out = static_cast<Element*>(p.out) + tile.batch * p.o_batch_stride + tile.head * p.o_head_stride;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int row = tile.m_block * Traits::kBlockM + get<0>(coord(r, 0));
      Element* row_out = out + static_cast<std::int64_t>(seq.offset_q + row) * p.o_row_stride;
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
        // A smaller head dim (a multiple of 8, validation's rule) may run on this kernel.
        const int col = 8 * (g0 + lane % 4);
        if (row < seq.seqlen_q && col < p.head_dim_v) {
          *reinterpret_cast<uint4*>(row_out + col) = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
    }
  }
};

}  // namespace fa3::hopper
