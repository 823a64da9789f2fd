// fa3 — the GPU kernel of fp8::quantize (fa3/fp8.h).
#pragma once

#include <cuda_runtime_api.h>

#include "fa3/fp8.h"

namespace fa3::hopper {

// Enqueues the one kernel for validated `args` (api/fp8.cpp); returns the launch's error.
cudaError_t launch_fp8_quantize(const fp8::QuantizeArgs& args, cudaStream_t stream);

}  // namespace fa3::hopper
