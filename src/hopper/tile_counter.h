// fa3 — the zeroed counter a dynamic tile scheduler draws tiles from, one per launch.
//
// Each launch gets its own int, allocated and zeroed in stream order from a memory
// pool the library keeps per device, and freed in stream order after the kernel, so
// launches on different streams never share a counter. While the stream is being
// captured into a CUDA graph no counter is made (the kernel then falls back to a
// static order), so captured graphs hold no allocation of ours.
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/status.h"

namespace fa3::hopper {

// Sets *counter to a zeroed device int ready for a kernel enqueued next on `stream`,
// or to nullptr when `stream` is capturing.
Status acquire_tile_counter(cudaStream_t stream, int** counter);

// Frees it after the work enqueued so far on `stream`; a nullptr is ignored.
Status release_tile_counter(int* counter, cudaStream_t stream);

}  // namespace fa3::hopper
