// fa3 program — the flags `fa3 run` and `fa3 bench` share: sizes, the pass, and what
// runs where, how it is timed, and the seed of the inputs.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fa3/tensor.h"
#include "flags.h"
#include "timing.h"

namespace fa3::cli {

// The library takes sizes up to int32; anything larger is a typo, not a request.
constexpr std::int64_t kMaxSize = std::numeric_limits<std::int32_t>::max();

// --NAME N: a size in [1, kMaxSize].
Flag size_flag(const char* name, std::int64_t* dst);
Flag size_flag(const char* name, std::optional<std::int64_t>* dst);

struct ExecutionOptions {
  DType dtype = DType::kBFloat16;
  DeviceChoice device = DeviceChoice::kAuto;
  std::optional<int> warmup;  // unset: the path's default
  std::optional<int> iters;   // unset: the path's default
  int threads = 0;            // CPU path; 0: one per hardware thread
  std::uint64_t seed = 0;
  std::string kernel;  // GPU forward kernel by name; empty: the library's choice
  bool flush_l2 = false;  // GPU: a cold L2 before each timed call (TimingConfig::flush_bytes)

  // `defaults` (the path's) with --warmup, --iters and --flush-l2 applied.
  TimingConfig timing(const TimingConfig& defaults) const;
};

// --dtype, --device, --warmup, --iters, --threads, --seed, --kernel, --flush-l2.
std::vector<Flag> execution_flags(ExecutionOptions* options);

// Rules between those flags (fp32 has no GPU kernels); throws UsageError.
void check_execution(const ExecutionOptions& options);

struct PassOptions {
  bool backward = false;       // the forward runs untimed, then the backward is timed
  bool deterministic = false;  // BackwardArgs::deterministic; only with backward
};

// --backward, --deterministic.
std::vector<Flag> pass_flags(PassOptions* options);

// --deterministic needs --backward; throws UsageError.
// Also refuses --backward with e4m3 inputs (the FP8 path is forward only).
void check_pass(const PassOptions& options, DType dtype);

}  // namespace fa3::cli
