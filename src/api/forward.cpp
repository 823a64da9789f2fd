#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "api/device_cache.h"
#include "api/tuned_kernels.h"
#include "api/validate.h"
#include "common/status_macros.h"
#include "fa3/attention.h"
#include "fa3/kernels.h"
#include "hopper/fwd_dispatch.h"

namespace fa3 {
namespace {

Status run_on_device(const ForwardArgs& args, const char* kernel, cudaStream_t stream) {
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, gpu_target(), &problem));
  const DeviceInfo* dev = nullptr;
  FA3_RETURN_IF_ERROR(current_device_cached(&dev));
  if (!dev->is_hopper()) {
    return {StatusCode::kNotSupported, "fa3::forward needs a Hopper GPU (compute capability 9.0); device " +
                                           std::to_string(dev->index) + " (" + dev->name + ") is " +
                                           std::to_string(dev->cc_major) + "." + std::to_string(dev->cc_minor)};
  }
  // A kernel named by the caller wins over the tuning cache's. The cache times plain
  // and causal kernels only (the general family has one per head dim), on fixed-length
  // shapes (a varlen call's lengths are bounds, not its shape) of one head dim (a V head
  // dim of its own runs on other kernels). FP8 calls take the build's first FP8 tile.
  const bool tunable = kernel == nullptr && !problem.varlen && problem.head_dim_v == problem.head_dim &&
                       hopper::mask_kind(problem) != hopper::MaskKind::kGeneral && args.q.dtype != DType::kFloat8E4M3;
  const std::string tuned = tunable ? tuned_forward_kernel(problem, args.q.dtype, *dev) : std::string();
  return hopper::run_forward(problem, args, problem.usable_sms(dev->sm_count), stream,
                             tuned.empty() ? kernel : tuned.c_str());
}

}  // namespace

Status forward(const ForwardArgs& args, cudaStream_t stream) { return run_on_device(args, nullptr, stream); }

Status forward_with_kernel(const ForwardArgs& args, const std::string& kernel, cudaStream_t stream) {
  return run_on_device(args, kernel.c_str(), stream);
}

Status forward_workspace_size(const ForwardArgs& args, std::size_t* bytes) {
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, gpu_shape_target(), &problem));
  *bytes = hopper::fwd_workspace_bytes(problem, args.q.dtype);
  return Status::ok();
}

Status forward_kernels(const ForwardArgs& args, std::vector<std::string>* names) {
  ValidationTarget target = gpu_target();
  target.forward_workspace = nullptr;
  Problem problem;
  FA3_RETURN_IF_ERROR(validate_forward(args, target, &problem));
  names->clear();
  for (const hopper::FwdKernelEntry* k : hopper::fwd_candidates(problem, args.q.dtype, args.out.dtype))
    names->push_back(k->name());
  return Status::ok();
}

}  // namespace fa3
