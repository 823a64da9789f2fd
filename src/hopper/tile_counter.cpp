#include "hopper/tile_counter.h"

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>

namespace fa3::hopper {
namespace {

Status cuda_error(cudaError_t err, const char* what) {
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// The pool of the current device, made on first use. It keeps what it reserved (a
// release threshold of "never"), so that counters cost no driver call after warm-up.
Status device_pool(cudaMemPool_t* pool) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_error(err, "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t made = nullptr;
    err = cudaMemPoolCreate(&made, &props);
    if (err != cudaSuccess) return cuda_error(err, "cudaMemPoolCreate (tile counters)");
    std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
    err = cudaMemPoolSetAttribute(made, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) return cuda_error(err, "cudaMemPoolSetAttribute (tile counters)");
    it = pools.emplace(device, made).first;
  }
  *pool = it->second;
  return Status::ok();
}

}  // namespace

Status acquire_tile_counter(cudaStream_t stream, int** counter) {
  *counter = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return cuda_error(err, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return Status::ok();
  cudaMemPool_t pool = nullptr;
  Status st = device_pool(&pool);
  if (!st.is_ok()) return st;
  void* ptr = nullptr;
  err = cudaMallocFromPoolAsync(&ptr, sizeof(int), pool, stream);
  if (err != cudaSuccess) return cuda_error(err, "cudaMallocFromPoolAsync (tile counter)");
  err = cudaMemsetAsync(ptr, 0, sizeof(int), stream);
  if (err != cudaSuccess) {
    cudaFreeAsync(ptr, stream);
    return cuda_error(err, "cudaMemsetAsync (tile counter)");
  }
  *counter = static_cast<int*>(ptr);
  return Status::ok();
}

Status release_tile_counter(int* counter, cudaStream_t stream) {
  if (counter == nullptr) return Status::ok();
  const cudaError_t err = cudaFreeAsync(counter, stream);
  return err == cudaSuccess ? Status::ok() : cuda_error(err, "cudaFreeAsync (tile counter)");
}

}  // namespace fa3::hopper
