#include <cuda_runtime_api.h>

#include <array>
#include <mutex>
#include <string>

#include "api/device_cache.h"
#include "fa3/device.h"

namespace fa3 {

DeviceInfo current_device() {
  DeviceInfo info;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    info.error = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    cudaGetLastError();  // a failed query must not leak into the caller's error state
    return info;
  }
  int dev = 0;
  cudaDeviceProp prop{};
  if ((err = cudaGetDevice(&dev)) != cudaSuccess || (err = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
    info.error = cudaGetErrorString(err);
    cudaGetLastError();
    return info;
  }
  info.present = true;
  info.index = dev;
  info.name = prop.name;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.global_memory_bytes = static_cast<long long>(prop.totalGlobalMem);
  info.l2_bytes = prop.l2CacheSize;
  info.max_smem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  return info;
}

Status current_device_cached(const DeviceInfo** info) {
  // cudaGetDeviceProperties costs far more than a launch: ask once per device.
  static constexpr int kMaxDevices = 64;
  static std::array<DeviceInfo, kMaxDevices> cache;
  static std::array<std::once_flag, kMaxDevices> once;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return {StatusCode::kCudaError, std::string("no usable CUDA device: ") + cudaGetErrorString(err)};
  }
  if (dev < 0 || dev >= kMaxDevices) return {StatusCode::kInternal, "CUDA device index out of range"};
  std::call_once(once[dev], [dev] { cache[dev] = current_device(); });
  if (!cache[dev].present) return {StatusCode::kCudaError, "CUDA device query failed: " + cache[dev].error};
  *info = &cache[dev];
  return Status::ok();
}

}  // namespace fa3
