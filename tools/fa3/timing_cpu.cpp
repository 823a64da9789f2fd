#include <algorithm>
#include <chrono>
#include <utility>

#include "timing.h"

namespace fa3::cli {

Timing summarize(std::vector<double> times_ms) {
  std::sort(times_ms.begin(), times_ms.end());
  const std::size_t n = times_ms.size();
  Timing t;
  t.iters = static_cast<int>(n);
  t.min_ms = times_ms.front();
  t.median_ms = n % 2 ? times_ms[n / 2] : 0.5 * (times_ms[n / 2 - 1] + times_ms[n / 2]);
  return t;
}

Status time_host_calls(const std::function<Status()>& call, const TimingConfig& config, Timing* timing) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < config.warmup; ++i) {
    Status s = call();
    if (!s.is_ok()) return s;
  }
  std::vector<double> times;
  for (int i = 0; i < config.iters; ++i) {
    const auto start = Clock::now();
    Status s = call();
    const auto stop = Clock::now();
    if (!s.is_ok()) return s;
    times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  *timing = summarize(std::move(times));
  return Status::ok();
}

Status time_cpu_forward(const ForwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                        Timing* timing) {
  return time_host_calls([&] { return cpu::forward(args, options); }, config, timing);
}

Status time_cpu_backward(const BackwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                         Timing* timing) {
  return time_host_calls([&] { return cpu::backward(args, options); }, config, timing);
}

}  // namespace fa3::cli
