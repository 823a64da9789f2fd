// fa3 — the host side of the forward kernel's timeline (hopper/timeline.h): a buffer for
// one launch's stamps, and the file they are appended to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fa3/status.h"

namespace fa3::hopper {

struct TimelineCapture {
  std::uint64_t* buffer = nullptr;  // null: this launch records nothing
  int streams = 0;
  int warpgroups = 0;
  int capacity = 0;
  std::string path;
};

// With FA3_FWD_TIMELINE naming a file in the environment: a zeroed buffer for `grid`
// CTAs of `warpgroups` consumer warpgroups, allocated in order on `stream`. Without it,
// or while `stream` is being captured into a graph, *capture stays empty.
Status timeline_begin(int grid, int warpgroups, cudaStream_t stream, TimelineCapture* capture);

// Waits for `stream`, appends the launch's stamps to the file (header, `kernel`'s name,
// the streams) and frees the buffer; nothing for an empty capture.
Status timeline_end(const TimelineCapture& capture, const char* kernel, int block_n, cudaStream_t stream);

}  // namespace fa3::hopper
