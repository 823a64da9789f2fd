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

// 1/x and log2(x) on the special-function unit (flush denormals), for the softmax's
// final normalization: within a few ulps, and short, where the IEEE division and logf
// would put branchy sequences between a tile's last P·V and its store.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Four fp32 values rounded to e4m3 (round to nearest even, saturating at 448) and
// packed into one register, x0 in the lowest byte.
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  std::uint32_t r;
  asm("{\n\t"
      ".reg .b16 lo, hi;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
      "mov.b32 %0, {lo, hi};\n\t"
      "}"
      : "=r"(r)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return r;
}

// Waits for the mbarrier phase with the given parity to complete. Unlike CUTLASS's
// wait it is also a compiler memory barrier, so that shared-memory reads of data the
// arriving thread wrote before its arrival are not hoisted above it.
__device__ __forceinline__ void mbarrier_wait(const std::uint64_t* bar, std::uint32_t phase) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n\t"
      ".reg .pred P1;\n\t"
      "FA3_WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
      "@!P1 bra FA3_WAIT;\n\t"
      "}" ::"r"(addr),
      "r"(phase)
      : "memory");
}

// Arrives on the mbarrier (release: this thread's earlier accesses are ordered before
// the phase completes). Unlike CUTLASS's arrive it is also a compiler memory barrier,
// so that a shared-memory store just before it is not sunk below it.
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(addr) : "memory");
}

// mbarrier_arrive on the barrier at the same shared-memory offset in CTA `cta` of the
// cluster (this CTA included). The release is the default one, at CTA scope: a
// release at cluster scope costs a GPU-wide memory barrier (MEMBAR.ALL.GPU) per
// arrival, and what the arrival announces, that this warp's GEMMs have finished
// reading a stage, needs no ordering of its memory accesses beyond their completion.
__device__ __forceinline__ void mbarrier_arrive_cluster(std::uint64_t* bar, int cta) {
  const auto addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n\t"
      ".reg .b32 remote;\n\t"
      "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t"
      "}" ::"r"(addr),
      "r"(cta)
      : "memory");
}

// Keeps the compiler from moving memory accesses across this point (no instruction).
__device__ __forceinline__ void compiler_barrier() { asm volatile("" ::: "memory"); }

// Returns p unchanged, where the compiler cannot see that it is: values computed
// from the result are recomputed where they are used rather than hoisted out of the
// loop and held in registers for its whole length.
template <class T>
__device__ __forceinline__ T* opaque(T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// Returns x unchanged (a byte permute that selects x's four bytes) once `after` is
// ready: instructions that read the result wait for whatever produces `after`, so that
// ptxas cannot schedule them before it.
__device__ __forceinline__ std::uint32_t ordered_after(std::uint32_t x, std::uint32_t after) {
  std::uint32_t y;
  asm("prmt.b32 %0, %1, %2, 0x3210;" : "=r"(y) : "r"(x), "r"(after));
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

// One-dimensional bulk copies (no tensor map): `bytes` a multiple of 16, both addresses
// 16-byte aligned. The load completes `bar`'s transaction count.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* gmem_src, std::uint32_t bytes,
                                          std::uint64_t* bar) {
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dst));
  const auto mbar = static_cast<std::uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
      "l"(gmem_src), "r"(bytes), "r"(mbar)
      : "memory");
}

// Adds `bytes` of fp32 values in shared memory to global memory, element by element, in
// the current bulk group (cute::tma_store_arrive commits it).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src, std::uint32_t bytes) {
  const auto src = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_src));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(gmem_dst),
               "r"(src), "r"(bytes)
               : "memory");
}

// The same with an L2 cache policy for the lines it adds into (a createpolicy value, such
// as cute::TMA::CacheHintSm90's).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem_dst, const float* smem_src, std::uint32_t bytes,
                                                    std::uint64_t l2_policy) {
  const auto src = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_src));
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.L2::cache_hint.add.f32 [%0], [%1], %2, %3;" ::"l"(gmem_dst),
      "r"(src), "r"(bytes), "l"(l2_policy)
      : "memory");
}

// Waits until every committed bulk group has completed, its writes to global memory
// included (cute::tma_store_wait waits only until the sources have been read), and
// orders those writes before this thread's later generic-proxy accesses.
__device__ __forceinline__ void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Adds four fp32 values to global memory (16 bytes, aligned), returning nothing. An
// atomicAdd on a float4 whose result is unused compiles to the same reduction, except
// in a function with a fence after it, where the compiler makes it a returning atomic
// (ATOMG) so that the fence can wait on its result.
__device__ __forceinline__ void red_add_v4(float4* dst, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// A global counter of the deterministic mode's ordered sums: wait until it reads
// `value` (acquire), or publish a new value (release) once this thread's earlier writes
// are visible GPU-wide.
__device__ __forceinline__ void wait_counter(const int* counter, int value) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != value);
}
__device__ __forceinline__ void publish_counter(int* counter, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(counter), "r"(value) : "memory");
}

// Programmatic dependent launch. A grid launched with the attribute may start while the
// grid before it still runs, once every CTA of that grid has let it
// (launch_dependent_grids) or exited; it reads nothing the earlier grid writes before
// wait_grid_dependencies, which returns once that grid has completed and its writes are
// visible (at once in a grid launched without the attribute).
__device__ __forceinline__ void launch_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_grid_dependencies() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace fa3::hopper::arch
