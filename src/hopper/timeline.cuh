// fa3 — the forward consumers' stamps (hopper/timeline.h): one stream per (CTA, consumer
// warpgroup), written by the warpgroup's first thread.
#pragma once

#include <cstdint>

#include "hopper/fwd_params.h"
#include "hopper/timeline.h"

namespace fa3::hopper {

// Off (the default build): every call compiles to nothing.
template <bool kOn>
struct FwdTimeline {
  __device__ void open(const FwdParams&, int, int, int) {}
  __device__ void begin_tile(int, int) {}
  __device__ void stamp(FwdEvent, int) {}
};

template <>
struct FwdTimeline<true> {
  std::uint64_t* stream = nullptr;  // its count, then its records; null: not recording
  int capacity = 0;
  int count = 0;
  int m_block = 0;
  int pair = 0;

  // Consumer thread `consumer_thread` of warpgroup `wg` (of `warpgroups`); only each
  // warpgroup's first thread records, and only when the launch gave a buffer.
  __device__ void open(const FwdParams& p, int wg, int consumer_thread, int warpgroups) {
    if (p.timeline == nullptr || consumer_thread % 128 != 0) return;
    capacity = p.timeline_capacity;
    stream = p.timeline + (static_cast<std::int64_t>(blockIdx.x) * warpgroups + wg) * timeline_stream_words(capacity);
  }
  __device__ void begin_tile(int tile_m_block, int tile_pair) {
    m_block = tile_m_block;
    pair = tile_pair;
  }
  __device__ void stamp(FwdEvent event, int block) {
    if (stream == nullptr) return;
    if (count < capacity) {
      std::uint64_t clock;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(clock));
      stream[1 + 2 * count] = clock;
      stream[2 + 2 * count] = pack_record(event, block, m_block, pair);
    }
    ++count;
    // The count once a tile, at its end (the last stamp of a stream is a tile's end).
    if (event == FwdEvent::kTileEnd) stream[0] = static_cast<std::uint64_t>(count);
  }
};

}  // namespace fa3::hopper
