// fa3 — every named barrier the kernels use, in one place, so that no two roles of a
// kernel can pick the same hardware id by accident. The forward's and the backward's
// are separate kernels, and their ids may coincide.
#pragma once

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

// Ids for up to kMaxConsumerWGs consumer warpgroups per role; the hardware has 16.
inline constexpr int kMaxConsumerWGs = 4;

// Each role's id for consumer warpgroup w is its first id + w.
enum class NamedBarrier : int {  // id 0 is __syncthreads'
  // Consumer warpgroup w may issue its GEMMs.
  kWarpScheduler0 = 1,
  // Inside consumer warpgroup w: its O rows in shared memory are complete / free; and,
  // at another point of the tile, a varlen block's V rows cleared (FwdConsumer::clear_v_rows).
  kEpilogue0 = kWarpScheduler0 + kMaxConsumerWGs,
  // O written through Q's buffer: the other warpgroups are done reading Q.
  kQueryRead0 = kEpilogue0 + kMaxConsumerWGs,
  kEnd = kQueryRead0 + kMaxConsumerWGs,
};
static_assert(static_cast<int>(NamedBarrier::kEnd) <= 16, "more named barriers than the hardware has");

// The backward kernel's (hopper/bwd_kernel.cuh); up to kMaxBwdConsumerWGs consumer warpgroups.
inline constexpr int kMaxBwdConsumerWGs = 3;
enum class BwdBarrier : int {
  // Every consumer thread: P / dS of a step are in shared memory (or free to be written).
  kPdS = 1,
  // The consumers before the epilogue writes dK/dV through K's and V's buffers, and
  // around their ordered dQ / dK / dV sums (deterministic mode).
  kConsumers = 2,
  // Consumer warpgroup w and the dQ warp: w's dQ part is in shared memory / was read.
  kDqFull0 = 3,
  kDqEmpty0 = kDqFull0 + kMaxBwdConsumerWGs,
  kEnd = kDqEmpty0 + kMaxBwdConsumerWGs,
};
static_assert(static_cast<int>(BwdBarrier::kEnd) <= 16, "more named barriers than the hardware has");

__device__ __forceinline__ void barrier_sync(BwdBarrier id, int count) {
  arch::named_barrier_sync(static_cast<int>(id), count);
}

__device__ __forceinline__ void barrier_arrive(BwdBarrier id, int count) {
  arch::named_barrier_arrive(static_cast<int>(id), count);
}

// A consumer warpgroup and the dQ warp meet at its dQ barriers.
inline constexpr int kDqBarrierThreads = 128 + 32;

__device__ __forceinline__ BwdBarrier dq_full_barrier(int wg) {
  return static_cast<BwdBarrier>(static_cast<int>(BwdBarrier::kDqFull0) + wg);
}

__device__ __forceinline__ BwdBarrier dq_empty_barrier(int wg) {
  return static_cast<BwdBarrier>(static_cast<int>(BwdBarrier::kDqEmpty0) + wg);
}

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
