// fa3 — small host helpers shared by the kernels' launch code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "fa3/status.h"

namespace fa3::hopper::detail {

// TMA wants every stride a positive multiple of 16 bytes, also for extent-1 modes whose
// stride is never used; give those the stride a packed layout would have.
inline std::int64_t usable_stride(std::int64_t stride, std::int64_t extent, std::int64_t packed) {
  return extent == 1 ? packed : stride;
}

// A packed row of `head_dim` elements, rounded up to whole 16-byte units: the row
// stride of an extent-1 mode, whatever the head dim.
template <class Element>
constexpr std::int64_t padded_row(std::int64_t head_dim) {
  constexpr std::int64_t kUnit = 16 / sizeof(Element);
  return (head_dim + kUnit - 1) / kUnit * kUnit;
}

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// Launches `kernel` on `stream`; with `programmatic`, as a programmatic dependent of the
// kernel before it in the stream (it may start once that kernel's CTAs have all let it,
// and must wait for that kernel, arch::wait_grid_dependencies, before reading its
// results).
template <class... KernelArgs, class... Args>
cudaError_t launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                          bool programmatic, Args&&... args) {
  cudaLaunchAttribute pdl;
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &pdl;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace fa3::hopper::detail
