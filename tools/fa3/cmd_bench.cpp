#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "api/validate.h"
#include "bench_output.h"
#include "commands.h"
#include "common_flags.h"
#include "cuda_resources.h"
#include "device_choice.h"
#include "device_tensors.h"
#include "errors.h"
#include "fa3/device.h"
#include "flags.h"
#include "format.h"
#include "host_tensors.h"
#include "shape.h"
#include "timing.h"

namespace fa3::cli {
namespace {

// What a sweep covers when the command line does not say.
struct SweepDefaults {
  std::vector<std::int64_t> head_dims;
  std::vector<std::int64_t> seqlens;
  std::int64_t tokens;
  std::int64_t hidden;
  TimingConfig timing;
};

// The FlashAttention-3 paper's sweep, which ANCHORS.md records for the peers.
const SweepDefaults kGpuSweep{{64, 128, 256}, {512, 1024, 2048, 4096, 8192, 16384}, 16384, 2048, {5, 20}};
// About 6 GFLOP a pass: well under a minute on 2 cores, even for a plain fp32 CPU loop.
const SweepDefaults kCpuSweep{{64, 128}, {128, 256, 512}, 1024, 512, {1, 3}};
// The CPU backward is the exact fp64 reference: a quarter of the forward sweep's work,
// timed once per shape.
const SweepDefaults kCpuBackwardSweep{{64, 128}, {128, 256}, 512, 256, {0, 1}};

struct BenchConfig {
  std::vector<std::int64_t> head_dims;     // empty: the path's default
  std::vector<std::int64_t> seqlens;       // empty: the path's default
  std::optional<std::int64_t> head_dim_v;  // of every shape's v and out; unset: its head dim
  bool causal_only = false;
  bool non_causal_only = false;
  std::optional<std::int64_t> tokens;
  std::optional<std::int64_t> hidden;
  ExecutionOptions exec;
  PassOptions pass;
  std::string json_path;
  std::string csv_path;
};

Flag file_flag(const char* name, std::string* dst) {
  return {name, true, [name, dst](const std::string& v) {
            if (v.empty()) throw UsageError(std::string("--") + name + " needs a file name");
            *dst = v;
          }};
}

BenchConfig parse_bench(const std::vector<std::string>& args) {
  BenchConfig c;
  std::vector<Flag> flags = {
      {"head-dims", true, [&](const std::string& v) { c.head_dims = parse_int_list("head-dims", v, 1, kMaxSize); }},
      size_flag("head-dim-v", &c.head_dim_v),
      {"seqlens", true, [&](const std::string& v) { c.seqlens = parse_int_list("seqlens", v, 1, kMaxSize); }},
      {"causal", false, [&](const std::string&) { c.causal_only = true; }},
      {"non-causal", false, [&](const std::string&) { c.non_causal_only = true; }},
      size_flag("tokens", &c.tokens),
      size_flag("hidden", &c.hidden),
      file_flag("json", &c.json_path),
      file_flag("csv", &c.csv_path),
  };
  for (Flag& f : execution_flags(&c.exec)) flags.push_back(std::move(f));
  for (Flag& f : pass_flags(&c.pass)) flags.push_back(std::move(f));
  apply_flags(args, flags);
  check_execution(c.exec);
  check_pass(c.pass, c.exec.dtype);
  return c;
}

// The default GPU head dims that this build compiled (all of them when none is).
std::vector<std::int64_t> compiled_head_dims(const std::vector<std::int64_t>& wanted) {
  const std::vector<int>& built = build_info().head_dims;
  std::vector<std::int64_t> kept;
  for (std::int64_t d : wanted) {
    if (std::find(built.begin(), built.end(), static_cast<int>(d)) != built.end()) kept.push_back(d);
  }
  if (kept.empty()) kept.assign(built.begin(), built.end());
  return kept;
}

// Shapes in the order of the ANCHORS.md table: head dim, then causal, then seqlen.
std::vector<AttentionShape> sweep_shapes(const BenchConfig& c, const SweepDefaults& defaults, bool gpu) {
  std::vector<std::int64_t> head_dims = c.head_dims;
  if (head_dims.empty()) head_dims = gpu ? compiled_head_dims(defaults.head_dims) : defaults.head_dims;
  const std::vector<std::int64_t>& seqlens = c.seqlens.empty() ? defaults.seqlens : c.seqlens;
  const std::int64_t tokens = c.tokens.value_or(defaults.tokens);
  const std::int64_t hidden = c.hidden.value_or(defaults.hidden);
  std::vector<bool> causal_modes;
  if (!c.causal_only || c.non_causal_only) causal_modes.push_back(false);
  if (c.causal_only || !c.non_causal_only) causal_modes.push_back(true);

  std::vector<AttentionShape> shapes;
  for (std::int64_t d : head_dims) {
    for (bool causal : causal_modes) {
      for (std::int64_t seqlen : seqlens) {
        AttentionShape s;
        s.batch = std::max<std::int64_t>(1, tokens / seqlen);
        s.seqlen_q = s.seqlen_k = seqlen;
        s.nheads_q = s.nheads_kv = std::max<std::int64_t>(1, hidden / d);
        s.head_dim = d;
        s.head_dim_v = c.head_dim_v.value_or(d);
        s.dtype = c.exec.dtype;
        s.options.causal = causal;
        shapes.push_back(s);
      }
    }
  }
  return shapes;
}

// "hdim 128 causal seqlen 2048", or "hdim 192 (v 128) causal seqlen 2048" when the sweep
// asked for a V head dim.
std::string shape_label(std::int64_t hdim, std::int64_t hdim_v, bool causal, std::int64_t seqlen) {
  return "hdim " + std::to_string(hdim) + (hdim_v > 0 ? " (v " + std::to_string(hdim_v) + ")" : "") +
         (causal ? " causal" : " non-causal") + " seqlen " + std::to_string(seqlen);
}

// The record of a shape, its timing still to fill in.
BenchRecord record_for(const AttentionShape& s, const BenchConfig& c, const PathChoice& path) {
  BenchRecord r;
  r.pass = c.pass.backward ? "bwd" : "fwd";
  r.deterministic = c.pass.deterministic;
  r.dtype = dtype_name(s.dtype);
  r.hdim = s.head_dim;
  if (c.head_dim_v) r.hdim_v = s.value_dim();
  r.causal = s.options.causal;
  r.seqlen = s.seqlen_q;
  r.batch = s.batch;
  r.nheads = s.nheads_q;
  r.device = path.path == Path::kGpu ? "gpu" : "cpu";
  r.gpu = path.path == Path::kGpu ? path.device.name : "cpu";
  if (c.exec.flush_l2 && path.path == Path::kGpu) r.timing = "l2-flushed";
  return r;
}

// One set of buffers, sized for the largest shape, serves the whole sweep: each shape
// reads a prefix of the same random inputs. The workspaces too (the backward's, and the
// forward's of e4m3 inputs) are sized for the sweep and allocated once.
class SweepBuffers {
 public:
  SweepBuffers(const std::vector<AttentionShape>& shapes, const BenchConfig& c, bool gpu) {
    TensorCapacity capacity;
    for (const AttentionShape& s : shapes) capacity.grow_to(s);
    host_ = std::make_unique<HostTensors>(capacity, c.exec.dtype, c.exec.seed);
    if (c.pass.backward) grads_ = std::make_unique<HostGradients>(capacity, c.exec.dtype, c.exec.seed);
    if (!gpu) return;
    device_ = std::make_unique<DeviceTensors>(*host_);
    std::size_t forward_most = 0;
    for (const AttentionShape& s : shapes) {
      std::size_t bytes = 0;
      if (forward_workspace_size(device_forward(s), &bytes).is_ok()) forward_most = std::max(forward_most, bytes);
    }
    if (forward_most > 0) forward_workspace_ = DeviceBuffer(forward_most);
    if (!c.pass.backward) return;
    device_grads_ = std::make_unique<DeviceGradients>(*grads_);
    std::size_t most = 1;
    for (const AttentionShape& s : shapes) {
      // A shape the library rejects needs none; its call reports why later.
      std::size_t bytes = 0;
      if (backward_workspace_size(device_args(s, c.pass.deterministic), &bytes).is_ok()) most = std::max(most, bytes);
    }
    workspace_ = DeviceBuffer(most);
  }

