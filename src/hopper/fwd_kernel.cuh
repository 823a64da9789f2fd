// fa3 — the forward kernel: warpgroup roles, register budgets, the persistent tile
// loop, and the handshakes between roles.
//
// Warpgroup 0 is the producer (one warp picks tiles and issues every TMA load; it
// keeps few registers); warpgroups 1.. are consumers, each owning 64 query rows of
// the tile. Handshakes:
//   K, V   : TmaPipeline rings (full: TMA bytes landed; empty: every consumer warp done)
//   Q      : q_full mbarrier, one phase per tile. The producer writes the tile's index
//            to shared memory before arming it, so its completion also tells the
//            consumers which tile to run; an index past the last tile (armed with no
//            load) tells them to stop.
//   Q free : the QueryEmpty named barrier. Consumers arrive once per tile when Q's
//            buffer (and O's, if shared) may be overwritten; the producer syncs on it
//            before announcing the next tile.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "hopper/barriers.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/fwd_mainloop.cuh"
#include "hopper/fwd_params.h"
#include "hopper/fwd_traits.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_scheduler.cuh"

namespace fa3::hopper {

template <class Traits_, class Mask_>
struct FwdKernel {
  using Traits = Traits_;
  using Mask = Mask_;
  using SharedStorage = typename Traits::SharedStorage;
  using Pipeline = typename Traits::Pipeline;
  using Scheduler = TileScheduler<Mask::kCausal>;
  static constexpr int kThreads = Traits::kThreads;
  static constexpr int kConsumerThreads = Traits::kConsumerThreads;
  static constexpr int kQueryEmptyCount = 32 + kConsumerThreads;  // producer warp + consumers

  struct Params {
    typename Traits::TmaQ tma_q;
    typename Traits::TmaK tma_k;
    typename Traits::TmaV tma_v;
    typename Traits::TmaO tma_o;
    FwdParams p;
    int num_m_blocks;
    int heads_per_group;  // tile order: (batch, head) pairs whose K/V share L2
    int* tile_counter;    // zeroed before the launch when the scheduler is dynamic
  };

  __device__ static void run(const Params& params, char* smem_raw) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);
    const int warp = cutlass::canonical_warp_idx_sync();
    const int warp_group = warp / 4;

    if (threadIdx.x == 0) {
      cutlass::arch::ClusterTransactionBarrier::init(&smem.q_full, 1);
      Pipeline::init(smem.k_pipe, kConsumerThreads / 32);
      Pipeline::init(smem.v_pipe, kConsumerThreads / 32);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();

    Pipeline k_pipe{&smem.k_pipe};
    Pipeline v_pipe{&smem.v_pipe};
    const Scheduler scheduler(params.num_m_blocks, params.p.nheads_q, params.p.batch, params.heads_per_group);
    const Mask mask(params.p);

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kCfg.producer_regs>();
      if (warp == 0) produce(params, smem, k_pipe, v_pipe, scheduler, mask);
    } else {
      cutlass::arch::warpgroup_reg_alloc<Traits::kCfg.consumer_regs>();
      consume(params, smem, k_pipe, v_pipe, scheduler, mask, static_cast<int>(threadIdx.x) - 128);
    }
  }

 private:
  __device__ static void produce(const Params& params, SharedStorage& smem, Pipeline& k_pipe, Pipeline& v_pipe,
                                 const Scheduler& scheduler, const Mask& mask) {
    const bool leader = cute::elect_one_sync();
    if (leader) {
      cute::prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
      cute::prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    }
    FwdProducer<Traits> producer;
    int t = scheduler.first();
    for (bool first = true;; first = false) {
      const bool valid = scheduler.valid(t);
      const TileCoord tile = scheduler.coord(valid ? t : 0);
      const int n_end = valid ? mask.template n_block_end<Traits::kBlockM, Traits::kBlockN>(tile.m_block) : 0;
      if (valid && leader) producer.load_first_kv(params, smem, k_pipe, v_pipe, tile, n_end);
      __syncwarp();
      if (!first) barrier_sync(NamedBarrier::kQueryEmpty, kQueryEmptyCount);
      int next = 0;
      if (leader) {
        smem.tile_index = t;
        arch::compiler_barrier();  // the index is written before q_full is armed
        if (valid) {
          // Ask for the next tile now; the answer is needed only after this one's loads.
          next = scheduler.next(t, params.tile_counter);
          producer.load_q_and_rest(params, smem, k_pipe, v_pipe, tile, n_end);
        } else {
          cutlass::arch::ClusterBarrier::arrive(&smem.q_full);
        }
      }
      if (!valid) break;
      t = __shfl_sync(0xffffffffu, next, 0);
    }
  }

  __device__ static void consume(const Params& params, SharedStorage& smem, Pipeline& k_pipe, Pipeline& v_pipe,
                                 const Scheduler& scheduler, const Mask& mask, int tid) {
    using namespace cute;
    using Epilogue = FwdEpilogue<Traits>;
    FwdConsumer<Traits, Mask> consumer(tid);
    Tensor tOrO = partition_fragment_C(consumer.mma_pv, Shape<typename Traits::BM, typename Traits::D>{});
    consumer.turn_start();
    for (std::uint32_t q_phase = 0;; q_phase ^= 1u) {
      arch::mbarrier_wait(&smem.q_full, q_phase);
      const int t = smem.tile_index;
      if (!scheduler.valid(t)) break;
      const TileCoord tile = scheduler.coord(t);
      const int n_end = mask.template n_block_end<Traits::kBlockM, Traits::kBlockN>(tile.m_block);
      OnlineSoftmax<2> softmax(params.p.softmax_scale_log2);
      using QueryDone = typename FwdConsumer<Traits, Mask>::QueryDone;
      const QueryDone q_done = Traits::kCfg.o_aliases_q ? QueryDone::kSignalPeers : QueryDone::kReleaseQ;
      consumer.mma_tile(smem, k_pipe, v_pipe, mask, tile.m_block, n_end, tOrO, softmax, q_done);

      auto o = rowcol_view(tOrO);
      float lse[2];
      softmax.finalize(o, params.p.softmax_scale, lse);
      Epilogue::store(params, smem, tid, tile, tOrO, lse);
      if (Traits::kCfg.o_aliases_q) {
        // Q's buffer is free once this warpgroup's store has read its rows of O.
        Epilogue::drain(tid);
        __syncwarp();
        barrier_arrive(NamedBarrier::kQueryEmpty, kQueryEmptyCount);
      }
    }
    Epilogue::drain(tid);
  }
};

template <class Kernel>
__global__ void __launch_bounds__(Kernel::kThreads, 1) fwd_kernel(const __grid_constant__ typename Kernel::Params params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel::run(params, smem);
}

}  // namespace fa3::hopper
