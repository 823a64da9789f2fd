// `fa3 run --backward`: the forward pass (with lse) once, untimed; then the backward
// pass timed alone; then out and lse checked on sampled query rows, dq on the same
// rows and dk, dv on as many sampled key rows.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "api/validate.h"
#include "cuda_resources.h"
#include "device_choice.h"
#include "device_tensors.h"
#include "errors.h"
#include "fa3/kernels.h"
#include "format.h"
#include "grad_check.h"
#include "host_tensors.h"
#include "row_check.h"
#include "run_config.h"
#include "run_report.h"
#include "shape.h"
#include "timing.h"

namespace fa3::cli {
namespace {

// What the runs on either path leave besides the tensors.
struct BackwardRun {
  Timing timing;
  std::string kernel;                 // GPU: the forward kernel that wrote out and lse
  std::size_t workspace_bytes = 0;    // GPU
  std::vector<std::byte> first_call;  // deterministic: dq, dk, dv of an untimed first call
};

BackwardRun run_on_gpu(const RunConfig& config, const TimingConfig& timing, HostTensors& host, HostGradients& grads) {
  const AttentionShape& shape = config.shape;
  BackwardRun run;
  const DeviceTensors device(host);
  const DeviceGradients device_grads(grads);
  const ForwardArgs fwd = forward_args(shape, device.pointers());
  std::vector<std::string> kernels;
  throw_if_error(forward_kernels(fwd, &kernels));
  run.kernel = config.exec.kernel.empty() ? kernels.front() : config.exec.kernel;
  throw_if_error(run_device_once([&](cudaStream_t s) { return gpu_forward(fwd, config.exec.kernel, s); }));

  BackwardArgs bwd = backward_args(shape, device.pointers(), device_grads.pointers(), config.pass.deterministic);
  throw_if_error(backward_workspace_size(bwd, &run.workspace_bytes));
  // Allocated once, outside the timing, as a training loop would keep it.
  const DeviceBuffer workspace(std::max<std::size_t>(run.workspace_bytes, 1));
  bwd.workspace = workspace.get();
  bwd.workspace_bytes = run.workspace_bytes;
  if (config.pass.deterministic) {
    throw_if_error(run_device_once([&](cudaStream_t s) { return backward(bwd, s); }));
    device_grads.download_gradients(grads);
    run.first_call = grads.gradient_bytes();
  }
  throw_if_error(time_gpu_backward(bwd, timing, &run.timing));
  device.download_outputs(host);
  device_grads.download_gradients(grads);
  return run;
}

BackwardRun run_on_cpu(const RunConfig& config, const TimingConfig& timing, HostTensors& host, HostGradients& grads) {
  BackwardRun run;
  cpu::Options options;
  options.num_threads = config.exec.threads;
  throw_if_error(cpu::forward(forward_args(config.shape, host.pointers()), options));
  const BackwardArgs bwd = backward_args(config.shape, host.pointers(), grads.pointers(), config.pass.deterministic);
  if (config.pass.deterministic) {
    throw_if_error(cpu::backward(bwd, options));
    run.first_call = grads.gradient_bytes();
  }
  throw_if_error(time_cpu_backward(bwd, options, timing, &run.timing));
  return run;
}

std::string kernel_summary(const BackwardRun& run) {
  return "forward " + run.kernel + "; backward workspace " + bytes_text(static_cast<double>(run.workspace_bytes));
}

}  // namespace

int run_backward(const RunConfig& config) {
  const AttentionShape& shape = config.shape;
  const PathChoice path = choose_path(config.exec.device, shape.dtype);
  const bool gpu = path.path == Path::kGpu;
  const TimingConfig timing = config.exec.timing(gpu ? kGpuTiming : kCpuBackwardTiming);

  TensorCapacity capacity;
  capacity.grow_to(shape);
  HostTensors host(capacity, shape.dtype, config.exec.seed, shape.sinks);
  HostGradients grads(capacity, shape.dtype, config.exec.seed);
  const BackwardRun run = gpu ? run_on_gpu(config, timing, host, grads) : run_on_cpu(config, timing, host, grads);

  // The calls were accepted, so the CPU rules (a superset of the GPU's) accept them too.
  const BackwardArgs host_args = backward_args(shape, host.pointers(), grads.pointers(), config.pass.deterministic);
  Problem problem;
  throw_if_error(validate_backward(host_args, cpu_target(), &problem));
  const std::vector<reference::RowRef> query_rows = sample_rows(problem, config.check_rows, config.exec.seed);
  const RowCheck forward = check_rows(problem, forward_args(shape, host.pointers()), query_rows);
  const GradientChecks grad =
      check_gradients(problem, host_args, query_rows, sample_key_rows(problem, config.check_rows, config.exec.seed),
                      config.exec.threads);
  const bool repeatable = !config.pass.deterministic || run.first_call == grads.gradient_bytes();

  std::printf(config.pass.deterministic ? "fa3 run --backward --deterministic\n" : "fa3 run --backward\n");
  report("path", describe(path, true));
  report("problem", shape.describe());
  if (gpu) report("kernel", kernel_summary(run));
  report("time", timing_summary(run.timing, timing));
  // The field's convention (FlashAttention papers): the backward does 2.5x the forward's work.
  report("speed", speed_summary(2.5 * problem.forward_flops(), run.timing, "2.5x the forward's"));
  report("check", forward_summary(forward));
  report("dq", gradient_summary("dq", "query rows", grad.dq));
  report("dk", gradient_summary("dk", "key rows", grad.dk));
  report("dv", gradient_summary("dv", "key rows", grad.dv));
  if (config.pass.deterministic) {
    const std::string calls = std::to_string(1 + timing.warmup + run.timing.iters);
    report("repeat", "dq, dk, dv of the last of " + calls + " calls " +
                         (repeatable ? "bitwise equal to" : "differ from") + " the first's");
  }

  std::vector<std::string> why = forward_failures(forward);
  for (std::string& w : gradient_failures(grad)) why.push_back(std::move(w));
  if (!repeatable) why.push_back("deterministic calls differ");
  report("result", why.empty() ? "PASS" : "FAIL: " + join(why));
  return why.empty() ? kExitOk : kExitCheckFailed;
}

}  // namespace fa3::cli
