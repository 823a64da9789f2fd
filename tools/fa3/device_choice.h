// fa3 program — which path runs: fa3::forward / fa3::backward on a Hopper GPU, or
// fa3::cpu::forward / fa3::cpu::backward.
#pragma once

#include <string>

#include "fa3/device.h"
#include "fa3/tensor.h"
#include "flags.h"

namespace fa3::cli {

enum class Path { kGpu, kCpu };

struct PathChoice {
  Path path = Path::kCpu;
  DeviceInfo device;  // the current CUDA device (present == false without one)
  std::string why;    // why this path: "requested", or why auto did not pick the GPU
};

// "" when fa3::forward can run on `device` with this build, else the reason it cannot.
std::string gpu_unusable_reason(const DeviceInfo& device);

// auto picks the GPU when it is usable and the dtype has GPU kernels (fp32 never does).
// Throws RunError when --device gpu was asked for and the GPU is not usable.
PathChoice choose_path(DeviceChoice choice, DType dtype);

// "gpu, fa3::forward on NVIDIA H200 (device 0)" or "cpu, fa3::cpu::backward (no CUDA
// device: ...)": the entry point of the pass that is timed, and where it runs.
std::string describe(const PathChoice& choice, bool backward);

}  // namespace fa3::cli
