// fa3 — a shared-memory ring filled by TMA and drained by wgmma, guarded by one
// "full" mbarrier (TMA transaction bytes) and one "empty" mbarrier per stage.
//
// With kCluster > 1 the CTAs of a cluster share the ring's loads: each CTA's producer
// loads its part of every stage and the TMA multicasts it into the same stage of
// every CTA of the cluster, so a stage is full once all parts have landed and may be
// refilled only once the consumers of every CTA are done with it: each consumer warp
// arrives on the stage's empty barrier in every CTA.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "hopper/arch/ptx.cuh"

namespace fa3::hopper {

// Position in a ring of kStages buffers, with the parity of the current lap.
template <int kStages>
struct StageState {
  int index = 0;
  std::uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

template <int kStages, int kCluster = 1>
struct TmaPipeline {
  using Barrier = cutlass::arch::ClusterTransactionBarrier;

  struct Storage {
    std::uint64_t full[kStages];
    std::uint64_t empty[kStages];
  };

  Storage* storage;

  // One thread initialises; `consumer_arrivals` arrivals from each CTA of the cluster
  // free a stage, and `producer_arrivals` fill it (with TMA, one arrival that announces
  // the bytes; producers that write with ordinary stores arrive each, producer_commit).
  __device__ static void init(Storage& s, int consumer_arrivals, int producer_arrivals = 1) {
    for (int i = 0; i < kStages; ++i) {
      Barrier::init(&s.full[i], producer_arrivals);
      Barrier::init(&s.empty[i], consumer_arrivals * kCluster);
    }
  }

  // The producer starts one lap ahead: every stage is empty at first.
  __device__ static StageState<kStages> producer_start() { return {0, 1u}; }

  // Producer (one thread): wait for the stage to be free, then announce the bytes the
  // TMA copies about to be issued will deliver. Returns the barrier they signal.
  __device__ __forceinline__ std::uint64_t* producer_acquire(const StageState<kStages>& st, std::uint32_t bytes) {
    producer_wait(st);
    return producer_expect(st, bytes);
  }

  // producer_acquire in two halves, for a producer that writes to shared memory
  // between them (the arrival publishes those writes to the consumers).
  __device__ __forceinline__ void producer_wait(const StageState<kStages>& st) {
    Barrier::wait(&storage->empty[st.index], st.phase);
  }
  __device__ __forceinline__ std::uint64_t* producer_expect(const StageState<kStages>& st, std::uint32_t bytes) {
    Barrier::arrive_and_expect_tx(&storage->full[st.index], bytes);
    return &storage->full[st.index];
  }
  // Fills the stage with nothing: the consumers' wait completes with no bytes.
  __device__ __forceinline__ void producer_commit_empty(const StageState<kStages>& st) {
    Barrier::arrive(&storage->full[st.index]);
  }

  // A producer thread's arrival on a stage it wrote with ordinary stores (fenced for the
  // async proxy first, where wgmma reads them): the arrival releases those stores.
  __device__ __forceinline__ void producer_commit(const StageState<kStages>& st) {
    Barrier::arrive(&storage->full[st.index]);
  }

  __device__ __forceinline__ void consumer_wait(const StageState<kStages>& st) {
    Barrier::wait(&storage->full[st.index], st.phase);
  }

  // consumer_wait for a stage that also carries data the producer thread wrote to
  // shared memory before arriving: the wait is a compiler memory barrier too, so that
  // those reads stay after it.
  __device__ __forceinline__ void consumer_wait_for_data(const StageState<kStages>& st) {
    arch::mbarrier_wait(&storage->full[st.index], st.phase);
  }

  // One arrival per consumer warp and CTA of the cluster, after the warp's reads are
  // complete: lane c arrives on the stage's empty barrier in the cluster's CTA c.
  __device__ __forceinline__ void consumer_release(const StageState<kStages>& st, int lane) {
    if constexpr (kCluster == 1) {
      if (lane == 0) Barrier::arrive(&storage->empty[st.index]);
    } else {
      if (lane < kCluster) arch::mbarrier_arrive_cluster(&storage->empty[st.index], lane);
    }
  }

  // The producer's last act with a cluster: its CTA may exit only once no other CTA
  // will arrive on its barriers any more, i.e. once every stage it filled has been
  // released by the consumers of every CTA. `st` is the stage after the last one filled.
  __device__ __forceinline__ void producer_drain(StageState<kStages> st) {
    for (int i = 0; i < kStages; ++i) {
      producer_wait(st);
      st.advance();
    }
  }

  // One arrival per consumer thread, for a ring whose empty barrier counts threads:
  // the stages also carry data that every thread reads with ordinary loads (see
  // consumer_wait_for_data), and an arrival releases only its own thread's reads.
  __device__ __forceinline__ void consumer_release_each(const StageState<kStages>& st) {
    Barrier::arrive(&storage->empty[st.index]);
  }
};

}  // namespace fa3::hopper
