// fa3 program — timing a forward pass: untimed warm-up calls, then the median of the
// timed ones (the median shrugs off a stray slow call).
#pragma once

#include <string>
#include <vector>

#include "fa3/attention.h"
#include "fa3/cpu.h"

namespace fa3::cli {

struct TimingConfig {
  int warmup = 1;
  int iters = 3;
};

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  int iters = 0;
};

// Summary of per-call times in milliseconds (at least one).
Timing summarize(std::vector<double> times_ms);

// fa3::cpu::forward timed with std::chrono. The first failing call's Status is
// returned; `timing` is filled only on success.
Status time_cpu_forward(const ForwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                        Timing* timing);

// fa3::forward on a stream of its own, timed with CUDA events around each call;
// `args` must point at device memory; a non-empty `kernel` forces that forward
// kernel. Throws RunError on a CUDA failure.
Status time_gpu_forward(const ForwardArgs& args, const std::string& kernel, const TimingConfig& config,
                        Timing* timing);

}  // namespace fa3::cli
