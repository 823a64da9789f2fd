// fa3 — every named barrier the forward kernel uses, in one place, so that no two
// roles can pick the same hardware id by accident.
#pragma once

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

enum class NamedBarrier : int {
  kEpilogue = 1,        // consumer warpgroups: O tile in shared memory is complete / free
  kQueryEmpty = 2,      // consumers -> producer: Q's buffer may be overwritten
  kWarpScheduler0 = 3,  // consumer warpgroup w may issue its GEMMs: kWarpScheduler0 + w
  kWarpScheduler1 = 4,
  kWarpScheduler2 = 5,
};

__device__ __forceinline__ void barrier_sync(NamedBarrier id, int count) {
  arch::named_barrier_sync(static_cast<int>(id), count);
}

__device__ __forceinline__ void barrier_arrive(NamedBarrier id, int count) {
  arch::named_barrier_arrive(static_cast<int>(id), count);
}

__device__ __forceinline__ NamedBarrier warp_scheduler_barrier(int wg) {
  return static_cast<NamedBarrier>(static_cast<int>(NamedBarrier::kWarpScheduler0) + wg);
}

}  // namespace fa3::hopper
