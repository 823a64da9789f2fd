#include <utility>
#include <vector>

#include "cuda_resources.h"
#include "fa3/kernels.h"
#include "timing.h"

namespace fa3::cli {

Status time_gpu_forward(const ForwardArgs& args, const std::string& kernel, const TimingConfig& config,
                        Timing* timing) {
  CudaStream stream;
  auto call = [&] { return kernel.empty() ? forward(args, stream.get()) : forward_with_kernel(args, kernel, stream.get()); };
  for (int i = 0; i < config.warmup; ++i) {
    Status s = call();
    if (!s.is_ok()) return s;
  }
  // One event pair per call, read after a single synchronisation: no host round trip
  // between calls, so back-to-back launches are timed as a user would issue them.
  std::vector<CudaEvent> start(static_cast<std::size_t>(config.iters));
  std::vector<CudaEvent> stop(static_cast<std::size_t>(config.iters));
  for (int i = 0; i < config.iters; ++i) {
    cuda_check(cudaEventRecord(start[i].get(), stream.get()), "cudaEventRecord");
    Status s = call();
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

}  // namespace fa3::cli