  ForwardArgs host_forward(const AttentionShape& s) const { return forward_args(s, host_->pointers()); }
  BackwardArgs host_backward(const AttentionShape& s, bool deterministic) const {
    return backward_args(s, host_->pointers(), grads_->pointers(), deterministic);
  }
  ForwardArgs device_forward(const AttentionShape& s) const {
    ForwardArgs a = forward_args(s, device_->pointers());
    a.workspace = forward_workspace_.get();
    a.workspace_bytes = forward_workspace_.bytes();
    return a;
  }
  BackwardArgs device_backward(const AttentionShape& s, bool deterministic) const {
    BackwardArgs a = device_args(s, deterministic);
    a.workspace = workspace_.get();
    a.workspace_bytes = workspace_.bytes();
    return a;
  }

 private:
  BackwardArgs device_args(const AttentionShape& s, bool deterministic) const {
    return backward_args(s, device_->pointers(), device_grads_->pointers(), deterministic);
  }

  std::unique_ptr<HostTensors> host_;
  std::unique_ptr<HostGradients> grads_;
  std::unique_ptr<DeviceTensors> device_;
  std::unique_ptr<DeviceGradients> device_grads_;
  DeviceBuffer workspace_;
  DeviceBuffer forward_workspace_;  // unallocated where no shape needs one
};

// The timed pass of one shape. A backward first runs the forward once, untimed, for
// the out and lse it reads; as either call may refuse the shape (no kernel built for
// its head dims, say), `refused_by` then names the one that did.
Status time_shape(const AttentionShape& s, const BenchConfig& c, bool gpu, const TimingConfig& timing,
                  const SweepBuffers& buffers, Timing* t, std::string* refused_by) {
  cpu::Options cpu_options;
  cpu_options.num_threads = c.exec.threads;
  if (gpu) {
    const ForwardArgs fwd = buffers.device_forward(s);
    if (!c.pass.backward) return time_gpu_forward(fwd, c.exec.kernel, timing, t);
    Status status = run_device_once([&](cudaStream_t stream) { return gpu_forward(fwd, c.exec.kernel, stream); });
    if (!status.is_ok()) {
      *refused_by = "fa3::forward";
      return status;
    }
    *refused_by = "fa3::backward";
    return time_gpu_backward(buffers.device_backward(s, c.pass.deterministic), timing, t);
  }
  const ForwardArgs fwd = buffers.host_forward(s);
  if (!c.pass.backward) return time_cpu_forward(fwd, cpu_options, timing, t);
  Status status = cpu::forward(fwd, cpu_options);
  if (!status.is_ok()) {
    *refused_by = "fa3::cpu::forward";
    return status;
  }
  *refused_by = "fa3::cpu::backward";
  return time_cpu_backward(buffers.host_backward(s, c.pass.deterministic), cpu_options, timing, t);
}

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  const BenchConfig config = parse_bench(args);
  const PathChoice path = choose_path(config.exec.device, config.exec.dtype);
  const bool gpu = path.path == Path::kGpu;
  const SweepDefaults& defaults = gpu ? kGpuSweep : config.pass.backward ? kCpuBackwardSweep : kCpuSweep;
  const TimingConfig timing = config.exec.timing(defaults.timing);
  const std::vector<AttentionShape> shapes = sweep_shapes(config, defaults, gpu);
  const SweepBuffers buffers(shapes, config, gpu);

