// fa3 program — timing a pass: untimed warm-up calls, then the median of the timed ones
// (the median shrugs off a stray slow call).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "fa3/attention.h"
#include "fa3/cpu.h"

namespace fa3::cli {

struct TimingConfig {
  int warmup = 1;
  int iters = 3;
  // GPU: bytes of a buffer overwritten before each timed call (outside its events), so
  // that every call starts with nothing of its own in the L2; 0: calls back to back.
  std::size_t flush_bytes = 0;
};

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int iters = 0;
};

// Summary of per-call times in milliseconds (at least one).
Timing summarize(std::vector<double> times_ms);

// `call` timed with std::chrono. The first failing call's Status is returned;
// `timing` is filled only on success.
Status time_host_calls(const std::function<Status()>& call, const TimingConfig& config, Timing* timing);

// `call` enqueued on a stream of its own, timed with CUDA events around each call
// (each after a flush of config.flush_bytes when set). Throws RunError on a CUDA failure.
Status time_device_calls(const std::function<Status(cudaStream_t)>& call, const TimingConfig& config,
                         Timing* timing);

// `call` once on a stream of its own, waited for: an untimed pass, such as the forward
// whose out and lse a timed backward reads. Throws RunError on a CUDA failure.
Status run_device_once(const std::function<Status(cudaStream_t)>& call);

// fa3::forward, or the forward kernel named `kernel` when it is not empty.
Status gpu_forward(const ForwardArgs& args, const std::string& kernel, cudaStream_t stream);

// fa3::cpu::forward / fa3::cpu::backward, timed.
Status time_cpu_forward(const ForwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                        Timing* timing);
Status time_cpu_backward(const BackwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                         Timing* timing);

// gpu_forward / fa3::backward, timed; `args` point at device memory, and the backward's
// carry its workspace.
Status time_gpu_forward(const ForwardArgs& args, const std::string& kernel, const TimingConfig& config,
                        Timing* timing);
Status time_gpu_backward(const BackwardArgs& args, const TimingConfig& config, Timing* timing);

}  // namespace fa3::cli
