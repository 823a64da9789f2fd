// fa3 — the counter a dynamic tile scheduler draws tiles from.
//
// The counter must be 0 when a launch starts. A launch draws exactly one value per
// tile, so the CTA that draws the last value knows that every other draw is done and
// sets the counter back to 0 (TileScheduler::next). A counter therefore needs zeroing
// only when it is made: the library keeps one per (device, stream), made and zeroed
// in stream order at the stream's first launch, and later launches on that stream
// reuse it. That saves a memset and an allocation before every causal launch, about 2
// µs of GPU time each. Streams are told apart by cudaStreamGetId, which no other
// stream of the process shares (a handle can be reused after cudaStreamDestroy), so
// launches that may run at the same time never share a counter. Past kMaxKeptCounters
// streams, each launch gets a counter of its own, zeroed before and freed after it.
// A launch captured into a CUDA graph gets one of its own too, as nodes of the graph:
// an allocation, a 4-byte memset, the kernel, a free. A graph may be replayed on any
// stream, also beside eager launches on the one it was captured from, so it can share
// no counter; its memset costs about a microsecond per replay, where the static tile
// order it would otherwise fall back to cost causal calls 6-14 %.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "fa3/status.h"

namespace fa3::hopper {

inline constexpr std::size_t kMaxKeptCounters = 4096;

struct TileCounter {
  int* ptr = nullptr;       // nullptr: none (static tile order)
  bool per_launch = false;  // freed by release_tile_counter
};

// A counter that is 0 for the kernel enqueued next on `stream` (captured ones included).
Status acquire_tile_counter(cudaStream_t stream, TileCounter* counter);

// Frees a per-launch counter after the work enqueued so far on `stream`; a kept one
// stays for the stream's next launch.
Status release_tile_counter(const TileCounter& counter, cudaStream_t stream);

}  // namespace fa3::hopper