  std::printf("fa3 bench: %s; %s; %s%zu shapes; median of %d calls after %d warm-up\n",
              describe(path, config.pass.backward).c_str(), dtype_name(config.exec.dtype),
              config.pass.deterministic ? "deterministic; " : "", shapes.size(), timing.iters, timing.warmup);
  std::fflush(stdout);

  // The field's convention (FlashAttention papers): the backward does 2.5x the forward's work.
  const double flops_factor = config.pass.backward ? 2.5 : 1.0;
  std::vector<BenchRecord> records;
  {
    Progress progress(shapes.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const AttentionShape& s = shapes[i];
      BenchRecord r = record_for(s, config, path);
      progress.show(i, shape_label(r.hdim, r.hdim_v, r.causal, r.seqlen));
      Timing t;
      std::string refused_by;
      Status status = time_shape(s, config, gpu, timing, buffers, &t, &refused_by);
      Problem problem;
      if (status.is_ok()) status = validate_forward(buffers.host_forward(s), cpu_target(), &problem);
      if (status.is_ok()) {
        r.ms = t.median_ms;
        r.tflops = flops_factor * problem.forward_flops() / (t.median_ms * 1e-3) / 1e12;
      } else {
        r.error = (refused_by.empty() ? "" : refused_by + ": ") + status.to_string();
      }
      records.push_back(r);
    }
  }

  std::fputs(table(records).c_str(), stdout);
  bool failed = false;
  for (const BenchRecord& r : records) {
    if (r.error.empty()) continue;
    std::fprintf(stderr, "fa3 bench: %s: %s\n", shape_label(r.hdim, r.hdim_v, r.causal, r.seqlen).c_str(),
                 r.error.c_str());
    failed = true;
  }
  if (!config.json_path.empty()) write_file(config.json_path, to_json(records));
  if (!config.csv_path.empty()) {
    const bool flushed =
        std::any_of(records.begin(), records.end(), [](const BenchRecord& r) { return !r.timing.empty(); });
    write_file(config.csv_path, to_csv(records, {config.head_dim_v.has_value(), config.pass.backward, flushed}));
  }
  return failed ? kExitError : kExitOk;
}

}  // namespace fa3::cli
