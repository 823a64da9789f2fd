// fa3::tune_forward: every candidate kernel timed on the caller's problem, the fastest
// stored in the tuning cache.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "api/device_cache.h"
#include "api/tune_class.h"
#include "api/tune_key.h"
#include "api/tuned_kernels.h"
#include "api/validate.h"
#include "common/status_macros.h"
#include "fa3/kernels.h"
#include "fa3/tune.h"
#include "hopper/fwd_dispatch.h"

namespace fa3 {
namespace {

// More calls than this are a typo: a million calls of the smallest problem take minutes.
constexpr int kMaxCalls = 1'000'000;

Status check_options(const TuneOptions& o) {
  if (o.warmup < 0 || o.warmup > kMaxCalls) {
    return {StatusCode::kInvalidArgument,
            "options.warmup must be from 0 to " + std::to_string(kMaxCalls) + ", got " + std::to_string(o.warmup)};
  }
  if (o.iters < 1 || o.iters > kMaxCalls) {
    return {StatusCode::kInvalidArgument,
            "options.iters must be from 1 to " + std::to_string(kMaxCalls) + ", got " + std::to_string(o.iters)};
  }
  return Status::ok();
}

// The current device, when the kernels can run on it.
Status hopper_device(const DeviceInfo** device) {
  const Status status = current_device_cached(device);
  if (!status.is_ok()) {
    return {StatusCode::kNotSupported,
            "fa3::tune_forward times the GPU kernels and needs a Hopper GPU: " + status.message()};
  }
  const DeviceInfo& d = **device;
  if (!d.is_hopper()) {
    return {StatusCode::kNotSupported, "fa3::tune_forward needs a Hopper GPU (compute capability 9.0); device " +
                                           std::to_string(d.index) + " (" + d.name + ") is " +
                                           std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)};
  }
  return Status::ok();
}

Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::ok();
  cudaGetLastError();
  return {StatusCode::kCudaError, std::string(what) + ": " + cudaGetErrorString(err)};
}

// CUDA events, destroyed with the pool.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  Status create(std::size_t count, std::vector<cudaEvent_t>* events) {
    events->clear();
    for (std::size_t i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      FA3_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "cudaEventCreate"));
      events_.push_back(e);
      events->push_back(e);
    }
    return Status::ok();
  }

 private:
  std::vector<cudaEvent_t> events_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median milliseconds of each kernel. The kernels take turns, call by call, so that a
// clock that drifts (power capping, heat) weighs on all of them alike; events around
// each call are read after one synchronisation, so calls run back to back as a user's.
Status time_kernels(const ForwardArgs& args, const std::vector<std::string>& kernels, const TuneOptions& o,
                    cudaStream_t stream, std::vector<double>* median_ms) {
  for (int i = 0; i < o.warmup; ++i) {
    for (const std::string& k : kernels) FA3_RETURN_IF_ERROR(forward_with_kernel(args, k, stream));
  }
  const std::size_t n = kernels.size();
  const std::size_t calls = n * static_cast<std::size_t>(o.iters);
  EventPool pool;
  std::vector<cudaEvent_t> start, stop;
  FA3_RETURN_IF_ERROR(pool.create(calls, &start));
  FA3_RETURN_IF_ERROR(pool.create(calls, &stop));
  for (std::size_t c = 0; c < calls; ++c) {
    FA3_RETURN_IF_ERROR(cuda_status(cudaEventRecord(start[c], stream), "cudaEventRecord"));
    FA3_RETURN_IF_ERROR(forward_with_kernel(args, kernels[c % n], stream));
    FA3_RETURN_IF_ERROR(cuda_status(cudaEventRecord(stop[c], stream), "cudaEventRecord"));
  }
  FA3_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize after the timed calls"));
  std::vector<std::vector<double>> times(n);
  for (std::size_t c = 0; c < calls; ++c) {
    float ms = 0;
    FA3_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms, start[c], stop[c]), "cudaEventElapsedTime"));
    times[c % n].push_back(ms);
  }
  median_ms->clear();
  for (const std::vector<double>& t : times) median_ms->push_back(median(t));
  return Status::ok();
}

}  // namespace

Status tune_forward(const ForwardArgs& args, cudaStream_t stream, TuneResult* result, const TuneOptions& options) {
  FA3_RETURN_IF_ERROR(check_options(options));
  const DeviceInfo* device = nullptr;
  FA3_RETURN_IF_ERROR(hopper_device(&device));
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, gpu_target(), &problem));

  TuneResult r;
  r.cls = tune_class_of(problem, args.q.dtype);
  for (const hopper::FwdKernelEntry* k : hopper::fwd_candidates(problem, args.q.dtype, args.out.dtype)) r.kernels.push_back(k->name());
  if (r.kernels.empty()) {
    return {StatusCode::kNotSupported, "no forward kernel was built for " + r.cls.describe()};
  }
  FA3_RETURN_IF_ERROR(time_kernels(args, r.kernels, options, stream, &r.median_ms));

  // Strictly faster only: a tie goes to the earlier kernel, the built-in choice first.
  std::size_t best = 0;
  for (std::size_t i = 1; i < r.kernels.size(); ++i) {
    if (r.median_ms[i] < r.median_ms[best]) best = i;
  }
  r.entry.cls = r.cls;
  r.entry.kernel = r.kernels[best];
  r.entry.kernel_ms = r.median_ms[best];
  r.entry.heuristic = r.kernels.front();
  r.entry.heuristic_ms = r.median_ms.front();

  Status stored = Status::ok();
  if (options.store) {
    const TuneKey key = tune_key_of(*device);
    const std::string path = tune_cache_path(key);
    stored = write_tune_cache(path, key, {r.entry});
    if (stored.is_ok()) {
      process_tuned_kernels().remember(*device, r.entry);
      r.cache_path = path;
    }
  }
  *result = std::move(r);
  return stored;
}

}  // namespace fa3
