#include "api/tune_key.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <string>

namespace fa3 {
namespace {

// cudaDriverGetVersion's 1000 * major + 10 * minor as "13.0".
std::string driver_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// The driver's CUDA version; 0 when no driver is installed (as the runtime reports it).
int cuda_driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not leak into the caller's error state
    return 0;
  }
  return version;
}

// Letters, digits and dots kept, every other run of characters one '-': a file name that
// needs no quoting ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3").
std::string file_name_part(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '.';
    if (plain) {
      out += ch;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

std::string TuneKey::describe() const {
  return gpu_name + ", " + std::to_string(sm_count) + " SMs, CUDA driver " + driver_text(cuda_driver) + ", fa3 " +
         fa3_version;
}

TuneKey tune_key_of(const DeviceInfo& device) {
  TuneKey key;
  key.gpu_name = device.name;
  key.sm_count = device.sm_count;
  key.cuda_driver = cuda_driver_version();
  key.fa3_version = build_info().version;
  return key;
}

Status current_tune_key(TuneKey* key) {
  const DeviceInfo device = current_device();
  if (!device.present) {
    return {StatusCode::kNotSupported, "no CUDA device to key a tuning cache by: " + device.error};
  }
  *key = tune_key_of(device);
  return Status::ok();
}

std::string tune_cache_path(const TuneKey& key) {
  const std::string explicit_path = env("FA3_TUNE_CACHE");
  if (!explicit_path.empty()) return explicit_path;
  // The XDG base directory rules: a relative XDG_CACHE_HOME is invalid and ignored.
  std::string dir = env("XDG_CACHE_HOME");
  if (dir.empty() || dir.front() != '/') {
    const std::string home = env("HOME");
    if (home.empty()) return "";
    dir = home + "/.cache";
  }
  return dir + "/fa3/tune-" + file_name_part(key.gpu_name) + "-" + std::to_string(key.sm_count) + "sm-cuda" +
         driver_text(key.cuda_driver) + "-fa3-" + file_name_part(key.fa3_version) + ".txt";
}

}  // namespace fa3
