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

Status time_cpu_forward(const ForwardArgs& args, const cpu::Options& options, const TimingConfig& config,
                        Timing* timing) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < config.warmup; ++i) {
    Status s = cpu::forward(args, options);
    if (!s.is_ok()) return s;
  }
  std::vector<double> times;
  for (int i = 0; i < config.iters; ++i) {
    const auto start = Clock::now();
    Status s = cpu::forward(args, options);
    const auto stop = Clock::now();
    if (!s.is_ok()) return s;
    times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  *timing = summarize(std::move(times));
  return Status::ok();
}

}  // namespace fa3::cli
