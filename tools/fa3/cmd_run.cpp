#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "api/validate.h"
#include "commands.h"
#include "common_flags.h"
#include "device_choice.h"
#include "device_tensors.h"
#include "errors.h"
#include "fa3/kernels.h"
#include "flags.h"
#include "format.h"
#include "host_tensors.h"
#include "row_check.h"
#include "run_config.h"
#include "run_report.h"
#include "shape.h"
#include "timing.h"

namespace fa3::cli {
namespace {

// Sampling more rows than this is a typo: 16 already cover every batch and head of
// ordinary shapes, and small problems are checked whole.
constexpr std::int64_t kMaxCheckRows = 1'000'000;

// --sinks gives one value for every head, or one per head.
std::vector<float> per_head_sinks(const std::vector<double>& values, std::int64_t nheads) {
  if (values.size() != 1 && static_cast<std::int64_t>(values.size()) != nheads) {
    throw UsageError("--sinks: " + std::to_string(values.size()) + " values for " + std::to_string(nheads) +
                     " heads; give one value, or one per head (--nheads values)");
  }
  std::vector<float> sinks(static_cast<std::size_t>(nheads));
  for (std::size_t h = 0; h < sinks.size(); ++h) sinks[h] = static_cast<float>(values[values.size() == 1 ? 0 : h]);
  return sinks;
}

}  // namespace

RunConfig parse_run(const std::vector<std::string>& args) {
  RunConfig c;
  AttentionShape& s = c.shape;
  std::int64_t seqlen = s.seqlen_q;
  std::optional<std::int64_t> seqlen_q, seqlen_k, nheads_kv, head_dim_v;
  std::vector<double> sinks;
  std::vector<Flag> flags = {
      size_flag("batch", &s.batch),
      size_flag("seqlen", &seqlen),
      size_flag("seqlen-q", &seqlen_q),
      size_flag("seqlen-k", &seqlen_k),
      size_flag("nheads", &s.nheads_q),
      size_flag("nheads-kv", &nheads_kv),
      size_flag("head-dim", &s.head_dim),
      size_flag("head-dim-v", &head_dim_v),
      {"causal", false, [&](const std::string&) { s.options.causal = true; }},
      {"window", true,
       [&](const std::string& v) {
         auto [left, right] = parse_window("window", v);
         s.options.window_left = left;
         s.options.window_right = right;
       }},
      {"softcap", true,
       [&](const std::string& v) { s.options.softcap = static_cast<float>(parse_nonnegative("softcap", v)); }},
      {"chunk", true,
       [&](const std::string& v) {
         s.options.attention_chunk = static_cast<int>(parse_int("chunk", v, 1, INT32_MAX));
       }},
      {"scale", true,
       [&](const std::string& v) { s.options.softmax_scale = static_cast<float>(parse_nonnegative("scale", v)); }},
      {"sinks", true, [&](const std::string& v) { sinks = parse_number_list("sinks", v); }},
      {"check-rows", true, [&](const std::string& v) { c.check_rows = parse_int("check-rows", v, 0, kMaxCheckRows); }},
  };
  for (Flag& f : execution_flags(&c.exec)) flags.push_back(std::move(f));
  for (Flag& f : pass_flags(&c.pass)) flags.push_back(std::move(f));
  apply_flags(args, flags);

  // --seqlen-q/--seqlen-k win over --seqlen wherever they stand on the line.
  s.seqlen_q = seqlen_q.value_or(seqlen);
  s.seqlen_k = seqlen_k.value_or(seqlen);
  s.nheads_kv = nheads_kv.value_or(s.nheads_q);
  s.head_dim_v = head_dim_v.value_or(s.head_dim);
  s.dtype = c.exec.dtype;
  if (!sinks.empty()) s.sinks = per_head_sinks(sinks, s.nheads_q);

  check_execution(c.exec);
  check_pass(c.pass, c.exec.dtype);
  if (s.nheads_q % s.nheads_kv != 0) {
    throw UsageError("--nheads-kv " + std::to_string(s.nheads_kv) + " must divide --nheads " +
                     std::to_string(s.nheads_q));
  }
  if (s.options.causal && s.options.window_right > 0) {
    throw UsageError("--window right side " + std::to_string(s.options.window_right) +
                     " conflicts with --causal (causal means right side 0)");
  }
  return c;
}

int run_forward(const RunConfig& config) {
  const AttentionShape& shape = config.shape;
  const PathChoice path = choose_path(config.exec.device, shape.dtype);
  const TimingConfig timing = config.exec.timing(path.path == Path::kGpu ? kGpuTiming : kCpuTiming);

  TensorCapacity capacity;
  capacity.grow_to(shape);
  HostTensors host(capacity, shape.dtype, config.exec.seed, shape.sinks);
  const ForwardArgs host_args = forward_args(shape, host.pointers());

  Timing t;
  std::string kernel;  // the GPU kernel that ran
  if (path.path == Path::kGpu) {
    const DeviceTensors device(host);
    DeviceBuffer workspace;
    const ForwardArgs device_args = with_forward_workspace(forward_args(shape, device.pointers()), workspace);
    std::vector<std::string> kernels;
    throw_if_error(forward_kernels(device_args, &kernels));
    kernel = config.exec.kernel.empty() ? kernels.front() : config.exec.kernel;
    throw_if_error(time_gpu_forward(device_args, config.exec.kernel, timing, &t));
    device.download_outputs(host);
  } else {
    cpu::Options options;
    options.num_threads = config.exec.threads;
    throw_if_error(time_cpu_forward(host_args, options, timing, &t));
  }

  // The call was accepted, so the CPU rules (a superset of the GPU's) accept it too.
  Problem problem;
  throw_if_error(validate_forward(host_args, cpu_target(), &problem));
  const RowCheck check = check_rows(problem, host_args, sample_rows(problem, config.check_rows, config.exec.seed));

  std::printf("fa3 run\n");
  report("path", describe(path, false));
  report("problem", shape.describe());
  if (!kernel.empty()) report("kernel", kernel);
  report("time", timing_summary(t, timing));
  report("speed", speed_summary(problem.forward_flops(), t));
  report("check", forward_summary(check));
  report("result", check.passed ? "PASS" : "FAIL: " + join(forward_failures(check)));
  return check.passed ? kExitOk : kExitCheckFailed;
}

int run_command(const std::vector<std::string>& args) {
  const RunConfig config = parse_run(args);
  return config.pass.backward ? run_backward(config) : run_forward(config);
}

}  // namespace fa3::cli
