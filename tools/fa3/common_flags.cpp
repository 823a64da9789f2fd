#include "common_flags.h"

#include <string>

#include "errors.h"

namespace fa3::cli {
namespace {

// Iteration counts beyond this are typos; a million calls of the smallest shape
// already take minutes.
constexpr std::int64_t kMaxIters = 1'000'000;
constexpr std::int64_t kMaxThreads = 4096;
// What --flush-l2 overwrites: 256 MiB, several times a Hopper GPU's L2 (50-60 MB), as the
// L2 flush of bench/bench_attention.py and Triton's do_bench.
constexpr std::size_t kFlushBytes = std::size_t{256} << 20;

}  // namespace

Flag size_flag(const char* name, std::int64_t* dst) {
  return {name, true, [name, dst](const std::string& v) { *dst = parse_int(name, v, 1, kMaxSize); }};
}

Flag size_flag(const char* name, std::optional<std::int64_t>* dst) {
  return {name, true, [name, dst](const std::string& v) { *dst = parse_int(name, v, 1, kMaxSize); }};
}

TimingConfig ExecutionOptions::timing(const TimingConfig& defaults) const {
  TimingConfig t = defaults;
  if (warmup) t.warmup = *warmup;
  if (iters) t.iters = *iters;
  if (flush_l2) t.flush_bytes = kFlushBytes;
  return t;
}

std::vector<Flag> execution_flags(ExecutionOptions* o) {
  return {
      {"dtype", true, [o](const std::string& v) { o->dtype = parse_dtype("dtype", v); }},
      {"device", true, [o](const std::string& v) { o->device = parse_device("device", v); }},
      {"warmup", true, [o](const std::string& v) { o->warmup = static_cast<int>(parse_int("warmup", v, 0, kMaxIters)); }},
      {"iters", true, [o](const std::string& v) { o->iters = static_cast<int>(parse_int("iters", v, 1, kMaxIters)); }},
      {"threads", true,
       [o](const std::string& v) { o->threads = static_cast<int>(parse_int("threads", v, 0, kMaxThreads)); }},
      {"seed", true,
       [o](const std::string& v) {
         o->seed = static_cast<std::uint64_t>(parse_int("seed", v, 0, std::numeric_limits<std::int64_t>::max()));
       }},
      {"kernel", true,
       [o](const std::string& v) {
         if (v.empty()) throw UsageError("--kernel needs a kernel name, such as 128x128");
         o->kernel = v;
       }},
      {"flush-l2", false, [o](const std::string&) { o->flush_l2 = true; }},
  };
}

void check_execution(const ExecutionOptions& o) {
  if (o.dtype == DType::kFloat32 && o.device == DeviceChoice::kGpu) {
    throw UsageError("--dtype fp32 runs on the CPU only (use --device cpu or auto)");
  }
  if (!o.kernel.empty() && o.device == DeviceChoice::kCpu) {
    throw UsageError("--kernel names a GPU kernel; it cannot be used with --device cpu");
  }
  if (o.flush_l2 && o.device == DeviceChoice::kCpu) {
    throw UsageError("--flush-l2 flushes the GPU's L2 cache; it cannot be used with --device cpu");
  }
}

std::vector<Flag> pass_flags(PassOptions* o) {
  return {
      {"backward", false, [o](const std::string&) { o->backward = true; }},
      {"deterministic", false, [o](const std::string&) { o->deterministic = true; }},
  };
}

void check_pass(const PassOptions& o, DType dtype) {
  if (o.deterministic && !o.backward) {
    throw UsageError("--deterministic applies to the backward pass; add --backward");
  }
  if (o.backward && dtype == DType::kFloat8E4M3) {
    throw UsageError("--dtype e4m3 runs the forward pass only (FP8 has no backward); drop --backward");
  }
}

}  // namespace fa3::cli
