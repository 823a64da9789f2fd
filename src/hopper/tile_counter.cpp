#include "hopper/tile_counter.h"

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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

// Counters kept for streams, by (device, stream id).
class KeptCounters {
 public:
  // The stream's counter; nullptr when the stream has none and the table is full. A
  // counter made here is zeroed on `stream`, ahead of any launch that uses it.
  Status find_or_make(int device, cudaStream_t stream, int** counter) {
    *counter = nullptr;
    unsigned long long id = 0;
    cudaError_t err = cudaStreamGetId(stream, &id);
    if (err != cudaSuccess) return cuda_error(err, "cudaStreamGetId");
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto key = std::make_pair(device, id);
    if (const auto it = counters_.find(key); it != counters_.end()) {
      *counter = it->second;
      return Status::ok();
    }
    if (counters_.size() >= kMaxKeptCounters) return Status::ok();
    int* made = nullptr;
    const Status st = make_zeroed(stream, &made);
    if (!st.is_ok()) return st;
    counters_.emplace(key, made);
    *counter = made;
    return Status::ok();
  }

  // A zeroed int from the device's pool, in `stream` order.
  static Status make_zeroed(cudaStream_t stream, int** counter) {
    cudaMemPool_t pool = nullptr;
    Status st = device_pool(&pool);
    if (!st.is_ok()) return st;
    void* ptr = nullptr;
    cudaError_t err = cudaMallocFromPoolAsync(&ptr, sizeof(int), pool, stream);
    if (err != cudaSuccess) return cuda_error(err, "cudaMallocFromPoolAsync (tile counter)");
    err = cudaMemsetAsync(ptr, 0, sizeof(int), stream);
    if (err != cudaSuccess) {
      cudaFreeAsync(ptr, stream);
      return cuda_error(err, "cudaMemsetAsync (tile counter)");
    }
    *counter = static_cast<int*>(ptr);
    return Status::ok();
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, unsigned long long>, int*> counters_;
};

KeptCounters& kept_counters() {
  // Never destroyed: a launch from another static object's destructor may still need it.
  static KeptCounters* kept = new KeptCounters;
  return *kept;
}

}  // namespace

Status acquire_tile_counter(cudaStream_t stream, TileCounter* counter) {
  *counter = TileCounter{};
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return cuda_error(err, "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    // Graph memory nodes: cudaMallocAsync is what stream capture turns into one.
    void* ptr = nullptr;
    err = cudaMallocAsync(&ptr, sizeof(int), stream);
    if (err != cudaSuccess) return cuda_error(err, "cudaMallocAsync (captured tile counter)");
    err = cudaMemsetAsync(ptr, 0, sizeof(int), stream);
    if (err != cudaSuccess) {
      cudaFreeAsync(ptr, stream);
      return cuda_error(err, "cudaMemsetAsync (captured tile counter)");
    }
    counter->ptr = static_cast<int*>(ptr);
    counter->per_launch = true;
    return Status::ok();
  }
  int device = 0;
  err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_error(err, "cudaGetDevice");
  Status st = kept_counters().find_or_make(device, stream, &counter->ptr);
  if (!st.is_ok() || counter->ptr != nullptr) return st;
  counter->per_launch = true;
  return KeptCounters::make_zeroed(stream, &counter->ptr);
}

Status release_tile_counter(const TileCounter& counter, cudaStream_t stream) {
  if (!counter.per_launch) return Status::ok();
  const cudaError_t err = cudaFreeAsync(counter.ptr, stream);
  return err == cudaSuccess ? Status::ok() : cuda_error(err, "cudaFreeAsync (tile counter)");
}

}  // namespace fa3::hopper
