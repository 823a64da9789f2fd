// fa3 — the few PTX instructions CuTe/CUTLASS do not wrap the way the kernels need.
#pragma once

#include <cstdint>

namespace fa3::hopper::arch {

// 2^x on the special-function unit (flushes denormals; exact for the exp2(-inf) = 0
// the masked scores rely on).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Named barriers: `sync` blocks until `count` threads have arrived at `id` (the
// calling warps included); `arrive` counts the calling warps without waiting.
// count must be a multiple of 32; ids 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

}  // namespace fa3::hopper::arch
