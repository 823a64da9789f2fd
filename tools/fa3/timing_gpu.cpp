#include <utility>
#include <vector>

#include "cuda_resources.h"
#include "fa3/kernels.h"
#include "timing.h"

namespace fa3::cli {

Status time_device_calls(const std::function<Status(cudaStream_t)>& call, const TimingConfig& config,
                         Timing* timing) {
  CudaStream stream;
  for (int i = 0; i < config.warmup; ++i) {
    Status s = call(stream.get());
    if (!s.is_ok()) return s;
  }
  // One event pair per call, read after a single synchronisation: no host round trip
  // between calls, so back-to-back launches are timed as a user would issue them. With
  // a flush, a write of the whole buffer comes between each call and the one before,
  // as bench/bench_attention.py and FlashAttention's benchmarks time.
  const DeviceBuffer flush = config.flush_bytes > 0 ? DeviceBuffer(config.flush_bytes) : DeviceBuffer();
  std::vector<CudaEvent> start(static_cast<std::size_t>(config.iters));
  std::vector<CudaEvent> stop(static_cast<std::size_t>(config.iters));
  for (int i = 0; i < config.iters; ++i) {
    if (flush.bytes() > 0) {
      cuda_check(cudaMemsetAsync(flush.get(), i & 0xff, flush.bytes(), stream.get()), "cudaMemsetAsync (L2 flush)");
    }
    cuda_check(cudaEventRecord(start[i].get(), stream.get()), "cudaEventRecord");
    Status s = call(stream.get());
    if (!s.is_ok()) return s;
    cuda_check(cudaEventRecord(stop[i].get(), stream.get()), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize after the timed calls");
  std::vector<double> times;
  for (int i = 0; i < config.iters; ++i) {
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start[i].get(), stop[i].get()), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  *timing = summarize(std::move(times));
  return Status::ok();
}

Status run_device_once(const std::function<Status(cudaStream_t)>& call) {
  CudaStream stream;
  Status s = call(stream.get());
  if (s.is_ok()) cuda_check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize after an untimed call");
  return s;
}

Status gpu_forward(const ForwardArgs& args, const std::string& kernel, cudaStream_t stream) {
  return kernel.empty() ? forward(args, stream) : forward_with_kernel(args, kernel, stream);
}

Status time_gpu_forward(const ForwardArgs& args, const std::string& kernel, const TimingConfig& config,
                        Timing* timing) {
  return time_device_calls([&](cudaStream_t s) { return gpu_forward(args, kernel, s); }, config, timing);
}

Status time_gpu_backward(const BackwardArgs& args, const TimingConfig& config, Timing* timing) {
  return time_device_calls([&](cudaStream_t s) { return backward(args, s); }, config, timing);
}

}  // namespace fa3::cli
