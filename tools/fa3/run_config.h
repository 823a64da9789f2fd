// fa3 program — what `fa3 run` was asked to do, and its two flows: a forward pass, or
// a forward pass (untimed) followed by the timed backward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common_flags.h"
#include "shape.h"
#include "timing.h"

namespace fa3::cli {

// A GPU call takes microseconds to milliseconds, a CPU call up to seconds.
constexpr TimingConfig kGpuTiming{.warmup = 5, .iters = 20};
constexpr TimingConfig kCpuTiming{.warmup = 1, .iters = 3};
// The CPU backward is the exact fp64 reference, single-threaded and about ten times
// slower than the CPU forward: one timed call is all a check needs.
constexpr TimingConfig kCpuBackwardTiming{.warmup = 0, .iters = 1};

struct RunConfig {
  AttentionShape shape;  // defaults: batch 1, seqlen 512, 8 heads, head dim 128, bf16
  ExecutionOptions exec;
  PassOptions pass;
  std::int64_t check_rows = 16;
};

// Throws UsageError for a bad command line (cmd_run.cpp).
RunConfig parse_run(const std::vector<std::string>& args);

// Each prints its report and returns the exit status.
int run_forward(const RunConfig& config);   // cmd_run.cpp
int run_backward(const RunConfig& config);  // run_backward.cpp

}  // namespace fa3::cli
