#include "device_choice.h"

#include <algorithm>

#include "errors.h"

namespace fa3::cli {

std::string gpu_unusable_reason(const DeviceInfo& device) {
  if (!device.present) return "no CUDA device: " + device.error;
  if (!device.is_hopper()) {
    return device.name + " has compute capability " + std::to_string(device.cc_major) + "." +
           std::to_string(device.cc_minor) + "; the kernels need a Hopper GPU (9.0)";
  }
  if (!build_info().gpu_kernels) return "this build of fa3 has no GPU kernels";
  return "";
}

PathChoice choose_path(DeviceChoice choice, DType dtype) {
  PathChoice c;
  if (choice == DeviceChoice::kCpu) {
    c.why = "requested";
    return c;
  }
  c.device = current_device();
  const std::string unusable = gpu_unusable_reason(c.device);
  const std::vector<std::string>& built = build_info().dtypes;
  // e4m3 inputs run on the FP8 kernels, built beside the 16-bit ones (BuildInfo::gpu_fp8).
  const bool dtype_built = dtype == DType::kFloat8E4M3
                               ? build_info().gpu_fp8
                               : std::find(built.begin(), built.end(), dtype_name(dtype)) != built.end();
  if (choice == DeviceChoice::kGpu) {
    if (!unusable.empty()) throw RunError("--device gpu: " + unusable);
    c.path = Path::kGpu;
    c.why = "requested";
  } else if (!unusable.empty()) {
    c.why = unusable;
  } else if (!dtype_built) {
    c.why = std::string("no GPU kernels for ") + dtype_name(dtype);
  } else {
    c.path = Path::kGpu;
    c.why = "Hopper GPU found";
  }
  return c;
}

std::string describe(const PathChoice& c, bool backward) {
  const char* pass = backward ? "backward" : "forward";
  if (c.path == Path::kGpu) {
    return std::string("gpu, fa3::") + pass + " on " + c.device.name + " (device " + std::to_string(c.device.index) +
           ")";
  }
  return std::string("cpu, fa3::cpu::") + pass + " (" + c.why + ")";
}

}  // namespace fa3::cli
