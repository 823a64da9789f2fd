// fa3 — every named barrier the forward kernel uses, in one place, so that no two
// roles can pick the same hardware id by accident.
#pragma once

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

enum class NamedBarrier : int {  // id 0 is __syncthreads'
  kWarpScheduler0 = 1,  // consumer warpgroup w may issue its GEMMs: kWarpScheduler0 + w
  kWarpScheduler1 = 2,
  kWarpScheduler2 = 3,
  kEpilogue0 = 4,       // inside consumer warpgroup w: its O rows in shared memory are complete / free
  kEpilogue1 = 5,
  kEpilogue2 = 6,
  kQueryRead0 = 7,      // O written through Q's buffer: the other warpgroups are done reading Q
  kQueryRead1 = 8,
  kQueryRead2 = 9,
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

__device__ __forceinline__ NamedBarrier epilogue_barrier(int wg) {
  return static_cast<NamedBarrier>(static_cast<int>(NamedBarrier::kEpilogue0) + wg);
}

__device__ __forceinline__ NamedBarrier query_read_barrier(int wg) {
  return static_cast<NamedBarrier>(static_cast<int>(NamedBarrier::kQueryRead0) + wg);
}

}  // namespace fa3::hopper
